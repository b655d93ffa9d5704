package tunnel_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/tunnel"
	"braid/internal/tunnel/path"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// memNet is an in-memory UDP network with NATs: a datagram sent to an address reaches the
// conn bound there, from the sender's address as its NAT (if any) maps it; a datagram to a
// NAT's public address reaches the conn that mapping belongs to. Rebind gives a conn a new
// public address and forgets the old one, as a NAT whose mapping expired or was flushed.
type memNet struct {
	mu    sync.Mutex
	conns map[netip.AddrPort]*memConn
	pub   map[netip.AddrPort]netip.AddrPort // private -> public
	priv  map[netip.AddrPort]netip.AddrPort // public -> private
	// tap, when set, sees every datagram and may swallow it (return false).
	tap func(from, to netip.AddrPort, b []byte) bool
}

type memConn struct {
	n      *memNet
	addr   netip.AddrPort
	in     chan memDatagram
	closed chan struct{}
	once   sync.Once
}

type memDatagram struct {
	from netip.AddrPort
	b    []byte
}

func newMemNet() *memNet {
	return &memNet{conns: map[netip.AddrPort]*memConn{}, pub: map[netip.AddrPort]netip.AddrPort{}, priv: map[netip.AddrPort]netip.AddrPort{}}
}

func (n *memNet) listen(addr string) *memConn {
	c := &memConn{n: n, addr: netip.MustParseAddrPort(addr), in: make(chan memDatagram, 4096), closed: make(chan struct{})}
	n.mu.Lock()
	n.conns[c.addr] = c
	n.mu.Unlock()
	return c
}

// rebind puts private behind the NAT address public (from now on, and only there).
func (n *memNet) rebind(private, public string) {
	a, b := netip.MustParseAddrPort(private), netip.MustParseAddrPort(public)
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.pub[a]; ok {
		delete(n.priv, old)
	}
	n.pub[a], n.priv[b] = b, a
}

// inject delivers b to to as if from from (an attacker, or a replay).
func (n *memNet) inject(from, to netip.AddrPort, b []byte) {
	n.mu.Lock()
	c := n.conns[to]
	n.mu.Unlock()
	if c != nil {
		c.in <- memDatagram{from, bytes.Clone(b)}
	}
}

func (c *memConn) Send(b []byte, dst netip.AddrPort) error {
	n := c.n
	n.mu.Lock()
	from := c.addr
	if p, ok := n.pub[from]; ok {
		from = p
	}
	if p, ok := n.priv[dst]; ok {
		dst = p
	}
	to := n.conns[dst]
	tap := n.tap
	n.mu.Unlock()
	if tap != nil && !tap(from, dst, b) {
		return nil
	}
	if to != nil {
		select {
		case to.in <- memDatagram{from, bytes.Clone(b)}:
		default: // a full queue drops, as a socket buffer does
		}
	}
	return nil
}

func (c *memConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	select {
	case d := <-c.in:
		return copy(b, d.b), d.from, nil
	case <-c.closed:
		return 0, netip.AddrPort{}, net.ErrClosed
	}
}

func (c *memConn) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

// memDev is a TUN device fed and read through channels.
type memDev struct {
	in     chan []byte
	out    chan []byte
	closed chan struct{}
	once   sync.Once
}

func newMemDev() *memDev {
	return &memDev{in: make(chan []byte, 64), out: make(chan []byte, 1024), closed: make(chan struct{})}
}

func (d *memDev) Read(b []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(b, p), nil
	case <-d.closed:
		return 0, net.ErrClosed
	}
}

func (d *memDev) Write(b []byte) (int, error) {
	select {
	case d.out <- bytes.Clone(b):
	default:
	}
	return len(b), nil
}

func (d *memDev) Close() error { d.once.Do(func() { close(d.closed) }); return nil }

// ipv4 returns a UDP-in-IPv4 packet from src to dst carrying payload.
func ipv4(src, dst string, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	copy(b[28:], payload)
	return b
}

// roamSites is a hub that knows only the branch's key and a branch with two uplinks behind
// two NATs. The branch's inner network is 10.1.0.0/16, the hub's 10.2.0.0/16.
type roamSites struct {
	net          *memNet
	hub, branch  *tunnel.Tunnel
	hubDev, bDev *memDev
	hubAddr      netip.AddrPort
	// startBranch starts the branch (again, after stopBranch) with its key: a restarted site.
	startBranch, stopBranch func()
}

const (
	hubAddr  = "198.51.100.1:4754"
	branchA  = "192.168.1.2:4754" // behind NAT a
	branchB  = "192.168.2.2:4754" // behind NAT b
	natA     = "203.0.113.1:40001"
	natB     = "203.0.113.2:50001"
	natBNext = "203.0.113.2:50999"
)

