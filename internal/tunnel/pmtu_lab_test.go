package tunnel_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tun"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// Path 1 crosses a router whose far link has an MTU of 1400 (and drops larger packets with DF
// set); path 2 is a plain 1500-byte link. The tunnel finds each path's MTU by probing, lowers
// its own MTU to what path 1 carries (the TUN device follows), and large inner packets then
// cross intact on both paths.
func TestTunnelPathMTU(t *testing.T) {
	shape := topo.Shape{Rate: 100e6, Delay: 2 * time.Millisecond}
	l := labtest.Up(t, &topo.Topology{Name: "pmtu",
		Hosts: []topo.Host{
			{Name: "a", Routes: []topo.Route{{Dst: pf("10.7.2.0/24"), Via: ad("10.7.0.254")}}},
			{Name: "r", Forward: true},
			{Name: "b", Routes: []topo.Route{{Dst: pf("10.7.0.0/24"), Via: ad("10.7.2.254")}}},
		},
		Links: []topo.Link{
			{A: topo.Endpoint{Host: "a", Addrs: []netip.Prefix{pf("10.7.0.1/24")}}, B: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf("10.7.0.254/24")}}, AB: shape, BA: shape},
			{A: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf("10.7.2.254/24")}}, B: topo.Endpoint{Host: "b", Addrs: []netip.Prefix{pf("10.7.2.2/24")}}, AB: shape, BA: shape, MTU: 1400},
			{A: topo.Endpoint{Host: "a", Addrs: []netip.Prefix{pf("10.7.1.1/24")}}, B: topo.Endpoint{Host: "b", Addrs: []netip.Prefix{pf("10.7.1.2/24")}}, AB: shape, BA: shape},
		}})
	ka, _ := session.GenerateKey()
	kb, _ := session.GenerateKey()
	start := func(name string, priv session.PrivateKey, peer session.PublicKey, inner, remote string, locals []netip.Addr, remotes []string) *tunnel.Tunnel {
		h := l.Host(name)
		pc := tunnel.PeerConfig{Name: "peer", PublicKey: peer, Routes: []netip.Prefix{pf(remote + "/32")}}
		for i, a := range locals {
			pc.Paths = append(pc.Paths, tunnel.PathConfig{Uplink: a.String(), Remote: ap(remotes[i])})
		}
		tn, stop, err := roles.StartTunnel(context.Background(), h, []netip.Prefix{pf(inner + "/24")}, locals,
			tunnel.Options{PrivateKey: priv, MTU: 1400, Reorder: true, Peers: []tunnel.PeerConfig{pc}},
			func(o *tunnel.Options) {
				for i := range o.Uplinks {
					o.Uplinks[i].MTU = 1500
				}
				o.SetMTU = func(m int) error { return tun.SetMTU(h.NS.Netlink(), "braid0", m) }
			})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("tunnel in %s: %v", name, err)
			}
		})
		return tn
	}
	ta := start("a", ka, kb.Public(), "10.255.0.1", "10.255.0.2", []netip.Addr{ad("10.7.0.1"), ad("10.7.1.1")},
		[]string{"10.7.2.2:4754", "10.7.1.2:4754"})
	start("b", kb, ka.Public(), "10.255.0.2", "10.255.0.1", []netip.Addr{ad("10.7.2.2"), ad("10.7.1.2")},
		[]string{"10.7.0.1:4754", "10.7.1.1:4754"})

	// Path 1 carries at most 1400 bytes: the tunnel MTU becomes 1400 - 28 - 44 = 1328 (the
	// search stops within 8 bytes of the real value).
	want := 1400 - 28 - tunnel.Overhead
	deadline := time.Now().Add(15 * time.Second)
	var st tunnel.Status
	for time.Now().Before(deadline) {
		st = ta.Status()
		if st.MTU <= want && len(st.Peers) == 1 && !st.Peers[0].Paths[0].MTUSearching && !st.Peers[0].Paths[1].MTUSearching {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.MTU > want || st.MTU < want-8 {
		t.Fatalf("tunnel MTU %d, want %d (within 8 below): %+v", st.MTU, want, st.Peers)
	}
	p1, p2 := st.Peers[0].Paths[0], st.Peers[0].Paths[1]
	if p1.MTU > 1400 || p1.MTU < 1392 || p2.MTU != 1500 {
		t.Fatalf("path MTUs %d and %d, want about 1400 and 1500", p1.MTU, p2.MTU)
	}
	link, err := l.Host("a").NS.Netlink().LinkByName("braid0")
	if err != nil {
		t.Fatal(err)
	}
	if got := link.Attrs().MTU; got != st.MTU {
		t.Fatalf("braid0 MTU %d, tunnel MTU %d", got, st.MTU)
	}
	t.Logf("path MTUs %d and %d, tunnel MTU %d", p1.MTU, p2.MTU, st.MTU)

	// Full-size TCP segments and UDP datagrams cross on both paths, intact.
	addr := serve(t, l.Host("b"), ad("10.255.0.2"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := traffic.File(ctx, l.Host("a").Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: 11})
	if err != nil || !f.Intact {
		t.Fatalf("file through the tunnel: %v %v", err, f)
	}
	echoed, corrupt, err := kit.UDPIntegrity(ctx, l.Host("a"), l.Host("b"), ad("10.255.0.2"), 400, st.MTU-28)
	if err != nil || corrupt != 0 || echoed < 390 {
		t.Fatalf("UDP of %d bytes: %d of 400 echoed, %d corrupt, %v", st.MTU-28, echoed, corrupt, err)
	}
	st = ta.Status()
	for _, pa := range st.Peers[0].Paths {
		if pa.TxPackets < 1000 {
			t.Errorf("path %d sent %d packets: the transfer did not use it", pa.ID, pa.TxPackets)
		}
	}
	if n := st.Counters["drop_too_big"]; n > 100 {
		t.Errorf("%d packets too big for the tunnel", n)
	}
}
