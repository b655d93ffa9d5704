package tunnel_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// reloadSites are two sites in memory: s (10.1.0.0/16) with uplinks s1 and s2, and a peer p
// (10.2.0.0/16) with one uplink; s starts with one path to p, on s1.
type reloadSites struct {
	net        *memNet
	s, p       *tunnel.Tunnel
	sDev, pDev *memDev
	s1, s2     *memConn
	pKey       session.PrivateKey
	pAddr      netip.AddrPort
	uplinks    []tunnel.Uplink
	peerP      tunnel.PeerConfig
	pUplinks   []tunnel.Uplink   // p's
	pPeer      tunnel.PeerConfig // p's view of s
}

func startReload(t *testing.T) *reloadSites {
	t.Helper()
	r := &reloadSites{net: newMemNet(), sDev: newMemDev(), pDev: newMemDev(), pAddr: netip.MustParseAddrPort("192.0.2.9:4754")}
	sKey, _ := session.GenerateKey()
	r.pKey, _ = session.GenerateKey()
	r.s1, r.s2 = r.net.listen("192.0.2.1:4754"), r.net.listen("192.0.2.2:4754")
	r.uplinks = []tunnel.Uplink{{Name: "s1", Conn: r.s1}, {Name: "s2", Conn: r.s2}}
	r.peerP = tunnel.PeerConfig{Name: "p", PublicKey: r.pKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")},
		Paths: []tunnel.PathConfig{{Uplink: "s1", Remote: r.pAddr}}}
	var err error
	r.s, err = tunnel.New(tunnel.Options{PrivateKey: sKey, Device: r.sDev, Uplinks: r.uplinks, Peers: []tunnel.PeerConfig{r.peerP}})
	if err != nil {
		t.Fatal(err)
	}
	r.pUplinks = []tunnel.Uplink{{Name: "u", Conn: r.net.listen(r.pAddr.String())}}
	r.pPeer = tunnel.PeerConfig{Name: "s", PublicKey: sKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Paths: []tunnel.PathConfig{{Uplink: "u", Remote: netip.MustParseAddrPort("192.0.2.1:4754")}, {Uplink: "u", Remote: netip.MustParseAddrPort("192.0.2.2:4754")}}}
	r.p, err = tunnel.New(tunnel.Options{PrivateKey: r.pKey, Device: r.pDev, Uplinks: r.pUplinks, Peers: []tunnel.PeerConfig{r.pPeer}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, tn := range []*tunnel.Tunnel{r.s, r.p} {
		wg.Go(func() { tn.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// toP sends a packet from s's device to 10.2.0.1 and reports whether p's device got it.
func (r *reloadSites) toP(tag byte) bool {
	pkt := ipv4("10.1.0.1", "10.2.0.1", []byte{tag})
	r.sDev.in <- pkt
	timeout := time.After(time.Second)
	for {
		select {
		case got := <-r.pDev.out:
			if bytes.Equal(got, pkt) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

func (r *reloadSites) peerStatus(t *testing.T, name string) *tunnel.PeerStatus {
	t.Helper()
	for _, p := range r.s.Status().Peers {
		if p.Name == name {
			return &p
		}
	}
	return nil
}

// readers counts the goroutines reading an uplink, in every tunnel of the test.
func readers() int {
	buf := make([]byte, 1<<20)
	return bytes.Count(buf[:runtime.Stack(buf, true)], []byte("tunnel.(*Tunnel).readUplink("))
}

// A peer changed in place keeps its session and the paths that stay; a new path is used, a
// removed uplink's socket is closed; a refused reload changes nothing; a new key replaces the
// peer; a removed peer is no longer routed to.
func TestReloadInPlace(t *testing.T) {
	r := startReload(t)
	roamWait(t, "a session and its path up", func() bool {
		p := r.peerStatus(t, "p")
		return p != nil && p.Session && p.Paths[0].State == "up"
	})
	if !r.toP(1) {
		t.Fatalf("no packet crosses before the reload: s %v\np %v\n%+v", r.s.Status().Counters, r.p.Status().Counters, r.p.Status().Peers)
	}
	hs := r.s.Status().Counters["handshakes_done"]
	before := r.peerStatus(t, "p")

	// Another route, a second path on s2, a capacity on the first.
	pc := r.peerP
	pc.Routes = append(slices.Clone(pc.Routes), netip.MustParsePrefix("10.3.0.0/16"))
	pc.Paths = []tunnel.PathConfig{{Uplink: "s1", Remote: r.pAddr, Capacity: 50e6}, {Uplink: "s2", Remote: r.pAddr}}
	withCapacity := slices.Clone(r.uplinks)
	withCapacity[0].Capacity = 80e6
	ch, err := r.s.Reload(tunnel.Config{Uplinks: withCapacity, Peers: []tunnel.PeerConfig{pc}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ch.PeersChanged, []string{"p"}) || len(ch.PeersAdded)+len(ch.PeersRemoved)+len(ch.PeersReplaced) != 0 ||
		!slices.Equal(ch.UplinksChanged, []string{"s1"}) || len(ch.UplinksAdded)+len(ch.UplinksRemoved)+len(ch.UplinksReplaced) != 0 {
		t.Errorf("change: %v", ch)
	}
	renamed := []tunnel.Uplink{r.uplinks[0], {Name: "s2b", Conn: r.s2}}
	if _, err := r.s.Reload(tunnel.Config{Uplinks: renamed, Peers: []tunnel.PeerConfig{r.peerP}}); !errors.Is(err, tunnel.ErrReloadNeedsRestart) {
		t.Errorf("s2's socket under another name: %v, want ErrReloadNeedsRestart", err)
	}
	roamWait(t, "the new path up", func() bool {
		p := r.peerStatus(t, "p")
		return len(p.Paths) == 2 && p.Paths[1].State == "up"
	})
	after := r.peerStatus(t, "p")
	if after.SessionAge <= before.SessionAge || r.s.Status().Counters["handshakes_done"] != hs {
		t.Errorf("the session changed: age %v -> %v, handshakes %d -> %d", before.SessionAge, after.SessionAge, hs, r.s.Status().Counters["handshakes_done"])
	}
	if p0 := after.Paths[0]; p0.ID != 1 || p0.TxPackets < before.Paths[0].TxPackets || p0.Capacity != 50e6 {
		t.Errorf("the first path did not stay as it was, with its new capacity: %+v", p0)
	}
	if !r.toP(2) {
		t.Error("no packet crosses after the reload")
	}

	// Refused: a path on an uplink that does not exist. Nothing changes.
	bad := pc
	bad.Paths = append(slices.Clone(pc.Paths), tunnel.PathConfig{Uplink: "nope", Remote: r.pAddr})
	extra := tunnel.PeerConfig{Name: "q", PublicKey: r.pKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}, Paths: pc.Paths}
	if _, err := r.s.Reload(tunnel.Config{Uplinks: r.uplinks, Peers: []tunnel.PeerConfig{extra, bad}}); err == nil {
		t.Fatal("a reload with a path on an unknown uplink was accepted")
	}
	if _, err := r.s.Reload(tunnel.Config{Uplinks: r.uplinks, Peers: []tunnel.PeerConfig{pc}, Scheduler: "wrr"}); !errors.Is(err, tunnel.ErrReloadNeedsRestart) {
		t.Errorf("paced to wrr: %v, want ErrReloadNeedsRestart", err)
	}
	if st := r.s.Status(); len(st.Peers) != 1 || len(st.Peers[0].Paths) != 2 {
		t.Fatalf("a refused reload changed the peers: %+v", st.Peers)
	}

	// s2 and its path go, s3 comes with a path to p (and p, reloaded too, takes a path to
	// s3): s2's socket is closed and its reader ends, s3's reader starts.
	s3 := r.net.listen("192.0.2.3:4754")
	ups := []tunnel.Uplink{r.uplinks[0], {Name: "s3", Conn: s3}}
	pc = tunnel.PeerConfig{Name: "p", PublicKey: pc.PublicKey, Routes: pc.Routes,
		Paths: []tunnel.PathConfig{pc.Paths[0], {Uplink: "s3", Remote: r.pAddr}}}
	ch, err = r.s.Reload(tunnel.Config{Uplinks: ups, Peers: []tunnel.PeerConfig{pc}})
	if err != nil || !slices.Equal(ch.UplinksRemoved, []string{"s2"}) || !slices.Equal(ch.UplinksAdded, []string{"s3"}) {
		t.Fatalf("s2 out, s3 in: %v %v", ch, err)
	}
	pPeer := r.pPeer
	pPeer.Paths = []tunnel.PathConfig{pPeer.Paths[0], {Uplink: "u", Remote: netip.MustParseAddrPort("192.0.2.3:4754")}}
	if _, err := r.p.Reload(tunnel.Config{Uplinks: r.pUplinks, Peers: []tunnel.PeerConfig{pPeer}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.s2.closed:
	case <-time.After(time.Second):
		t.Error("the removed uplink's socket is still open")
	}
	roamWait(t, "the path on s3 up", func() bool {
		p := r.peerStatus(t, "p")
		return len(p.Paths) == 2 && p.Paths[1].Uplink == "s3" && p.Paths[1].State == "up"
	})
	if !r.toP(3) {
		t.Error("no packet crosses after s2 went and s3 came")
	}
	// Three uplinks in all (s1, s3; p's u): s2's reader has ended.
	roamWait(t, "three uplink readers", func() bool { return readers() == 3 })
	uplinks := ups

	// Another key: the peer is replaced (and, p not knowing that key, has no session).
	other, _ := session.GenerateKey()
	replaced := tunnel.PeerConfig{Name: "p", PublicKey: other.Public(), Routes: pc.Routes, Paths: pc.Paths}
	ch, err = r.s.Reload(tunnel.Config{Uplinks: uplinks, Peers: []tunnel.PeerConfig{replaced}})
	if err != nil || !slices.Equal(ch.PeersReplaced, []string{"p"}) {
		t.Fatalf("new key: %v %v", ch, err)
	}
	if p := r.peerStatus(t, "p"); p.Session {
		t.Error("a peer with a new key kept the old key's session")
	}

	// No peers: nothing is routed.
	noRoute := r.s.Status().Counters["drop_no_route"]
	if _, err := r.s.Reload(tunnel.Config{Uplinks: uplinks}); err != nil {
		t.Fatal(err)
	}
	if r.toP(4) {
		t.Error("a packet crossed to a removed peer")
	}
	if got := r.s.Status().Counters["drop_no_route"]; got != noRoute+1 {
		t.Errorf("drop_no_route %d -> %d, want one more", noRoute, got)
	}
}
