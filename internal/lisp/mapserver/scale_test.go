package mapserver

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

// TestMapserverMemoryPerPrefix: registered prefixes cost a bounded amount of heap each, also
// when they are scattered (IPv6 /48s and IPv4 /24s drawn at random from a site's space, no
// two sharing much of their path), and a refresh of every registration leaves it unchanged.
func TestMapserverMemoryPerPrefix(t *testing.T) {
	const n = 50000
	const bound = 250 // bytes per prefix; 125 measured in bench/lisp (dense /24s)
	cfg := Defaults()
	cfg.RatePerSource = 0
	cfg.Sites = []Site{{Name: "big", Keys: map[uint8][]byte{0: []byte("big-site-key-0123456789")},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("10.0.0.0/8")}}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	seen := map[netip.Prefix]bool{}
	var ps []netip.Prefix
	for len(ps) < n {
		var p netip.Prefix
		if len(ps)%2 == 0 {
			var b [16]byte
			b[0], b[1], b[2], b[3], b[4], b[5] = 0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(256)), byte(r.IntN(256))
			p = netip.PrefixFrom(netip.AddrFrom16(b), 48)
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), 0}), 24)
		}
		if !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	locs := []lisp.Locator{
		{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("172.16.0.1"))},
		{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("172.17.0.1"))}}
	register := func(now time.Time) {
		for i := 0; i < len(ps); i += 100 {
			m := lisp.MapRegister{AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32)}
			for _, p := range ps[i:min(i+100, len(ps))] {
				m.Records = append(m.Records, lisp.Record{TTL: 10, MaskLen: uint8(p.Bits()), EID: lisp.AddrFrom(p.Addr()), Locators: locs})
			}
			b := mustEncode(&m)
			lisp.Sign(b, []byte("big-site-key-0123456789"))
			s.Handle(now, netip.MustParseAddrPort("172.16.0.1:4342"), b, nil)
		}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	now := time.Now()
	register(now)
	if got := s.RegisteredPrefixes(); got != n {
		t.Fatalf("%d prefixes registered, want %d", got, n)
	}
	after := heap()
	per := float64(after-before) / n
	register(now.Add(time.Minute))
	refreshed := heap()
	t.Logf("%.0f bytes of heap per scattered prefix; after a refresh of all: %.0f", per, float64(refreshed-before)/n)
	if per > bound {
		t.Errorf("%.0f bytes per registered prefix, want at most %d", per, bound)
	}
	if refreshed > after+after/10+(1<<20) {
		t.Errorf("a refresh grew the heap from %d to %d bytes", after-before, refreshed-before)
	}
	if c := s.Counters()[CountRegistered]; c != 2*n {
		t.Errorf("%d registrations counted, want %d", c, 2*n)
	}
	runtime.KeepAlive(s)
}
