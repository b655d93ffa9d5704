package pm

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"braid/internal/lisp/xtr"
	"braid/internal/mptcp/pm/core"
	"braid/internal/wire/lisp"
)

type sent struct {
	to  netip.AddrPort
	req lisp.MapRequest
	ecm lisp.ECM
}

// testResolver is a resolver whose requests are captured instead of sent.
func testResolver(t *testing.T, o ResolverOptions) (*Resolver, *[]sent) {
	t.Helper()
	if len(o.Resolvers) == 0 {
		o.Resolvers = []netip.AddrPort{netip.MustParseAddrPort("10.0.9.1:4342"), netip.MustParseAddrPort("10.0.9.5:4342")}
	}
	r := newResolver(o)
	r.src = netip.MustParseAddrPort("192.168.1.1:40404")
	var out []sent
	r.write = func(b []byte, to netip.AddrPort) {
		var s sent
		n, err := s.ecm.Decode(b)
		if err != nil {
			t.Fatalf("request is no ECM: %v", err)
		}
		if _, err := s.req.Decode(b[n:]); err != nil {
			t.Fatalf("request is no Map-Request: %v", err)
		}
		s.to = to
		out = append(out, s)
	}
	return r, &out
}

func replyBytes(nonce uint64, prefix string, ttl uint32, locs ...lisp.Locator) []byte {
	p := netip.MustParsePrefix(prefix)
	m := lisp.MapReply{Nonce: nonce, Records: []lisp.Record{{TTL: ttl, MaskLen: uint8(p.Bits()), EID: lisp.AddrFrom(p.Addr()), Locators: locs}}}
	b := make([]byte, m.Len())
	m.Encode(b)
	return b
}

func loc(addr string, prio uint8) lisp.Locator {
	return lisp.Locator{Priority: prio, Weight: 50, MPriority: 255, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr(addr))}
}

