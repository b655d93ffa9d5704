package tunnel_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

const hubSites = 8

// hubManyTopology: a hub and hubSites sites, each with two uplinks behind NATs of its own (a
// home router keeping ports, and a carrier-grade NAT with random ports), plus an attacker x on
// a network of its own. Site i: up1 192.168.i.2 behind ni-a (outside 10.i.1.2, the hub 10.i.1.1),
// up2 192.168.(100+i).2 behind ni-b (outside 10.i.2.2, the hub 10.i.2.1). x: 100.64.99.2, the
// hub 100.64.99.1. Every link is a kernel veth: the test is about many peers, not rates.
func hubManyTopology() *topo.Topology {
	pf := netip.MustParsePrefix
	ad := netip.MustParseAddr
	tp := &topo.Topology{Name: "hubmany", Hosts: []topo.Host{{Name: "hub"},
		{Name: "x", Routes: []topo.Route{{Dst: pf("10.0.0.0/8"), Via: ad("100.64.99.1")}}}}}
	tp.Links = append(tp.Links, topo.Link{Name: "x-hub", Kernel: true,
		A: topo.Endpoint{Host: "x", Addrs: []netip.Prefix{pf("100.64.99.2/24")}},
		B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf("100.64.99.1/24")}}})
	for i := 1; i <= hubSites; i++ {
		s, na, nb := fmt.Sprintf("s%d", i), fmt.Sprintf("n%da", i), fmt.Sprintf("n%db", i)
		tp.Hosts = append(tp.Hosts,
			topo.Host{Name: s, Routes: []topo.Route{
				{Dst: pf(fmt.Sprintf("10.%d.1.0/24", i)), Via: ad(fmt.Sprintf("192.168.%d.1", i))},
				{Dst: pf(fmt.Sprintf("10.%d.2.0/24", i)), Via: ad(fmt.Sprintf("192.168.%d.1", 100+i))},
			}},
			topo.Host{Name: na, NAT: &topo.NAT{Outside: []string{"wan"}}},
			topo.Host{Name: nb, NAT: &topo.NAT{Outside: []string{"wan"}, RandomPorts: true}})
		tp.Links = append(tp.Links,
			topo.Link{Name: s + "-" + na, Kernel: true,
				A: topo.Endpoint{Host: s, Ifname: "up1", Addrs: []netip.Prefix{pf(fmt.Sprintf("192.168.%d.2/24", i))}},
				B: topo.Endpoint{Host: na, Addrs: []netip.Prefix{pf(fmt.Sprintf("192.168.%d.1/24", i))}}},
			topo.Link{Name: na + "-hub", Kernel: true,
				A: topo.Endpoint{Host: na, Ifname: "wan", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.1.2/24", i))}},
				B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.1.1/24", i))}}},
			topo.Link{Name: s + "-" + nb, Kernel: true,
				A: topo.Endpoint{Host: s, Ifname: "up2", Addrs: []netip.Prefix{pf(fmt.Sprintf("192.168.%d.2/24", 100+i))}},
				B: topo.Endpoint{Host: nb, Addrs: []netip.Prefix{pf(fmt.Sprintf("192.168.%d.1/24", 100+i))}}},
			topo.Link{Name: nb + "-hub", Kernel: true,
				A: topo.Endpoint{Host: nb, Ifname: "wan", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.2.2/24", i))}},
				B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.2.1/24", i))}}})
	}
	return tp
}

// One hub serves eight sites, each with two NAT'd uplinks, knowing each only by its key (issue
// 17 item 3): all eight send a file at once and every file arrives intact; meanwhile an
// attacker on another network replays the first site's data packets and sends tampered ones
// from its own address: they are counted as drops and move no path.
func TestTunnelHubManySites(t *testing.T) {
	l := labtest.Up(t, hubManyTopology())
	ad := netip.MustParseAddr
	kh, _ := session.GenerateKey()
	hubInner := ad("10.255.0.1")
	var hubUplinks []netip.Addr
	var hubPeers []tunnel.PeerConfig
	keys := make([]session.PrivateKey, hubSites+1)
	for i := 1; i <= hubSites; i++ {
		keys[i], _ = session.GenerateKey()
		a, b := ad(fmt.Sprintf("10.%d.1.1", i)), ad(fmt.Sprintf("10.%d.2.1", i))
		hubUplinks = append(hubUplinks, a, b)
		hubPeers = append(hubPeers, tunnel.PeerConfig{Name: fmt.Sprintf("s%d", i), PublicKey: keys[i].Public(),
			Routes: []netip.Prefix{netip.PrefixFrom(ad(fmt.Sprintf("10.255.0.%d", 10+i)), 32)},
			Paths:  []tunnel.PathConfig{{Uplink: a.String()}, {Uplink: b.String()}}})
	}
	start := func(h *lab.Host, k session.PrivateKey, inner netip.Addr, locals []netip.Addr, peers []tunnel.PeerConfig, mutate func(*tunnel.Options)) *tunnel.Tunnel {
		adjust := []func(*tunnel.Options){func(o *tunnel.Options) {
			for i := range o.Uplinks {
				o.Uplinks[i].Local = netip.AddrPortFrom(netip.MustParseAddr(o.Uplinks[i].Name), roles.TunnelPort)
			}
		}}
		if mutate != nil {
			adjust = append(adjust, mutate)
		}
		tn, stop, err := roles.StartTunnel(context.Background(), h, []netip.Prefix{netip.PrefixFrom(inner, 24)}, locals,
			tunnel.Options{PrivateKey: k, MTU: 1400, Reorder: true, Recovery: true, Peers: peers}, adjust...)
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
	hub := start(l.Host("hub"), kh, hubInner, hubUplinks, hubPeers, nil)
	addr := serve(t, l.Host("hub"), hubInner)
	var rec *recorder
	sites := make([]*tunnel.Tunnel, hubSites+1)
	for i := 1; i <= hubSites; i++ {
		u1, u2 := ad(fmt.Sprintf("192.168.%d.2", i)), ad(fmt.Sprintf("192.168.%d.2", 100+i))
		peer := tunnel.PeerConfig{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{netip.PrefixFrom(hubInner, 32)},
			Paths: []tunnel.PathConfig{
				{Uplink: u1.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.1.1", i)), roles.TunnelPort)},
				{Uplink: u2.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.2.1", i)), roles.TunnelPort)}}}
		var mutate func(*tunnel.Options)
		if i == 1 {
			mutate = func(o *tunnel.Options) {
				rec = &recorder{Conn: o.Uplinks[0].Conn}
				o.Uplinks[0].Conn = rec
			}
		}
		sites[i] = start(l.Host(fmt.Sprintf("s%d", i)), keys[i], ad(fmt.Sprintf("10.255.0.%d", 10+i)), []netip.Addr{u1, u2}, []tunnel.PeerConfig{peer}, mutate)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 1; i <= hubSites; i++ {
		if err := roles.WaitTunnel(ctx, sites[i], 10*time.Second); err != nil {
			t.Fatalf("site %d: %v", i, err)
		}
	}
	// A first exchange from site 1, whose data packets the attacker records.
	if f, err := traffic.File(ctx, l.Host("s1").Dial, addr, traffic.FileOptions{Size: 256 << 10, Seed: 1}); err != nil || !f.Intact {
		t.Fatalf("site 1 to the hub: %v %v", err, f)
	}
	remotes := func() map[string]string {
		m := map[string]string{}
		for _, p := range hub.Status().Peers {
			for _, pa := range p.Paths {
				m[fmt.Sprintf("%s/%d", p.Name, pa.ID)] = pa.Remote
			}
		}
		return m
	}
	before, beforeRemotes := hub.Status().Counters, remotes()
	if len(beforeRemotes) != 2*hubSites {
		t.Fatalf("the hub knows %d paths, want %d: %v", len(beforeRemotes), 2*hubSites, beforeRemotes)
	}

	// All sites at once, and the attacker beside them.
	var wg sync.WaitGroup
	errs := make([]error, hubSites+1)
	for i := 1; i <= hubSites; i++ {
		wg.Go(func() {
			f, err := traffic.File(ctx, l.Host(fmt.Sprintf("s%d", i)).Dial, addr, traffic.FileOptions{Size: 4 << 20, Seed: uint64(i)})
			if err == nil && !f.Intact {
				err = fmt.Errorf("file corrupt: %v", f)
			}
			errs[i] = err
		})
	}
	pc, err := l.Host("x").ListenPacket("udp", "100.64.99.2:4754")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rec.mu.Lock()
	recorded := append([][]byte(nil), rec.data...)
	rec.mu.Unlock()
	if len(recorded) == 0 {
		t.Fatal("no data packet of site 1 was recorded")
	}
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(ad("10.1.1.1"), roles.TunnelPort))
	forged := 0
	for j, d := range recorded[max(0, len(recorded)-200):] {
		pc.WriteTo(d, to) // replayed
		// Forged: a fresh counter (ahead of the replay window), which its tag does not cover.
		tampered := bytes.Clone(d)
		binary.BigEndian.PutUint64(tampered[12:20], binary.BigEndian.Uint64(tampered[12:20])+1<<20+uint64(j))
		pc.WriteTo(tampered, to)
		forged++
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	for i := 1; i <= hubSites; i++ {
		if errs[i] != nil {
			t.Errorf("site %d: %v", i, errs[i])
		}
	}
	after, afterRemotes := hub.Status().Counters, remotes()
	d := func(k string) uint64 { return after[k] - before[k] }
	t.Logf("%d sites sent 4 MiB each at once; the attacker replayed and tampered %d of site 1's packets: drop_replay_new_source %d, drop_auth_new_source %d, path_moves %d",
		hubSites, forged, d("drop_replay_new_source"), d("drop_auth_new_source"), d("path_moves"))
	if d("drop_replay_new_source") == 0 || d("drop_auth_new_source") < uint64(forged) {
		t.Errorf("the attacker's packets were not counted as drops: replayed %d, forged %d of %d", d("drop_replay_new_source"), d("drop_auth_new_source"), forged)
	}
	for k, r := range beforeRemotes {
		if afterRemotes[k] != r {
			t.Errorf("path %s moved from %s to %s", k, r, afterRemotes[k])
		}
	}
	for _, p := range hub.Status().Peers {
		var rx uint64
		for _, pa := range p.Paths {
			rx += pa.RxDataBytes
		}
		if rx < 4<<20 {
			t.Errorf("the hub counted %d data bytes from %s, less than its file", rx, p.Name)
		}
	}
}
