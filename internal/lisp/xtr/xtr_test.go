package xtr

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

// resolverStub is a UDP socket on loopback that plays the map-resolver and map server.
type resolverStub struct {
	t    *testing.T
	conn *net.UDPConn
}

func (r *resolverStub) addr() netip.AddrPort { return r.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// request reads the next ECM Map-Request, skipping registrations.
func (r *resolverStub) request() (lisp.ECM, lisp.MapRequest) {
	r.t.Helper()
	buf := make([]byte, 2048)
	r.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := r.conn.Read(buf)
	for err == nil && lisp.Type(buf[:n]) == lisp.TypeMapRegister {
		n, err = r.conn.Read(buf)
	}
	if err != nil {
		r.t.Fatalf("no Map-Request: %v", err)
	}
	var e lisp.ECM
	off, err := e.Decode(buf[:n])
	if err != nil {
		r.t.Fatalf("not an ECM: %v", err)
	}
	var m lisp.MapRequest
	if _, err := m.Decode(buf[off:n]); err != nil {
		r.t.Fatalf("not a Map-Request: %v", err)
	}
	return e, m
}

func testXTR(t *testing.T) (*XTR, *resolverStub) {
	rc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	rs := &resolverStub{t: t, conn: rc}
	x, err := New(Options{Device: nullDevice{}, EIDs: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Uplinks: []*Uplink{{Addr: netip.MustParseAddr("127.0.0.1"), Control: uc}}, Locators: []Locator{{Priority: 1, Weight: 1}},
		Resolvers: []netip.AddrPort{rs.addr()}, MapServers: []MapServer{{Addr: rs.addr(), Key: []byte("k"), AlgID: lisp.AlgHMACSHA1}},
		RequestTimeout: time.Second, RequestRetries: 2, QueuePerEID: 4})
	if err != nil {
		t.Fatal(err)
	}
	return x, rs
}

func packetTo(t *testing.T, dst string) []byte {
	in := ipUDP(t, "192.168.1.1:1000", dst)
	buf := make([]byte, headroom+len(in))
	copy(buf[headroom:], in)
	return buf
}

func replyBytes(m *lisp.MapReply) []byte {
	b := make([]byte, m.Len())
	m.Encode(b)
	return b
}

// TestXtrMapCache walks a destination through resolution: held packets, a negative reply
// cached for its TTL, expiry, retries and giving up, then a positive reply.
func TestXtrMapCache(t *testing.T) {
	x, rs := testXTR(t)
	now := time.Now()
	for range 6 {
		p := packetTo(t, "192.168.2.5:7")
		x.encap(p, len(p)-headroom)
	}
	e, req := rs.request()
	if req.Records[0].EID.IP != netip.MustParseAddr("192.168.2.5") || req.Records[0].MaskLen != 32 ||
		req.ITRRLOCs[0].IP != netip.MustParseAddr("127.0.0.1") || e.Inner.Src.Port() != lisp.ControlPort ||
		req.SourceEID.IP != netip.MustParseAddr("192.168.1.1") {
		t.Fatalf("request %+v %+v", e, req)
	}
	c := x.Counters()
	if c[CountRequests] != 1 || c[DropQueueFull] != 2 {
		t.Fatalf("one request, 4 held, 2 over the bound: %v", c)
	}
	// A reply with another nonce is not ours.
	x.control(now, 0, rs.addr(), replyBytes(&lisp.MapReply{Nonce: req.Nonce + 1, Records: []lisp.Record{{TTL: 1}}}))
	if x.Counters()[DropUnexpected] != 1 {
		t.Fatal("reply with a wrong nonce accepted")
	}
	// Negative reply for the /16: cached for its minute, the held packets are dropped.
	neg := lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{{TTL: 1, MaskLen: 16, Action: lisp.ActNativelyForward, Authoritative: true,
		EID: lisp.AddrFrom(netip.MustParseAddr("192.168.0.0"))}}}
	x.control(now, 0, rs.addr(), replyBytes(&neg))
	st := x.Status()
	if len(st.Cache) != 1 || !st.Cache[0].Negative || st.Cache[0].Prefix != netip.MustParsePrefix("192.168.0.0/16") || st.Cache[0].Action != "natively-forward" {
		t.Fatalf("cache %+v", st.Cache)
	}
	if got := x.Counters()[DropNegative]; got != 4 {
		t.Fatalf("held packets dropped as negative: %d, want 4", got)
	}
	p := packetTo(t, "192.168.77.1:7")
	x.encap(p, len(p)-headroom)
	if x.Counters()[DropNegative] != 5 || x.Counters()[CountRequests] != 1 {
		t.Fatal("the negative entry did not cover the /16")
	}
	// Past its TTL the entry goes; the next packet asks again, and with no answer the
	// request is sent again twice (RequestRetries), then the resolution fails.
	x.tick(now.Add(61 * time.Second))
	if len(x.Status().Cache) != 0 || x.Counters()[CountCacheExpired] != 1 {
		t.Fatalf("not expired: %+v", x.Status().Cache)
	}
	x.encap(p, len(p)-headroom)
	_, r1 := rs.request()
	start := time.Now()
	x.tick(start.Add(1100 * time.Millisecond))
	_, r2 := rs.request()
	x.tick(start.Add(2200 * time.Millisecond))
	_, r3 := rs.request()
	if r1.Nonce == r2.Nonce || r2.Nonce == r3.Nonce {
		t.Fatal("retries reuse the nonce")
	}
	x.tick(start.Add(3300 * time.Millisecond))
	if c := x.Counters(); c[CountResolveFailed] != 1 || c[DropNoMapping] != 1 || len(x.Status().Cache) != 0 {
		t.Fatalf("after the retries: %v %+v", c, x.Status().Cache)
	}
	// A positive reply: priority 255 is never used, the others are.
	x.encap(p, len(p)-headroom)
	_, r4 := rs.request()
	pos := lisp.MapReply{Nonce: r4.Nonce, Records: []lisp.Record{{TTL: 10, MaskLen: 24, Authoritative: true, EID: lisp.AddrFrom(netip.MustParseAddr("192.168.77.0")),
		Locators: []lisp.Locator{
			{Priority: 255, Weight: 100, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.3.9"))},
			{Priority: 1, Weight: 10, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.3.1"))},
			{Priority: 2, Weight: 10, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.4.1"))},
		}}}}
	x.control(time.Now(), 0, rs.addr(), replyBytes(&pos))
	x.mu.RLock()
	_, ent, ok := x.cache.Lookup(netip.MustParseAddr("192.168.77.1"))
	x.mu.RUnlock()
	if !ok || ent.negative || len(ent.all) != 2 || len(ent.remote) != 1 {
		t.Fatalf("entry %+v", ent)
	}
	f, _ := parseFlow(p[headroom:])
	for sport := range uint16(200) {
		f.sport = sport
		if _, pr := x.choose(ent, &f); pr == nil || pr.remote != netip.MustParseAddr("10.0.3.1") {
			t.Fatalf("flow %d took %+v, want the priority-1 locator", sport, pr)
		}
	}
	// The priority-1 pair stops answering: the priority-2 locator takes over.
	ent.pairs[0].up.Store(false)
	if _, pr := x.choose(ent, &f); pr == nil || pr.remote != netip.MustParseAddr("10.0.4.1") {
		t.Fatalf("with 10.0.3.1 down: %+v", pr)
	}
	ent.pairs[1].up.Store(false)
	if _, pr := x.choose(ent, &f); pr != nil {
		t.Fatal("a pair chosen with every pair down")
	}
	// In use and in the last tenth of its TTL, the entry is refreshed: it stays meanwhile.
	ent.used.Store(true)
	x.tick(ent.expires.Add(-30 * time.Second))
	_, r5 := rs.request()
	if r5.Records[0].EID.IP != netip.MustParseAddr("192.168.77.0") {
		t.Fatalf("refresh asks for %v", r5.Records[0].EID.IP)
	}
	pos.Nonce = r5.Nonce
	pos.Records[0].TTL = 20
	x.control(time.Now(), 0, rs.addr(), replyBytes(&pos))
	x.mu.RLock()
	_, ent2, _ := x.cache.Lookup(netip.MustParseAddr("192.168.77.1"))
	x.mu.RUnlock()
	if ent2 == ent || ent2.ttl != 20 {
		t.Fatalf("refresh not installed: %+v", ent2)
	}
	// The ETR answers only for its own EIDs.
	own := lisp.MapRequest{Nonce: 1, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(netip.MustParseAddr("10.0.3.1"))},
		Records: []lisp.RequestRecord{{MaskLen: 32, EID: lisp.AddrFrom(netip.MustParseAddr("192.168.1.9"))}}}
	if x.answerMessage(0, &own, false) == nil {
		t.Fatal("no answer for an own EID")
	}
	own.Records[0].EID = lisp.AddrFrom(netip.MustParseAddr("192.168.2.9"))
	if x.answerMessage(0, &own, false) != nil {
		t.Fatal("answered for another site's EID")
	}
}

func TestXtrRegistration(t *testing.T) {
	x, rs := testXTR(t)
	now := time.Now()
	x.tick(now)
	buf := make([]byte, 2048)
	rs.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := rs.conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := lisp.Verify(buf[:n], []byte("k")); err != nil {
		t.Fatalf("Map-Register does not verify: %v", err)
	}
	var m lisp.MapRegister
	m.Decode(buf[:n])
	if m.Flags&lisp.RegWantNotify == 0 || len(m.Records) != 1 || m.Records[0].Locators[0].Flags != lisp.LocLocal|lisp.LocReachable {
		t.Fatalf("register %+v", m)
	}
	// The nonce is the time of sending, so that a map server can refuse a stale replay.
	if d := time.Unix(0, int64(m.Nonce)).Sub(now); d < 0 || d > time.Second {
		t.Fatalf("Map-Register nonce %#x is not the time of sending (%v away)", m.Nonce, d)
	}
	notify := func(key string) []byte {
		nt := lisp.MapRegister{Type: lisp.TypeMapNotify, Nonce: m.Nonce, AlgID: lisp.AlgHMACSHA1, AuthData: make([]byte, 20), Records: m.Records}
		b := make([]byte, nt.Len())
		nt.Encode(b)
		lisp.Sign(b, []byte(key))
		return b
	}
	x.control(now, 0, rs.addr(), notify("wrong"))
	if x.Status().Registrations[0].Registered || x.Counters()[DropNotifyAuth] != 1 {
		t.Fatal("a Map-Notify with a wrong HMAC was believed")
	}
	x.control(now, 0, rs.addr(), notify("k"))
	if !x.Status().Registrations[0].Registered {
		t.Fatal("Map-Notify not taken")
	}
}

// FuzzXtrControl feeds arbitrary datagrams to the xTR's control plane and packets to its
// flow parser: nothing panics, and without a request of its own outstanding nothing enters the
// map-cache or marks the site registered.
func FuzzXtrControl(f *testing.F) {
	f.Add(replyBytes(&lisp.MapReply{Records: []lisp.Record{{TTL: 1, MaskLen: 8, EID: lisp.AddrFrom(netip.MustParseAddr("10.0.0.0"))}}}))
	f.Add(probeMessage(1, netip.MustParseAddr("10.0.1.1"), netip.MustParsePrefix("192.168.1.0/24")))
	f.Add([]byte{0x80, 0, 0, 0, 0x45})
	f.Add([]byte{0x40, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, rs := testXTR(t)
		x.control(time.Now(), 0, rs.addr(), b)
		parseFlow(b)
		st := x.Status()
		if len(st.Cache) != 0 || st.Registrations[0].Registered {
			t.Fatalf("state changed: %+v", st)
		}
	})
}

// TestXtrPlacementUnequalSites: with one local RLOC and two remote ones (the A-MPTCP paper's
// testbed), TCP flows whose port sums differ mod 2 take the two remote RLOCs, from either side
// of the prefix order.
func TestXtrPlacementUnequalSites(t *testing.T) {
	x, _ := testXTR(t)
	x.o.Placement = true
	for _, remote := range []string{"192.168.2.0", "192.168.0.0"} { // sorts after, then before 192.168.1.0/24
		rec := lisp.Record{TTL: 10, MaskLen: 24, EID: lisp.AddrFrom(netip.MustParseAddr(remote)),
			Locators: []lisp.Locator{{Priority: 1, Weight: 1, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.3.1"))},
				{Priority: 1, Weight: 1, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.4.1"))}}}
		x.mu.Lock()
		x.installLocked(time.Now(), &rec)
		x.mu.Unlock()
		dst := netip.MustParseAddr(remote).Next()
		x.mu.RLock()
		_, e, _ := x.cache.Lookup(dst)
		for _, pr := range e.pairs {
			pr.up.Store(true)
		}
		got := map[netip.Addr]bool{}
		for sport := uint16(40000); sport < 40002; sport++ {
			f := flow{src: netip.MustParseAddr("192.168.1.1"), dst: dst, proto: 6, sport: sport, dport: 5201}
			_, pr := x.place(e, &f)
			if pr == nil {
				t.Fatalf("%s: no pair for port %d", remote, sport)
			}
			got[pr.remote] = true
		}
		x.mu.RUnlock()
		if len(got) != 2 {
			t.Errorf("%s: two residues went to %v", remote, got)
		}
	}
}
