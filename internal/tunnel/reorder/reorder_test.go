package reorder

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func newBuf(t testing.TB, c Config) *Buffer[uint32] {
	t.Helper()
	b, err := New[uint32](c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// push is Push with the packet's value equal to its sequence number.
func push(b *Buffer[uint32], now int64, seq uint32) []uint32 {
	return b.Push(now, seq, 1000, seq, nil)
}

func wantOut(t *testing.T, what string, got []uint32, want ...uint32) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: delivered %v, want %v", what, got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{MaxPackets: -1},
		{MaxPackets: maxPacketsLimit + 1},
		{MaxBytes: -5},
		{MinHold: 10 * time.Millisecond, MaxHold: time.Millisecond},
		{Hold: -time.Millisecond},
	}
	for _, c := range bad {
		if _, err := New[int](c); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", c)
		}
	}
	b, err := New[int](Config{MaxPackets: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.ring) != 2048 {
		t.Errorf("ring of %d slots for 1000 packets, want 2048", len(b.ring))
	}
}

func TestInOrderPassesThrough(t *testing.T) {
	b := newBuf(t, Config{})
	for i := range uint32(100) {
		wantOut(t, "in order", push(b, int64(i), 500+i), 500+i)
	}
	st := b.Stats()
	if st.InOrder != 100 || st.Packets != 0 || st.Bytes != 0 || st.Lost != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, ok := b.NextDeadline(); ok {
		t.Fatal("NextDeadline ok with nothing held")
	}
}

func TestPermutationWithinWindowComesOutSorted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const blocks, n = 50, 64
	b := newBuf(t, Config{MaxPackets: 64})
	// The first packet sets the next expected number.
	got := b.Push(0, 1<<32-1, 100, 1<<32-1, nil)
	for blk := range uint32(blocks) {
		for _, p := range rng.Perm(n) {
			got = b.Push(0, blk*n+uint32(p), 100, blk*n+uint32(p), got)
			if err := b.check(); err != "" {
				t.Fatal(err)
			}
		}
	}
	got = got[1:]
	if len(got) != blocks*n {
		t.Fatalf("delivered %d, want %d", len(got), blocks*n)
	}
	for i, s := range got {
		if s != uint32(i) {
			t.Fatalf("delivered[%d] = %d: not sorted", i, s)
		}
	}
	if st := b.Stats(); st.InOrder != blocks*n+1 || st.Lost != 0 || st.Overflows != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// check verifies the ring's invariants: held packets sit in their own slot, inside the window
// (next, next+ring), and are counted.
func (b *Buffer[T]) check() string {
	n, bytes := 0, 0
	for i, s := range b.ring {
		if s.state != slotHeld {
			continue
		}
		n++
		bytes += int(s.size)
		if int(s.seq&b.mask) != i {
			return "held packet in the wrong slot"
		}
		if d := int64(int32(s.seq - b.next)); d <= 0 || d >= int64(len(b.ring)) {
			return "held packet outside the window"
		}
	}
	if n != b.count || bytes != b.byt {
		return "occupancy miscounted"
	}
	return ""
}

func TestGapHeldUntilHoldTime(t *testing.T) {
	b := newBuf(t, Config{Hold: 5 * time.Millisecond})
	wantOut(t, "push 0", push(b, 0, 0), 0)
	wantOut(t, "push 2", push(b, 0, 2))
	wantOut(t, "push 3", push(b, 1*ms, 3))
	if at, ok := b.NextDeadline(); !ok || at != 5*ms {
		t.Fatalf("NextDeadline = %d, %v; want %d, true", at, ok, 5*ms)
	}
	wantOut(t, "expire early", b.Expire(5*ms-1, nil))
	wantOut(t, "expire", b.Expire(5*ms, nil), 2, 3)
	st := b.Stats()
	if st.Lost != 1 || st.AfterGap != 2 || st.Timeouts != 1 || st.Packets != 0 {
		t.Fatalf("stats %+v", st)
	}
	wantOut(t, "next in order", push(b, 6*ms, 4), 4)
	wantOut(t, "late 1", push(b, 7*ms, 1), 1)
	if st := b.Stats(); st.Late != 1 {
		t.Fatalf("Late = %d, want 1", st.Late)
	}
}

