package mapserver

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Vectors captured from OpenOverlayRouter (internal/wire/lisp tests, docs/lisp.md).
const (
	v1Register = "30000101ad67a76f40a6650c000100146d697637dc15ae8e41edec2b605edadf1cee31430000000a0218100000000001c0a865000132ff00000500010a630b020132ff00000500010a630c02"
	v2Notify   = "40000001ad67a76f40a6650c000100146c513107b17de228b3e4cf7a4d2ef4e9ea61f16f0000000a0218100000000001c0a865000132ff00000100010a630b020132ff00000100010a630c02"
	v3ECM      = "800000004500003c00024000ff112f49c0a8650ac0a8660a10f610f60028bafa10000001ebea337b5b30e8cb0001c0a8650a00010a630c0200200001c0a8660a"
	v7Register = "38000101b882faec1c0a6db100010014240be655c1432132b7394eb7b3404594bef56870000005a00218100000000001c0a867000132ff00000500010a6302020132ff00000500010a630203"
	v7Notify   = "40000001b882faec1c0a6db10001001489860e467e5666940fdd014b598fcc0ba6fa0e7e000005a00218100000000001c0a867000132ff00000100010a6302020132ff00000100010a630203"
	v9SHA256   = "30000101ad67a76f40a6650c000200201d8bce101f42bd4e55d86ee4ca477addce73dafcbf41b56c3b503fbee516eff70000000a0218100000000001c0a865000132ff00000500010a630b020132ff00000500010a630c02"
)

