package accuracy

import (
	"testing"
	"time"
)

// The goodput bound sits around what TCP can reach, so that a shaper off in either direction
// fails: measured goodput is the ceiling scaled by how fast the shaper really runs.
func TestGoodputBound(t *testing.T) {
	const rate, mtu = 50e6, 1500
	if c := TCPCeiling(mtu); c < 0.9653 || c > 0.9654 {
		t.Fatalf("TCPCeiling(1500) = %v, want 1448/1500", c)
	}
	for _, tc := range []struct {
		name    string
		shaper  float64 // the shaper's real rate over the configured one
		wantsOK bool
	}{
		{"exact", 1, true},
		{"1.5 % slow", 0.985, true},
		{"4 % fast", 1.04, true},
		{"9 % fast", 1.09, false},
		{"6 % fast", 1.06, false},
		{"6 % slow", 0.94, false},
	} {
		steady := rate * TCPCeiling(mtu) * tc.shaper
		if rel, ok := goodputBound(steady, rate, mtu); ok != tc.wantsOK {
			t.Errorf("%s: goodput %.2f Mbit/s: error %+.2f %%, ok %v; want ok %v", tc.name, steady/1e6, 100*rel, ok, tc.wantsOK)
		}
	}
}

func TestQueueBound(t *testing.T) {
	// 52 datagrams through while the burst took 4.8 ms: two left the queue meanwhile at 5 Mbit/s.
	if got := queueHeld(52, 4800*time.Microsecond, 5e6, 1500); got < 49.99 || got > 50.01 {
		t.Fatalf("queueHeld = %v, want 50", got)
	}
	for _, tc := range []struct {
		measured, configured float64
		ok                   bool
	}{
		{50, 50, true}, {51, 50, true}, {53.4, 50, true}, {53.6, 50, false}, {46.4, 50, false},
		{40, 40, true}, {64, 40, false}, {20, 40, false},
	} {
		if ok := queueBound(tc.measured, tc.configured); ok != tc.ok {
			t.Errorf("queueBound(%v, %v) = %v, want %v", tc.measured, tc.configured, ok, tc.ok)
		}
	}
}