func TestExpireReleasesByArrivalNotBySequence(t *testing.T) {
	// 9 arrives first and has waited longest: its deadline releases 5 too.
	b := newBuf(t, Config{Hold: 10 * time.Millisecond})
	push(b, 0, 0)
	wantOut(t, "9", push(b, 0, 9))
	wantOut(t, "5", push(b, 3*ms, 5))
	if at, _ := b.NextDeadline(); at != 10*ms {
		t.Fatalf("deadline %d, want %d (oldest arrival)", at, 10*ms)
	}
	wantOut(t, "expire", b.Expire(10*ms, nil), 5, 9)
	if st := b.Stats(); st.Lost != 7 {
		t.Fatalf("Lost = %d, want 7 (1-4, 6-8)", st.Lost)
	}
}

func TestNextDeadlineFollowsReleasesAndSetHold(t *testing.T) {
	b := newBuf(t, Config{Hold: 20 * time.Millisecond})
	push(b, 0, 0)
	push(b, 1*ms, 2) // waits for 1
	push(b, 2*ms, 4) // waits for 3
	if at, _ := b.NextDeadline(); at != 21*ms {
		t.Fatalf("deadline %d, want 21 ms", at)
	}
	wantOut(t, "fill 1", push(b, 3*ms, 1), 1, 2)
	if at, _ := b.NextDeadline(); at != 22*ms {
		t.Fatalf("after gap filled: deadline %d, want 22 ms", at)
	}
	b.SetHold(5 * time.Millisecond)
	if at, _ := b.NextDeadline(); at != 7*ms {
		t.Fatalf("after SetHold: deadline %d, want 7 ms", at)
	}
	b.SetHold(time.Hour) // clamped to MaxHold
	if b.Hold() != 100*time.Millisecond {
		t.Fatalf("hold %v, want clamp to 100ms", b.Hold())
	}
	b.SetHold(0)
	if b.Hold() != time.Millisecond {
		t.Fatalf("hold %v, want clamp to 1ms", b.Hold())
	}
	wantOut(t, "expire", b.Expire(3*ms, nil), 4)
	if _, ok := b.NextDeadline(); ok {
		t.Fatal("deadline with nothing held")
	}
}

func TestOverflowReleasesInOrder(t *testing.T) {
	b := newBuf(t, Config{MaxPackets: 4})
	push(b, 0, 0)
	for _, s := range []uint32{5, 2, 4, 3} {
		wantOut(t, "hold", push(b, 0, s))
	}
	// The fifth held packet releases the run after the first gap (1), not everything.
	wantOut(t, "overflow", push(b, 0, 7), 2, 3, 4, 5)
	st := b.Stats()
	if st.Overflows != 1 || st.Lost != 1 || st.Packets != 1 {
		t.Fatalf("stats %+v", st)
	}
	wantOut(t, "fill 6", push(b, 0, 6), 6, 7)
}