type roamOpts struct {
	hubPeer   func(pc *tunnel.PeerConfig) // changes the hub's view of the branch
	pathCfg   path.Config
	keepalive time.Duration
}

func startRoam(t *testing.T, o roamOpts) *roamSites {
	t.Helper()
	s := &roamSites{net: newMemNet(), hubDev: newMemDev(), bDev: newMemDev(), hubAddr: netip.MustParseAddrPort(hubAddr)}
	hubKey, _ := session.GenerateKey()
	branchKey, _ := session.GenerateKey()
	s.net.rebind(branchA, natA)
	s.net.rebind(branchB, natB)
	hubPeer := tunnel.PeerConfig{Name: "branch", PublicKey: branchKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Paths: []tunnel.PathConfig{{Uplink: "pub"}}}
	if o.hubPeer != nil {
		o.hubPeer(&hubPeer)
	}
	var err error
	s.hub, err = tunnel.New(tunnel.Options{PrivateKey: hubKey, Device: s.hubDev, Path: o.pathCfg,
		Uplinks: []tunnel.Uplink{{Name: "pub", Conn: s.net.listen(hubAddr), Local: s.hubAddr}},
		Peers:   []tunnel.PeerConfig{hubPeer}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.hub.Run(ctx) })
	s.startBranch = func() {
		s.bDev = newMemDev()
		br, err := tunnel.New(tunnel.Options{PrivateKey: branchKey, Device: s.bDev, Path: o.pathCfg,
			Uplinks: []tunnel.Uplink{{Name: "a", Conn: s.net.listen(branchA)}, {Name: "b", Conn: s.net.listen(branchB)}},
			Peers: []tunnel.PeerConfig{{Name: "hub", PublicKey: hubKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")},
				Keepalive: o.keepalive,
				Paths:     []tunnel.PathConfig{{Uplink: "a", Remote: s.hubAddr}, {Uplink: "b", Remote: s.hubAddr}}}}})
		if err != nil {
			t.Fatal(err)
		}
		s.branch = br
		bctx, bcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { br.Run(bctx); close(done) }()
		s.stopBranch = func() { bcancel(); <-done }
	}
	s.startBranch()
	t.Cleanup(func() { s.stopBranch(); cancel(); wg.Wait() })
	return s
}

// waitFor polls cond for up to 3 s.
func roamWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("after 3 s: %s", what)
}

func hubPaths(s *roamSites) []tunnel.PathStatus { return s.hub.Status().Peers[0].Paths }

func remotes(ps []tunnel.PathStatus) map[string]tunnel.PathStatus {
	m := map[string]tunnel.PathStatus{}
	for _, p := range ps {
		m[p.Remote] = p
	}
	return m
}

// learnedBoth waits until the hub has learned both of the branch's paths, at want's addresses,
// and both are up, as are the branch's.
func learnedBoth(t *testing.T, s *roamSites, want ...string) {
	t.Helper()
	roamWait(t, "the hub learns the branch's paths "+want[0]+" and "+want[1], func() bool {
		m := remotes(hubPaths(s))
		for _, w := range want {
			if p, ok := m[w]; !ok || p.State != "up" {
				return false
			}
		}
		for _, p := range s.branch.Status().Peers[0].Paths {
			if p.State != "up" {
				return false
			}
		}
		return len(m) == len(want)
	})
}

// crosses sends an inner packet each way and waits for it.
func crosses(t *testing.T, s *roamSites, tag byte) {
	t.Helper()
	for _, dir := range []struct {
		from, to *memDev
		pkt      []byte
	}{
		{s.bDev, s.hubDev, ipv4("10.1.0.1", "10.2.0.1", []byte{tag, 1})},
		{s.hubDev, s.bDev, ipv4("10.2.0.1", "10.1.0.1", []byte{tag, 2})},
	} {
		dir.from.in <- dir.pkt
		timeout := time.After(2 * time.Second)
	wait:
		for {
			select {
			case got := <-dir.to.out:
				if bytes.Equal(got, dir.pkt) {
					break wait
				}
			case <-timeout:
				t.Fatalf("packet %x did not cross; counters: hub %v, branch %v", dir.pkt[28:], s.hub.Status().Counters, s.branch.Status().Counters)
			}
		}
	}
}

