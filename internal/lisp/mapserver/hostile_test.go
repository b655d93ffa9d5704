package mapserver

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/lisp/limit"
	"braid/internal/wire/lisp"
)

var attacker = netip.MustParseAddrPort("10.66.0.66:4342")

// TestMapserverReplayedRegisterCannotRedirect (issue 18, item 4): an attacker captures a
// site's Map-Register and replays it from its own address once the nonce has left the replay
// window. With timestamp nonces the replay is refused; with random nonces ("window") it is
// accepted, but Map-Requests still go to the locators the site signed, never to the attacker.
func TestMapserverReplayedRegisterCannotRedirect(t *testing.T) {
	eid := netip.MustParseAddr("192.168.101.10")
	for _, ts := range []bool{false, true} {
		s := testServer(t, func(c *Config) { c.Sites[0].TimestampNonces = ts })
		captured := signed(t, uint64(t0.UnixNano()), lisp.AlgHMACSHA256, 32, "secret-x1", 0, "192.168.101.0/24")
		if out := s.Handle(t0, etr1, captured, nil); len(out) != 1 {
			t.Fatalf("timestamps %v: legitimate registration refused: %v", ts, s.Counters())
		}
		// Within the window: a replay by nonce.
		s.Handle(t0.Add(time.Minute), attacker, captured, nil)
		if s.Counters()[DropReplay] != 1 {
			t.Fatalf("timestamps %v: replay within the window accepted", ts)
		}
		// Eleven minutes later the nonce is forgotten.
		later := t0.Add(11 * time.Minute)
		s.Expire(later)
		s.Handle(later, attacker, captured, nil)
		if ts && s.Counters()[DropStale] != 1 {
			t.Fatalf("timestamps on: stale replay not refused: %v", s.Counters())
		}
		req := ecmRequest(t, eid, 32, 5, itr)
		out := s.Handle(later, itr, req, nil)
		if ts {
			// The registration was refused and has expired (3 min): negative answer.
			if len(out) != 1 || out[0].To != itr {
				t.Fatalf("timestamps on: %+v", out)
			}
			continue
		}
		if len(out) != 1 || out[0].To.Addr() == attacker.Addr() {
			t.Fatalf("timestamps off: the replayed registration redirected requests to the attacker: %+v", out)
		}
		if out[0].To != netip.AddrPortFrom(etr1.Addr(), lisp.ControlPort) {
			t.Fatalf("timestamps off: forwarded to %v, want the signed locator %v", out[0].To, etr1.Addr())
		}
	}
}

// TestMapserverNonceZeroRegistrations: registrations without a Map-Notify carry nonce 0
// (RFC 9301); every refresh is taken, with timestamp nonces on too.
func TestMapserverNonceZeroRegistrations(t *testing.T) {
	s := testServer(t, func(c *Config) { c.Sites[0].TimestampNonces = true })
	m := lisp.MapRegister{AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: []lisp.Record{{TTL: 10, MaskLen: 24,
		EID: lisp.AddrFrom(netip.MustParseAddr("192.168.101.0")), Locators: []lisp.Locator{{Priority: 1, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(etr1.Addr())}}}}}
	b := mustEncode(&m)
	if err := lisp.Sign(b, []byte("secret-x1")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		s.Handle(t0.Add(time.Duration(i)*time.Minute), etr1, b, nil)
	}
	if c := s.Counters(); c[CountRegistered] != 3 || c[DropReplay] != 0 {
		t.Fatalf("nonce-0 refreshes: %v", c)
	}
}

