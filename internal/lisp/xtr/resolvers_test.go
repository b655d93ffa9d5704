package xtr

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

// TestResolverSetBackoff: the first resolver not resting is asked; a miss rests it 1 s, then
// 2, 4 ... up to the bound; an answer clears it; with every resolver resting, the one whose
// rest ends first is asked.
func TestResolverSetBackoff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newResolverSet(3, 5*time.Second)
	if r := s.pick(t0, 0); r != 0 {
		t.Fatalf("first pick %d, want 0", r)
	}
	if r := s.pick(t0, 1); r != 1 {
		t.Fatalf("pick after 0 was tried: %d, want 1", r)
	}
	if r := s.pick(t0, 0b111); r != 0 {
		t.Fatalf("every resolver tried: pick %d, want 0 again", r)
	}
	if !s.miss(0, t0) {
		t.Fatal("first miss did not report the resolver going down")
	}
	if r := s.pick(t0, 0); r != 1 {
		t.Fatalf("resolver 0 resting: pick %d, want 1", r)
	}
	if r := s.pick(t0.Add(time.Second), 0); r != 0 {
		t.Fatalf("after its 1 s rest: pick %d, want 0", r)
	}
	var rests []time.Duration
	for k := range 4 {
		now := t0.Add(time.Duration(k) * time.Minute)
		if s.miss(0, now) {
			t.Fatal("a resolver already down reported going down again")
		}
		rests = append(rests, s.h[0].restUntil.Sub(now))
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if rests[i] != want[i] {
			t.Fatalf("rests after misses 2..5: %v, want %v", rests, want)
		}
	}
	now := t0.Add(time.Hour)
	s.miss(0, now)
	s.miss(1, now.Add(time.Millisecond))
	s.miss(2, now.Add(2*time.Millisecond))
	if r := s.pick(now, 0); r != 1 {
		t.Fatalf("every resolver resting: pick %d, want 1 (its 1 s rest ends first)", r)
	}
	if !s.ok(0, now) || s.ok(0, now) {
		t.Fatal("ok did not report the resolver coming back exactly once")
	}
	if r := s.pick(now, 0); r != 0 {
		t.Fatalf("after an answer: pick %d, want 0", r)
	}
}

