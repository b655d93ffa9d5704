package maglev

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

const m = 65521

func backends(n int) []Backend {
	var bs []Backend
	for i := 0; i < n; i++ {
		bs = append(bs, Backend{Name: fmt.Sprintf("backend-%d", i), ID: uint32(i), Weight: 1})
	}
	return bs
}

func shares(t []uint32) map[uint32]int {
	s := map[uint32]int{}
	for _, v := range t {
		s[v]++
	}
	return s
}

func changed(a, b []uint32) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func TestBalance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 16, 100, 256} {
		s := shares(Table(backends(n), m))
		if len(s) != n {
			t.Fatalf("n=%d: %d backends in the table", n, len(s))
		}
		for id, c := range s {
			if d := math.Abs(float64(c) - float64(m)/float64(n)); d > 1 {
				t.Errorf("n=%d: backend %d has %d slots, want %d ± 1", n, id, c, m/n)
			}
		}
	}
}

func TestWeights(t *testing.T) {
	bs := []Backend{{"a", 0, 1}, {"b", 1, 2}, {"c", 2, 5}, {"drained", 3, 0}}
	s := shares(Table(bs, m))
	if s[3] != 0 {
		t.Fatalf("a backend of weight 0 got %d slots", s[3])
	}
	for i, w := range []float64{1, 2, 5} {
		want := m * w / 8
		if d := math.Abs(float64(s[uint32(i)]) - want); d > 2 {
			t.Errorf("backend of weight %g: %d slots, want %.0f", w, s[uint32(i)], want)
		}
	}
}

func TestEmptyAndOrder(t *testing.T) {
	for _, v := range Table(nil, m) {
		if v != None {
			t.Fatal("empty table has a backend")
		}
	}
	bs := backends(10)
	a := Table(bs, m)
	rand.New(rand.NewPCG(1, 1)).Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
	if changed(a, Table(bs, m)) != 0 {
		t.Fatal("the table depends on the order of the backends")
	}
}

// TestDisruption bounds the slots that move when one backend joins or leaves: the ideal is the
// newcomer's share (or the leaver's); Maglev moves a little more.
func TestDisruption(t *testing.T) {
	for _, n := range []int{2, 4, 10, 16, 50} {
		before := Table(backends(n), m)
		after := Table(backends(n+1), m)
		moved := changed(before, after)
		ideal := float64(m) / float64(n+1)
		t.Logf("adding to %d: %d slots changed (ideal %.0f)", n, moved, ideal)
		if float64(moved) > ideal*1.3 {
			t.Errorf("adding to %d: %d slots changed, ideal %.0f", n, moved, ideal)
		}
		// Slots that changed but did not go to the newcomer are collateral damage.
		collateral := 0
		for i := range before {
			if before[i] != after[i] && after[i] != uint32(n) {
				collateral++
			}
		}
		t.Logf("adding to %d: %d slots moved between old backends", n, collateral)
		if float64(collateral) > 0.01*m {
			t.Errorf("adding to %d: %d slots moved between old backends", n, collateral)
		}
		// Removing one backend (the middle one).
		bs := backends(n + 1)
		gone := bs[n/2]
		rest := append(append([]Backend(nil), bs[:n/2]...), bs[n/2+1:]...)
		full := Table(bs, m)
		less := Table(rest, m)
		collateral = 0
		for i := range full {
			if full[i] != gone.ID && full[i] != less[i] {
				collateral++
			}
		}
		t.Logf("removing from %d: %d slots of remaining backends moved", n+1, collateral)
		if float64(collateral) > 0.01*m {
			t.Errorf("removing from %d: %d slots of remaining backends moved", n+1, collateral)
		}
	}
}

func TestDrainMovesOnlyTheDrained(t *testing.T) {
	bs := backends(8)
	a := Table(bs, m)
	bs[3].Weight = 0
	b := Table(bs, m)
	collateral := 0
	for i := range a {
		if a[i] != b[i] && a[i] != 3 {
			collateral++
		}
		if b[i] == 3 {
			t.Fatal("drained backend still in the table")
		}
	}
	if float64(collateral) > 0.01*m {
		t.Fatalf("draining one of 8 moved %d slots of the others", collateral)
	}
}

func BenchmarkTable16(b *testing.B) {
	bs := backends(16)
	for b.Loop() {
		Table(bs, m)
	}
}
