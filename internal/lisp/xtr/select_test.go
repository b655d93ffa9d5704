package xtr

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

func locs(n int, base string, prio uint8) []Loc {
	var out []Loc
	a := netip.MustParseAddr(base)
	for range n {
		out = append(out, Loc{Addr: a, Priority: prio, Weight: 1})
		a = a.Next()
	}
	return out
}

// TestPlacementProperties: for every site size pair, the rule is a bijection onto the pairs
// and both ITRs compute the same pair for a flow, whatever order the replies listed the RLOCs.
func TestXtrPlacementProperties(t *testing.T) {
	for a := 1; a <= 4; a++ {
		for b := 1; b <= 4; b++ {
			t.Run(fmt.Sprintf("%dx%d", a, b), func(t *testing.T) {
				x := locs(a, "10.0.1.1", 1)
				y := locs(b, "10.0.2.1", 1)
				// Shuffled as replies may list them, plus a backup and a do-not-use RLOC.
				xs := append([]Loc{{Addr: netip.MustParseAddr("10.9.9.9"), Priority: 255}}, x...)
				xs = append(xs, Loc{Addr: netip.MustParseAddr("10.0.1.200"), Priority: 2})
				for i, j := 0, len(xs)-1; i < j; i, j = i+1, j-1 {
					xs[i], xs[j] = xs[j], xs[i]
				}
				ux, uy := Usable(xs), Usable(y)
				if len(ux) != a || len(uy) != b {
					t.Fatalf("usable %d %d", len(ux), len(uy))
				}
				seen := map[[2]netip.Addr]bool{}
				for s := 40000; s < 40000+a*b; s++ {
					const d = 443
					_, ix, iy := Placement(uint16(s), d, len(ux), len(uy))
					// The reverse direction: ports swapped, same site order.
					_, rx, ry := Placement(d, uint16(s), len(ux), len(uy))
					if ix != rx || iy != ry {
						t.Fatalf("asymmetric: %d,%d vs %d,%d", ix, iy, rx, ry)
					}
					seen[[2]netip.Addr{ux[ix].Addr, uy[iy].Addr}] = true
				}
				if len(seen) != a*b {
					t.Fatalf("%d consecutive ports cover %d pairs", a*b, len(seen))
				}
			})
		}
	}
}

func TestXtrWeighted(t *testing.T) {
	l := []Loc{{Weight: 25}, {Weight: 75}, {Weight: 0}}
	n := [3]int{}
	for h := range uint32(10000) {
		i, _ := Weighted(l, h*2654435761)
		n[i]++
	}
	if n[2] != 0 || n[0] < 2300 || n[0] > 2700 {
		t.Fatalf("weights 25/75/0 gave %v", n)
	}
	if i, ok := Weighted([]Loc{{}, {}}, 3); !ok || i != 1 {
		t.Fatalf("all-zero weights: %d %v", i, ok)
	}
	if _, ok := Weighted(nil, 1); ok {
		t.Fatal("empty set chose")
	}
	if Usable([]Loc{{Priority: 255}}) != nil {
		t.Fatal("priority 255 is usable")
	}
}

// SetLocators changes the mapping the site registers and the placement set at once, and
// refuses settings that leave no usable RLOC.
func TestSetLocators(t *testing.T) {
	x, err := New(Options{Device: nullDevice{}, EIDs: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Uplinks:   []*Uplink{{Addr: netip.MustParseAddr("10.0.1.1")}, {Addr: netip.MustParseAddr("10.0.2.1")}},
		Locators:  []Locator{{Priority: 1, Weight: 50}, {Priority: 1, Weight: 50}},
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("10.0.9.1:4342")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]Locator{{{Priority: 1}}, {{Priority: 255}, {Priority: 255}}} {
		if err := x.SetLocators(bad); !errors.Is(err, ErrLocators) {
			t.Errorf("%v: %v", bad, err)
		}
	}
	if err := x.SetLocators([]Locator{{Priority: 1, Weight: 50}, {Priority: 255, Weight: 0}}); err != nil {
		t.Fatal(err)
	}
	rec := x.ownRecord(netip.MustParsePrefix("192.168.1.0/24"), netip.Addr{})
	if len(rec.Locators) != 2 || rec.Locators[1].Priority != 255 || rec.Locators[0].Priority != 1 {
		t.Errorf("registered record %+v", rec.Locators)
	}
	if len(x.usableL) != 1 || x.usableL[0].Addr != netip.MustParseAddr("10.0.1.1") {
		t.Errorf("placement set %v", x.usableL)
	}
}