func TestResolverCacheHonoursTTL(t *testing.T) {
	r, out := testResolver(t, ResolverOptions{MaxAge: 10 * time.Second})
	eid := netip.MustParseAddr("192.168.2.1")
	now := time.Unix(5000, 0)
	if _, s := r.MappingAt(now, eid); s != core.MapPending {
		t.Fatalf("first lookup: %v", s)
	}
	r.send(now)
	if len(*out) != 1 {
		t.Fatalf("%d requests", len(*out))
	}
	q := (*out)[0]
	if q.to != r.o.Resolvers[0] || len(q.req.Records) != 1 || q.req.Records[0].EID.IP != eid || q.req.ITRRLOCs[0].IP != r.src.Addr() ||
		q.ecm.Inner.Src != r.src || q.ecm.Inner.Dst != netip.AddrPortFrom(eid, lisp.ControlPort) {
		t.Fatalf("request %+v to %v", q.req, q.to)
	}
	// A second ask while in flight sends nothing more.
	r.MappingAt(now, eid)
	r.send(now.Add(10 * time.Millisecond))
	if len(*out) != 1 {
		t.Fatalf("duplicate request")
	}
	// A TTL of 1 minute, three locators of which one is for backup (priority 2).
	r.reply(now, replyBytes(q.req.Nonce, "192.168.2.0/24", 1, loc("10.0.3.1", 1), loc("10.0.4.1", 1), loc("10.0.5.1", 2)))
	m, s := r.MappingAt(now.Add(time.Second), netip.MustParseAddr("192.168.2.77"))
	if s != core.MapFound || m.Usable != 2 || m.Prefix != "192.168.2.0/24" {
		t.Fatalf("after the reply: %+v %v", m, s)
	}
	// Past MaxAge: still served, refreshed in the background.
	m, s = r.MappingAt(now.Add(11*time.Second), eid)
	if s != core.MapFound || m.Usable != 2 {
		t.Fatalf("stale: %+v %v", m, s)
	}
	r.send(now.Add(11 * time.Second))
	if len(*out) != 2 {
		t.Fatalf("no refresh sent")
	}
	// The refresh goes unanswered: the mapping serves until its TTL, then not.
	for i := 1; i <= 3; i++ {
		r.send(now.Add(11*time.Second + time.Duration(i)*time.Second))
	}
	if _, s := r.MappingAt(now.Add(50*time.Second), eid); s != core.MapFound {
		t.Errorf("within the TTL after a failed refresh: %v", s)
	}
	if _, s := r.MappingAt(now.Add(61*time.Second), eid); s != core.MapPending {
		t.Errorf("past the TTL: %v, want a new lookup", s)
	}
	// The new lookup's answer: the site lost an RLOC.
	r.send(now.Add(61 * time.Second))
	last := (*out)[len(*out)-1]
	r.reply(now.Add(61*time.Second), replyBytes(last.req.Nonce, "192.168.2.0/24", 1, loc("10.0.3.1", 1), loc("10.0.4.1", 255)))
	if m, s := r.MappingAt(now.Add(62*time.Second), eid); s != core.MapFound || m.Usable != 1 {
		t.Errorf("after the change: %+v %v", m, s)
	}
	c := r.Counters()
	if c.Replies != 2 || c.Timeouts != 1 || c.Cached != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestResolverFailures(t *testing.T) {
	r, out := testResolver(t, ResolverOptions{Retries: 2, RetryFailed: 5 * time.Second})
	now := time.Unix(5000, 0)
	silent := netip.MustParseAddr("192.168.7.1")
	r.MappingAt(now, silent)
	for i := range 4 {
		r.send(now.Add(time.Duration(i) * time.Second))
	}
	if len(*out) != 3 || (*out)[1].to != r.o.Resolvers[1] {
		t.Fatalf("requests %d (want 3, alternating resolvers)", len(*out))
	}
	if _, s := r.MappingAt(now.Add(4*time.Second), silent); s != core.MapNoAnswer {
		t.Errorf("silent resolvers: %v", s)
	}
	if _, s := r.MappingAt(now.Add(9*time.Second), silent); s != core.MapPending {
		t.Errorf("after the hold: %v, want a new lookup", s)
	}
	// Negative reply, and a mapping with only priority-255 locators.
	neg, none := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("192.168.8.1")
	r.MappingAt(now, neg)
	r.MappingAt(now, none)
	n0 := len(*out)
	r.send(now.Add(10 * time.Second))
	for _, q := range (*out)[n0:] {
		switch q.req.Records[0].EID.IP {
		case neg:
			r.reply(now, replyBytes(q.req.Nonce, "203.0.0.0/8", 15))
		case none:
			r.reply(now, replyBytes(q.req.Nonce, "192.168.8.0/24", 10, loc("10.0.8.1", 255)))
		}
	}
	if _, s := r.MappingAt(now.Add(11*time.Second), neg); s != core.MapNone {
		t.Errorf("negative: %v", s)
	}
	if _, s := r.MappingAt(now.Add(11*time.Second), none); s != core.MapNoLocator {
		t.Errorf("zero usable locators: %v", s)
	}
	// Garbage and replies nobody asked for are counted and change nothing.
	r.reply(now, []byte{0x20, 1, 2})
	r.reply(now, replyBytes(12345, "192.168.9.0/24", 10, loc("10.0.9.9", 1)))
	c := r.Counters()
	if c.Malformed != 1 || c.Stray != 1 || c.Negative != 1 {
		t.Errorf("counters %+v", c)
	}
	if _, s := r.MappingAt(now.Add(11*time.Second), netip.MustParseAddr("192.168.9.1")); s != core.MapPending {
		t.Errorf("a stray reply was cached: %v", s)
	}
}

func TestDecodeReply(t *testing.T) {
	b := replyBytes(7, "fd00:2::/64", 0xffffffff, loc("10.0.3.1", 1), loc("2001:db8::1", 1), loc("10.0.4.1", 3))
	nonce, r, err := DecodeReply(b)
	if err != nil || nonce != 7 || r.Prefix != netip.MustParsePrefix("fd00:2::/64") || r.Mapping.Usable != 2 || r.State != core.MapFound || r.TTL != 24*time.Hour {
		t.Errorf("got %d %+v %v", nonce, r, err)
	}
	probe := lisp.MapReply{Flags: lisp.ReplyProbe, Nonce: 1, Records: []lisp.Record{{TTL: 1, MaskLen: 24, EID: lisp.AddrFrom(netip.MustParseAddr("10.1.1.0")), Locators: []lisp.Locator{loc("10.0.3.1", 1)}}}}
	pb := make([]byte, probe.Len())
	probe.Encode(pb)
	for _, bad := range [][]byte{nil, {0x20}, pb, {0x10, 0, 0, 0}} {
		if _, _, err := DecodeReply(bad); !errors.Is(err, ErrNotReply) {
			t.Errorf("% x: %v", bad, err)
		}
	}
}

func FuzzDecodeReply(f *testing.F) {
	f.Add(replyBytes(7, "192.168.2.0/24", 10, loc("10.0.3.1", 1), loc("10.0.4.1", 1)))
	f.Add(replyBytes(8, "fd00:2::/64", 0xffffffff, loc("2001:db8::1", 255)))
	f.Add(replyBytes(9, "203.0.0.0/8", 15))
	f.Fuzz(func(t *testing.T, b []byte) {
		nonce, r, err := DecodeReply(b)
		if err != nil {
			if !errors.Is(err, ErrNotReply) {
				t.Fatalf("error outside the documented set: %v", err)
			}
			return
		}
		var m lisp.MapReply
		if _, err := m.Decode(b); err != nil || m.Nonce != nonce {
			t.Fatalf("DecodeReply accepted what the codec refuses: %v", err)
		}
		rec := m.Records[0]
		if !r.Prefix.IsValid() || r.Prefix.Bits() != int(rec.MaskLen) || r.Mapping.Prefix != r.Prefix.String() {
			t.Fatalf("prefix %v for mask %d", r.Prefix, rec.MaskLen)
		}
		if r.Mapping.Usable > len(rec.Locators) {
			t.Fatalf("%d usable of %d locators", r.Mapping.Usable, len(rec.Locators))
		}
		switch r.State {
		case core.MapFound:
			if r.Mapping.Usable == 0 {
				t.Fatal("found without a usable locator")
			}
		case core.MapNone:
			if len(rec.Locators) != 0 {
				t.Fatal("negative with locators")
			}
		case core.MapNoLocator:
			if r.Mapping.Usable != 0 || len(rec.Locators) == 0 {
				t.Fatal("no-locator state with usable locators")
			}
		default:
			t.Fatalf("state %v", r.State)
		}
	})
}

// The ports the policy chooses land on distinct RLOC pairs under the xTR's placement rule, in
// both directions of each subflow, for every site size up to 4x4.
func TestPortsMatchXTRPlacement(t *testing.T) {
	for a := 1; a <= 4; a++ {
		for b := 1; b <= 4; b++ {
			t.Run(fmt.Sprintf("%dx%d", a, b), func(t *testing.T) {
				maps := fakeSource{"192.168.1.1": a, "192.168.2.1": b}
				p := &core.AMPTCP{Maps: maps, Routing: core.RoutingBound}
				m := core.New(core.Config{Uplinks: []core.Uplink{{Name: "eth0", Addr: "192.168.1.1"}}}, p)
				local, remote := core.Endpoint{Addr: "192.168.1.1", Port: 39517}, core.Endpoint{Addr: "192.168.2.1", Port: 443}
				m.Event(time.Unix(1, 0), core.Event{Kind: core.Created, Token: 1, Local: local, Remote: remote})
				acts := m.Event(time.Unix(1, 0), core.Event{Kind: core.Established, Token: 1, Local: local, Remote: remote})
				ports := []uint16{local.Port}
				for _, act := range acts {
					ports = append(ports, act.Local.Port)
				}
				if len(ports) != a*b {
					t.Fatalf("%d subflows, want %d", len(ports), a*b)
				}
				pairs := map[[2]int]bool{}
				for _, sp := range ports {
					// Site 1 (192.168.1.0/24) sorts first: X = site 1 (a RLOCs), Y = site 2.
					_, ix, iy := xtr.Placement(sp, remote.Port, a, b)
					_, rx, ry := xtr.Placement(remote.Port, sp, a, b)
					if ix != rx || iy != ry {
						t.Errorf("port %d: directions disagree", sp)
					}
					pairs[[2]int{ix, iy}] = true
				}
				if len(pairs) != a*b {
					t.Errorf("ports %v use %d RLOC pairs, want %d", ports, len(pairs), a*b)
				}
			})
		}
	}
}

type fakeSource map[string]int

func (f fakeSource) Mapping(eid string) (core.Mapping, core.MapState) {
	n, ok := f[eid]
	if !ok {
		return core.Mapping{}, core.MapNone
	}
	return core.Mapping{Prefix: eid, Usable: n}, core.MapFound
}