// TestMapserverForwardOnlyToSignedLocators: a registration sent from an address that is not
// among its locators (a NAT, or an attacker replaying it) never makes the server send there.
func TestMapserverForwardOnlyToSignedLocators(t *testing.T) {
	s := testServer(t)
	loc6 := netip.MustParseAddr("2001:db8::2")
	m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: 99, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: []lisp.Record{{TTL: 10, MaskLen: 24,
		EID: lisp.AddrFrom(netip.MustParseAddr("192.168.101.0")), Locators: []lisp.Locator{
			{Priority: 1, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(loc6)},
			{Priority: 2, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.99.11.7"))},
			{Priority: 255, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.99.11.8"))}}}}}
	b := mustEncode(&m)
	lisp.Sign(b, []byte("secret-x1"))
	s.Handle(t0, attacker, b, nil)
	out := s.Handle(t0, itr, ecmRequest(t, netip.MustParseAddr("192.168.101.1"), 32, 1, itr), nil)
	if len(out) != 1 || out[0].To != netip.MustParseAddrPort("10.99.11.7:4342") {
		t.Fatalf("forwarded %+v, want the IPv4 locator of the record", out)
	}
}

// lcafLocator is a locator in an LCAF that is not an instance ID (type 1, AFI list), which the
// codec keeps as raw bytes.
func lcafLocator(payload []byte) lisp.Locator {
	return lisp.Locator{Priority: 1, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.Addr{AFI: lisp.AFILCAF, LCAFType: 1, Raw: payload}}
}

// TestMapserverLCAFLocatorCopied (issue 18, item 8): a registered locator in a raw LCAF is
// copied out of the receive buffer, which Serve reuses: a later datagram in the same buffer
// does not change what the server answers.
func TestMapserverLCAFLocatorCopied(t *testing.T) {
	s := testServer(t)
	raw := []byte{0, 1, 10, 99, 11, 2} // AFI 1, 10.99.11.2
	m := lisp.MapRegister{Flags: lisp.RegProxyReply, Nonce: 5, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: []lisp.Record{{TTL: 10, MaskLen: 24,
		EID: lisp.AddrFrom(netip.MustParseAddr("192.168.101.0")), Locators: []lisp.Locator{lcafLocator(raw)}}}}
	buf := make([]byte, 65536)
	n := m.Encode(buf)
	lisp.Sign(buf[:n], []byte("secret-x1"))
	s.Handle(t0, etr1, buf[:n], nil)
	if s.Counters()[CountRegistered] != 1 {
		t.Fatalf("not registered: %v", s.Counters())
	}
	// The next datagram overwrites the buffer, as the server's read loop does.
	for i := range buf {
		buf[i] = 0xee
	}
	r := replyOf(t, s.Handle(t0, itr, ecmRequest(t, netip.MustParseAddr("192.168.101.1"), 32, 1, itr), nil), itr)
	if got := r.Records[0].Locators[0].Addr.Raw; !bytes.Equal(got, raw) {
		t.Fatalf("the stored locator changed with the receive buffer: % x, want % x", got, raw)
	}
}

// ecmMany builds the smallest ECM Map-Request an attacker can send for n EIDs of prefix,
// with the victim as the only ITR-RLOC and no source EID.
func ecmMany(t testing.TB, prefix string, n int, victim netip.AddrPort) []byte {
	base := netip.MustParsePrefix(prefix).Addr().As4()
	req := lisp.MapRequest{Nonce: 1, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(victim.Addr())}}
	for i := range n {
		a := base
		a[3] = byte(i)
		req.Records = append(req.Records, lisp.RequestRecord{MaskLen: 32, EID: lisp.AddrFrom(netip.AddrFrom4(a))})
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: victim, Dst: netip.AddrPortFrom(netip.AddrFrom4(base), lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	e.Encode(b)
	return b
}

// TestMapserverAmplificationBounded (issue 18, item 7): a request names where its reply goes;
// the reply to the victim is at most MaxAmplification (3) times the request, and the victim
// gets at most BurstPerDestination + RatePerDestination·t replies however many sources ask.
func TestMapserverAmplificationBounded(t *testing.T) {
	victim := netip.MustParseAddrPort("10.77.0.7:4342")
	factor := func(s *Server, n int) float64 {
		req := ecmMany(t, "192.168.101.0/24", n, victim)
		out := s.Handle(t0, attacker, req, nil)
		sent := 0
		for _, p := range out {
			if p.To.Addr() != victim.Addr() {
				t.Fatalf("reply to %v", p.To)
			}
			sent += len(p.Data)
		}
		return float64(sent) / float64(len(req))
	}
	// Site x1 answers by proxy with 8 IPv4 locators.
	setup := func(amp float64) *Server {
		s := testServer(t, func(c *Config) { c.MaxAmplification = amp })
		m := lisp.MapRegister{Flags: lisp.RegProxyReply, Nonce: 3, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: []lisp.Record{{TTL: 10, MaskLen: 24,
			EID: lisp.AddrFrom(netip.MustParseAddr("192.168.101.0"))}}}
		for i := range 8 {
			m.Records[0].Locators = append(m.Records[0].Locators, lisp.Locator{Priority: 1, Weight: 1, Flags: lisp.LocReachable,
				Addr: lisp.AddrFrom(netip.AddrFrom4([4]byte{10, 99, 11, byte(i + 1)}))})
		}
		b := mustEncode(&m)
		lisp.Sign(b, []byte("secret-x1"))
		s.Handle(t0, etr1, b, nil)
		return s
	}
	for _, n := range []int{1, 16, 255} {
		before := factor(setup(0), n)
		after := factor(setup(3), n)
		t.Logf("%3d records asked: reply/request %.1fx without the bound, %.1fx with it", n, before, after)
		if after > 3 {
			t.Errorf("%d records: amplification %.1fx", n, after)
		}
	}
	// A flood toward one victim from 10 000 spoofed sources within one second.
	s := setup(3)
	req := ecmMany(t, "192.168.101.0/24", 1, victim)
	replies := 0
	for i := range 10000 {
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 88, byte(i >> 8), byte(i)}), 4342)
		replies += len(s.Handle(t0.Add(time.Duration(i)*100*time.Microsecond), from, req, nil))
	}
	t.Logf("10000 requests for one victim in 1 s: %d replies", replies)
	if replies > 200+100+1 {
		t.Errorf("%d replies to one destination in 1 s, want at most 301", replies)
	}
}

// TestMapserverLimiterSpoofedSources (issue 18, item 7): a flood from more spoofed sources than
// the limiter holds does not lock out sources: the least recently used are forgotten.
func TestMapserverLimiterSpoofedSources(t *testing.T) {
	s := testServer(t)
	legit := netip.MustParseAddrPort("10.99.12.9:4342")
	req := ecmRequest(t, netip.MustParseAddr("192.0.2.1"), 32, 1, legit)
	for i := range limit.MaxAddrs + 5000 {
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200 + byte(i>>16), byte(i >> 8), byte(i)}), 4342)
		s.Handle(t0, from, []byte{0xf0}, nil)
	}
	if out := s.Handle(t0, legit, req, nil); len(out) != 1 {
		t.Fatalf("a new source is refused after a spoofed flood: %v", s.Counters()[DropRateLimited])
	}
}

