package tunnel_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

const shardSites = 4

// hubShardsTopology: a hub and shardSites sites, each joined to it by two kernel veths (site i:
// 10.i.1.2 to the hub's 10.i.1.1, 10.i.2.2 to 10.i.2.1): the test is about the hub's readers,
// not rates.
func hubShardsTopology() *topo.Topology {
	tp := &topo.Topology{Name: "hubshards", Hosts: []topo.Host{{Name: "hub"}}}
	for i := 1; i <= shardSites; i++ {
		s := fmt.Sprintf("s%d", i)
		tp.Hosts = append(tp.Hosts, topo.Host{Name: s})
		for j := 1; j <= 2; j++ {
			tp.Links = append(tp.Links, topo.Link{Name: fmt.Sprintf("%s-hub-%d", s, j), Kernel: true,
				A: topo.Endpoint{Host: s, Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.%d.2/24", i, j))}},
				B: topo.Endpoint{Host: "hub", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.%d.%d.1/24", i, j))}}})
		}
	}
	return tp
}

// A hub whose uplinks are groups of two sockets, each read by its own goroutine (issue 21
// item 4), carries four sites at once, each over two paths: the peers are spread over both
// sockets, both read, every site's file arrives intact, and a sequence-numbered UDP stream
// from each site arrives in order (out of order only as far as the hub's reorder buffer
// counts late packets, which it had before sharding too).
func TestTunnelHubShards(t *testing.T) {
	const shards = 2
	l := labtest.Up(t, hubShardsTopology())
	kh, _ := session.GenerateKey()
	hubInner := ad("10.255.0.1")
	var hubUplinks []netip.Addr
	var hubPeers []tunnel.PeerConfig
	keys := make([]session.PrivateKey, shardSites+1)
	for i := 1; i <= shardSites; i++ {
		keys[i], _ = session.GenerateKey()
		a, b := ad(fmt.Sprintf("10.%d.1.1", i)), ad(fmt.Sprintf("10.%d.2.1", i))
		hubUplinks = append(hubUplinks, a, b)
		hubPeers = append(hubPeers, tunnel.PeerConfig{Name: fmt.Sprintf("s%d", i), PublicKey: keys[i].Public(),
			Routes: []netip.Prefix{netip.PrefixFrom(ad(fmt.Sprintf("10.255.0.%d", 10+i)), 32)},
			Paths: []tunnel.PathConfig{
				{Uplink: a.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.1.2", i)), roles.TunnelPort)},
				{Uplink: b.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.2.2", i)), roles.TunnelPort)}}})
	}
	start := func(host string, o tunnel.Options, inner netip.Addr, locals []netip.Addr) *tunnel.Tunnel {
		o.MTU, o.Reorder, o.Recovery = 1400, true, true
		tn, stop, err := roles.StartTunnel(context.Background(), l.Host(host), []netip.Prefix{netip.PrefixFrom(inner, 24)}, locals, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("tunnel in %s: %v", host, err)
			}
		})
		return tn
	}
	hub := start("hub", tunnel.Options{PrivateKey: kh, Peers: hubPeers, Shards: shards}, hubInner, hubUplinks)
	addr := serve(t, l.Host("hub"), hubInner)
	sites := make([]*tunnel.Tunnel, shardSites+1)
	for i := 1; i <= shardSites; i++ {
		u1, u2 := ad(fmt.Sprintf("10.%d.1.2", i)), ad(fmt.Sprintf("10.%d.2.2", i))
		peer := tunnel.PeerConfig{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{netip.PrefixFrom(hubInner, 32)},
			Paths: []tunnel.PathConfig{
				{Uplink: u1.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.1.1", i)), roles.TunnelPort)},
				{Uplink: u2.String(), Remote: netip.AddrPortFrom(ad(fmt.Sprintf("10.%d.2.1", i)), roles.TunnelPort)}}}
		sites[i] = start(fmt.Sprintf("s%d", i), tunnel.Options{PrivateKey: keys[i], Peers: []tunnel.PeerConfig{peer}},
			ad(fmt.Sprintf("10.255.0.%d", 10+i)), []netip.Addr{u1, u2})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i <= shardSites; i++ {
		if err := roles.WaitTunnel(ctx, sites[i], 10*time.Second); err != nil {
			t.Fatalf("site %d: %v", i, err)
		}
	}
	perShard := map[int]int{}
	for _, p := range hub.Status().Peers {
		if p.Shard < 0 || p.Shard >= shards {
			t.Fatalf("peer %s has shard %d, want 0..%d", p.Name, p.Shard, shards-1)
		}
		perShard[p.Shard]++
	}
	if perShard[0] != shardSites/shards || perShard[1] != shardSites/shards {
		t.Errorf("the peers are not spread evenly over the shards: %v", perShard)
	}
	readsOf := func() [][]uint64 {
		var r [][]uint64
		for _, u := range hub.Status().Uplinks {
			r = append(r, u.ShardReads)
		}
		return r
	}
	before := readsOf()

	// The UDP receiver at the hub: per site, datagrams received and those behind one already
	// received.
	const datagrams = 3000
	pc, err := l.Host("hub").ListenPacket("udp", netip.AddrPortFrom(hubInner, 5301).String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var got, behind [shardSites + 1]int
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		last := [shardSites + 1]int64{}
		for i := range last {
			last[i] = -1
		}
		b := make([]byte, 2048)
		for {
			pc.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, _, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			if n < 5 || b[0] < 1 || int(b[0]) > shardSites {
				continue
			}
			s, seq := int(b[0]), int64(binary.BigEndian.Uint32(b[1:5]))
			got[s]++
			if seq < last[s] {
				behind[s]++
			} else {
				last[s] = seq
			}
		}
	}()

	var wg sync.WaitGroup
	errs := make([]error, shardSites+1)
	for i := 1; i <= shardSites; i++ {
		wg.Go(func() {
			f, err := traffic.File(ctx, l.Host(fmt.Sprintf("s%d", i)).Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: uint64(i)})
			if err == nil && !f.Intact {
				err = fmt.Errorf("file corrupt: %v", f)
			}
			errs[i] = err
		})
		wg.Go(func() {
			c, err := l.Host(fmt.Sprintf("s%d", i)).Dial(ctx, "udp", netip.AddrPortFrom(hubInner, 5301).String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			b := make([]byte, 1000)
			b[0] = byte(i)
			for seq := range datagrams {
				binary.BigEndian.PutUint32(b[1:5], uint32(seq))
				c.Write(b)
				if seq%10 == 9 {
					time.Sleep(5 * time.Millisecond) // some 2000 datagrams/s per site
				}
			}
		})
	}
	wg.Wait()
	<-recvDone
	for i := 1; i <= shardSites; i++ {
		if errs[i] != nil {
			t.Errorf("site %d: %v", i, errs[i])
		}
	}
	after := readsOf()
	late := map[string]uint64{}
	for _, p := range hub.Status().Peers {
		if p.Reorder != nil {
			late[p.Name] = p.Reorder.Late
		}
	}
	for i := 1; i <= shardSites; i++ {
		name := fmt.Sprintf("s%d", i)
		t.Logf("%s: %d of %d datagrams, %d out of order; the hub's reorder buffer counted %d late", name, got[i], datagrams, behind[i], late[name])
		if got[i] < datagrams*9/10 {
			t.Errorf("%s: only %d of %d datagrams arrived", name, got[i], datagrams)
		}
		if uint64(behind[i]) > late[name] {
			t.Errorf("%s: %d datagrams arrived out of order, more than the %d the reorder buffer let through late", name, behind[i], late[name])
		}
	}
	// Every uplink carries one site's path, so each reads on its peer's shard alone; over all
	// uplinks, both shards read the data.
	var total [shards]uint64
	for k := range after {
		if len(after[k]) != shards || len(before[k]) != shards {
			t.Fatalf("uplink %d reports %d shard counters, want %d", k, len(after[k]), shards)
		}
		for s := range shards {
			total[s] += after[k][s] - before[k][s]
		}
	}
	t.Logf("reads per shard during the transfer: %v", total)
	for s := range shards {
		if total[s] < 1000 {
			t.Errorf("shard %d read %d times during the transfer: the sites did not spread over the shards", s, total[s])
		}
	}
}