// TestXTRResolverFailover: with the first of two resolvers silent, a resolution goes to the
// second after ResolverTimeout; the next resolutions ask the second at once while the first
// rests, and the first is asked again when its rest is over.
func TestXTRResolverFailover(t *testing.T) {
	listen := func() *net.UDPConn {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	r0 := &resolverStub{t: t, conn: listen()}
	r1 := &resolverStub{t: t, conn: listen()}
	uc := listen()
	x, err := New(Options{Device: nullDevice{}, EIDs: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Uplinks: []*Uplink{{Addr: netip.MustParseAddr("127.0.0.1"), Control: uc}}, Locators: []Locator{{Priority: 1, Weight: 1}},
		Resolvers: []netip.AddrPort{r0.addr(), r1.addr()}, RequestTimeout: time.Second, RequestRetries: 3})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(dst string, r *resolverStub, nonce uint64) {
		t.Helper()
		rep := lisp.MapReply{Nonce: nonce, Records: []lisp.Record{{TTL: 10, MaskLen: 24, Authoritative: true,
			EID:      lisp.AddrFrom(netip.MustParsePrefix(dst + "/24").Masked().Addr()),
			Locators: []lisp.Locator{{Priority: 1, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.3.1"))}}}}}
		x.control(time.Now(), 0, r.addr(), replyBytes(&rep))
		x.mu.RLock()
		_, e, ok := x.cache.Lookup(netip.MustParseAddr(dst))
		x.mu.RUnlock()
		if !ok || e.pending {
			t.Fatalf("%s not resolved", dst)
		}
	}
	send := func(dst string) time.Time {
		p := packetTo(t, dst+":7")
		x.encap(p, len(p)-headroom)
		return time.Now()
	}
	start := send("192.168.2.1")
	r0.request() // r0 is asked first and stays silent
	x.tick(start.Add(100 * time.Millisecond))
	if x.Counters()[CountRequests] != 1 {
		t.Fatal("a request sent again before ResolverTimeout")
	}
	x.tick(start.Add(310 * time.Millisecond))
	_, req := r1.request()
	resolve("192.168.2.1", r1, req.Nonce)
	st := x.Status().Resolvers
	if st[0].Up || st[0].Misses != 1 || st[0].RetryIn <= 0 || !st[1].Up || st[1].LastAnswer.IsZero() {
		t.Fatalf("resolver status %+v", st)
	}
	if x.Counters()[CountResolverTimeouts] != 1 {
		t.Fatalf("timeouts %d, want 1", x.Counters()[CountResolverTimeouts])
	}
	// While r0 rests, a new destination goes straight to r1.
	send("192.168.3.1")
	_, req = r1.request()
	resolve("192.168.3.1", r1, req.Nonce)
	// Past its rest r0 is asked first again, and answering brings it back.
	x.mu.Lock()
	x.resolvers.h[0].restUntil = time.Now().Add(-time.Millisecond)
	x.mu.Unlock()
	send("192.168.4.1")
	_, req = r0.request()
	resolve("192.168.4.1", r0, req.Nonce)
	if st := x.Status().Resolvers; !st[0].Up || st[0].Misses != 0 {
		t.Fatalf("resolver 0 answered but is %+v", st[0])
	}
	// A refresh r0 leaves unanswered goes to r1 after ResolverTimeout.
	x.mu.RLock()
	x.cache.All(func(_ netip.Prefix, e *entry) bool { e.used.Store(false); return true })
	_, ent, _ := x.cache.Lookup(netip.MustParseAddr("192.168.4.1"))
	x.mu.RUnlock()
	ent.used.Store(true)
	at := ent.expires.Add(-30 * time.Second)
	x.tick(at)
	if _, req = r0.request(); req.Records[0].EID.IP != netip.MustParseAddr("192.168.4.0") {
		t.Fatalf("refresh asks r0 for %v", req.Records[0].EID.IP)
	}
	x.tick(at.Add(310 * time.Millisecond))
	_, req = r1.request()
	resolve("192.168.4.1", r1, req.Nonce)
	if st := x.Status().Resolvers; st[0].Up || !st[1].Up {
		t.Fatalf("after an unanswered refresh: %+v", st)
	}
	x.mu.Lock()
	x.resolvers.h[0] = resolverHealth{}
	x.mu.Unlock()
	// With both silent, the first round is quick, later retries keep RequestTimeout.
	start = send("192.168.5.1")
	r0.request()
	x.tick(start.Add(310 * time.Millisecond))
	r1.request()
	x.tick(start.Add(620 * time.Millisecond))
	if n := x.Counters()[CountRequests]; n != 8 {
		t.Fatalf("requests %d, want 8: the third attempt waits RequestTimeout", n)
	}
	x.tick(start.Add(1400 * time.Millisecond))
	if n := x.Counters()[CountRequests]; n != 9 {
		t.Fatalf("requests %d, want 9", n)
	}
}

// countHandler counts log records by message.
type countHandler struct{ n map[string]int }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.n[r.Message]++
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// TestXTRResolverLogsLimited: a resolver that answers one request in two (a flood, a lossy
// link) logs "did not answer" at most once in 10 s, and "answers again" only after it.
func TestXTRResolverLogsLimited(t *testing.T) {
	h := &countHandler{n: map[string]int{}}
	x, err := New(Options{Device: nullDevice{}, EIDs: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Uplinks: []*Uplink{{Addr: netip.MustParseAddr("127.0.0.1")}}, Locators: []Locator{{Priority: 1, Weight: 1}},
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("10.0.9.1:4342"), netip.MustParseAddrPort("10.0.9.5:4342")},
		Logger:    slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	e := &entry{resolver: 0}
	t0 := time.Unix(1000, 0)
	x.mu.Lock()
	for k := range 100 {
		now := t0.Add(time.Duration(k) * 100 * time.Millisecond) // 10 s of flapping
		x.resolverMissLocked(now, e)
		x.resolverOKLocked(now.Add(50*time.Millisecond), e)
	}
	x.resolverMissLocked(t0.Add(11*time.Second), e)
	x.mu.Unlock()
	down, up := h.n["map-resolver did not answer: asking the next one"], h.n["map-resolver answers again"]
	if down != 2 || up != 1 {
		t.Errorf("100 flaps in 10 s then one miss logged %d \"did not answer\" and %d \"answers again\", want 2 and 1", down, up)
	}
	if c := x.Counters()[CountResolverTimeouts]; c != 101 {
		t.Errorf("timeouts counted %d, want 101", c)
	}
}

// TestXTRReloadResolvers: a reload that changes the map-resolvers keeps the health of those
// that stay (at their new places), forgets the removed ones, and a resolution in progress at
// a removed resolver changes no one's health when it times out.
func TestXTRReloadResolvers(t *testing.T) {
	a, b, c := netip.MustParseAddrPort("10.0.9.1:4342"), netip.MustParseAddrPort("10.0.9.5:4342"), netip.MustParseAddrPort("10.0.9.9:4342")
	eids := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}
	x, err := New(Options{Device: nullDevice{}, EIDs: eids,
		Uplinks: []*Uplink{{Addr: netip.MustParseAddr("127.0.0.1")}}, Locators: []Locator{{Priority: 1, Weight: 1}},
		Resolvers: []netip.AddrPort{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	x.mu.Lock()
	x.resolvers.miss(1, now) // b rests
	pendingAtA := &entry{pending: true, resolver: 0, tried: 1}
	pendingAtB := &entry{pending: true, resolver: 1, tried: 3}
	x.cache.Insert(netip.MustParsePrefix("192.168.7.0/24"), pendingAtA)
	x.cache.Insert(netip.MustParsePrefix("192.168.8.0/24"), pendingAtB)
	x.mu.Unlock()
	if _, err := x.SetMapping(Mapping{EIDs: eids, Resolvers: []netip.AddrPort{c, b}, Locators: []Locator{{Priority: 1, Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	st := x.Status().Resolvers
	if len(st) != 2 || st[0].Address != c || !st[0].Up || st[1].Address != b || st[1].Up || st[1].Misses != 1 {
		t.Fatalf("resolvers after the reload: %+v", st)
	}
	if pendingAtA.resolver != -1 || pendingAtA.tried != 0 || pendingAtB.resolver != 1 || pendingAtB.tried != 2 {
		t.Fatalf("resolutions renumbered to %d/%b and %d/%b, want -1/0 and 1/10", pendingAtA.resolver, pendingAtA.tried, pendingAtB.resolver, pendingAtB.tried)
	}
	x.mu.Lock()
	x.resolverMissLocked(now, pendingAtA) // its resolver is gone: nothing to blame
	x.mu.Unlock()
	if st := x.Status().Resolvers; !st[0].Up || st[1].Misses != 1 {
		t.Fatalf("a timeout at a removed resolver changed %+v", st)
	}
	if _, err := x.SetMapping(Mapping{EIDs: eids, Resolvers: make([]netip.AddrPort, MaxResolvers+1), Locators: []Locator{{Priority: 1, Weight: 1}}}); err == nil {
		t.Fatal("more than MaxResolvers taken")
	}
}
