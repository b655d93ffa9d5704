package tunnel

import (
	"testing"

	"braid/internal/sched"
)

// A path's nacked losses end its estimator's probing only as a burst: at least overflowLost
// packets, and at least overflowShare of what the path was sent since the capacity sample
// began; a new sample starts the count again.
func TestOverflowNeedsABurst(t *testing.T) {
	c, err := sched.NewCapacity(sched.CapacityConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const capacity = 50e6
	for range 30 { // a 100 ms window, a 10 ms round trip, traffic enough for any rate
		sent := c.PacingRate()
		c.OnSample(min(sent, capacity), sent, 100e6, 10e6, 10e6)
	}
	if c.Phase() != sched.PhaseCruise {
		t.Fatalf("estimator in %v after 30 samples, want cruise", c.Phase())
	}
	pp := &peerPath{capEst: c}
	pp.txPackets.Store(1000) // since the sample began: a burst is at least 30 of them
	for lost := 1; lost <= 29; lost++ {
		if pp.noteLossesLocked(1) {
			t.Fatalf("%d losses in 1000 packets counted as an overflow", lost)
		}
	}
	if !pp.noteLossesLocked(1) || c.Gain() >= 1 {
		t.Fatalf("30 losses in 1000 packets: no overflow (gain %v)", c.Gain())
	}
	// A new sample's window: the count starts again, from the packets sent by then.
	pp.startLossWindowLocked(pp.txPackets.Load())
	pp.txPackets.Add(10)
	if pp.noteLossesLocked(7) {
		t.Fatal("7 losses counted as an overflow (fewer than overflowLost)")
	}
	// Without an estimator (a configured capacity) nothing is counted.
	if (&peerPath{}).noteLossesLocked(100) {
		t.Fatal("a path with a configured capacity reported an overflow")
	}
}