func TestBytesBound(t *testing.T) {
	b := newBuf(t, Config{MaxBytes: 3000})
	b.Push(0, 0, 1000, 0, nil)
	for _, s := range []uint32{2, 3, 5} {
		wantOut(t, "hold", b.Push(0, s, 1000, s, nil))
	}
	if st := b.Stats(); st.Bytes != 3000 || st.Packets != 3 {
		t.Fatalf("stats %+v", st)
	}
	wantOut(t, "bytes overflow", b.Push(0, 6, 1000, 6, nil), 2, 3)
	if st := b.Stats(); st.Bytes != 2000 || st.Overflows != 1 {
		t.Fatalf("stats %+v", st)
	}
	// One packet larger than the bound is released at once, in order.
	wantOut(t, "jumbo", b.Push(0, 8, 5000, 8, nil), 5, 6, 8)
	if st := b.Stats(); st.Bytes != 0 || st.Packets != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWindowMovesForFarAheadPacket(t *testing.T) {
	b := newBuf(t, Config{MaxPackets: 4})
	push(b, 0, 0)
	push(b, 0, 2)
	push(b, 0, 3)
	// 20 is beyond the 8-slot ring: the window slides so that 20 fits (next = 13).
	wantOut(t, "far", push(b, 0, 20), 2, 3)
	st := b.Stats()
	if st.Lost != 1+9 || st.Packets != 1 {
		t.Fatalf("stats %+v", st)
	}
	var out []uint32
	for s := uint32(13); s < 20; s++ {
		out = push(b, 0, s)
	}
	wantOut(t, "fill", out, 19, 20)
}

func TestSequenceWrap(t *testing.T) {
	b := newBuf(t, Config{})
	start := uint32(1<<32 - 10)
	order := []uint32{0, 2, 1, 4, 3, 9, 8, 10, 5, 6, 7, 12, 11, 13, 14, 15, 19, 16, 17, 18}
	var got []uint32
	for _, o := range order {
		got = b.Push(0, start+o, 100, start+o, got)
	}
	if len(got) != len(order) {
		t.Fatalf("delivered %d, want %d", len(got), len(order))
	}
	for i, s := range got {
		if s != start+uint32(i) {
			t.Fatalf("delivered[%d] = %d, want %d", i, s, start+uint32(i))
		}
	}
	// Late across the wrap.
	b = newBuf(t, Config{})
	push(b, 0, 1<<32-2)
	push(b, 0, 1<<32-1)
	push(b, 0, 1)
	b.Expire(time.Hour.Nanoseconds(), nil)
	wantOut(t, "late across wrap", push(b, time.Hour.Nanoseconds(), 0), 0)
	if st := b.Stats(); st.Late != 1 || st.Lost != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDuplicates(t *testing.T) {
	b := newBuf(t, Config{})
	push(b, 0, 0)
	push(b, 0, 3)
	wantOut(t, "held dup", push(b, 0, 3))
	wantOut(t, "delivered dup", push(b, 0, 0))
	if st := b.Stats(); st.Duplicates != 2 || st.Packets != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Duplicate of a late packet delivered out of the ring.
	b.Expire(time.Hour.Nanoseconds(), nil) // 1, 2 lost; 3 out
	wantOut(t, "late", push(b, time.Hour.Nanoseconds(), 1), 1)
	wantOut(t, "dup of late", push(b, time.Hour.Nanoseconds(), 1))
	wantOut(t, "dup again", push(b, time.Hour.Nanoseconds(), 1))
	if st := b.Stats(); st.Duplicates != 4 || st.Late != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestartBehind(t *testing.T) {
	// The peer sent 0..999, then restarts at 0. Its new numbers look like duplicates.
	b := newBuf(t, Config{Hold: 2 * time.Millisecond})
	now := int64(0)
	for s := range uint32(1000) {
		push(b, now, s)
	}
	var got []uint32
	for s := range uint32(20) {
		now += ms / 4
		got = b.Push(now, s, 100, s, got)
	}
	st := b.Stats()
	if st.Resets != 1 {
		t.Fatalf("Resets = %d, want 1; stats %+v", st.Resets, st)
	}
	// Only the first two look-alike duplicates are dropped.
	if len(got) != 18 || got[0] != 2 || !slices.IsSorted(got) {
		t.Fatalf("delivered %v", got)
	}
	// Reordering works on the new stream.
	wantOut(t, "after restart held", push(b, now, 21))
	wantOut(t, "after restart", push(b, now, 20), 20, 21)
}

func TestRestartFarAway(t *testing.T) {
	b := newBuf(t, Config{Hold: 2 * time.Millisecond})
	push(b, 0, 100_000)
	push(b, 0, 100_002) // held
	now := int64(0)
	var got []uint32
	for s := uint32(7); s < 30; s++ {
		now += ms / 2
		got = b.Push(now, s, 100, s, got)
	}
	st := b.Stats()
	if st.Resets != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Nothing was dropped: the strays, the flushed 100002, the rest in order.
	if len(got) != 24 || !slices.Contains(got, 100_002) {
		t.Fatalf("delivered %v", got)
	}
}

func TestNoRestartFromLateBatchOrStraggler(t *testing.T) {
	b := newBuf(t, Config{Hold: 5 * time.Millisecond})
	now := int64(0)
	for s := uint32(1000); s < 2000; s++ {
		push(b, now, s)
	}
	// A receive batch of 20 late packets from a slow path, all at one instant.
	for s := uint32(900); s < 920; s++ {
		push(b, now, s)
	}
	// A straggler from very far behind, then the stream goes on.
	push(b, now, 1)
	wantOut(t, "stream continues", push(b, now, 2000), 2000)
	// Late packets spread over time but interleaved with the live stream.
	for i := range uint32(50) {
		now += ms
		push(b, now, 950+i)
		push(b, now, 2001+i)
	}
	if st := b.Stats(); st.Resets != 0 || st.Late != 71 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFlush(t *testing.T) {
	b := newBuf(t, Config{})
	push(b, 0, 0)
	push(b, 0, 4)
	push(b, 0, 2)
	wantOut(t, "flush", b.Flush(nil), 2, 4)
	if st := b.Stats(); st.Packets != 0 || st.Lost != 2 {
		t.Fatalf("stats %+v", st)
	}
	wantOut(t, "after flush", push(b, 0, 5), 5)
}

func TestHoldFor(t *testing.T) {
	c := Config{}.Defaults()
	d := time.Millisecond
	tests := []struct {
		name  string
		paths []PathRTT
		want  time.Duration
	}{
		{"no estimate: initial hold", nil, 10 * d},
		{"one path: its jitter does not reorder", []PathRTT{{SRTT: 20 * d, RTTVar: d}}, d},
		{"one path of an LTE link's jitter", []PathRTT{{SRTT: 120 * d, RTTVar: 30 * d}}, d},
		{"equal paths", []PathRTT{{20 * d, 0}, {20 * d, 0}}, 1 * d},
		{"spread", []PathRTT{{10 * d, d}, {40 * d, 2 * d}, {0, 0}}, 40*d + 8*d - 10*d + d},
		{"clamped", []PathRTT{{10 * d, 0}, {600 * d, 0}}, 100 * d},
		{"tiny clamped up", []PathRTT{{100 * time.Microsecond, 0}}, d},
	}
	for _, tc := range tests {
		if got := c.HoldFor(tc.paths); got != tc.want {
			t.Errorf("%s: HoldFor = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRandomPaths interleaves three paths with different delays, jitter, loss and some
// duplication, drives Expire every millisecond, and checks the buffer's promises: every packet
// that arrived is delivered, within hold time + one Expire period; output only goes backwards
// for packets counted late; duplicates are dropped or, beyond the delivered-memory, delivered
// as late; the counters account for every arrival.
func TestRandomPaths(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		// 10k packets/s, default bounds: the buffer is big enough for the delay spread.
		randomPaths(t, seed, 100_000, Config{})
		// 50k packets/s into 256 packets: overflow releases all the time.
		randomPaths(t, seed, 20_000, Config{MaxPackets: 256})
	}
}

func randomPaths(t *testing.T, seed uint64, gap int64, c Config) {
	rng := rand.New(rand.NewPCG(seed, 99))
	hold := time.Duration(2+rng.IntN(25)) * time.Millisecond
	c.Hold = hold
	b := newBuf(t, c)
	type path struct {
		delay, jitter int64
		loss          float64
	}
	paths := []path{
		{5 * ms, ms / 2, 0.01},
		{12 * ms, 2 * ms, 0.02},
		{25 * ms, 5 * ms, 0.05},
	}
	type ev struct {
		at  int64
		seq uint32
	}
	var evs []ev
	start := rng.Uint32()
	const n = 20000
	for i := range n {
		sent := int64(i) * gap
		p := paths[rng.IntN(len(paths))]
		if rng.Float64() < p.loss {
			continue
		}
		at := sent + p.delay + rng.Int64N(p.jitter)
		evs = append(evs, ev{at, start + uint32(i)})
		if rng.Float64() < 0.005 {
			evs = append(evs, ev{at + rng.Int64N(ms), start + uint32(i)})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })

	arrived := map[uint32]int64{} // seq -> first arrival
	delivered := map[uint32]int{}
	var maxOut uint32
	haveOut := false
	backwards, deliveries := 0, 0
	var out []uint32
	check := func(now int64) {
		for _, s := range out {
			deliveries++
			delivered[s]++
			if w := now - arrived[s]; w > int64(hold)+ms {
				t.Fatalf("seed %d: %d waited %v > hold %v + 1ms", seed, s, time.Duration(w), hold)
			}
			if haveOut && int32(s-maxOut) <= 0 {
				backwards++
			} else {
				maxOut, haveOut = s, true
			}
		}
	}
	// A first packet at time 0 fixes the next expected number at start.
	arrived[start-1] = 0
	arrivals := 1
	out = b.Push(0, start-1, 1200, start-1, out[:0])
	check(0)
	tick := int64(0)
	for _, e := range evs {
		for tick+ms <= e.at {
			tick += ms
			out = b.Expire(tick, out[:0])
			check(tick)
		}
		if _, ok := arrived[e.seq]; !ok {
			arrived[e.seq] = e.at
		}
		arrivals++
		out = b.Push(e.at, e.seq, 1200, e.seq, out[:0])
		check(e.at)
		if err := b.check(); err != "" {
			t.Fatalf("seed %d: %s", seed, err)
		}
	}
	for b.Stats().Packets > 0 {
		tick += ms
		out = b.Expire(tick, out[:0])
		check(tick)
	}
	st := b.Stats()
	for s := range arrived {
		if delivered[s] == 0 {
			t.Fatalf("seed %d: %d arrived and was never delivered", seed, s)
		}
	}
	if extra := deliveries - len(arrived); int(st.Duplicates)+extra != arrivals-len(arrived) {
		t.Fatalf("seed %d: %d duplicates dropped + %d delivered, want %d", seed, st.Duplicates, extra, arrivals-len(arrived))
	}
	if uint64(backwards) != st.Late || st.Stray != 0 || st.Resets != 0 {
		t.Fatalf("seed %d: %d went backwards, stats %+v", seed, backwards, st)
	}
	never := 0 // numbers passed by and never arrived: the real loss
	for s := start; s != b.next; s++ {
		if _, ok := arrived[s]; !ok {
			never++
		}
	}
	// Every late first delivery was declared lost before; nothing else was.
	if extra := deliveries - len(arrived); st.Lost != uint64(never)+st.Late-uint64(extra) {
		t.Fatalf("seed %d: Lost = %d, want %d never arrived + %d late", seed, st.Lost, never, int(st.Late)-extra)
	}
	if got := st.InOrder + st.AfterGap + st.Late; got != uint64(deliveries) {
		t.Fatalf("seed %d: stats account for %d deliveries, want %d: %+v", seed, got, deliveries, st)
	}
	if testing.Verbose() && seed == 1 {
		t.Logf("hold %v, 1 packet per %v: %+v", hold, time.Duration(gap), st)
	}
}

func TestNoAllocs(t *testing.T) {
	b := newBuf(t, Config{})
	out := make([]uint32, 0, 2048)
	seq := uint32(0)
	now := int64(0)
	inOrder := testing.AllocsPerRun(1000, func() {
		out = b.Push(now, seq, 1400, seq, out[:0])
		seq++
	})
	reordered := testing.AllocsPerRun(1000, func() {
		now += 1000
		out = b.Push(now, seq+1, 1400, seq+1, out[:0])
		out = b.Push(now, seq, 1400, seq, out[:0])
		out = b.Push(now, seq+3, 1400, seq+3, out[:0])
		out = b.Expire(now+int64(time.Second), out[:0])
		_, _ = b.NextDeadline()
		seq += 4
	})
	if inOrder != 0 || reordered != 0 {
		t.Fatalf("allocs per Push: in order %v, reordered %v; want 0", inOrder, reordered)
	}
}

func BenchmarkPushInOrder(b *testing.B) {
	buf := newBuf(b, Config{})
	out := make([]uint32, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out = buf.Push(int64(i), uint32(i), 1400, uint32(i), out[:0])
	}
}

// BenchmarkPushTwoPaths interleaves a fast path (even numbers) with a slow one (odd numbers,
// 8 packets behind), the steady state of two paths with different delays.
func BenchmarkPushTwoPaths(b *testing.B) {
	const lag = 8
	buf := newBuf(b, Config{})
	out := make([]uint32, 0, 64)
	b.ReportAllocs()
	j, odd := uint32(0), false
	for i := 0; b.Loop(); i++ {
		var s uint32
		if !odd {
			s = 2 * j
			if j >= lag {
				odd = true
			} else {
				j++
			}
		} else {
			s = 2*(j-lag) + 1
			j++
			odd = false
		}
		out = buf.Push(int64(i), s, 1400, s, out[:0])
	}
	if st := buf.Stats(); st.Lost != 0 || st.Late != 0 {
		b.Fatalf("stats %+v", st)
	}
}

// A gap that a path still delivering may yet bring is held past the hold, up to MaxHold; once
// every path has delivered beyond it (or none has lately), the hold applies again.
func TestExpireWaitsForAPathStillDelivering(t *testing.T) {
	b := newBuf(t, Config{Hold: 5 * time.Millisecond})
	wantOut(t, "push 0", push(b, 0, 0), 0)
	wantOut(t, "push 2", push(b, 0, 2)) // 1 is on the slow path, which delivered 0 at most
	b.SetInFlight(1, true)
	if at, ok := b.NextDeadline(); !ok || at != 100*ms {
		t.Fatalf("NextDeadline = %d, %v; want %d (MaxHold), true", at, ok, 100*ms)
	}
	wantOut(t, "expire at the hold", b.Expire(5*ms, nil))
	wantOut(t, "expire later", b.Expire(50*ms, nil))
	if st := b.Stats(); st.Waited != 1 || st.Timeouts != 0 || st.Lost != 0 {
		t.Fatalf("stats %+v: want one gap waited for, none lost", st)
	}
	wantOut(t, "the slow path brings 1", push(b, 60*ms, 1), 1, 2)

	// Every path has delivered past 3 and 4 (the lowest any may yet bring is 5): they come
	// only as resends, and the hold applies.
	wantOut(t, "push 5", push(b, 61*ms, 5))
	b.SetInFlight(5, true)
	wantOut(t, "expire at the hold", b.Expire(66*ms, nil), 5)
	if st := b.Stats(); st.Lost != 2 || st.Timeouts != 1 {
		t.Fatalf("stats %+v: want 3 and 4 lost at the hold", st)
	}

	// Still pending at MaxHold: given up on then.
	wantOut(t, "push 7", push(b, 70*ms, 7))
	b.SetInFlight(6, true)
	wantOut(t, "before MaxHold", b.Expire(169*ms, nil))
	wantOut(t, "at MaxHold", b.Expire(170*ms, nil), 7)

	// No path delivered lately: the hold.
	wantOut(t, "push 9", push(b, 200*ms, 9))
	b.SetInFlight(0, false)
	wantOut(t, "no path in flight", b.Expire(205*ms, nil), 9)
}

// A placed packet (delivered by the caller, out of order) keeps its number's place: the
// packets around it come out in order without it, and a copy of it is dropped.
func TestPlaceKeepsOrderAndDropsCopies(t *testing.T) {
	b := newBuf(t, Config{Hold: 5 * time.Millisecond})
	wantOut(t, "push 0", push(b, 0, 0), 0)
	wantOut(t, "push 2", push(b, 0, 2))
	out, dup := b.Place(0, 3, nil)
	wantOut(t, "place 3", out)
	if dup || !b.Seen(3) || b.Seen(1) || b.Seen(4) {
		t.Fatalf("place 3: dup %v, Seen(3) %v, Seen(1) %v, Seen(4) %v; want false, true, false, false", dup, b.Seen(3), b.Seen(1), b.Seen(4))
	}
	wantOut(t, "the copy of 3", push(b, 1*ms, 3))
	wantOut(t, "push 1", push(b, 1*ms, 1), 1, 2)
	if out, dup := b.Place(1*ms, 3, nil); !dup || len(out) != 0 {
		t.Fatalf("placing 3 again: released %v, dup %v; want nothing, true", out, dup)
	}
	out, dup = b.Place(2*ms, 4, nil) // the next expected number: nothing held after it
	wantOut(t, "place 4", out)
	if dup {
		t.Fatal("place 4: dup")
	}
	wantOut(t, "push 5", push(b, 2*ms, 5), 5)
	// A placed number with a gap before it goes with the packets held after it, releasing
	// nothing of its own.
	out, _ = b.Place(3*ms, 7, nil)
	wantOut(t, "place 7", out)
	wantOut(t, "push 8", push(b, 3*ms, 8))
	wantOut(t, "expire", b.Expire(8*ms, nil), 8)
	// Copies of placed numbers in a row are duplicates, however many: not the look-alikes
	// of a restarted peer, which are delivered after the second (Push).
	for seq := uint32(9); seq < 14; seq++ {
		if _, dup := b.Place(9*ms, seq, nil); dup {
			t.Fatalf("place %d: dup", seq)
		}
	}
	for seq := uint32(9); seq < 14; seq++ {
		wantOut(t, "a late copy of a placed number", push(b, 10*ms, seq))
	}
	st := b.Stats()
	if st.Placed != 8 || st.Duplicates != 7 || st.Lost != 1 || st.Packets != 0 {
		t.Fatalf("stats %+v; want 8 placed, 7 duplicates, 1 lost, none held", st)
	}
	// Alone, it waits for nothing: no deadline, nothing to expire.
	b.Place(11*ms, 20, nil)
	if at, ok := b.NextDeadline(); ok {
		t.Fatalf("a placed number alone has a deadline at %d", at)
	}
	wantOut(t, "expire with only a placed number held", b.Expire(time.Hour.Nanoseconds(), nil))
	wantOut(t, "the gap filled", push(b, 12*ms, 14), 14)
}

// Overdue names the numbers missing before packets that waited at least the given time, from
// where the caller left off; Rescue holds such a gap past the hold until its resend may come,
// and gives it up then; a gap filled by the resend does not teach the buffer to hold longer.
func TestOverdueAndRescue(t *testing.T) {
	b := newBuf(t, Config{MinHold: time.Millisecond, MaxHold: 100 * time.Millisecond, Hold: 20 * time.Millisecond, Learn: true})
	b.SetHold(20 * time.Millisecond)
	wantOut(t, "0", push(b, 0, 0), 0)
	wantOut(t, "2, 3", append(push(b, 1*ms, 2), push(b, 1*ms, 3)...))
	wantOut(t, "6", push(b, 8*ms, 6))
	if got := b.Overdue(5*ms, 10*ms, 0, 64, nil); len(got) != 0 {
		t.Fatalf("Overdue before any packet waited 10 ms: %v", got)
	}
	got := b.Overdue(11*ms, 10*ms, 0, 64, nil)
	wantOut(t, "Overdue at 11 ms", got, 1)
	got = b.Overdue(18*ms, 10*ms, 0, 64, nil)
	wantOut(t, "Overdue at 18 ms", got, 1, 4, 5)
	wantOut(t, "Overdue from 2", b.Overdue(18*ms, 10*ms, 2, 64, nil), 4, 5)
	wantOut(t, "Overdue of at most 2", b.Overdue(18*ms, 10*ms, 0, 2, nil), 1, 4)
	b.Rescue(1, 45*ms)
	b.Rescue(5, 45*ms)
	b.Rescue(3, 45*ms) // held: ignored
	if st := b.Stats(); st.Rescued != 2 {
		t.Fatalf("Rescued = %d, want 2", st.Rescued)
	}
	// Past the hold (20 ms after 1 ms) the gap of 1 is held for its resend.
	wantOut(t, "expire at 30 ms", b.Expire(30*ms, nil))
	if at, _ := b.NextDeadline(); at != 45*ms {
		t.Fatalf("NextDeadline = %v ms, want 45", at/ms)
	}
	// The resend of 1 comes: 1 to 3 go; 4 was not rescued and has waited past the hold
	// (behind 6, which came at 8 ms), so it is given up, but 5 is held for its resend.
	wantOut(t, "resend of 1", push(b, 40*ms, 1), 1, 2, 3)
	if b.need > float64(20*ms) {
		t.Fatalf("need %v ms after a rescued gap filled, want at most 20 (the rescue's 39 ms is not learnt)", b.need/float64(ms))
	}
	wantOut(t, "expire at 41 ms", b.Expire(41*ms, nil))
	if st := b.Stats(); st.Lost != 1 || st.Refilled != 1 || b.next != 5 {
		t.Fatalf("after the resend of 1: lost %d, refilled %d, next %d; want 1, 1, 5", st.Lost, st.Refilled, b.next)
	}
	// No resend of 5 by its deadline: it is given up then.
	wantOut(t, "expire at 44 ms", b.Expire(44*ms, nil))
	wantOut(t, "expire at 45 ms", b.Expire(45*ms, nil), 6)
	if st := b.Stats(); st.Lost != 2 || st.Refilled != 1 || st.Timeouts != 2 {
		t.Fatalf("lost %d, refilled %d, timeouts %d; want 2, 1, 2", st.Lost, st.Refilled, st.Timeouts)
	}
	if msg := b.check(); msg != "" {
		t.Fatal(msg)
	}
}
