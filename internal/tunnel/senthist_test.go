package tunnel

import (
	"math"
	"testing"
)

// A path sent 1 MB/s whose counters are recorded every 10 ms: the counters at any time in the
// last second are found (interpolated between entries histStep apart), at now they are the
// current ones, and before the oldest entry the oldest.
func TestSendHistory(t *testing.T) {
	var h sendHistory
	const ms = int64(1e6)
	start := 5000 * ms
	at := func(t int64) (uint64, uint64) { return uint64((t - start) / ms * 1000), uint64((t - start) / ms) }
	now := start
	for ; now <= start+3000*ms; now += 10 * ms {
		b, p := at(now)
		h.record(now, b, p)
	}
	now -= 10 * ms
	cb, cp := at(now)
	for _, back := range []int64{0, 5, 100, 333, 1000, 2000} {
		x := now - back*ms
		b, p := h.countersAt(x, now, cb, cp)
		wb, wp := at(x)
		if math.Abs(b-float64(wb)) > 1e-6 || math.Abs(p-float64(wp)) > 1e-6 {
			t.Errorf("%d ms ago: %.1f bytes, %.1f packets, want %d, %d", back, b, p, wb, wp)
		}
	}
	oldest := now - int64(histLen-1)*histStep
	ob, _ := at(oldest)
	if b, _ := h.countersAt(start, now, cb, cp); b != float64(ob) {
		t.Errorf("before the oldest entry: %.0f bytes, want the oldest entry's %d", b, ob)
	}
	var empty sendHistory
	if b, p := empty.countersAt(now-ms, now, 7, 1); b != 7 || p != 1 {
		t.Errorf("no entries: %v, %v, want the current counters", b, p)
	}
}
