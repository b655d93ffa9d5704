package emu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"braid/internal/lab/topo"
)

func traceShape(t *testing.T, text string, offset time.Duration) topo.Shape {
	t.Helper()
	tr, err := topo.ParseTrace("synthetic", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return topo.Shape{Trace: tr.WithOffset(offset), QueuePackets: 10000}
}

// Back-to-back MTU packets leave one per opportunity, at the opportunities' times, and the
// trace repeats after its last timestamp.
func TestShaperTraceSaturated(t *testing.T) {
	s := NewShaper(traceShape(t, "1\n1\n3\n", 0), 1500, 1)
	want := []int64{1, 1, 3, 4, 4, 6, 7, 7, 9}
	for i, w := range want {
		at, v := s.Admit(0, 1500, 1)
		if v != Pass || at != w*ms {
			t.Fatalf("packet %d: deliver %v %v, want %d ms", i, time.Duration(at), v, w)
		}
	}
}

// The byte rule: small packets share an opportunity while they queue, a super-packet takes
// several, and an opportunity that finds the queue empty is lost with its leftover bytes.
func TestShaperTraceBytes(t *testing.T) {
	s := NewShaper(traceShape(t, "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", 0), 1500, 1)
	steps := []struct {
		now   int64 // ms
		bytes int
		want  int64 // ms
	}{
		{0, 500, 1}, {0, 500, 1}, {0, 500, 1}, // three share the opportunity at 1 ms
		{0, 500, 2},    // the fourth takes the next
		{0, 4000, 4},   // 1000 left at 2 ms, then 3 and 4 ms exactly
		{0, 400, 5},    // 1100 left at 5 ms
		{0, 200, 5},    // fits the leftover: 900 left
		{0, 1000, 6},   // does not: takes 100 of 6
		{7, 100, 7},    // the queue ran empty: 6's leftover is lost, 7 is taken
		{7, 100, 7},    // queued at 7 ms, shares it
		{8, 1500, 8},   // arrives at 8 ms: 7's leftover is gone, takes 8
		{25, 1500, 25}, // the trace repeats: 25 ms is the line "5" of its third period
	}
	for i, st := range steps {
		at, v := s.Admit(st.now*ms, st.bytes, 1)
		if v != Pass || at != st.want*ms {
			t.Fatalf("step %d (%d B at %d ms): deliver %v %v, want %d ms", i, st.bytes, st.now, time.Duration(at), v, st.want)
		}
	}
}

// The replay starts at the origin, Offset into the trace; delay and jitter still apply.
func TestShaperTraceOriginOffsetDelay(t *testing.T) {
	sh := traceShape(t, "2\n4\n6\n8\n", 3*time.Millisecond)
	sh.Delay = 10 * time.Millisecond
	s := NewShaper(sh, 1500, 1)
	s.SetOrigin(100 * ms)
	// At link time 0 the trace is at 3 ms: the next opportunity is at trace time 4, link time 1.
	for i, w := range []int64{101, 103, 105, 107, 109} {
		at, _ := s.Admit(100*ms, 1500, 1)
		if at != w*ms+10*ms {
			t.Fatalf("packet %d: deliver %v, want %d ms + 10 ms delay", i, time.Duration(at), w)
		}
	}
}

// Whatever the packet sizes, a saturated trace link delivers the trace's bytes each second, to
// within the largest packet (one that straddles a second's end counts in the second it leaves).
func TestShaperTracePerSecond(t *testing.T) {
	// A synthetic trace of 5 s whose rate changes each second, with bursts and gaps.
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for sec := range 5 {
		perMs := []int{0, 1, 2, 5, 1}[sec]
		for m := sec*1000 + 1; m <= (sec+1)*1000; m++ {
			for range rng.IntN(2*perMs + 1) {
				fmt.Fprintf(&b, "%d\n", m)
			}
		}
	}
	fmt.Fprintf(&b, "%d\n", 5000)
	sh := traceShape(t, b.String(), 0)
	s := NewShaper(sh, 1500, 1)
	delivered := make([]int64, 10)
	now := int64(0)
	for now < 10*int64(time.Second) {
		size := 40 + rng.IntN(1461)
		segs := 1
		if rng.IntN(10) == 0 { // now and then a super-packet
			segs = 1 + rng.IntN(8)
			size = segs * 1500
		}
		at, v := s.Admit(now, size, segs)
		if v != Pass {
			t.Fatalf("dropped at %v", time.Duration(now))
		}
		if sec := (at - 1) / int64(time.Second); sec < 10 { // (sec, sec+1] as the trace counts
			delivered[sec] += int64(size)
		}
		// Keep the queue from running empty: the next packet arrives well before this one leaves.
		now = max(now, at-50*ms)
	}
	for sec, got := range delivered {
		from := time.Duration(sec) * time.Second
		want := sh.Trace.Bytes(from, from+time.Second)
		if d := got - want; d > 8*1500 || d < -8*1500 {
			t.Errorf("second %d: delivered %d bytes, the trace holds %d", sec, got, want)
		}
	}
}

// A trace link's default queue is one bandwidth-delay product at the trace's mean rate.
func TestQueueLimitsTrace(t *testing.T) {
	sh := traceShape(t, "1\n", 0) // 12 Mbit/s
	sh.QueuePackets, sh.Delay = 0, 100*time.Millisecond
	if p, b := QueueLimits(sh, 1500); p != 0 || b != 300_000 {
		t.Errorf("QueueLimits = %d packets, %d bytes; want 0 and 300000 (12 Mbit/s for 200 ms)", p, b)
	}
	sh.Delay = time.Millisecond
	if _, b := QueueLimits(sh, 1500); b != 64*1500 {
		t.Errorf("QueueLimits of a short link = %d bytes, want 64 packets", b)
	}
}

func TestShaperTraceAllocs(t *testing.T) {
	s := NewShaper(traceShape(t, "1\n1\n3\n", 0), 1500, 1)
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() { now += ms; s.Admit(now, 1500, 1) }); n != 0 {
		t.Errorf("Admit on a trace link allocates %v times", n)
	}
}
