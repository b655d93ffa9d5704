package tunnel_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// natTopology is a branch site whose two uplinks each sit behind a NAT, bonded to a hub on the
// far side of both: up1 behind a home router (cpe: masquerade keeping ports when it can), up2
// behind a carrier-grade NAT (cgnat: a random port for every mapping, UDP mappings forgotten
// after 30 s). The hub has an address on each NAT's outside network. The links behind the
// NATs are kernel veths; the outside links carry the paths' rates and delays.
//
//	site up1 192.168.1.2 - cpe  (wan 198.51.100.2) --- hub 198.51.100.1
//	site up2 192.168.2.2 - cgnat (wan 203.0.113.2) --- hub 203.0.113.1
func natTopology(shapes [2]topo.Shape) *topo.Topology {
	pf := netip.MustParsePrefix
	return &topo.Topology{Name: "nat", Hosts: []topo.Host{
		{Name: "site", Routes: []topo.Route{
			{Dst: pf("198.51.100.0/24"), Via: netip.MustParseAddr("192.168.1.1")},
			{Dst: pf("203.0.113.0/24"), Via: netip.MustParseAddr("192.168.2.1")},
		}},
		{Name: "cpe", NAT: &topo.NAT{Outside: []string{"wan"}}},
		{Name: "cgnat", NAT: &topo.NAT{Outside: []string{"wan"}, RandomPorts: true, UDPTimeout: 30 * time.Second}},
		{Name: "hub"},
	}, Links: []topo.Link{
		{Name: "site-cpe", Kernel: true,
			A: topo.Endpoint{Host: "site", Ifname: "up1", Addrs: []netip.Prefix{pf("192.168.1.2/24")}},
			B: topo.Endpoint{Host: "cpe", Addrs: []netip.Prefix{pf("192.168.1.1/24")}}},
		{Name: "cpe-hub", AB: shapes[0], BA: shapes[0],
			A: topo.Endpoint{Host: "cpe", Ifname: "wan", Addrs: []netip.Prefix{pf("198.51.100.2/24")}},
			B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("198.51.100.1/24")}}},
		{Name: "site-cgnat", Kernel: true,
			A: topo.Endpoint{Host: "site", Ifname: "up2", Addrs: []netip.Prefix{pf("192.168.2.2/24")}},
			B: topo.Endpoint{Host: "cgnat", Addrs: []netip.Prefix{pf("192.168.2.1/24")}}},
		{Name: "cgnat-hub", AB: shapes[1], BA: shapes[1],
			A: topo.Endpoint{Host: "cgnat", Ifname: "wan", Addrs: []netip.Prefix{pf("203.0.113.2/24")}},
			B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("203.0.113.1/24")}}},
	}}
}

var (
	natHubAddrs  = []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("203.0.113.1")}
	natSiteAddrs = []netip.Addr{netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("192.168.2.2")}
	natHubInner  = netip.MustParseAddr("10.255.0.1")
	natSiteInner = netip.MustParseAddr("10.255.0.2")
)

// natTunnels runs the hub, which knows the site by its key alone (its paths learned on both
// of the hub's addresses), and the site, whose paths go to the hub's two addresses through the
// NATs. rates, when given, are configured as the uplinks' capacities on both sides.
func natTunnels(t *testing.T, l *lab.Lab, rates []uint64) (hub, site *tunnel.Tunnel) {
	t.Helper()
	kh, _ := session.GenerateKey()
	ks, _ := session.GenerateKey()
	capacity := func(i int) uint64 {
		if rates == nil {
			return 0
		}
		return rates[i]
	}
	withCapacity := func(o *tunnel.Options) {
		for i := range o.Uplinks {
			o.Uplinks[i].Capacity = capacity(i)
			o.Uplinks[i].Local = netip.AddrPortFrom(netip.MustParseAddr(o.Uplinks[i].Name), roles.TunnelPort)
		}
	}
	learned := tunnel.PeerConfig{Name: "site", PublicKey: ks.Public(), Routes: []netip.Prefix{netip.PrefixFrom(natSiteInner, 32)}}
	fixed := tunnel.PeerConfig{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{netip.PrefixFrom(natHubInner, 32)}}
	for i := range natHubAddrs {
		learned.Paths = append(learned.Paths, tunnel.PathConfig{Uplink: natHubAddrs[i].String(), Capacity: capacity(i)})
		fixed.Paths = append(fixed.Paths, tunnel.PathConfig{Uplink: natSiteAddrs[i].String(),
			Remote: netip.AddrPortFrom(natHubAddrs[i], roles.TunnelPort), Capacity: capacity(i)})
	}
	start := func(h *lab.Host, k session.PrivateKey, inner netip.Addr, locals []netip.Addr, peer tunnel.PeerConfig) *tunnel.Tunnel {
		tn, stop, err := roles.StartTunnel(context.Background(), h, []netip.Prefix{netip.PrefixFrom(inner, 24)}, locals,
			tunnel.Options{PrivateKey: k, MTU: 1400, Reorder: true, Recovery: true, Peers: []tunnel.PeerConfig{peer}}, withCapacity)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("tunnel in %s: %v", h.Name, err)
			}
		})
		return tn
	}
	hub = start(l.Host("hub"), kh, natHubInner, natHubAddrs, learned)
	site = start(l.Host("site"), ks, natSiteInner, natSiteAddrs, fixed)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := roles.WaitTunnel(ctx, site, 10*time.Second); err != nil {
		t.Fatalf("site: %v: %+v", err, site.Status())
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps := hub.Status().Peers[0]
		up := 0
		for _, p := range ps.Paths {
			if p.State == "up" {
				up++
			}
		}
		if ps.Session && up == 2 && len(ps.Paths) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hub has not learned the site's two paths: %+v", ps)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return hub, site
}

