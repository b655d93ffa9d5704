package sched

import (
	"testing"
	"time"
)

// planPaths are the unequal paths of issue 16's test: 50 Mbit/s at 5 ms and 25 Mbit/s at 50 ms
// one way.
func planPaths() []Path {
	return []Path{
		{ID: 0, Up: true, Capacity: 50e6, MinRTT: 10 * time.Millisecond},
		{ID: 1, Up: true, Capacity: 25e6, MinRTT: 100 * time.Millisecond},
	}
}

func plan(t *testing.T, s *Paced, now int64, paths []Path, n int) ([]int, int64) {
	t.Helper()
	sizes, out := make([]int, n), make([]int, n)
	for k := range sizes {
		sizes[k] = 1500
	}
	wake, ok := s.Plan(now, paths, sizes, out)
	if !ok {
		t.Fatal("Plan: no path")
	}
	return out, wake
}

// While the fast path alone delivers the queue sooner than the slow path's delay, the slow path
// is given nothing, and the fast one sends the head of the queue, as much as its bucket holds.
func TestPlanShortQueueStaysOnFastPath(t *testing.T) {
	s, _ := NewPaced(PacedConfig{})
	now := int64(time.Second)
	out, wake := plan(t, s, now, planPaths(), 100)
	sent := 0
	for k, i := range out {
		if i == 1 {
			t.Fatalf("packet %d given to the slow path with only 100 packets queued", k)
		}
		if i == 0 {
			if k != sent {
				t.Fatalf("fast path sends packet %d out of order (after %d)", k, sent)
			}
			sent++
		}
	}
	if want := (64 << 10) / 1500; sent != want {
		t.Errorf("fast path sent %d packets now, want its bucket's %d", sent, want)
	}
	if wake <= now || wake > now+int64(time.Millisecond) {
		t.Errorf("wake %v after now, want within 1 ms", time.Duration(wake-now))
	}
}

// With a queue deeper than the fast path drains in the difference of the delays, the slow path
// takes packets from the point where the fast path would deliver them later than it would, and
// every packet it is given arrives no earlier than those ahead of it on the fast path.
func TestPlanDeepQueueUsesSlowPathDownTheQueue(t *testing.T) {
	s, _ := NewPaced(PacedConfig{})
	now := int64(time.Second)
	out, _ := plan(t, s, now, planPaths(), 600)
	first := -1
	for k, i := range out {
		if i == 1 && first < 0 {
			first = k
		}
	}
	// The fast path's bucket (64 KiB) leaves now, then it drains 50 Mbit/s: packet k leaves
	// after (k·1500 − 65536)/6.25 MB/s and arrives 5 ms later; by the slow path it arrives
	// 50 ms after now. They meet at k ≈ 232.
	if first < 220 || first > 240 {
		t.Fatalf("slow path's first packet is number %d, want about 232", first)
	}
	// The slow path leaves nothing in its bucket idle that it could usefully carry: it sends
	// its bucket's worth, consecutively.
	n := 0
	for k := first; k < len(out) && out[k] == 1; k++ {
		n++
	}
	if want := (64 << 10) / 1500; n != want {
		t.Errorf("slow path sent %d consecutive packets, want %d", n, want)
	}
}

// Equal delays: both paths send at once from the head of the queue, the faster first.
func TestPlanEqualDelaysFillBoth(t *testing.T) {
	s, _ := NewPaced(PacedConfig{})
	paths := []Path{
		{ID: 0, Up: true, Capacity: 300e6, MinRTT: 10 * time.Millisecond},
		{ID: 1, Up: true, Capacity: 100e6, MinRTT: 10 * time.Millisecond},
	}
	out, _ := plan(t, s, int64(time.Second), paths, 200)
	var got [2]int
	last := -1
	for k, i := range out {
		if i >= 0 {
			got[i]++
			last = k
		}
	}
	if got[0] == 0 || got[1] == 0 {
		t.Fatalf("sent now per path %v: want both", got)
	}
	if last != got[0]+got[1]-1 {
		t.Errorf("packets sent now are not the head of the queue: last %d of %d", last, got[0]+got[1])
	}
}

// A path that is down takes nothing, and no path up means nothing is sent.
func TestPlanDownPaths(t *testing.T) {
	s, _ := NewPaced(PacedConfig{})
	paths := planPaths()
	paths[0].Up = false
	out, _ := plan(t, s, int64(time.Second), paths, 10)
	for k, i := range out {
		if i != 1 {
			t.Fatalf("packet %d on %d with the fast path down", k, i)
		}
	}
	paths[1].Up = false
	sizes, out := []int{1500}, []int{5}
	if _, ok := s.Plan(int64(2*time.Second), paths, sizes, out); ok || out[0] != -1 {
		t.Errorf("no path up: ok %v, out %v", ok, out)
	}
}

func TestPlanDoesNotAllocate(t *testing.T) {
	s, _ := NewPaced(PacedConfig{})
	paths := planPaths()
	sizes, out := make([]int, 300), make([]int, 300)
	for k := range sizes {
		sizes[k] = 1500
	}
	now := int64(time.Second)
	if a := testing.AllocsPerRun(100, func() {
		now += int64(time.Millisecond)
		s.Plan(now, paths, sizes, out)
	}); a != 0 {
		t.Errorf("Plan allocates %.1f times per call", a)
	}
}
