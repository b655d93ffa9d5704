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

// Equal paths take the queue in runs, not packet by packet: consecutive packets share a path
// for up to runTime at its rate (at most maxRun bytes), so that each path's share of a batch
// leaves in one send and arrives in order; over time the shares are still the paths' (3:1
// here), and on slow paths the runs are short.
func TestPlanEqualPathsSendRuns(t *testing.T) {
	runs := func(paths []Path, rounds int) (got [2]int, switches, longest int) {
		s, _ := NewPaced(PacedConfig{})
		sizes, out := make([]int, 40), make([]int, 40)
		for k := range sizes {
			sizes[k] = 1500
		}
		now, last, run := int64(time.Second), -1, 0
		for range rounds {
			// Between plans the buckets refill by what was sent: the paths run at capacity.
			now += int64(time.Millisecond)
			s.Plan(now, paths, sizes, out)
			for _, i := range out {
				if i < 0 {
					continue
				}
				got[i]++
				if i == last {
					run++
				} else {
					if last >= 0 {
						switches++
					}
					last, run = i, 1
				}
				longest = max(longest, run)
			}
		}
		return got, switches, longest
	}
	fast := []Path{
		{ID: 0, Up: true, Capacity: 3e9, MinRTT: time.Millisecond},
		{ID: 1, Up: true, Capacity: 3e9, MinRTT: time.Millisecond},
	}
	got, switches, longest := runs(fast, 200)
	n := got[0] + got[1]
	if n == 0 || got[0] < n*45/100 || got[1] < n*45/100 {
		t.Fatalf("equal paths carried %v packets: want about half each", got)
	}
	// 3 Gbit/s for 500 µs is 187 KB, capped at 64 KiB: runs of about 43 packets.
	if avg := n / (switches + 1); avg < 20 || longest > maxRun/1500+1 {
		t.Errorf("equal fast paths: %d packets in %d runs (average %d, longest %d): want runs of 20 to %d", n, switches+1, avg, longest, maxRun/1500+1)
	}

	unequal := []Path{
		{ID: 0, Up: true, Weight: 3, Capacity: 3e9, MinRTT: time.Millisecond},
		{ID: 1, Up: true, Weight: 1, Capacity: 3e9, MinRTT: time.Millisecond},
	}
	got, switches, _ = runs(unequal, 200)
	if n := got[0] + got[1]; got[0] < n*70/100 || got[0] > n*80/100 || switches < 10 {
		t.Errorf("weights 3:1 carried %v packets in %d runs: want 75 %% on the first, in runs", got, switches+1)
	}

	slow := []Path{
		{ID: 0, Up: true, Capacity: 50e6, MinRTT: time.Millisecond},
		{ID: 1, Up: true, Capacity: 50e6, MinRTT: time.Millisecond},
	}
	// 50 Mbit/s for 500 µs is 3 125 bytes: runs of 2 or 3 packets.
	if got, _, longest := runs(slow, 200); longest > 3 || got[0] == 0 || got[1] == 0 {
		t.Errorf("equal slow paths carried %v with runs up to %d packets: want both, runs of at most 3", got, longest)
	}
}

// A slow path whose capacity is still the estimator's guess is given the packets the fast path
// must wait for, as far as its window lets it, so that it is measured although the queue is too
// short for it by arrival time; once measured, it is given them no more.
func TestPlanUnmeasuredPathTakesWhatTheFastPathWaitsFor(t *testing.T) {
	for _, unmeasured := range []bool{false, true} {
		s, _ := NewPaced(PacedConfig{})
		now := int64(time.Second)
		paths := planPaths()
		paths[1].Capacity, paths[1].Unmeasured, paths[1].CWnd = 100e6, unmeasured, 64<<10
		out, _ := plan(t, s, now, paths, 100)
		fast, slow, firstSlow := 0, 0, -1
		for k, i := range out {
			switch i {
			case 0:
				fast++
			case 1:
				if firstSlow < 0 {
					firstSlow = k
				}
				slow++
			}
		}
		if want := (64 << 10) / 1500; fast != want {
			t.Errorf("unmeasured %v: fast path sent %d packets now, want its bucket's %d", unmeasured, fast, want)
		}
		if !unmeasured {
			if slow != 0 {
				t.Errorf("measured slow path given %d packets of a 100-packet queue, want none", slow)
			}
			continue
		}
		// The slow path takes from right after the fast path's bucket, within its window.
		if firstSlow != fast {
			t.Errorf("unmeasured slow path's first packet is number %d, want %d (right after the fast path's)", firstSlow, fast)
		}
		if want := (64 << 10) / 1500; slow != want {
			t.Errorf("unmeasured slow path given %d packets, want its window's %d", slow, want)
		}
	}
}

// A path that the queue left with tokens to spare (the traffic inside paused) banks no more than
// a quarter of its bandwidth-delay product until the next walk: after 50 ms with nothing queued,
// the 50 Mbit/s path of 10 ms sends 15.6 KB at once, not its 64 KiB bucket, which would
// overflow a link queue of one bandwidth-delay product that already holds a little. A path
// the queue kept busy keeps its whole bucket: a reader woken 8 ms late sends the 50 KB it
// owes the path at once, and the path keeps its rate.
func TestPlanIdlePathBanksLittle(t *testing.T) {
	paths := planPaths()[:1]
	count := func(out []int) (n int) {
		for _, i := range out {
			if i == 0 {
				n++
			}
		}
		return n
	}
	t.Run("idle", func(t *testing.T) {
		s, _ := NewPaced(PacedConfig{})
		now := int64(time.Second)
		plan(t, s, now, paths, 100) // the first walk spends the bucket
		now += int64(50 * time.Millisecond)
		plan(t, s, now, paths, 1) // the queue had one packet: the path is left tokens to spare
		now += int64(50 * time.Millisecond)
		out, _ := plan(t, s, now, paths, 100)
		// A quarter of 50 Mbit/s × 10 ms: 15625 bytes, 10 whole packets of 1500.
		if got, want := count(out), 15625/1500; got != want {
			t.Errorf("after an idle spell the path sent %d packets at once, want %d", got, want)
		}
	})
	t.Run("busy", func(t *testing.T) {
		s, _ := NewPaced(PacedConfig{})
		now := int64(time.Second)
		out, wake := plan(t, s, now, paths, 200)
		sent := count(out)
		// The reader comes back 8 ms after the path could send again.
		now = wake + int64(8*time.Millisecond)
		out, _ = plan(t, s, now, paths, 200-sent)
		if got, low := count(out), 8*50e6/8/1e3/1500; float64(got) < low {
			t.Errorf("a reader 8 ms late sent %d packets at once, want at least the %.0f it owed", got, low)
		}
	})
}

// What is sent on a path outside the plan (Charge: a sparse flow's copy) takes the path's
// tokens: the bytes the next plan gives the path now are fewer by as much.
func TestPlanChargeTakesTokens(t *testing.T) {
	sent := func(charge int) int {
		s, _ := NewPaced(PacedConfig{})
		now := int64(time.Second)
		paths := planPaths()[:1]
		plan(t, s, now, paths, 100) // a busy path: its bucket spent, no idle cap
		s.Charge(paths, 0, charge)
		now += int64(10 * time.Millisecond) // 62.5 KB at 50 Mbit/s
		out, _ := plan(t, s, now, paths, 100)
		n := 0
		for _, i := range out {
			if i == 0 {
				n++
			}
		}
		return n
	}
	without, with := sent(0), sent(15*1500)
	if without-with != 15 {
		t.Errorf("after a charge of 15 packets' worth, the plan sent %d packets now against %d without: want 15 fewer", with, without)
	}
}