var (
	t0   = time.Unix(1_700_000_000, 0)
	etr1 = netip.MustParseAddrPort("10.99.11.2:4342")
	itr  = netip.MustParseAddrPort("10.99.12.2:4342")
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func testServer(t *testing.T, mod ...func(*Config)) *Server {
	cfg := Defaults()
	cfg.Sites = []Site{
		{Name: "x1", Keys: map[uint8][]byte{0: []byte("secret-x1")}, Prefixes: []netip.Prefix{pfx("192.168.101.0/24"), pfx("fd01::/48")}},
		{Name: "x2", Keys: map[uint8][]byte{0: []byte("secret-x2")}, Prefixes: []netip.Prefix{pfx("192.168.102.0/24")}},
		{Name: "x3", Keys: map[uint8][]byte{0: []byte("secret-x3"), 7: []byte("rollover")}, Prefixes: []netip.Prefix{pfx("192.168.103.0/24")}},
	}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ecmRequest builds an ECM Map-Request for eid from the ITR at itr.
func ecmRequest(t testing.TB, eid netip.Addr, bits int, nonce uint64, from netip.AddrPort) []byte {
	req := lisp.MapRequest{Nonce: nonce, SourceEID: lisp.AddrFrom(from.Addr()), ITRRLOCs: []lisp.Addr{lisp.AddrFrom(from.Addr())},
		Records: []lisp.RequestRecord{{MaskLen: uint8(bits), EID: lisp.AddrFrom(eid)}}}
	src := netip.AddrPortFrom(from.Addr(), from.Port())
	dst := netip.AddrPortFrom(eid, lisp.ControlPort)
	if eid.Is4() != src.Addr().Is4() {
		t.Fatal("test builds same-family ECMs only")
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: src, Dst: dst, TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	e.Encode(b)
	return b
}

func replyOf(t *testing.T, out []Packet, to netip.AddrPort) lisp.MapReply {
	t.Helper()
	if len(out) != 1 || out[0].To != to {
		t.Fatalf("sent %+v, want one packet to %v", out, to)
	}
	var r lisp.MapReply
	if _, err := r.Decode(out[0].Data); err != nil {
		t.Fatalf("reply: %v", err)
	}
	return r
}

// TestRegisterAsOOR: the capture of an OOR xTR registering is accepted and answered with the
// Map-Notify OOR's map-server sent, byte for byte.
func TestMapserverRegisterAsOOR(t *testing.T) {
	for _, tt := range []struct{ reg, notify string }{{v1Register, v2Notify}, {v7Register, v7Notify}} {
		s := testServer(t)
		out := s.Handle(t0, etr1, unhex(t, tt.reg), nil)
		if len(out) != 1 || out[0].To != etr1 || !bytes.Equal(out[0].Data, unhex(t, tt.notify)) {
			t.Fatalf("notify %+v\nwant %s", out, tt.notify)
		}
		regs := s.Registrations(t0)
		if len(regs) != 1 || len(regs[0].Locators) != 2 || regs[0].ETR != etr1.String() {
			t.Fatalf("registrations %+v", regs)
		}
	}
}

func TestMapserverSHA256AndTruncated(t *testing.T) {
	s := testServer(t)
	if out := s.Handle(t0, etr1, unhex(t, v9SHA256), nil); len(out) != 1 {
		t.Fatalf("SHA-256 register not answered: %v", s.Counters())
	}
	var nt lisp.MapRegister
	if _, err := nt.Decode(s.Handle(t0, etr1, signed(t, 1, lisp.AlgHMACSHA1, 12, "secret-x1", 0, "192.168.101.0/24"), nil)[0].Data); err != nil || len(nt.AuthData) != 12 {
		t.Fatalf("notify for a 12-byte register: %v %+v", err, nt)
	}
	if err := lisp.Verify(mustEncode(&nt), []byte("secret-x1")); err != nil {
		t.Fatalf("notify does not verify: %v", err)
	}
	// Key ID 7 selects the second key of site x3.
	if out := s.Handle(t0, etr1, signed(t, 2, lisp.AlgHMACSHA256, 32, "rollover", 7, "192.168.103.0/24"), nil); len(out) != 1 {
		t.Fatalf("key 7 refused: %v", s.Counters())
	}
}

func mustEncode(m *lisp.MapRegister) []byte {
	b := make([]byte, m.Len())
	m.Encode(b)
	return b
}

// signed builds a Map-Register (want-notify) of prefixes to RLOC 10.99.11.2.
func signed(t testing.TB, nonce uint64, alg uint8, authLen int, key string, keyID uint8, prefixes ...string) []byte {
	m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: nonce, KeyID: keyID, AlgID: alg, AuthData: make([]byte, authLen)}
	for _, p := range prefixes {
		pp := pfx(p)
		m.Records = append(m.Records, lisp.Record{TTL: 10, MaskLen: uint8(pp.Bits()), Authoritative: true, EID: lisp.AddrFrom(pp.Addr()),
			Locators: []lisp.Locator{{Priority: 1, Weight: 50, MPriority: 255, Flags: lisp.LocLocal | lisp.LocReachable, Addr: lisp.AddrFrom(etr1.Addr())}}})
	}
	b := mustEncode(&m)
	if key != "" {
		if err := lisp.Sign(b, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestBadInput: every kind of bad message is dropped, counted with its reason, and leaves the
// registration table as it was.
func TestMapserverBadInput(t *testing.T) {
	good := unhex(t, v1Register)
	for _, tt := range []struct {
		name   string
		msg    []byte
		reason string
	}{
		{"wrong key", signed(t, 5, lisp.AlgHMACSHA1, 20, "guess", 0, "192.168.101.0/24"), DropBadAuth},
		{"no authentication", signed(t, 5, lisp.AlgNone, 0, "", 0, "192.168.101.0/24"), DropNoAuth},
		{"unknown algorithm", func() []byte {
			b := signed(t, 5, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24")
			b[13] = 9
			return b
		}(), DropAuthAlgorithm},
		{"digest of a wrong length", signed(t, 5, lisp.AlgHMACSHA1, 16, "", 0, "192.168.101.0/24"), DropAuthAlgorithm},
		{"unknown key id", signed(t, 5, lisp.AlgHMACSHA1, 20, "secret-x1", 3, "192.168.101.0/24"), DropUnknownKeyID},
		{"another site's prefix", signed(t, 5, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24", "192.168.102.0/24"), DropNotOwned},
		{"prefix wider than the site's", signed(t, 5, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24", "192.168.0.0/16"), DropNotOwned},
		{"prefix of no site", signed(t, 5, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "10.0.0.0/8"), DropUnknownSite},
		{"replayed nonce", good, DropReplay},
		{"truncated", good[:40], DropTruncated},
		{"flipped bit", func() []byte { b := bytes.Clone(good); b[len(b)-1] ^= 1; return b }(), DropBadAuth},
		{"unknown AFI", func() []byte { b := bytes.Clone(good); b[len(b)-5] = 9; return b }(), DropUnknownAFI},
		{"unknown type", []byte{0x70, 0, 0, 0}, DropUnknownType},
		{"empty", nil, DropUnknownType},
		{"plain map-request", unhex(t, v3ECM)[32:], DropNotEncapsulated},
		{"ecm truncated", unhex(t, v3ECM)[:30], DropTruncated},
		{"ecm with a reply inside", func() []byte { b := bytes.Clone(unhex(t, v3ECM)); b[32] = 0x20; return b }(), DropUnknownType},
		{"map-reply to a server", unhex(t, "2000000155548a581b0aae8e0000000f0009300000000001c0000000"), DropUnsolicitedReply},
		{"oversized garbage", bytes.Repeat([]byte{0x30}, 65000), DropUnknownAFI},
		{"oversized announced auth", append(bytes.Clone(good[:14]), 0xff, 0xff), DropTruncated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := testServer(t)
			if out := s.Handle(t0, etr1, good, nil); len(out) != 1 {
				t.Fatal("good registration refused")
			}
			before := s.Registrations(t0)
			c0 := s.Counters()
			if out := s.Handle(t0.Add(time.Second), etr1, tt.msg, nil); len(out) != 0 {
				t.Fatalf("answered: %+v", out)
			}
			c1 := s.Counters()
			if c1[tt.reason] != c0[tt.reason]+1 {
				t.Fatalf("counter %s: %d -> %d; all %v", tt.reason, c0[tt.reason], c1[tt.reason], c1)
			}
			if after := s.Registrations(t0); !reflect.DeepEqual(before, after) {
				t.Fatalf("registrations changed:\n%+v\n%+v", before, after)
			}
		})
	}
}

func TestMapserverRateLimit(t *testing.T) {
	s := testServer(t, func(c *Config) { c.RatePerSource, c.BurstPerSource = 10, 20 })
	req := ecmRequest(t, netip.MustParseAddr("192.0.2.1"), 32, 1, itr)
	answered := 0
	for range 1000 {
		answered += len(s.Handle(t0, itr, req, nil))
	}
	if answered != 20 || s.Counters()[DropRateLimited] != 980 {
		t.Fatalf("flood: %d answered, %d limited", answered, s.Counters()[DropRateLimited])
	}
	// Another source is not affected, and the flooder gets tokens back with time.
	if len(s.Handle(t0, netip.MustParseAddrPort("10.99.21.2:4342"), req, nil)) != 1 {
		t.Fatal("other source limited")
	}
	if len(s.Handle(t0.Add(200*time.Millisecond), itr, req, nil)) != 1 {
		t.Fatal("no refill")
	}
}

func TestMapserverNegativeReplies(t *testing.T) {
	s := testServer(t)
	// Space no site holds: the widest prefix around it that overlaps no site (docs/lisp.md V5).
	r := replyOf(t, s.Handle(t0, itr, ecmRequest(t, netip.MustParseAddr("192.0.2.1"), 32, 0x55548a581b0aae8e, itr), nil), itr)
	want := lisp.MapReply{Nonce: 0x55548a581b0aae8e, Records: []lisp.Record{{TTL: 15, MaskLen: 9, Action: lisp.ActNativelyForward, Authoritative: true, EID: lisp.AddrFrom(netip.MustParseAddr("192.0.0.0"))}}}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("negative reply %+v", r)
	}
	if got := hex.EncodeToString(mustReply(&r)); got != "2000000155548a581b0aae8e0000000f0009300000000001c0000000" {
		t.Fatalf("wire %s", got)
	}
	// A configured site that has not registered: the queried EID, for a minute (V6).
	r = replyOf(t, s.Handle(t0, itr, ecmRequest(t, netip.MustParseAddr("192.168.103.5"), 32, 2, itr), nil), itr)
	if rec := r.Records[0]; rec.TTL != 1 || rec.MaskLen != 32 || len(rec.Locators) != 0 || rec.Action != lisp.ActNativelyForward || !rec.Authoritative {
		t.Fatalf("unregistered: %+v", rec)
	}
	// IPv6.
	i6 := netip.MustParseAddrPort("[2001:db8::2]:40000")
	r = replyOf(t, s.Handle(t0, i6, ecmRequest(t, netip.MustParseAddr("fd01:1::1"), 128, 3, i6), nil), i6)
	if rec := r.Records[0]; rec.MaskLen != 32 || rec.EID.IP != netip.MustParseAddr("fd01:1::") {
		t.Fatalf("IPv6 negative %+v", rec)
	}
	if s.Counters()[CountNegative] != 3 {
		t.Fatal("negative replies not counted")
	}
}

func mustReply(r *lisp.MapReply) []byte {
	b := make([]byte, r.Len())
	r.Encode(b)
	return b
}

func TestMapserverForwardAndProxyReply(t *testing.T) {
	s := testServer(t)
	s.Handle(t0, etr1, unhex(t, v1Register), nil)
	ecm := unhex(t, v3ECM)
	// 192.168.101.10 is registered without proxy reply: the ECM goes to the ETR as it came.
	req := ecmRequest(t, netip.MustParseAddr("192.168.101.10"), 32, 9, itr)
	out := s.Handle(t0, itr, req, nil)
	if len(out) != 1 || out[0].To != etr1 || !bytes.Equal(out[0].Data, req) {
		t.Fatalf("forward %+v", out)
	}
	// V7 asks for proxy replies: the server answers with the registered locators, A=0.
	s.Handle(t0, netip.MustParseAddrPort("10.99.2.2:4342"), unhex(t, v7Register), nil)
	r := replyOf(t, s.Handle(t0, itr, ecmRequest(t, netip.MustParseAddr("192.168.103.77"), 32, 10, itr), nil), itr)
	rec := r.Records[0]
	if r.Nonce != 10 || rec.Authoritative || rec.MaskLen != 24 || rec.TTL != 1440 || len(rec.Locators) != 2 ||
		rec.Locators[0].Addr.IP != netip.MustParseAddr("10.99.2.2") || rec.Locators[0].Flags != lisp.LocReachable {
		t.Fatalf("proxy reply %+v", r)
	}
	// The V3 capture asks for 192.168.102.10 (site x2, not registered): negative, TTL 1.
	r = replyOf(t, s.Handle(t0, itr, ecm, nil), itr)
	if r.Nonce != 0xebea337b5b30e8cb || r.Records[0].TTL != 1 {
		t.Fatalf("V3 reply %+v", r)
	}
}

func TestMapserverExpiryAndDeregistration(t *testing.T) {
	s := testServer(t, func(c *Config) { c.RegistrationTimeout = time.Minute })
	s.Handle(t0, etr1, unhex(t, v1Register), nil)
	s.Expire(t0.Add(59 * time.Second))
	if len(s.Registrations(t0)) != 1 {
		t.Fatal("expired early")
	}
	s.Expire(t0.Add(61 * time.Second))
	if len(s.Registrations(t0)) != 0 || s.Counters()[CountExpired] != 1 {
		t.Fatal("not expired")
	}
	// The nonce is still remembered within the replay window.
	s.Handle(t0.Add(62*time.Second), etr1, unhex(t, v1Register), nil)
	if s.Counters()[DropReplay] != 1 {
		t.Fatal("replay within the window accepted")
	}
	s.Handle(t0, etr1, signed(t, 77, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24"), nil)
	b := signed(t, 78, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24")
	var m lisp.MapRegister
	m.Decode(b)
	m.Records[0].TTL = 0
	b = mustEncode(&m)
	lisp.Sign(b, []byte("secret-x1"))
	s.Handle(t0, etr1, b, nil)
	if len(s.Registrations(t0)) != 0 || s.Counters()[CountDeregistered] != 1 {

		t.Fatal("TTL 0 did not deregister")
	}
}

func TestMapserverResolverOnlyForwards(t *testing.T) {
	ms := netip.MustParseAddrPort("10.0.9.9:4342")
	s := testServer(t, func(c *Config) { c.MapServer = false; c.Sites = nil; c.Forward = []netip.AddrPort{ms} })
	req := ecmRequest(t, netip.MustParseAddr("192.168.101.1"), 32, 1, itr)
	out := s.Handle(t0, itr, req, nil)
	if len(out) != 1 || out[0].To != ms || !bytes.Equal(out[0].Data, req) {
		t.Fatalf("%+v", out)
	}
	if out := s.Handle(t0, etr1, unhex(t, v1Register), nil); len(out) != 0 || s.Counters()[DropRoleDisabled] != 1 {
		t.Fatal("resolver took a registration")
	}
}

// TestServeUDP runs the server on a loopback socket.
func TestMapserverServeUDP(t *testing.T) {
	s := testServer(t)
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, conn) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c, err := net.DialUDP("udp", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	me := c.LocalAddr().(*net.UDPAddr).AddrPort()
	c.Write(ecmRequest(t, netip.MustParseAddr("192.0.2.1"), 32, 42, me))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var r lisp.MapReply
	if _, err := r.Decode(buf[:n]); err != nil || r.Nonce != 42 || r.Records[0].MaskLen != 9 {
		t.Fatalf("%v %+v", err, r)
	}
}

func FuzzMapserverHandle(f *testing.F) {
	f.Add(unhex(f, v1Register))
	f.Add(unhex(f, v3ECM))
	f.Add(unhex(f, v7Register))
	f.Add(ecmRequest(f, netip.MustParseAddr("192.168.101.1"), 32, 1, itr))
	// A signed proxy-reply registration of site x1 whose locator is a raw (non-instance-ID)
	// LCAF, the kind the codec leaves pointing into the input.
	lcaf := lisp.MapRegister{Flags: lisp.RegProxyReply, Nonce: 77, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: []lisp.Record{{TTL: 10, MaskLen: 24,
		EID: lisp.AddrFrom(netip.MustParseAddr("192.168.101.0")), Locators: []lisp.Locator{lcafLocator([]byte{0, 1, 10, 99, 11, 2})}}}}
	lcafReg := mustEncode(&lcaf)
	lisp.Sign(lcafReg, []byte("secret-x1"))
	f.Add(lcafReg)
	query := ecmRequest(f, netip.MustParseAddr("192.168.101.1"), 32, 1, itr)
	f.Fuzz(func(t *testing.T, b []byte) {
		s := testServer(t, func(c *Config) { c.RatePerSource = 0; c.RatePerDestination = 0 })
		// One receive buffer for every datagram, as Serve reads them.
		buf := make([]byte, 65536)
		handle := func(d []byte) []Packet {
			n := copy(buf, d)
			return s.Handle(t0, etr1, buf[:n], nil)
		}
		answer := func() []byte {
			out := handle(query)
			if len(out) != 1 {
				t.Fatalf("query answered with %d packets", len(out))
			}
			return out[0].Data
		}
		handle(lcafReg)
		handle(unhex(t, v7Register))
		before, reply := s.Registrations(t0), answer()
		out := handle(b)
		sent := make([][]byte, len(out))
		for i, p := range out {
			if !p.To.IsValid() || len(p.Data) == 0 {
				t.Fatalf("bad packet %+v", p)
			}
			sent[i] = bytes.Clone(p.Data)
		}
		// The next datagram overwrites the buffer: nothing sent or stored may change with it.
		for i := range buf {
			buf[i] = ^buf[i]
		}
		for i, p := range out {
			if !bytes.Equal(p.Data, sent[i]) {
				t.Fatalf("packet %d to %v aliases the receive buffer", i, p.To)
			}
		}
		// Only a correctly signed registration can change the table; the fuzzer cannot sign.
		after := s.Registrations(t0)
		if !reflect.DeepEqual(before, after) {
			if len(out) == 0 && !bytes.Equal(b, lcafReg) {
				t.Fatalf("table changed without a notify")
			}
			return
		}
		if got := answer(); !bytes.Equal(got, reply) {
			t.Fatalf("the proxy reply changed with the receive buffer:\n% x\nwant\n% x", got, reply)
		}
	})
}

// BenchmarkMapserverRequest is the map server's own cost of answering one ECM Map-Request
// from 10 000 registered prefixes (proxy replies), without sockets.
func BenchmarkMapserverRequest(b *testing.B) {
	cfg := Defaults()
	cfg.RatePerSource, cfg.RatePerDestination = 0, 0
	site := Site{Name: "s", Keys: map[uint8][]byte{0: []byte("k")}, ProxyReply: true}
	var recs []lisp.Record
	for n := range 10000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24)
		site.Prefixes = append(site.Prefixes, p)
		recs = append(recs, lisp.Record{TTL: 10, MaskLen: 24, EID: lisp.AddrFrom(p.Addr()), Locators: []lisp.Locator{
			{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("172.16.0.1"))},
			{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("172.16.0.2"))}}})
	}
	cfg.Sites = []Site{site}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; len(recs) > 0; i++ {
		k := min(len(recs), 200)
		m := lisp.MapRegister{Nonce: uint64(i + 1), AlgID: lisp.AlgHMACSHA1, AuthData: make([]byte, 20), Records: recs[:k]}
		buf := mustEncode(&m)
		lisp.Sign(buf, []byte("k"))
		s.Handle(t0, etr1, buf, nil)
		recs = recs[k:]
	}
	if n := len(s.Registrations(t0)); n != 10000 {
		b.Fatalf("%d registered", n)
	}
	reqs := make([][]byte, 256)
	for i := range reqs {
		reqs[i] = ecmRequest(b, netip.AddrFrom4([4]byte{10, byte(i * 37 >> 8), byte(i * 37), 9}), 32, uint64(i), itr)
	}
	var out []Packet
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out = s.Handle(t0, itr, reqs[i%len(reqs)], out[:0])
		if len(out) != 1 {
			b.Fatal("no reply")
		}
	}
}