// logNATPaths logs the hub's view of the site's paths: the NATs' outside addresses and ports.
func logNATPaths(t *testing.T, hub *tunnel.Tunnel) {
	t.Helper()
	for _, p := range hub.Status().Peers[0].Paths {
		moved := "never moved"
		if p.MovedAt != nil {
			moved = "moved " + p.MovedAt.Format("15:04:05.000")
		}
		t.Logf("hub path %d: %s <- %s, %s, %s, %d data packets received", p.ID, p.Local, p.Remote, p.Origin, moved, p.RxDataPackets)
	}
}

// A site whose two uplinks sit behind two different NATs (one with random ports) reaches a
// hub that knows only its key: the hub learns both paths from the site's packets, one TCP flow
// from the site gets at least 0.9 of the sum of the two paths alone (plain TCP through each
// NAT, measured in the same lab; up to three 5 s flows, labtest.Measure, as
// TestTunnelAggregation: in one CI run three flows back to back carried 0.54, 0.36 and 0.33),
// and a file crosses intact both ways.
func TestTunnelBehindNAT(t *testing.T) {
	rates := []uint64{40e6, 20e6}
	l := labtest.Up(t, natTopology([2]topo.Shape{{Rate: rates[0], Delay: 5 * time.Millisecond}, {Rate: rates[1], Delay: 5 * time.Millisecond}}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const dur = 5 * time.Second
	sum := 0.0
	for i, a := range natHubAddrs {
		addr := serve(t, l.Host("hub"), a)
		res, err := traffic.Bulk(ctx, l.Host("site").Dial, addr, traffic.BulkOptions{Duration: dur})
		if err != nil {
			t.Fatalf("path %d alone: %v", i+1, err)
		}
		t.Logf("path %d alone (%d Mbit/s, through the %s), no tunnel: %.1f Mbit/s", i+1, rates[i]/1e6, []string{"cpe", "cgnat"}[i], res.Steady/1e6)
		sum += res.Steady
	}
	hub, site := natTunnels(t, l, rates)
	logNATPaths(t, hub)
	for _, p := range hub.Status().Peers[0].Paths {
		if p.Origin != "learned" {
			t.Errorf("hub path %d is %s, want learned", p.ID, p.Origin)
		}
	}
	addr := serve(t, l.Host("hub"), natHubInner)
	labtest.Measure(t, func(run int) []string {
		res, err := traffic.Bulk(ctx, l.Host("site").Dial, addr, traffic.BulkOptions{Duration: dur})
		if err != nil {
			t.Fatalf("through the tunnel: %v", err)
		}
		ratio := res.Steady / sum
		t.Logf("run %d: site to hub through the tunnel %.1f Mbit/s, %.3f of the sum of the paths alone (%.1f Mbit/s); %d retransmits", run, res.Steady/1e6, ratio, sum/1e6, res.Retransmits)
		if ratio < 0.9 {
			return []string{fmt.Sprintf("one TCP flow through the tunnel behind NAT: %.3f of the sum of the paths alone, want at least 0.9", ratio)}
		}
		return nil
	})
	for i, p := range site.Status().Peers[0].Paths {
		t.Logf("site path %d: %d data packets sent", i+1, p.TxDataPackets)
		if p.TxDataPackets == 0 {
			t.Errorf("site path %d carried no data", i+1)
		}
	}
	f, err := traffic.File(ctx, l.Host("site").Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: 17})
	if err != nil || !f.Intact {
		t.Errorf("file from the site to the hub: %v %v", err, f)
	}
	siteAddr := serve(t, l.Host("site"), natSiteInner)
	f, err = traffic.File(ctx, l.Host("hub").Dial, siteAddr, traffic.FileOptions{Size: 8 << 20, Seed: 18})
	if err != nil || !f.Intact {
		t.Errorf("file from the hub to the site (over the learned paths): %v %v", err, f)
	}
	t.Logf("file hub to site: %v", f)
	c := hub.Status().Counters
	if c["drop_unknown_path"] != 0 || c["paths_learned"] != 2 {
		t.Errorf("hub: drop_unknown_path %d, paths_learned %d (want 0 and 2)", c["drop_unknown_path"], c["paths_learned"])
	}
}

// Both NATs' mappings are flushed during a transfer from the site: the hub's paths move to the
// NATs' new mappings on the site's next packets, without a handshake; a 10 ms ping through the
// tunnel never waits more than 300 ms for a reply, and the file arrives intact.
func TestTunnelNATRebinding(t *testing.T) {
	shape := topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}
	l := labtest.Up(t, natTopology([2]topo.Shape{shape, shape}))
	hub, site := natTunnels(t, l, nil)
	logNATPaths(t, hub)
	before := remotesOf(hub)
	handshakes := func() uint64 {
		return hub.Status().Counters["handshakes_done"] + site.Status().Counters["handshakes_done"]
	}
	hs := handshakes()
	addr := serve(t, l.Host("hub"), natHubInner)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	flushed := make(chan int, 2)
	flush := time.AfterFunc(1500*time.Millisecond, func() {
		for _, h := range []string{"cpe", "cgnat"} {
			n, err := l.Host(h).FlushNAT()
			if err != nil {
				t.Errorf("flush %s: %v", h, err)
			}
			flushed <- n
		}
	})
	defer flush.Stop()
	fileDone := make(chan traffic.FileResult, 1)
	go func() {
		f, err := traffic.File(ctx, l.Host("site").Dial, addr, traffic.FileOptions{Size: 16 << 20, Seed: 19})
		if err != nil {
			t.Errorf("transfer across the flush: %v", err)
		}
		fileDone <- f
	}()
	worst, err := kit.Ping(ctx, l.Host("site"), l.Host("hub"), natHubInner, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := <-fileDone
	n1, n2 := <-flushed, <-flushed
	t.Logf("mappings flushed: %d in cpe, %d in cgnat; longest ping gap %v; transfer %v", n1, n2, worst, f)
	logNATPaths(t, hub)
	if n1 == 0 || n2 == 0 {
		t.Errorf("a NAT had no mapping to flush (%d, %d)", n1, n2)
	}
	if worst > 300*time.Millisecond {
		t.Errorf("longest time without a ping reply across the flush: %v, want at most 300 ms", worst)
	}
	if !f.Intact {
		t.Errorf("transfer across the flush: %v", f)
	}
	if now := handshakes(); now != hs {
		t.Errorf("handshakes done went from %d to %d: the NAT rebinding needed a new handshake", hs, now)
	}
	after := remotesOf(hub)
	// The cgnat gives every mapping a random port: its path must have moved.
	cg := natHubAddrs[1].String()
	if after[cg] == before[cg] {
		t.Errorf("the cgnat path did not move: %s before and after the flush", before[cg])
	}
	c := hub.Status().Counters
	t.Logf("hub: path_moves %d, paths_learned %d, handshakes_done %d", c["path_moves"], c["paths_learned"], c["handshakes_done"])
	if c["paths_learned"] != 2 {
		t.Errorf("paths_learned %d: a rebinding must move a path, not add one", c["paths_learned"])
	}
}

// remotesOf returns the hub's paths' remote addresses by uplink (the hub's address).
func remotesOf(hub *tunnel.Tunnel) map[string]string {
	out := map[string]string{}
	for _, p := range hub.Status().Peers[0].Paths {
		out[p.Uplink] = p.Remote
	}
	return out
}
