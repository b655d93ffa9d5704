package sched

import (
	"testing"
	"time"
)

// mesh is the four paths of two sites with two uplinks each (internal/config/testdata/
// site-a.toml): fibre (100 Mbit/s) and lte (20 Mbit/s) each reach both of the peer's
// addresses. Each path has the capacity of its uplink, as the site file gives it.
func mesh() ([]Path, []*Bucket) {
	fibre, lte := NewBucket(100e6), NewBucket(20e6)
	return []Path{
		{ID: 1, Up: true, Capacity: 100e6, Uplink: fibre},
		{ID: 2, Up: true, Capacity: 100e6, Uplink: fibre},
		{ID: 3, Up: true, Capacity: 20e6, Uplink: lte},
		{ID: 4, Up: true, Capacity: 20e6, Uplink: lte},
	}, []*Bucket{fibre, lte}
}

// perUplink sums sent (bytes per path) by uplink, in the order of ups.
func perUplink(paths []Path, ups []*Bucket, sent []float64) []float64 {
	out := make([]float64, len(ups))
	for i, p := range paths {
		for j, u := range ups {
			if p.Uplink == u {
				out[j] += sent[i]
			}
		}
	}
	return out
}

// checkUplinks fails unless each uplink carried its rate over dur (within 1 %, less one
// burst) and no more than its rate plus one burst.
func checkUplinks(t *testing.T, got []float64, ups []*Bucket, dur int64) {
	t.Helper()
	for j, u := range ups {
		want := u.Rate / 8 * float64(dur) / 1e9
		burst := max(u.Rate/8*0.002, 64<<10)
		t.Logf("uplink %d (%.0f Mbit/s): %.0f bytes in %v, %.4f of its rate", j+1, u.Rate/1e6, got[j], time.Duration(dur), got[j]/want)
		if got[j] > want+burst || got[j] < want*0.99-burst {
			t.Errorf("uplink %d (%.0f Mbit/s): %.0f bytes in %v, want %.0f (its rate), within one burst", j+1, u.Rate/1e6, got[j], time.Duration(dur), want)
		}
	}
}

// Four paths over two uplinks, saturated: each uplink carries its capacity, not the sum of
// its paths' (twice as much), and the two uplinks together carry the sum of their rates.
func TestPacedSharedUplink(t *testing.T) {
	paths, ups := mesh()
	s := newPaced(t)
	const dur = int64(time.Second)
	sent := saturate(t, s, paths, 5*ms, dur, nil)
	checkUplinks(t, perUplink(paths, ups, sent), ups, dur)
	// The paths of one uplink share it evenly.
	for _, pair := range [][2]int{{0, 1}, {2, 3}} {
		a, b := sent[pair[0]], sent[pair[1]]
		if r := a / b; r < 0.95 || r > 1.05 {
			t.Errorf("paths %d and %d of one uplink: %.0f and %.0f bytes", pair[0]+1, pair[1]+1, a, b)
		}
	}
}

// Paths whose capacity is measured (here each one's estimate is the uplink's rate, and one
// probes 25 % above it) still stay, together, within the uplink's capacity.
func TestPacedSharedUplinkMeasured(t *testing.T) {
	paths, ups := mesh()
	for i := range paths {
		paths[i].PaceRate = paths[i].Capacity
	}
	paths[0].PaceRate *= 1.25
	paths[2].PaceRate *= 1.25
	s := newPaced(t)
	const dur = int64(time.Second)
	sent := saturate(t, s, paths, 5*ms, dur, nil)
	checkUplinks(t, perUplink(paths, ups, sent), ups, dur)
}

// Two peers (two schedulers) with a path each on one uplink share its bucket: together
// they carry the uplink's rate. The sender offers each peer's packets in turn, and then each
// peer gets about half.
func TestPacedSharedUplinkTwoPeers(t *testing.T) {
	up := NewBucket(50e6)
	a := []Path{{ID: 1, Up: true, Capacity: 50e6, Uplink: up}}
	b := []Path{{ID: 1, Up: true, Capacity: 50e6, Uplink: up}}
	sa, sb := newPaced(t), newPaced(t)
	const size, dur = 1500, int64(time.Second)
	var sent [2]float64
	now := int64(5 * ms)
	type peer struct {
		s     *Paced
		paths []Path
	}
	peers := []peer{{sa, a}, {sb, b}}
	first := 0 // the peer offered first; the other after each packet sent
	for now < 5*ms+dur {
		next := now + 10*ms
		for j := range peers {
			k := (first + j) % 2
			c := peers[k]
			_, at, ok := c.s.Next(now, c.paths, size)
			if !ok {
				t.Fatal("Next: ok = false")
			}
			if at <= now {
				sent[k] += size
				next, first = now, 1-k
			} else {
				next = min(next, at)
			}
		}
		now = next
	}
	got := sent[0] + sent[1]
	checkUplinks(t, []float64{got}, []*Bucket{up}, dur)
	if r := sent[0] / sent[1]; r < 0.9 || r > 1.1 {
		t.Errorf("two peers on one uplink: %.0f and %.0f bytes, want about equal", sent[0], sent[1])
	}
}

// A bucket with no rate limits nothing: the paths keep their own rates.
func TestPacedUplinkWithoutRate(t *testing.T) {
	up := NewBucket(0)
	paths := []Path{{ID: 1, Up: true, Capacity: 100e6, Uplink: up}, {ID: 2, Up: true, Capacity: 100e6, Uplink: up}}
	s := newPaced(t)
	const dur = int64(time.Second)
	sent := saturate(t, s, paths, 5*ms, dur, nil)
	if got, want := sent[0]+sent[1], 2*100e6/8.0; got < want*0.99 {
		t.Errorf("uplink without a rate: %.0f bytes in 1 s, want %.0f (the paths' own rates)", got, want)
	}
}

func TestPacedSharedUplinkNoAllocs(t *testing.T) {
	paths, _ := mesh()
	s := newPaced(t)
	var now int64
	s.Next(now, paths, 1500)
	if a := testing.AllocsPerRun(1000, func() { now += 10_000; s.Next(now, paths, 1500) }); a != 0 {
		t.Errorf("Paced.Next with shared uplinks: %v allocs, want 0", a)
	}
}
