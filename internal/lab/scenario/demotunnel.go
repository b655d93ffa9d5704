package scenario

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// TunnelResult is what the demo measured through braid's tunnel over both paths.
type TunnelResult struct {
	Goodput     float64       // TCP bulk h1 -> h2, steady, bit/s
	RTT         time.Duration // median request/response time
	Retransmits int64
	FileSize    int
	FileTime    time.Duration
	FileIntact  bool
	CutGap      time.Duration // longest time without a reply of a 10 ms ping while path A is cut
	CutIntact   bool          // a transfer running across the cut arrived intact
}

// demoTunnelPaths are the tunnel's two paths between the site routers, with the capacity of
// each path's bottleneck (the slower of its two uplinks).
var demoTunnelPaths = [2]struct {
	r1, r2   string
	capacity uint64
}{
	{"10.0.1.1", "10.0.3.2", 50e6},
	{"10.0.2.1", "10.0.4.2", 20e6},
}

// MeasureTunnel runs braid's tunnel between the demo's site routers r1 and r2 over both
// uplinks, routes the sites' traffic into it, and measures it like a single path; then it cuts
// path A during a transfer and a 10 ms ping.
func MeasureTunnel(ctx context.Context, l *lab.Lab, quick bool) (TunnelResult, error) {
	r := TunnelResult{FileSize: 8 << 20}
	dur := 8 * time.Second
	if quick {
		dur, r.FileSize = 3*time.Second, 2<<20
	}
	k1, err := session.GenerateKey()
	if err != nil {
		return r, err
	}
	k2, err := session.GenerateKey()
	if err != nil {
		return r, err
	}
	type end struct {
		host      string
		key, peer session.PrivateKey
		inner     string
		routes    []netip.Prefix
		site      netip.Prefix
	}
	ends := []end{
		{"r1", k1, k2, "10.254.0.1/30", []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24"), netip.MustParsePrefix("10.254.0.2/32")}, netip.MustParsePrefix("10.2.0.0/24")},
		{"r2", k2, k1, "10.254.0.2/30", []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("10.254.0.1/32")}, netip.MustParsePrefix("10.1.0.0/24")},
	}
	var tunnels []*tunnel.Tunnel
	for i, e := range ends {
		var locals []netip.Addr
		peer := tunnel.PeerConfig{Name: ends[1-i].host, PublicKey: e.peer.Public(), Routes: e.routes}
		for _, p := range demoTunnelPaths {
			local, remote := p.r1, p.r2
			if i == 1 {
				local, remote = remote, local
			}
			locals = append(locals, netip.MustParseAddr(local))
			peer.Paths = append(peer.Paths, tunnel.PathConfig{Uplink: local, Remote: netip.AddrPortFrom(netip.MustParseAddr(remote), TunnelPort), Capacity: p.capacity})
		}
		t, stop, err := StartTunnel(ctx, l.Host(e.host), []netip.Prefix{netip.MustParsePrefix(e.inner)}, locals,
			tunnel.Options{PrivateKey: e.key, Reorder: true, Peers: []tunnel.PeerConfig{peer}})
		if err != nil {
			return r, fmt.Errorf("scenario: tunnel in %s: %w", e.host, err)
		}
		defer stop()
		tunnels = append(tunnels, t)
		if err := l.Host(e.host).ReplaceRoute(topo.Route{Dst: e.site, Dev: "braid0"}); err != nil {
			return r, err
		}
	}
	for _, t := range tunnels {
		if err := WaitTunnel(ctx, t, 10*time.Second); err != nil {
			return r, err
		}
	}
	h1 := l.Host("h1")
	const srv = "10.2.0.1:5201"
	rr, err := traffic.RR(ctx, h1.Dial, srv, traffic.RROptions{Count: 20})
	if err != nil {
		return r, fmt.Errorf("scenario: tunnel: rtt: %w", err)
	}
	r.RTT = rr.Median
	bulk, err := traffic.Bulk(ctx, h1.Dial, srv, traffic.BulkOptions{Duration: dur})
	if err != nil {
		return r, fmt.Errorf("scenario: tunnel: bulk: %w", err)
	}
	r.Goodput, r.Retransmits = bulk.Steady, bulk.Retransmits
	f, err := traffic.File(ctx, h1.Dial, srv, traffic.FileOptions{Size: int64(r.FileSize), Seed: 1})
	if err != nil {
		return r, fmt.Errorf("scenario: tunnel: file: %w", err)
	}
	r.FileTime, r.FileIntact = f.Duration, f.Intact

	// Path A dies during a transfer and a ping.
	fibre := l.Link("site1-fibre")
	if fibre == nil {
		return r, fmt.Errorf("scenario: no link site1-fibre")
	}
	cutAt := 1500 * time.Millisecond
	timer := time.AfterFunc(cutAt, fibre.Cut)
	defer timer.Stop()
	defer fibre.Restore()
	files := make(chan traffic.FileResult, 1)
	go func() {
		f, _ := traffic.File(ctx, h1.Dial, srv, traffic.FileOptions{Size: int64(r.FileSize), Seed: 2})
		files <- f
	}()
	gap, err := Ping(ctx, l.Host("h1"), l.Host("h2"), netip.MustParseAddr("10.2.0.1"), 4*time.Second)
	if err != nil {
		return r, err
	}
	r.CutGap = gap
	r.CutIntact = (<-files).Intact
	return r, nil
}

