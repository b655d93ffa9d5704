package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/traffic"
)

// ProxyResult is what the demo measured through braid proxy on r1 and r2.
type ProxyResult struct {
	Goodput    float64
	RTT        time.Duration   // request/response, persistent connection
	FirstByte  time.Duration   // request/response on a new connection
	NewConns   []time.Duration // each new connection's request/response, in order
	FileSize   int
	FileTime   time.Duration
	FileIntact bool
	Subflows   int // most subflows seen carrying data on one connection
}

// ProxySite is the [proxy] section for r1 (side 1) or r2 (side 2) of the demo topology: the
// routers' two uplinks, tenant "demo" with the site's LAN, the other router as the peer; extra
// (lines of keys) goes into [proxy].
func ProxySite(l *lab.Lab, side int, key, peer, extra string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "[proxy]\nmode = \"tproxy\"\nprivate_key = %q\nmetrics = %q\n%s", key, roles.ProxyMetrics, extra)
	router := fmt.Sprintf("r%d", side)
	for _, name := range demoUplinks[side-1] {
		lk := l.Link(name)
		if lk == nil {
			return nil, fmt.Errorf("scenario: the demo topology has no link %s", name)
		}
		ep := lk.Spec.A
		if ep.Host != router {
			ep = lk.Spec.B
		}
		var addr netip.Addr
		for _, p := range ep.Addrs {
			if p.Addr().Is4() {
				addr = p.Addr()
			}
		}
		fmt.Fprintf(&b, "[[proxy.uplink]]\nname = %q\ninterface = %q\naddress = %q\n", name, ep.Ifname, addr)
	}
	own, other := fmt.Sprintf("10.%d.0.0/24", side), fmt.Sprintf("10.%d.0.0/24", 3-side)
	peerAddr := map[int]string{1: "10.0.3.2:7101", 2: "10.0.1.1:7101"}[side] // the other router's fibre
	fmt.Fprintf(&b, "[[proxy.tenant]]\nname = \"demo\"\nnetworks = [%q]\nport = 7001\npeer_port = 7101\n", own)
	fmt.Fprintf(&b, "  [[proxy.tenant.peer]]\n  name = \"site%d\"\n  public_key = %q\n  address = [%q]\n  networks = [%q]\n", 3-side, peer, peerAddr, other)
	return []byte(b.String()), nil
}

// proxyRampUp is how many of the proxy's first 1 s samples its goodput leaves out: kernel
// MPTCP's second subflow takes that long to fill (see MeasureProxy).
const proxyRampUp = 3

