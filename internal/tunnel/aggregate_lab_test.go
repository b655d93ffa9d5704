package tunnel_test

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/sock"
	"braid/internal/traffic"
	"braid/internal/tun"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// One TCP flow through the tunnel over a 300 and a 100 Mbit/s path (5 ms one way, the uplinks'
// capacities configured) gets at least 0.9 of the sum of the paths. The sum is measured in the
// same test and lab: one TCP flow over each path alone, without the tunnel (bench/tunnel's
// baseline), so the bound is physically reachable; the tunnel's own 72 bytes per packet cost
// about 5 % of it (bench/BENCH.md: 0.949 of the sum). One path alone is 0.75 of the sum, so a
// tunnel that uses one path fails. Up to three 5 s runs (labtest.Measure: a run that misses
// while the hypervisor takes the CPU waits for it to give it back before the next; one run
// in such a spell carried 16 Mbit/s).
func TestTunnelAggregation(t *testing.T) {
	rates := []uint64{300e6, 100e6}
	l := labtest.Up(t, kit.ParallelLinks("agg",
		topo.Shape{Rate: rates[0], Delay: 5 * time.Millisecond}, topo.Shape{Rate: rates[1], Delay: 5 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const dur = 5 * time.Second
	sum := 0.0
	for i, lk := range l.Links() {
		addr := serve(t, l.Host("b"), pickFamily(lk.Spec.B.Addrs, 4))
		res, err := traffic.Bulk(ctx, l.Host("a").Dial, addr, traffic.BulkOptions{Duration: dur})
		if err != nil {
			t.Fatalf("path %d alone: %v", i+1, err)
		}
		t.Logf("path %d alone (%d Mbit/s), no tunnel: %.1f Mbit/s", i+1, rates[i]/1e6, res.Steady/1e6)
		sum += res.Steady
	}
	eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
		for i := range o.Uplinks {
			o.Uplinks[i].Capacity = rates[i]
			o.Peers[0].Paths[i].Capacity = rates[i]
		}
	})
	waitUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	labtest.Measure(t, func(run int) []string {
		res, err := traffic.Bulk(ctx, eps[0].host.Dial, addr, traffic.BulkOptions{Duration: dur})
		if err != nil {
			t.Fatalf("through the tunnel: %v", err)
		}
		ratio := res.Steady / sum
		t.Logf("run %d: tunnel over both paths %.1f Mbit/s, %.3f of the sum of the paths alone (%.1f Mbit/s); %d retransmits", run, res.Steady/1e6, ratio, sum/1e6, res.Retransmits)
		if ratio < 0.9 {
			return []string{fmt.Sprintf("one TCP flow through the tunnel: %.3f of the sum of the paths alone, want at least 0.9", ratio)}
		}
		return nil
	})
	// The data went over both paths in about the ratio of their rates (0.75 and 0.25).
	checkDataSpread(t, eps, 0.15)
}

// With unequal delays (10 and 60 ms one way, 50 Mbit/s each, capacities configured), one TCP
// flow through the tunnel is faster than the fast path alone with cubic (Linux's default
// congestion control) and no slower with bbr, each set on the sending socket: the queue
// planner sends on the slow path only what arrives no later than by the fast one, so neither
// sees a fast-path packet held behind a slow one. The path alone is measured in the same lab
// (plain TCP, no tunnel); each figure is the median of three 4 s flows, measured up to three
// times (labtest.Measure): in a CI run on a quiet commit, with 35 % of the CPU stolen at the
// time, cubic's flows carried 59, 45 and 40 Mbit/s and bbr's 36, 24 and 20.
//
// Measured when the test was written: path alone 47 Mbit/s; cubic 77.3 and 73.1 (medians of
// two executions), bbr 44.8 in every run. Before the planner (capacity-proportional split,
// the reorder buffer holding the fast path's packets behind the slow one's): cubic 6.7 and
// 12.8; bbr stuck at 1.4-2.3 Mbit/s in 10 of 16 runs, its minimum RTT the fast path's 20 ms
// while its packets took 120 ms. bbr does not aggregate the two: its window, two minimum RTTs
// of its bandwidth estimate, never holds the 45 ms of queue on the fast path after which the
// slow path delivers in time (docs/scheduling.md, "Unequal paths").
func TestTunnelUnequalDelayCC(t *testing.T) {
	const rate = 50e6
	l := labtest.Up(t, kit.ParallelLinks("unequal",
		topo.Shape{Rate: rate, Delay: 10 * time.Millisecond}, topo.Shape{Rate: rate, Delay: 60 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lk := l.Links()[0]
	res, err := traffic.Bulk(ctx, ccDial(l.Host("a"), "cubic"), serve(t, l.Host("b"), pickFamily(lk.Spec.B.Addrs, 4)),
		traffic.BulkOptions{Duration: 4 * time.Second})
	if err != nil {
		t.Fatalf("fast path alone: %v", err)
	}
	alone := res.Goodput
	t.Logf("fast path alone, no tunnel (cubic): %.1f Mbit/s", alone/1e6)
	eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
		for i := range o.Uplinks {
			o.Peers[0].Paths[i].Capacity = rate
		}
	})
	waitUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	for _, c := range []struct {
		cc  string
		min float64 // of the fast path alone
	}{{"cubic", 1.3}, {"bbr", 0.9}} {
		labtest.Measure(t, func(try int) []string {
			var goodput []float64
			for run := 1; run <= 3; run++ {
				res, err := traffic.Bulk(ctx, ccDial(eps[0].host, c.cc), addr, traffic.BulkOptions{Duration: 4 * time.Second})
				if err != nil {
					t.Fatalf("%s run %d: %v", c.cc, run, err)
				}
				t.Logf("%s measurement %d, run %d: %.1f Mbit/s, %d retransmits", c.cc, try, run, res.Goodput/1e6, res.Retransmits)
				goodput = append(goodput, res.Goodput)
			}
			m := median(goodput)
			t.Logf("%s measurement %d: median %.1f Mbit/s, %.2f of the fast path alone", c.cc, try, m/1e6, m/alone)
			if m < c.min*alone {
				return []string{fmt.Sprintf("%s through the tunnel: median %.1f Mbit/s, %.2f of the fast path alone (%.1f), want at least %.1f", c.cc, m/1e6, m/alone, alone/1e6, c.min)}
			}
			return nil
		})
	}
}

// ccDial dials from h with congestion control cc set on the socket.
func ccDial(h *lab.Host, cc string) traffic.DialFunc { return traffic.CCDial(h.Dial, cc) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// meshUplinks are site a's two uplinks in TestTunnelPacingSharedUplink.
var meshUplinks = []struct {
	name     string
	addr     string
	rate     uint64
	delay    time.Duration
	hop      string // the router's end
	remote   string // b's address and interface on its side
	remoteIf string
}{
	{"fibre", "10.10.1.1", 30e6, 2 * time.Millisecond, "10.10.1.254", "10.20.1.2", "fibre"},
	{"lte", "10.10.2.1", 15e6, 2 * time.Millisecond, "10.10.2.254", "10.20.2.2", "dsl"},
}

// meshTopology is the four-path mesh of internal/config/testdata/site-a.toml in the lab, at half
// its rates: site a has two uplinks (fibre 30 Mbit/s, lte 15 Mbit/s) to a router r, site b two fast ones
// (fibre, dsl), and every uplink of a reaches every address of b, so a's tunnel has four
// paths, two on each uplink. Each site routes the other's addresses over both uplinks; the
// tunnel's sockets are bound to their interfaces, so each leaves by its own. The uplinks'
// delays are equal (2 ms one way) so that the test is about pacing: with lte at 10 ms one TCP
// flow got only 0.47 of the sum, with no retransmission (the tunnel's trouble with unequal
// delays, issue 16; TestTunnelUnequalDelayReorder). Half the site file's rates: at 60 + 30
// Mbit/s the flow through two tunnels and four emulated hops failed the 0.75 bound in 2 of 20
// runs with a busy loop on one core, and in 5 of 20 of one spell with nothing else running
// (1 of 110 at other times; this virtual machine's steal time reaches 30 % at times, which
// the test now logs); at 30 + 15 none of 26 with the busy loop did (lowest 0.82), and a run with
// 30 % stolen got 0.78.
func meshTopology() *topo.Topology {
	pf := netip.MustParsePrefix
	tp := &topo.Topology{Name: "mesh", Hosts: []topo.Host{{Name: "a"}, {Name: "r", Forward: true}, {Name: "b"}}}
	for i, u := range meshUplinks {
		s := topo.Shape{Rate: u.rate, Delay: u.delay}
		tp.Links = append(tp.Links,
			topo.Link{Name: "a-" + u.name, AB: s, BA: s,
				A: topo.Endpoint{Host: "a", Ifname: u.name, Addrs: []netip.Prefix{pf(u.addr + "/24")}},
				B: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf(u.hop + "/24")}}},
			topo.Link{Name: "b-" + u.remoteIf, AB: topo.Shape{Delay: time.Millisecond}, BA: topo.Shape{Delay: time.Millisecond},
				A: topo.Endpoint{Host: "b", Ifname: u.remoteIf, Addrs: []netip.Prefix{pf(u.remote + "/24")}},
				B: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.20.%d.254/24", i+1))}}})
		tp.Hosts[0].Routes = append(tp.Hosts[0].Routes, topo.Route{Dst: pf("10.20.0.0/16"), Via: netip.MustParseAddr(u.hop), Metric: 10 * (i + 1)})
		tp.Hosts[2].Routes = append(tp.Hosts[2].Routes, topo.Route{Dst: pf("10.10.0.0/16"), Via: netip.MustParseAddr(fmt.Sprintf("10.20.%d.254", i+1)), Metric: 10 * (i + 1)})
	}
	return tp
}

// startMeshTunnel runs a tunnel in h whose uplinks are bound to their interfaces (ifs[i] for
// locals[i]), until the test ends.
func startMeshTunnel(t *testing.T, h *lab.Host, inner netip.Prefix, locals []netip.Addr, ifs []string, o tunnel.Options) *tunnel.Tunnel {
	t.Helper()
	var closers []func() error
	cleanup := func() {
		for _, c := range closers {
			c()
		}
	}
	for i, a := range locals {
		var c *sock.Conn
		if err := h.NS.Do(func() (err error) {
			if c, err = sock.Listen(netip.AddrPortFrom(a, roles.TunnelPort), ifs[i]); err == nil {
				c.EnableGRO()
			}
			return err
		}); err != nil {
			cleanup()
			t.Fatal(err)
		}
		closers = append(closers, c.Close)
		o.Uplinks[i].Conn = c
	}
	var dev *tun.Device
	if err := h.NS.Do(func() (err error) { dev, err = tun.OpenOffload("braid0"); return err }); err != nil {
		cleanup()
		t.Fatal(err)
	}
	closers = append(closers, dev.Close)
	o.Device, o.MTU = dev, 1400
	if err := tun.Configure(h.NS.Netlink(), "braid0", o.MTU, []netip.Prefix{inner}); err != nil {
		cleanup()
		t.Fatal(err)
	}
	tn, err := tunnel.New(o)
	if err != nil {
		cleanup()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tn.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tunnel in %s: %v", h.Name, err)
		}
	})
	return tn
}

// uplinkRates returns, per uplink of a (meshUplinks order), the bits of data packets (IP
// bytes, with the outer IP and UDP headers) its paths sent between two statuses.
func uplinkBits(before, after tunnel.Status) []float64 {
	out := make([]float64, len(meshUplinks))
	for k, p := range after.Peers[0].Paths {
		q := before.Peers[0].Paths[k]
		for j, u := range meshUplinks {
			if p.Uplink == u.name {
				out[j] += float64(p.TxDataBytes-q.TxDataBytes+28*(p.TxDataPackets-q.TxDataPackets)) * 8
			}
		}
	}
	return out
}

// In the four-path mesh (two uplinks at site a, two addresses at site b), each of a's uplinks
// is paced at its own capacity, not at the sum of its two paths' (twice as much): UDP offered
// at 1.5 times the sum of the uplinks leaves each uplink at no more than its capacity (5 %
// above for timing) with under 3 % dropped in the uplink's queue (measured 0-1 %; 36 % with
// a token bucket per path only), and the two together reach at
// least 0.9 of the sum. Then one TCP flow gets at least 0.75 of the sum of the capacities
// (at most about 0.9 is reachable: TCP payload over 1400-byte inner packets in 1500-byte outer
// ones; the fibre uplink alone is 0.6 of it).
func TestTunnelPacingSharedUplink(t *testing.T) {
	l := labtest.Up(t, meshTopology())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ka, _ := session.GenerateKey()
	kb, _ := session.GenerateKey()
	innerA, innerB := netip.MustParseAddr("10.255.0.1"), netip.MustParseAddr("10.255.0.2")
	var oa, ob tunnel.Options
	oa = tunnel.Options{PrivateKey: ka, Reorder: true}
	ob = tunnel.Options{PrivateKey: kb, Reorder: true}
	pa := tunnel.PeerConfig{Name: "b", PublicKey: kb.Public(), Routes: []netip.Prefix{netip.PrefixFrom(innerB, 32)}}
	pb := tunnel.PeerConfig{Name: "a", PublicKey: ka.Public(), Routes: []netip.Prefix{netip.PrefixFrom(innerA, 32)}}
	var localsA, localsB []netip.Addr
	var ifsA, ifsB []string
	sum := 0.0
	for _, u := range meshUplinks {
		oa.Uplinks = append(oa.Uplinks, tunnel.Uplink{Name: u.name, Capacity: u.rate})
		ob.Uplinks = append(ob.Uplinks, tunnel.Uplink{Name: u.remoteIf})
		localsA, localsB = append(localsA, netip.MustParseAddr(u.addr)), append(localsB, netip.MustParseAddr(u.remote))
		ifsA, ifsB = append(ifsA, u.name), append(ifsB, u.remoteIf)
		sum += float64(u.rate)
	}
	for _, u := range meshUplinks {
		for _, v := range meshUplinks {
			// As the site file gives it: each path has its uplink's capacity.
			pa.Paths = append(pa.Paths, tunnel.PathConfig{Uplink: u.name, Capacity: u.rate,
				Remote: netip.AddrPortFrom(netip.MustParseAddr(v.remote), roles.TunnelPort)})
			pb.Paths = append(pb.Paths, tunnel.PathConfig{Uplink: u.remoteIf,
				Remote: netip.AddrPortFrom(netip.MustParseAddr(v.addr), roles.TunnelPort)})
		}
	}
	oa.Peers, ob.Peers = []tunnel.PeerConfig{pa}, []tunnel.PeerConfig{pb}
	ta := startMeshTunnel(t, l.Host("a"), netip.PrefixFrom(innerA, 24), localsA, ifsA, oa)
	tb := startMeshTunnel(t, l.Host("b"), netip.PrefixFrom(innerB, 24), localsB, ifsB, ob)
	for _, tn := range []*tunnel.Tunnel{ta, tb} {
		if err := roles.WaitTunnel(ctx, tn, 10*time.Second); err != nil {
			t.Fatalf("mesh tunnel: %v; %+v", err, tn.Status())
		}
	}
	addr := serve(t, l.Host("b"), innerB)

	// UDP above the sum: the pacer, not the uplinks' queues, holds the excess back.
	links := []*lab.Link{l.Link("a-fibre"), l.Link("a-lte")}
	var dropsBefore, pktsBefore [2]uint64
	for j, lk := range links {
		dropsBefore[j], pktsBefore[j] = lk.Stats(0).DropQueue, lk.Stats(0).Packets
	}
	before, start := ta.Status(), time.Now()
	u, err := traffic.UDP(ctx, l.Host("a").Dial, addr, traffic.UDPOptions{Rate: uint64(1.5 * sum), Size: 1300, Duration: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	after, elapsed := ta.Status(), time.Since(start)
	bits := uplinkBits(before, after)
	total := 0.0
	for j, m := range meshUplinks {
		rate := bits[j] / elapsed.Seconds()
		total += rate
		drops, pkts := links[j].Stats(0).DropQueue-dropsBefore[j], links[j].Stats(0).Packets-pktsBefore[j]
		t.Logf("UDP at %.0f Mbit/s: uplink %s (%d Mbit/s) sent %.1f Mbit/s (%.3f of its capacity); its queue dropped %d of %d packets", 1.5*sum/1e6, m.name, m.rate/1e6, rate/1e6, rate/float64(m.rate), drops, pkts+drops)
		if rate > 1.05*float64(m.rate) {
			t.Errorf("uplink %s sent %.1f Mbit/s, over its capacity of %d Mbit/s", m.name, rate/1e6, m.rate/1e6)
		}
		if float64(drops) > 0.03*float64(pkts+drops) {
			t.Errorf("uplink %s: its queue dropped %d of %d packets: it was fed above its capacity", m.name, drops, pkts+drops)
		}
	}
	for _, p := range after.Peers[0].Paths {
		t.Logf("path %d (%s -> %s): %d data packets", p.ID, p.Uplink, p.Remote, p.TxDataPackets-before.Peers[0].Paths[p.ID-1].TxDataPackets)
	}
	t.Logf("UDP: uplinks together %.1f Mbit/s, %.3f of the sum of their capacities; %v", total/1e6, total/sum, u)
	if total < 0.9*sum {
		t.Errorf("UDP above capacity: the uplinks together sent %.1f Mbit/s, want at least 0.9 of %.0f", total/1e6, sum/1e6)
	}

	// One TCP flow reaches the sum. The flow is bbr (the host's default), whose window can
	// fall short of its round trip through the tunnel, 4-5 times the paths' minimum
	// (docs/scheduling.md, "bbr in the four-path mesh"), and a host whose hypervisor takes
	// the CPU lengthens that round trip: in one CI run, with 22 % of the CPU stolen, the flow carried 0.52 of the sum. So a
	// flow that misses the bound is measured again, up to three in all, each logged with the
	// host's CPU shares; the test fails when all three miss.
	labtest.Measure(t, func(try int) []string {
		before, start := ta.Status(), time.Now()
		res, err := traffic.Bulk(ctx, l.Host("a").Dial, addr, traffic.BulkOptions{Duration: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		bits, elapsed := uplinkBits(before, ta.Status()), time.Since(start)
		for j, m := range meshUplinks {
			t.Logf("TCP flow %d: uplink %s sent %.1f Mbit/s (%.3f of its capacity)", try, m.name, bits[j]/elapsed.Seconds()/1e6, bits[j]/elapsed.Seconds()/float64(m.rate))
		}
		t.Logf("TCP flow %d through the mesh: %.1f Mbit/s, %.3f of the sum of the uplinks' capacities; %d retransmits", try, res.Steady/1e6, res.Steady/sum, res.Retransmits)
		if res.Steady >= 0.75*sum {
			return nil
		}
		for _, x := range res.Samples {
			t.Logf("TCP flow %d, second %v: %.1f Mbit/s", try, x.At, x.BitsPerSecond/1e6)
		}
		return []string{fmt.Sprintf("one TCP flow through the four-path mesh: %.1f Mbit/s, %.3f of the sum of the uplinks (%.0f Mbit/s), want at least 0.75", res.Steady/1e6, res.Steady/sum, sum/1e6)}
	})
}
