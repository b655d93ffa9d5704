package tunnel_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"

	"github.com/vishvananda/netlink"
)

// runTunnel starts a tunnel in host h (roles.StartTunnel) until the test ends.
func runTunnel(t *testing.T, h *lab.Host, priv session.PrivateKey, inner netip.Prefix, locals []netip.Addr, peers []tunnel.PeerConfig) *tunnel.Tunnel {
	t.Helper()
	tn, stop, err := roles.StartTunnel(context.Background(), h, []netip.Prefix{inner}, locals,
		tunnel.Options{PrivateKey: priv, Reorder: true, Peers: peers})
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

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func pf(s string) netip.Prefix   { return netip.MustParsePrefix(s) }
func ad(s string) netip.Addr     { return netip.MustParseAddr(s) }

// One hub serves two sites, each with its own key and paths: both reach it, and neither can
// send as the other.
func TestTunnelHub(t *testing.T) {
	shape := topo.Shape{Rate: 50e6, Delay: 3 * time.Millisecond}
	l := labtest.Up(t, &topo.Topology{Name: "hub", Hosts: []topo.Host{{Name: "hub"}, {Name: "s1"}, {Name: "s2"}},
		Links: []topo.Link{
			{A: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("10.8.1.1/24")}}, B: topo.Endpoint{Host: "s1", Addrs: []netip.Prefix{pf("10.8.1.2/24")}}, AB: shape, BA: shape},
			{A: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("10.8.2.1/24")}}, B: topo.Endpoint{Host: "s1", Addrs: []netip.Prefix{pf("10.8.2.2/24")}}, AB: shape, BA: shape},
			{A: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("10.8.3.1/24")}}, B: topo.Endpoint{Host: "s2", Addrs: []netip.Prefix{pf("10.8.3.2/24")}}, AB: shape, BA: shape},
		}})
	kh, _ := session.GenerateKey()
	k1, _ := session.GenerateKey()
	k2, _ := session.GenerateKey()
	hub := runTunnel(t, l.Host("hub"), kh, pf("10.255.0.1/24"), []netip.Addr{ad("10.8.1.1"), ad("10.8.2.1"), ad("10.8.3.1")}, []tunnel.PeerConfig{
		{Name: "s1", PublicKey: k1.Public(), Routes: []netip.Prefix{pf("10.255.0.11/32")}, Paths: []tunnel.PathConfig{
			{Uplink: "10.8.1.1", Remote: ap("10.8.1.2:4754")}, {Uplink: "10.8.2.1", Remote: ap("10.8.2.2:4754")}}},
		{Name: "s2", PublicKey: k2.Public(), Routes: []netip.Prefix{pf("10.255.0.12/32")}, Paths: []tunnel.PathConfig{
			{Uplink: "10.8.3.1", Remote: ap("10.8.3.2:4754")}}},
	})
	toHub := func(k session.PrivateKey, paths ...tunnel.PathConfig) []tunnel.PeerConfig {
		return []tunnel.PeerConfig{{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{pf("10.255.0.1/32")}, Paths: paths}}
	}
	runTunnel(t, l.Host("s1"), k1, pf("10.255.0.11/24"), []netip.Addr{ad("10.8.1.2"), ad("10.8.2.2")}, toHub(k1,
		tunnel.PathConfig{Uplink: "10.8.1.2", Remote: ap("10.8.1.1:4754")}, tunnel.PathConfig{Uplink: "10.8.2.2", Remote: ap("10.8.2.1:4754")}))
	runTunnel(t, l.Host("s2"), k2, pf("10.255.0.12/24"), []netip.Addr{ad("10.8.3.2")}, toHub(k2,
		tunnel.PathConfig{Uplink: "10.8.3.2", Remote: ap("10.8.3.1:4754")}))

	addr := serve(t, l.Host("hub"), ad("10.255.0.1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deadline := time.Now().Add(10 * time.Second)
	for _, site := range []string{"s1", "s2"} {
		var f traffic.FileResult
		var err error
		for time.Now().Before(deadline) {
			if f, err = traffic.File(ctx, l.Host(site).Dial, addr, traffic.FileOptions{Size: 1 << 20, Seed: 5}); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || !f.Intact {
			t.Fatalf("%s to the hub: %v %v", site, err, f)
		}
	}
	st := hub.Status()
	if len(st.Peers) != 2 || !st.Peers[0].Session || !st.Peers[1].Session {
		t.Fatalf("hub sessions: %+v", st.Peers)
	}
	for _, p := range st.Peers {
		for _, pa := range p.Paths {
			if pa.RxPackets == 0 {
				t.Errorf("hub heard nothing from %s on path %d", p.Name, pa.ID)
			}
		}
	}
	// s2 pretending to be s1's address: its packets authenticate as s2, whose routes do not
	// hold 10.255.0.11, so the hub drops them.
	before := hub.Status().Counters["drop_spoofed"]
	nl := l.Host("s2").NS.Netlink()
	dev, err := nl.LinkByName("braid0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.AddrAdd(dev, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{10, 255, 0, 11}, Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	pc, err := l.Host("s2").ListenPacket("udp", "10.255.0.11:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for range 5 {
		pc.WriteTo([]byte("spoof"), net.UDPAddrFromAddrPort(ap("10.255.0.1:9")))
	}
	time.Sleep(300 * time.Millisecond)
	if hub.Status().Counters["drop_spoofed"] < before+5 {
		t.Errorf("the hub did not drop s2's packets sent from s1's address")
	}
}

// A hub sends to a site behind a slow link and to one behind a fast link at once: the slow
// site's send queue stays full, and the fast site's flow must not be held back by it (the
// device reader drops the full peer's packets instead of waiting for its queue to drain).
func TestTunnelHubSlowPeer(t *testing.T) {
	slow := topo.Shape{Rate: 200e3, Delay: 10 * time.Millisecond}
	fast := topo.Shape{Rate: 50e6, Delay: 3 * time.Millisecond}
	l := labtest.Up(t, &topo.Topology{Name: "hubslow", Hosts: []topo.Host{{Name: "hub"}, {Name: "s1"}, {Name: "s2"}},
		Links: []topo.Link{
			{A: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("10.8.1.1/24")}}, B: topo.Endpoint{Host: "s1", Addrs: []netip.Prefix{pf("10.8.1.2/24")}}, AB: slow, BA: slow},
			{A: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("10.8.3.1/24")}}, B: topo.Endpoint{Host: "s2", Addrs: []netip.Prefix{pf("10.8.3.2/24")}}, AB: fast, BA: fast},
		}})
	kh, _ := session.GenerateKey()
	k1, _ := session.GenerateKey()
	k2, _ := session.GenerateKey()
	hub := runTunnel(t, l.Host("hub"), kh, pf("10.255.0.1/24"), []netip.Addr{ad("10.8.1.1"), ad("10.8.3.1")}, []tunnel.PeerConfig{
		{Name: "s1", PublicKey: k1.Public(), Routes: []netip.Prefix{pf("10.255.0.11/32")}, Paths: []tunnel.PathConfig{
			{Uplink: "10.8.1.1", Remote: ap("10.8.1.2:4754")}}},
		{Name: "s2", PublicKey: k2.Public(), Routes: []netip.Prefix{pf("10.255.0.12/32")}, Paths: []tunnel.PathConfig{
			{Uplink: "10.8.3.1", Remote: ap("10.8.3.2:4754")}}},
	})
	toHub := func(path tunnel.PathConfig) []tunnel.PeerConfig {
		return []tunnel.PeerConfig{{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{pf("10.255.0.1/32")}, Paths: []tunnel.PathConfig{path}}}
	}
	runTunnel(t, l.Host("s1"), k1, pf("10.255.0.11/24"), []netip.Addr{ad("10.8.1.2")}, toHub(tunnel.PathConfig{Uplink: "10.8.1.2", Remote: ap("10.8.1.1:4754")}))
	runTunnel(t, l.Host("s2"), k2, pf("10.255.0.12/24"), []netip.Addr{ad("10.8.3.2")}, toHub(tunnel.PathConfig{Uplink: "10.8.3.2", Remote: ap("10.8.3.1:4754")}))
	to1, to2 := serve(t, l.Host("s1"), ad("10.255.0.11")), serve(t, l.Host("s2"), ad("10.255.0.12"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range []string{to1, to2} {
		var err error
		for time.Now().Before(deadline) {
			if _, err = traffic.File(ctx, l.Host("hub").Dial, addr, traffic.FileOptions{Size: 1 << 10, Seed: 1}); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("hub to %s: %v", addr, err)
		}
	}
	opts := traffic.BulkOptions{Duration: 8 * time.Second}
	alone, err := traffic.Bulk(ctx, l.Host("hub").Dial, to2, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Several flows to the slow site keep its queue full.
	slowCtx, stopSlow := context.WithCancel(ctx)
	defer stopSlow()
	slowDone := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := traffic.Bulk(slowCtx, l.Host("hub").Dial, to1, traffic.BulkOptions{Duration: 12 * time.Second})
			slowDone <- err
		}()
	}
	time.Sleep(2 * time.Second)
	beside, err := traffic.Bulk(ctx, l.Host("hub").Dial, to2, opts)
	if err != nil {
		t.Fatal(err)
	}
	var s1 tunnel.PeerStatus
	for _, p := range hub.Status().Peers {
		if p.Name == "s1" {
			s1 = p
		}
	}
	stopSlow()
	for range 4 {
		<-slowDone
	}
	t.Logf("hub to the fast site alone: %.1f Mbit/s; beside four flows to the slow site: %.1f Mbit/s (%.2f); slow site's queue drops %d",
		alone.Steady/1e6, beside.Steady/1e6, beside.Steady/alone.Steady, s1.SendQueueDrops)
	if beside.Steady < 0.8*alone.Steady {
		t.Errorf("the fast site's flow fell to %.2f of its rate alone beside flows to a slow site (bound 0.8)", beside.Steady/alone.Steady)
	}
}
