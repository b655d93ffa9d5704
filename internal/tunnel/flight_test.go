package tunnel

import (
	"testing"
	"time"
)

func TestSentLogInFlight(t *testing.T) {
	ms := int64(time.Millisecond)
	var l sentLog
	if got := l.inFlight(0, 10*time.Millisecond); got != 0 {
		t.Fatalf("empty log: %d", got)
	}
	// 1000 bytes every millisecond for a second.
	for i := int64(0); i < 1000; i++ {
		l.add(i*ms, 1000)
	}
	now := 999 * ms
	for _, tt := range []struct {
		rtt      time.Duration
		min, max int
	}{
		{20 * time.Millisecond, 19000, 21000}, // within a 2 ms slot of the truth
		{100 * time.Millisecond, 99000, 101000},
		{2 * time.Second, 1000000, 1000000}, // everything in the log
		{0, 0, 0},
	} {
		if got := l.inFlight(now, tt.rtt); got < tt.min || got > tt.max {
			t.Errorf("in flight over %v: %d, want %d..%d", tt.rtt, got, tt.min, tt.max)
		}
	}
	// After a quiet RTT nothing is in flight.
	if got := l.inFlight(now+50*ms, 20*time.Millisecond); got != 0 {
		t.Errorf("after a quiet RTT: %d", got)
	}
	// The ring wraps: far more slots than it holds, and the span it keeps still answers.
	for i := int64(1000); i < 10000; i++ {
		l.add(i*2*ms, 500)
	}
	if l.n != sentSlots {
		t.Fatalf("slots %d", l.n)
	}
	if got := l.inFlight(9999*2*ms, 100*time.Millisecond); got < 24500 || got > 26000 {
		t.Errorf("after wrapping: %d, want about 25000", got)
	}
}

func BenchmarkSentLog(b *testing.B) {
	var l sentLog
	now := int64(0)
	for b.Loop() {
		now += 10000
		l.add(now, 1400)
		_ = l.inFlight(now, 30*time.Millisecond)
	}
}

func TestBaseRTTRemembersMinutes(t *testing.T) {
	ms, sec := time.Millisecond, int64(time.Second)
	var b baseRTT
	if got := b.observe(0, 0); got != 0 {
		t.Fatalf("nothing measured: %v", got)
	}
	b.observe(0, 20*ms)
	// A standing queue raises the estimator's 10-20 s minimum; the base stays.
	for at := int64(1); at < 140; at++ {
		if got := b.observe(at*sec, 60*ms); got != 20*ms {
			t.Fatalf("at %d s: %v, want 20ms", at, got)
		}
	}
	// After two epochs without the old minimum, the new one shows.
	var got time.Duration
	for at := int64(140); at <= 320; at++ {
		got = b.observe(at*sec, 60*ms)
	}
	if got != 60*ms {
		t.Errorf("after 320 s: %v, want 60ms", got)
	}
	if got := b.observe(321*sec, 0); got != 60*ms {
		t.Errorf("no sample: %v", got)
	}
}

func TestWindow(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		capacity, delivery float64
		base               time.Duration
		want               int
	}{
		{0, 0, 20 * ms, 0},            // no rate: the scheduler derives it
		{0, 5e6, 0, 0},                // no RTT
		{0, 5e6, 20 * ms, 21250},      // 5 Mbit/s × (24 + 10) ms
		{0, 8e6, 100 * ms, 130000},    // 8 Mbit/s × (120 + 10) ms
		{8e6, 1e6, 100 * ms, 130000},  // a configured capacity wins over the delivery rate
		{0, 1e6, 200 * ms, 31250},     // 1 Mbit/s × 250 ms
		{0, 1e3, 10 * ms, minWindow},  // a trickle still gets the floor
		{-1, 2e6, 10 * ms, minWindow}, // nonsense capacity: the delivery rate
	} {
		if got := window(tt.capacity, tt.delivery, tt.base); got != tt.want {
			t.Errorf("window(%v, %v, %v) = %d, want %d", tt.capacity, tt.delivery, tt.base, got, tt.want)
		}
	}
}

// The budget of sparse flows' packets starts full, refills at its rate up to its burst, and
// stays right after any gap, however long (a tunnel up for days before its first sparse packet
// must not overflow the refill).
func TestSparseBudget(t *testing.T) {
	const rate, burst = sparseCopyRate, sparseCopyBurst
	var b budget
	day := int64(24 * time.Hour)
	now := 30 * day
	n := 0
	for b.take(now, 1000, rate, burst) {
		n++
	}
	if n != burst/1000 {
		t.Fatalf("took %d packets of 1000 bytes at once, want the burst's %d", n, burst/1000)
	}
	now += int64(8 * time.Millisecond) // 1000 bytes at 125 kB/s
	if !b.take(now, 1000, rate, burst) || b.take(now, 1000, rate, burst) {
		t.Fatal("8 ms after the burst: want exactly one packet of 1000 bytes")
	}
	now += 300 * day
	n = 0
	for b.take(now, 1000, rate, burst) {
		n++
	}
	if n != burst/1000 {
		t.Fatalf("after 300 days: took %d packets, want %d", n, burst/1000)
	}
}