// A hub that knows only the branch's key learns its two NAT'd paths from its packets, and
// carries traffic both ways on them; the status says how each path was learned.
func TestRoamLearnsPaths(t *testing.T) {
	s := startRoam(t, roamOpts{})
	learnedBoth(t, s, natA, natB)
	crosses(t, s, 1)
	for _, p := range hubPaths(s) {
		if p.Origin != "learned" || p.LearnedAt == nil || p.MovedAt != nil || p.Local != hubAddr {
			t.Errorf("path %d: origin %q learned %v moved %v local %q", p.ID, p.Origin, p.LearnedAt, p.MovedAt, p.Local)
		}
	}
	ps := s.hub.Status().Peers[0]
	if !ps.LearnsPaths || ps.Protocol != int(session.Current) {
		t.Errorf("peer status: learns %v protocol %d", ps.LearnsPaths, ps.Protocol)
	}
	if c := s.hub.Status().Counters; c["paths_learned"] != 2 || c["drop_unknown_path"] != 0 {
		t.Errorf("paths_learned %d drop_unknown_path %d", c["paths_learned"], c["drop_unknown_path"])
	}
}

// A NAT that rebinds (its mapping flushed, a new public port) moves the hub's path to the
// new address on the branch's next packet: no new handshake, no path added.
func TestRoamRebindingMovesPath(t *testing.T) {
	s := startRoam(t, roamOpts{})
	learnedBoth(t, s, natA, natB)
	crosses(t, s, 1)
	hs := s.hub.Status().Counters["handshakes_done"] + s.branch.Status().Counters["handshakes_done"]
	s.net.rebind(branchB, natBNext)
	roamWait(t, "the path moves to "+natBNext, func() bool {
		_, ok := remotes(hubPaths(s))[natBNext]
		return ok
	})
	learnedBoth(t, s, natA, natBNext)
	crosses(t, s, 2)
	p := remotes(hubPaths(s))[natBNext]
	if p.MovedAt == nil || p.Moves != 1 || p.Origin != "learned" {
		t.Errorf("moved path: moved %v moves %d origin %q", p.MovedAt, p.Moves, p.Origin)
	}
	c := s.hub.Status().Counters
	if now := c["handshakes_done"] + s.branch.Status().Counters["handshakes_done"]; now != hs {
		t.Errorf("handshakes done went from %d to %d: the move needed a handshake", hs, now)
	}
	if c["path_moves"] != 1 || c["paths_learned"] != 2 {
		t.Errorf("path_moves %d paths_learned %d", c["path_moves"], c["paths_learned"])
	}
}

// A configured remote is only where the first packets go: a fixed peer behind a NAT that
// rebinds is followed the same way.
func TestRoamFixedPeerFollows(t *testing.T) {
	s := startRoam(t, roamOpts{hubPeer: func(pc *tunnel.PeerConfig) {
		pc.Paths = []tunnel.PathConfig{{Uplink: "pub", Remote: netip.MustParseAddrPort(natA)}, {Uplink: "pub", Remote: netip.MustParseAddrPort(natB)}}
	}})
	learnedBoth(t, s, natA, natB)
	s.net.rebind(branchB, natBNext)
	learnedBoth(t, s, natA, natBNext)
	crosses(t, s, 3)
	p := remotes(hubPaths(s))[natBNext]
	if p.Origin != "configured" || p.MovedAt == nil {
		t.Errorf("origin %q moved %v", p.Origin, p.MovedAt)
	}
}

// A fixed peer's initiation from an address that is none of its paths is not answered.
func TestRoamFixedPeerRefusesUnknownInitiation(t *testing.T) {
	s := startRoam(t, roamOpts{hubPeer: func(pc *tunnel.PeerConfig) {
		pc.Paths = []tunnel.PathConfig{{Uplink: "pub", Remote: netip.MustParseAddrPort("203.0.113.77:4754")}}
	}})
	roamWait(t, "initiations from unknown addresses counted", func() bool {
		return s.hub.Status().Counters["drop_unknown_path"] >= 2
	})
	if c := s.hub.Status().Counters; c["handshakes_done"] != 0 {
		t.Errorf("the hub answered: handshakes_done %d", c["handshakes_done"])
	}
}