// countHandler counts log records by message.
type countHandler struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs[r.Message]++
	h.mu.Unlock()
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// TestMapserverLogsRegistrations (issue 18, item 9): accepted registrations are logged when
// new or changed (not each refresh), and authentication failures are logged, at most 10 lines a
// second in bursts of 20 however fast they come.
func TestMapserverLogsRegistrations(t *testing.T) {
	h := &countHandler{msgs: map[string]int{}}
	s := testServer(t, func(c *Config) { c.Logger = slog.New(h); c.RatePerSource = 0 })
	s.Handle(t0, etr1, signed(t, 1, lisp.AlgHMACSHA256, 32, "secret-x1", 0, "192.168.101.0/24"), nil)
	s.Handle(t0.Add(time.Minute), etr1, signed(t, 2, lisp.AlgHMACSHA256, 32, "secret-x1", 0, "192.168.101.0/24"), nil)
	if n := h.msgs["registration accepted"]; n != 1 {
		t.Fatalf("%d lines for a registration and its refresh, want 1", n)
	}
	// 10 000 forged registrations within one second.
	forged := signed(t, 3, lisp.AlgHMACSHA256, 32, "not-the-key", 0, "192.168.101.0/24")
	for i := range 10000 {
		s.Handle(t0.Add(2*time.Minute+time.Duration(i)*100*time.Microsecond), attacker, forged, nil)
	}
	n := h.msgs["map-register refused: authentication"]
	t.Logf("10000 forged registrations in 1 s: %d log lines", n)
	if n == 0 || n > 20+10+1 {
		t.Fatalf("%d log lines for 10000 authentication failures in 1 s", n)
	}
}