// MeasureProxy runs braid proxy on r1 and r2 (this executable, as `braid proxy`) and measures
// h1 -> h2 through it: both uplinks of each site carry the connection.
func MeasureProxy(ctx context.Context, l *lab.Lab, quick bool) (ProxyResult, error) {
	var r ProxyResult
	bin, err := os.Executable()
	if err != nil {
		return r, err
	}
	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp("", "braid-demo-proxy-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	s1, err := ProxySite(l, 1, k1.String(), k2.Public().String(), "")
	if err != nil {
		return r, err
	}
	s2, err := ProxySite(l, 2, k2.String(), k1.Public().String(), "")
	if err != nil {
		return r, err
	}
	p1, err := roles.StartProxy(l.Host("r1"), bin, dir, s1)
	if err != nil {
		return r, err
	}
	defer p1.Stop()
	p2, err := roles.StartProxy(l.Host("r2"), bin, dir, s2)
	if err != nil {
		return r, err
	}
	defer p2.Stop()
	if err := WaitPooled(ctx, p1, p2); err != nil {
		return r, err
	}
	h1, h2 := l.Host("h1"), l.Host("h2")
	const srvAddr = "10.2.0.1:5202"
	stop, err := kit.StartServer(ctx, h2, srvAddr)
	if err != nil {
		return r, err
	}
	defer stop()
	// Kernel MPTCP puts a connection's data on its fastest subflow first and the slower one
	// fills over 2-4 s: per-second download samples in --quick read 51.7, 55.3, 53.4, 58.6, 62.1
	// Mbit/s in a slow run and 63.2-65.9 from the second on in a fast one. The goodput is
	// therefore that of the samples after the first three, over a bulk of 10 s in --quick (6 s,
	// with the median of the samples after the first, read 49.5 Mbit/s in a CI run).
	dur, fileSize := 15*time.Second, 8<<20
	if quick {
		dur, fileSize = 10*time.Second, 2<<20
	}
	fail := func(what string, err error) (ProxyResult, error) {
		return r, fmt.Errorf("scenario: proxy: %s: %w\n%s\n%s", what, err, p1.Log(), p2.Log())
	}
	rr, err := traffic.RR(ctx, h1.Dial, srvAddr, traffic.RROptions{Count: 20})
	if err != nil {
		return fail("rtt", err)
	}
	r.RTT = rr.Median
	nc, err := traffic.RR(ctx, h1.Dial, srvAddr, traffic.RROptions{Count: 20, NewConn: true})
	if err != nil {
		return fail("new connections", err)
	}
	r.FirstByte, r.NewConns = nc.Median, nc.Samples
	bulk, err := traffic.Bulk(ctx, h1.Dial, srvAddr, traffic.BulkOptions{Duration: dur, Reverse: true, OnSample: func(traffic.Sample) {
		if st, err := roles.ProxyStatus(ctx, p1.Host); err == nil {
			for _, c := range st.Proxy.Connections {
				carried := 0
				for _, sf := range c.Subflows {
					if sf.BytesRecv > 0 {
						carried++
					}
				}
				r.Subflows = max(r.Subflows, carried)
			}
		}
	}})
	if err != nil {
		return fail("bulk", err)
	}
	r.Goodput = bulk.MeanAfter(proxyRampUp)
	f, err := traffic.File(ctx, h1.Dial, srvAddr, traffic.FileOptions{Size: int64(fileSize), Seed: 2})
	if err != nil {
		return fail("file", err)
	}
	r.FileSize, r.FileTime, r.FileIntact = fileSize, f.Duration, f.Intact
	return r, nil
}

// WaitPooled waits up to 15 s until each of the demo's proxies a and b has a pooled connection
// to the other.
func WaitPooled(ctx context.Context, a, b *roles.ProxyProc) error {
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ready := 0
		for _, p := range []*roles.ProxyProc{a, b} {
			st, err := roles.ProxyStatus(ctx, p.Host)
			if err != nil || len(st.Proxy.Tenants) == 0 {
				continue
			}
			for _, n := range st.Proxy.Tenants[0].PoolReady {
				if n > 0 {
					ready++
				}
			}
		}
		if ready == 2 {
			return nil
		}
	}
	return fmt.Errorf("scenario: the demo's proxies did not connect within 15 s\n%s\n%s", a.Log(), b.Log())
}

func printProxy(w io.Writer, pr ProxyResult, paths []PathResult) {
	var sum uint64
	for _, p := range paths {
		sum += p.Bottleneck
	}
	fmt.Fprintf(w, "\nbraid proxy on r1 and r2 (TCP from h1 intercepted, MPTCP over both uplinks, TLS 1.3):\n"+
		"  download %.1f Mbit/s after the first %d s (%.1f %% of the %s its paths carry: each ISP reaches only its\n"+
		"  own customers' uplinks), %d subflows carried data on a connection; request/response %.1f ms on\n"+
		"  a persistent connection, %.1f ms on a new one; %d MiB file in %.2f s, intact: %s\n",
		pr.Goodput/1e6, proxyRampUp, 100*pr.Goodput/float64(max(sum, 1)), kit.RateText(sum), pr.Subflows,
		float64(pr.RTT)/1e6, float64(pr.FirstByte)/1e6, pr.FileSize>>20, pr.FileTime.Seconds(), kit.YesNo(pr.FileIntact))
}
