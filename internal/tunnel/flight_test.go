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
