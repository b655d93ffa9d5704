package demo

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
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
			peer.Paths = append(peer.Paths, tunnel.PathConfig{Uplink: local, Remote: netip.AddrPortFrom(netip.MustParseAddr(remote), roles.TunnelPort), Capacity: p.capacity})
		}
		t, stop, err := roles.StartTunnel(ctx, l.Host(e.host), []netip.Prefix{netip.MustParsePrefix(e.inner)}, locals,
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
		if err := roles.WaitTunnel(ctx, t, 10*time.Second); err != nil {
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
	r.Goodput, r.Retransmits = bulk.MeanAfter(1), bulk.Retransmits
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
	gap, err := kit.Ping(ctx, l.Host("h1"), l.Host("h2"), netip.MustParseAddr("10.2.0.1"), 4*time.Second)
	if err != nil {
		return r, err
	}
	r.CutGap = gap
	r.CutIntact = (<-files).Intact
	return r, nil
}