// Ping sends a UDP echo request every 10 ms from host from to the echo server it runs in host
// to (on addr, port 7) for d, and returns the longest time without a reply.
func Ping(ctx context.Context, from, to *lab.Host, addr netip.Addr, d time.Duration) (time.Duration, error) {
	dst := netip.AddrPortFrom(addr, 7).String()
	pc, err := to.ListenPacket("udp", dst)
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], src)
		}
	}()
	c, err := from.Dial(ctx, "udp", dst)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	got := make(chan time.Time, 1024)
	go func() {
		defer close(got)
		buf := make([]byte, 64)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			got <- time.Now()
		}
	}()
	start := time.Now()
	last := start
	var worst time.Duration
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < d {
		select {
		case at, ok := <-got:
			if ok {
				worst = max(worst, at.Sub(last))
				last = at
			}
		case <-tick.C:
			c.Write([]byte("ping"))
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return max(worst, time.Since(last)), nil
}

// UDPIntegrity sends n datagrams of size bytes with pseudo-random content from host from to an
// echo server in host to (addr, port 7), and reports how many came back and how many of those
// came back changed: the content of datagram i is derived from i, so each echo is checked whole.
func UDPIntegrity(ctx context.Context, from, to *lab.Host, addr netip.Addr, n, size int) (echoed, corrupt int, err error) {
	dst := netip.AddrPortFrom(addr, 7).String()
	pc, err := to.ListenPacket("udp", dst)
	if err != nil {
		return 0, 0, err
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			k, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], src)
		}
	}()
	c, err := from.Dial(ctx, "udp", dst)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	payload := func(i uint32, b []byte) {
		x := uint64(i)*0x9e3779b97f4a7c15 + 1
		for j := range b {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			b[j] = byte(x)
		}
		binary.BigEndian.PutUint32(b, i)
	}
	seen := make([]bool, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, want := make([]byte, 65536), make([]byte, size)
		c.SetReadDeadline(time.Now().Add(time.Duration(n)*time.Millisecond + 5*time.Second))
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			if k < 4 {
				corrupt++
				continue
			}
			i := binary.BigEndian.Uint32(buf)
			payload(i, want)
			if int(i) >= n || k != size || !bytes.Equal(buf[:k], want) {
				corrupt++
				continue
			}
			if !seen[i] {
				seen[i] = true
				echoed++
			}
			if echoed == n {
				return
			}
		}
	}()
	out := make([]byte, size)
	for i := range n {
		payload(uint32(i), out)
		c.Write(out)
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // two datagrams a millisecond at most: below the links' rate
		}
	}
	<-done
	return echoed, corrupt, nil
}