// A replayed or forged packet from a new address moves no path and is counted as such; an
// authentic packet never delivered (held back by whoever sends it from elsewhere) moves it,
// and the branch's next packet moves it back.
func TestRoamReplayAndForgeryMoveNothing(t *testing.T) {
	s := startRoam(t, roamOpts{})
	var mu sync.Mutex
	var last, held []byte
	hold := false
	s.net.mu.Lock()
	defer func() { s.net.mu.Lock(); s.net.tap = nil; s.net.mu.Unlock() }()
	s.net.tap = func(from, to netip.AddrPort, b []byte) bool {
		if to.String() != hubAddr || len(b) < 20 || b[8] != mpath.TypeData {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		if hold && held == nil {
			held = bytes.Clone(b)
			return false
		}
		last = bytes.Clone(b)
		return true
	}
	s.net.mu.Unlock()
	learnedBoth(t, s, natA, natB)
	crosses(t, s, 1)
	mu.Lock()
	delivered := last
	mu.Unlock()
	if delivered == nil {
		t.Fatal("no data packet seen")
	}
	attacker := netip.MustParseAddrPort("203.0.113.66:6666")
	before := s.hub.Status().Counters
	s.net.inject(attacker, s.hubAddr, delivered)
	forged := bytes.Clone(delivered)
	forged[len(forged)-3] ^= 0x40
	forged[12] ^= 0x01 // a counter far ahead, not seen: the packet fails authentication, not the window
	s.net.inject(attacker, s.hubAddr, forged)
	roamWait(t, "the replay and the forgery counted", func() bool {
		c := s.hub.Status().Counters
		return c["drop_replay_new_source"] > before["drop_replay_new_source"] && c["drop_auth_new_source"] > before["drop_auth_new_source"]
	})
	time.Sleep(50 * time.Millisecond)
	if c := s.hub.Status().Counters; c["path_moves"] != 0 {
		t.Fatalf("a replayed or forged packet moved a path: path_moves %d", c["path_moves"])
	}
	if _, ok := remotes(hubPaths(s))[attacker.String()]; ok {
		t.Fatal("a path points at the attacker")
	}

	mu.Lock()
	hold = true
	mu.Unlock()
	s.bDev.in <- ipv4("10.1.0.1", "10.2.0.1", []byte{9})
	roamWait(t, "a data packet held back", func() bool { mu.Lock(); defer mu.Unlock(); return held != nil })
	s.net.inject(attacker, s.hubAddr, held)
	roamWait(t, "the held packet moves its path", func() bool { return s.hub.Status().Counters["path_moves"] == 1 })
	roamWait(t, "the branch's own packets move it back", func() bool {
		m := remotes(hubPaths(s))
		_, a := m[natA]
		_, b := m[natB]
		return a && b && s.hub.Status().Counters["path_moves"] == 2
	})
}

// A peer whose paths are learned has at most MaxPaths of them; packets on another are
// dropped and counted, and the known ones go on.
func TestRoamLearnedPathLimit(t *testing.T) {
	s := startRoam(t, roamOpts{hubPeer: func(pc *tunnel.PeerConfig) { pc.MaxPaths = 1 }})
	roamWait(t, "one path learned, the other refused", func() bool {
		c := s.hub.Status().Counters
		return c["paths_learned"] == 1 && c["drop_path_limit"] > 0
	})
	// Up at both ends: the branch sends only on a path it sees up (one run in about fifty
	// sent the first packet before its own view of the path came up: drop_no_path).
	roamWait(t, "the learned path up", func() bool {
		ps := hubPaths(s)
		if len(ps) != 1 || ps[0].State != "up" {
			return false
		}
		for _, p := range s.branch.Status().Peers[0].Paths {
			if p.State == "up" {
				return true
			}
		}
		return false
	})
	crosses(t, s, 4)
	if n := len(hubPaths(s)); n != 1 {
		t.Fatalf("%d paths, max 1", n)
	}
}

// A path whose probes are sparser than the keepalive still sends every keepalive interval.
func TestRoamKeepalive(t *testing.T) {
	s := startRoam(t, roamOpts{pathCfg: path.Config{ProbeInterval: 20 * time.Second, DownAfter: time.Minute}, keepalive: 50 * time.Millisecond})
	roamWait(t, "the handshake", func() bool { return s.branch.Status().Peers[0].Session })
	before := s.branch.Status().Counters["keepalives_sent"]
	time.Sleep(400 * time.Millisecond)
	// Two paths, one keepalive each per 50 ms: some 16 in 400 ms.
	if n := s.branch.Status().Counters["keepalives_sent"] - before; n < 6 {
		t.Fatalf("%d keepalives in 400 ms on two paths with keepalive 50ms", n)
	}
}

// Options that cannot work are refused.
func TestRoamOptionsRefused(t *testing.T) {
	k, _ := session.GenerateKey()
	n := newMemNet()
	for _, pc := range []tunnel.PeerConfig{
		{Name: "mixed", PublicKey: k.Public(), Paths: []tunnel.PathConfig{{Uplink: "u"}, {Uplink: "u", Remote: netip.MustParseAddrPort("192.0.2.1:1")}}},
		{Name: "max", PublicKey: k.Public(), MaxPaths: 255, Paths: []tunnel.PathConfig{{Uplink: "u"}}},
		{Name: "keepalive", PublicKey: k.Public(), Keepalive: -1, Paths: []tunnel.PathConfig{{Uplink: "u"}}},
	} {
		own, _ := session.GenerateKey()
		_, err := tunnel.New(tunnel.Options{PrivateKey: own, Device: newMemDev(), Uplinks: []tunnel.Uplink{{Name: "u", Conn: n.listen("192.0.2.9:1")}}, Peers: []tunnel.PeerConfig{pc}})
		if err == nil {
			t.Errorf("%s: accepted", pc.Name)
		}
	}
}

// The hub initiates rekeys too, over the paths it learned (to the NATs' addresses), and they
// go on moving with the NATs across sessions.
func TestRoamHubRekeysOverLearnedPaths(t *testing.T) {
	t.Cleanup(tunnel.SetRekeyTimers(300*time.Millisecond, 100*time.Millisecond))
	s := startRoam(t, roamOpts{})
	learnedBoth(t, s, natA, natB)
	roamWait(t, "the hub initiates a rekey", func() bool { return s.hub.Status().Counters["handshakes_sent"] >= 2 })
	s.net.rebind(branchA, "203.0.113.1:40777")
	learnedBoth(t, s, "203.0.113.1:40777", natB)
	roamWait(t, "more rekeys after the move", func() bool {
		return s.hub.Status().Counters["handshakes_done"]+s.branch.Status().Counters["handshakes_done"] >= 8
	})
	crosses(t, s, 5)
	if c := s.hub.Status().Counters; c["paths_learned"] != 2 || c["drop_handshake"] != 0 {
		t.Errorf("paths_learned %d drop_handshake %d", c["paths_learned"], c["drop_handshake"])
	}
}

// A site that restarts behind new NAT mappings (a router that rebooted) starts a new session
// from addresses the hub has not seen: the hub answers (it knows the site by its key), and its
// learned paths move to the new addresses; none is added.
func TestRoamSiteRestartsBehindNewMappings(t *testing.T) {
	s := startRoam(t, roamOpts{})
	learnedBoth(t, s, natA, natB)
	crosses(t, s, 6)
	hs := s.hub.Status().Counters["handshakes_done"]
	s.stopBranch()
	s.net.rebind(branchA, "203.0.113.1:41111")
	s.net.rebind(branchB, "203.0.113.2:52222")
	s.startBranch()
	learnedBoth(t, s, "203.0.113.1:41111", "203.0.113.2:52222")
	crosses(t, s, 7)
	c := s.hub.Status().Counters
	if c["handshakes_done"] <= hs || c["paths_learned"] != 2 || c["path_moves"] != 2 {
		t.Errorf("handshakes_done %d (was %d), paths_learned %d, path_moves %d", c["handshakes_done"], hs, c["paths_learned"], c["path_moves"])
	}
}

// At max_paths a new path of the peer is refused while the known ones live; once a learned
// path has been silent for the reuse time, the new one takes its place (a peer that numbered
// its paths anew, or lost an uplink for good, is not locked out).
func TestRoamLearnedPathReused(t *testing.T) {
	t.Cleanup(tunnel.SetReuseAfter(300 * time.Millisecond))
	s := startRoam(t, roamOpts{hubPeer: func(pc *tunnel.PeerConfig) { pc.MaxPaths = 1 }})
	var mu sync.Mutex
	cut := natB // what the tap drops on its way to the hub
	s.net.mu.Lock()
	s.net.tap = func(from, to netip.AddrPort, b []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		return from.String() != cut
	}
	s.net.mu.Unlock()
	defer func() { s.net.mu.Lock(); s.net.tap = nil; s.net.mu.Unlock() }()
	roamWait(t, "the hub learns the path through NAT a", func() bool {
		ps := hubPaths(s)
		return len(ps) == 1 && ps[0].Remote == natA && ps[0].State == "up"
	})
	mu.Lock()
	cut = natA
	mu.Unlock()
	roamWait(t, "the path through NAT b refused at max_paths", func() bool { return s.hub.Status().Counters["drop_path_limit"] > 0 })
	roamWait(t, "the silent path reused for NAT b", func() bool {
		ps := hubPaths(s)
		return len(ps) == 1 && ps[0].Remote == natB && ps[0].State == "up"
	})
	if c := s.hub.Status().Counters; c["paths_learned"] != 1 || c["path_moves"] < 1 {
		t.Errorf("paths_learned %d path_moves %d", c["paths_learned"], c["path_moves"])
	}
}
