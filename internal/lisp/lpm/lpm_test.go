package lpm

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func TestLispLPMLookupAndUncovered(t *testing.T) {
	var tb Table[string]
	for _, p := range []string{"192.168.101.0/24", "192.168.102.0/24", "192.168.0.0/16", "10.1.0.0/24", "fd01::/64"} {
		tb.Insert(pfx(p), p)
	}
	for _, tt := range []struct{ a, want string }{
		{"192.168.101.7", "192.168.101.0/24"},
		{"192.168.103.7", "192.168.0.0/16"},
		{"10.1.0.200", "10.1.0.0/24"},
		{"fd01::5", "fd01::/64"},
		{"::ffff:10.1.0.1", "10.1.0.0/24"},
	} {
		p, v, ok := tb.Lookup(addr(tt.a))
		if !ok || p.String() != tt.want || v != tt.want {
			t.Errorf("Lookup(%s) = %v, %q, %v; want %s", tt.a, p, v, ok, tt.want)
		}
	}
	for _, tt := range []struct{ a, want string }{
		{"192.0.2.1", "192.0.0.0/9"}, // the resolver behaviour of docs/lisp.md
		{"10.1.1.1", "10.1.1.0/24"},
		{"11.0.0.1", "11.0.0.0/8"},
		{"128.0.0.1", "128.0.0.0/2"},
		{"2001:db8::1", "::/1"},
		{"fd01:0:0:1::1", "fd01:0:0:1::/64"},
	} {
		p, ok := tb.Uncovered(addr(tt.a))
		if !ok || p.String() != tt.want {
			t.Errorf("Uncovered(%s) = %v, %v; want %s", tt.a, p, ok, tt.want)
		}
	}
	if _, ok := tb.Uncovered(addr("10.1.0.1")); ok {
		t.Error("Uncovered inside a stored prefix")
	}
	var empty Table[int]
	if p, ok := empty.Uncovered(addr("1.2.3.4")); !ok || p.Bits() != 0 {
		t.Errorf("empty table: %v %v", p, ok)
	}
}

// TestLispLPMAgainstLinear compares the table with a linear scan on random tables, IPv4 and
// IPv6.
func TestLispLPMAgainstLinear(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	t.Run("ipv4", func(t *testing.T) {
		againstLinear(t, r, 8, 32, func() netip.Addr {
			return netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
		})
	})
	t.Run("ipv6", func(t *testing.T) {
		againstLinear(t, r, 16, 128, func() netip.Addr {
			var b [16]byte
			b[0], b[1], b[5], b[6], b[15] = 0xfd, byte(r.IntN(2)), byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))
			return netip.AddrFrom16(b)
		})
	})
}

func againstLinear(t *testing.T, r *rand.Rand, minBits, maxBits int, randAddr func() netip.Addr) {
	var tb Table[int]
	set := map[netip.Prefix]int{}
	for i := range 3000 {
		p := netip.PrefixFrom(randAddr(), minBits+r.IntN(maxBits-minBits+1)).Masked()
		if r.IntN(4) == 0 {
			tb.Delete(p)
			delete(set, p)
			continue
		}
		tb.Insert(p, i)
		set[p] = i
	}
	if tb.Len() != len(set) {
		t.Fatalf("Len = %d, want %d", tb.Len(), len(set))
	}
	n := 0
	tb.All(func(p netip.Prefix, v int) bool {
		if set[p] != v {
			t.Fatalf("All gave %v = %d", p, v)
		}
		n++
		return true
	})
	if n != len(set) {
		t.Fatalf("All visited %d", n)
	}
	for range 2000 {
		a := randAddr()
		best := -1
		var bv int
		overlap := func(q netip.Prefix) bool {
			for p := range set {
				if p.Overlaps(q) {
					return true
				}
			}
			return false
		}
		for p, v := range set {
			if p.Contains(a) && p.Bits() > best {
				best, bv = p.Bits(), v
			}
		}
		p, v, ok := tb.Lookup(a)
		if ok != (best >= 0) || (ok && (p.Bits() != best || v != bv)) {
			t.Fatalf("Lookup(%v) = %v %d %v; want /%d %d", a, p, v, ok, best, bv)
		}
		u, ok := tb.Uncovered(a)
		if ok == (best >= 0) {
			t.Fatalf("Uncovered(%v) ok = %v with best %d", a, ok, best)
		}
		if ok {
			if overlap(u) {
				t.Fatalf("Uncovered(%v) = %v overlaps a stored prefix", a, u)
			}
			if u.Bits() > 0 {
				wider, _ := a.Prefix(u.Bits() - 1)
				if !overlap(wider) {
					t.Fatalf("Uncovered(%v) = %v, but %v is free too", a, u, wider)
				}
			}
		}
	}
	for p := range set {
		if !tb.Delete(p) {
			t.Fatalf("Delete(%v) false", p)
		}
	}
	if tb.Len() != 0 {
		t.Fatalf("not empty after deleting all: %d", tb.Len())
	}
}

// TestLispLPMLookupAllocs: lookups are on the xTR's and the map server's per-packet paths and
// allocate nothing.
func TestLispLPMLookupAllocs(t *testing.T) {
	var tb Table[*int]
	v := 1
	for i := range 1000 {
		tb.Insert(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), &v)
	}
	tb.Insert(pfx("fd00::/16"), &v)
	a4, a6, q := addr("10.3.7.9"), addr("fd00::1"), pfx("10.3.7.0/28")
	allocs := testing.AllocsPerRun(1000, func() {
		if _, _, ok := tb.Lookup(a4); !ok {
			t.Fatal("miss")
		}
		tb.Lookup(a6)
		tb.LookupPrefix(q)
		tb.Get(q)
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per lookup round, want 0", allocs)
	}
}
