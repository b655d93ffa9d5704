package sched

import (
	"errors"
	"math"
	"testing"
)

// modelPath is a path of a given capacity fed by traffic of a given offered rate: over one
// sample window the tunnel sends min(offered, pacing rate) and the path delivers at most its
// capacity.
const window, rtt = int64(100e6), int64(10e6) // a 100 ms sample window, a 10 ms round trip

func step(c *Capacity, capacity, offered float64) (delivered, sent float64) {
	sent = min(offered, c.PacingRate())
	delivered = min(sent, capacity)
	c.OnSample(delivered, sent, window, rtt, rtt)
	return delivered, sent
}

func newCap(t *testing.T) *Capacity {
	t.Helper()
	c, err := NewCapacity(CapacityConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

func TestCapacityFindsTheRate(t *testing.T) {
	for _, capacity := range []float64{1e6, 100e6, 300e6, 1e9, 10e9} {
		c := newCap(t)
		n := 0
		for ; n < 100 && c.Phase() != PhaseCruise; n++ {
			step(c, capacity, math.Inf(1))
		}
		if c.Phase() != PhaseCruise {
			t.Fatalf("capacity %.0f: still in %v after %d samples", capacity, c.Phase(), n)
		}
		// Doubling from 100 Mbit/s reaches 10 Gbit/s in 7 samples; a few more find the end.
		if n > 16 {
			t.Errorf("capacity %.0f: %d samples to leave startup", capacity, n)
		}
		if !within(c.Estimate(), capacity, 0.01) {
			t.Errorf("capacity %.0f: estimate %.0f", capacity, c.Estimate())
		}
		// In cruise, one cycle sends on average about the capacity: it neither starves the
		// path nor floods it.
		var sum float64
		for range 8 {
			_, sent := step(c, capacity, math.Inf(1))
			sum += sent
		}
		if avg := sum / 8; !within(avg, capacity, 0.02) {
			t.Errorf("capacity %.0f: cruise sends %.0f on average", capacity, avg)
		}
	}
}

func TestCapacityKeepsEstimateWhileIdle(t *testing.T) {
	c := newCap(t)
	for range 30 {
		step(c, 300e6, math.Inf(1))
	}
	for range 500 {
		step(c, 300e6, 1e6) // application limited: says nothing about the path
	}
	if !within(c.Estimate(), 300e6, 0.01) {
		t.Fatalf("estimate after idling %.0f, want 300e6", c.Estimate())
	}
}

func TestCapacityFollowsADrop(t *testing.T) {
	c := newCap(t)
	for range 30 {
		step(c, 300e6, math.Inf(1))
	}
	n := 0
	for ; n < 100 && !within(c.Estimate(), 100e6, 0.01); n++ {
		step(c, 100e6, math.Inf(1))
	}
	// The first sample at 100e6 lost two thirds of what it was sent, and so did the second
	// (drained meanwhile): the estimate falls on the second (before the collapse, it was the
	// largest of the last 10 busy samples: 11 samples).
	if n > 2 {
		t.Fatalf("estimate %.0f after %d samples at 100e6", c.Estimate(), n)
	}
}

// A capacity that falls without loss, into a queue that grows (a cellular link's buffer): the
// first such sample drains below the estimate and keeps it; on the second the estimate falls to
// what the path delivered, and the pacing drains below it while the queue stands, for at most
// 1+maxDrains samples.
func TestCapacityCollapsesIntoAQueue(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 50e6, math.Inf(1))
	}
	est := c.Estimate()
	c.OnSample(10e6, 49e6, window, rtt+200*int64(1e6), rtt) // a fifth of the rate, 200 ms of queue
	if c.Estimate() != est || c.Gain() >= 1 {
		t.Fatalf("after one full sample at a fifth of the rate: estimate %.0f, gain %v; want %.0f kept, drained", c.Estimate(), c.Gain(), est)
	}
	c.OnSample(10e6, c.PacingRate(), window, rtt+250*int64(1e6), rtt) // the same again
	if !within(c.Estimate(), 10e6, 0.01) || c.Phase() != PhaseDrain {
		t.Fatalf("after a full sample at a fifth of the rate: estimate %.0f, %v", c.Estimate(), c.Phase())
	}
	n := 0
	for ; c.Phase() == PhaseDrain && n < 10; n++ {
		if g := c.Gain(); g >= 1 {
			t.Fatalf("gain %v while draining", g)
		}
		c.OnSample(10e6, c.PacingRate(), window, rtt+100*int64(1e6), rtt) // the queue still stands
	}
	if n != 1+maxDrains {
		t.Errorf("%d samples drained while the queue stood, want %d", n, 1+maxDrains)
	}
	// A queue gone at once: one drain sample only, then startup finds the rate again.
	c = newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 50e6, math.Inf(1))
	}
	c.OnSample(10e6, 49e6, window, rtt+200*int64(1e6), rtt)
	c.OnSample(10e6, 37e6, window, rtt+250*int64(1e6), rtt)
	c.OnSample(10e6, 7.5e6, window, rtt, rtt)
	if c.Phase() != PhaseStartup {
		t.Errorf("%v after a collapse's drain without a queue, want startup", c.Phase())
	}
}

// A cellular link's rate falls for a moment and comes back: after the collapse the estimate
// is back near the rate within a few samples (startup), not after many probing cycles.
func TestCapacityRegrowsAfterCollapse(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 40e6, math.Inf(1))
	}
	c.OnSample(4e6, 39e6, window, rtt+200*int64(1e6), rtt) // the link fell to a tenth
	c.OnSample(4e6, 29e6, window, rtt+250*int64(1e6), rtt) // and stays there
	if !within(c.Estimate(), 4e6, 0.01) {
		t.Fatalf("estimate %.0f after the fall, want 4e6", c.Estimate())
	}
	n := 0
	for ; c.Estimate() < 0.9*40e6 && n < 100; n++ {
		step(c, 40e6, math.Inf(1)) // the link is back at 40 Mbit/s
	}
	if n > 6 {
		t.Errorf("%d samples to find 40 Mbit/s again after a fall to 4 (estimate %.0f), want at most 6", n, c.Estimate())
	}
	for range 20 {
		step(c, 40e6, math.Inf(1))
	}
	if c.Phase() != PhaseCruise || !within(c.Estimate(), 40e6, 0.05) {
		t.Errorf("%v at %.0f twenty samples later, want cruise at 40e6", c.Phase(), c.Estimate())
	}
}

// A sample that was full but delivered nearly the estimate is noise on a steady path, and an
// outage does not stop the path: the estimate falls at most to a sixteenth.
func TestCapacityCollapseBounds(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 100e6, math.Inf(1))
	}
	est := c.Estimate()
	c.OnSample(0.85*est, 0.99*est, window, rtt+5*int64(1e6), rtt) // queued, 85 %
	if c.Estimate() != est {
		t.Fatalf("estimate %.0f after a queued sample at 85 %%, want %.0f kept", c.Estimate(), est)
	}
	c.OnSample(0, est, window, rtt, rtt)      // nothing delivered
	c.OnSample(0, 0.75*est, window, rtt, rtt) // twice
	if !within(c.Estimate(), est/16, 0.01) {
		t.Fatalf("estimate %.0f after an outage, want %.0f", c.Estimate(), est/16)
	}
}

// A path the scheduler offers less than its estimate (the slower of two unequal paths, given
// only what arrives in time, or the first burst after an idle spell) delivers less than the
// estimate by the traffic's choice, and what it was sent is aligned with what it delivered only
// as well as its round trip is known: a queue then (a CPU stall, the burst) is no fall in its
// capacity.
// The estimate stays; the same queue on a path offered its estimate is a fall.
func TestCapacityOfferedLittleDoesNotCollapse(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 25e6, math.Inf(1))
	}
	est := c.Estimate()
	long := int64(100e6) // a round trip of 100 ms
	for _, s := range []struct{ delivered, sent float64 }{
		{0.3 * est, 0.4 * est},  // offered 40 %, a third of it not delivered yet
		{0.66 * est, 0.8 * est}, // offered 80 %, the windows a sixth out of step
		{0.1 * est, 0.2 * est},  // a burst after an idle spell
	} {
		c.OnSample(s.delivered, s.sent, 3*window, long+40*int64(1e6), long)
		if c.Estimate() != est {
			t.Fatalf("estimate %.0f after a queued sample that delivered %.2f of %.2f sent (of the estimate), want %.0f kept",
				c.Estimate(), s.delivered/est, s.sent/est, est)
		}
	}
	c.OnSample(0.3*est, 0.98*est, 3*window, long+40*int64(1e6), long)
	c.OnSample(0.3*est, 0.75*est, 3*window, long+60*int64(1e6), long)
	if !within(c.Estimate(), 0.3*est, 0.01) || c.Phase() != PhaseDrain {
		t.Fatalf("estimate %.0f (%v) after a queued sample offered the estimate that delivered 0.3 of it, want %.0f and drain",
			c.Estimate(), c.Phase(), 0.3*est)
	}
}

// A slower path of two, offered only what arrives in time, never carries the initial guess
// (100 Mbit/s) nor half of it: its first sample that shows a queue (or loss) enters, so that it
// is not paced and planned at the guess for ever.
func TestCapacityMeasuresAPathOfferedLessThanTheGuess(t *testing.T) {
	c := newCap(t)
	long := int64(100e6)
	c.OnSample(19e6, 20e6, 3*window, long, long) // no queue, nothing lost: says nothing
	if c.Measured() {
		t.Fatalf("measured (%.0f) after a sample that delivered all it was sent below the guess", c.Estimate())
	}
	c.OnSample(19e6, 21e6, 3*window, long+30*int64(1e6), long) // a queue grows
	if !c.Measured() || !within(c.Estimate(), 19e6, 0.01) {
		t.Fatalf("estimate %.0f (measured %v) after a queued sample at 19e6, want 19e6", c.Estimate(), c.Measured())
	}
}

// A path that loses what it is sent is busy even below its pacing rate: the estimate falls
// although the traffic never reached the estimate.
func TestCapacityLossyPathIsBusy(t *testing.T) {
	c := newCap(t)
	for range 30 {
		step(c, 300e6, math.Inf(1))
	}
	for range 11 {
		c.OnSample(50e6, 150e6, window, rtt, rtt) // sent 150, delivered 50: far below the pacing rate
	}
	if !within(c.Estimate(), 50e6, 0.01) {
		t.Fatalf("estimate %.0f, want 50e6", c.Estimate())
	}
}

// A long path (100 ms round trip, 300 ms windows) measured at half its rate, with data waiting
// for it: a window shows what its pacing sent only after a round trip, two thirds of a
// probe's excess. The probes find room, and two in a row start the search again: the rate is
// found within a few cycles, not one probe's few per cent per cycle.
func TestCapacityFollowsARiseOnALongPath(t *testing.T) {
	c := newCap(t)
	const win, long = 3 * window, int64(100e6)
	prev := 0.0
	sample := func(capacity float64) {
		pace := c.PacingRate()
		sent := pace/3 + 2*pace/3 // the window's sends, as delivered: a round trip late
		if prev > 0 {
			sent = prev/3 + 2*pace/3
		}
		prev = pace
		c.OnSample(min(sent, capacity), sent, win, long, long)
	}
	for c.Phase() != PhaseCruise {
		sample(12e6)
	}
	n := 0
	for ; n < 100 && c.Estimate() < 0.9*25e6; n++ {
		sample(25e6)
	}
	if n > 20 {
		t.Fatalf("%d samples (300 ms each) to find 0.9 of 25 Mbit/s from %v, want at most 20", n, 12e6)
	}
}

func TestCapacityFollowsARise(t *testing.T) {
	c := newCap(t)
	for range 30 {
		step(c, 100e6, math.Inf(1))
	}
	n := 0
	for ; n < 200 && !within(c.Estimate(), 200e6, 0.01); n++ {
		step(c, 200e6, math.Inf(1))
	}
	// Probes 5 % higher (half a 10 ms BDP over 100 ms); one that finds room is repeated after
	// its drain, and two that found room start the search again: 100 -> 200 within the first
	// cycle, two probes and a few startup samples.
	if n > 16 {
		t.Fatalf("estimate %.0f after %d samples at 200e6", c.Estimate(), n)
	}
}

func TestCapacityRaisedByLightTraffic(t *testing.T) {
	c := newCap(t)
	c.OnSample(150e6, 150e6, window, rtt, rtt) // more than the 100 Mbit/s guess arrived: the path carries that much
	if c.Estimate() != 150e6 {
		t.Fatalf("estimate %.0f, want 150e6", c.Estimate())
	}
}

func TestCapacityIgnoresBadSamples(t *testing.T) {
	c := newCap(t)
	for _, s := range [][2]float64{{math.NaN(), 1}, {math.Inf(1), 1}, {-1, 1}, {1, math.NaN()}, {1, -5}} {
		c.OnSample(s[0], s[1], window, rtt, rtt)
	}
	c.OnSample(50e6, 50e6, 0, rtt, rtt)
	c.OnSample(50e6, 50e6, window, -1, rtt)
	c.OnSample(50e6, 50e6, window, rtt, -1)
	if c.Estimate() != 100e6 || c.Phase() != PhaseStartup {
		t.Fatalf("estimate %.0f phase %v after bad samples", c.Estimate(), c.Phase())
	}
}

func TestCapacityConfigValidate(t *testing.T) {
	bad := []CapacityConfig{
		{Initial: -1}, {Initial: math.Inf(1)}, {Window: -1}, {Window: 5000},
		{StartupGain: 0.5}, {ProbeGain: 0.9}, {ProbeGain: 2.5}, {DrainGain: 1.5}, {DrainGain: -1},
		{CycleLength: 1}, {CruiseGain: 1.1}, {CruiseGain: 0.3}, {BusyShare: 2}, {LossyShare: -0.5},
	}
	for _, c := range bad {
		if _, err := NewCapacity(c); !errors.Is(err, ErrCapacityConfig) {
			t.Errorf("%+v: err %v, want ErrCapacityConfig", c, err)
		}
	}
	if _, err := NewCapacity(CapacityConfig{}); err != nil {
		t.Fatal(err)
	}
}

func TestPacedUsesPaceRate(t *testing.T) {
	s, err := NewPaced(PacedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Capacity says 100 Mbit/s but the estimator probes at 115: over one second the path
	// is sent 115 Mbit/s (plus one burst).
	paths := []Path{{ID: 0, Up: true, Capacity: 100e6, PaceRate: 115e6}}
	var now int64
	sent := 0
	for now < 1e9 {
		_, at, ok := s.Next(now, paths, 1500)
		if !ok {
			t.Fatal("no path")
		}
		if at > now {
			now = at
			continue
		}
		sent += 1500
	}
	rate := float64(sent) * 8
	if !within(rate, 115e6, 0.02) {
		t.Fatalf("paced at %.0f bit/s, want about 115e6", rate)
	}
}

// A queue that grows (round trip well above the minimum, more sent than delivered) makes the
// next sample drain; a long round trip on a path that delivered all it was sent (the sites'
// CPU) does not.
func TestCapacityDrainsAStandingQueue(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 100e6, math.Inf(1))
	}
	for range 3 {
		c.OnSample(100e6, 100e6, window, rtt, rtt) // cruise
	}
	cruise := CapacityConfig{}.Defaults().CruiseGain
	if g := c.Gain(); g != cruise {
		t.Fatalf("gain %v in cruise, want %v", g, cruise)
	}
	c.OnSample(99.5e6, 99.5e6, window, rtt+5*int64(1e6), rtt)
	if g := c.Gain(); g != cruise {
		t.Fatalf("gain %v after a long RTT with all sent delivered, want %v (no drain)", g, cruise)
	}
	c.OnSample(100e6, 105e6, window, rtt+5*int64(1e6), rtt)
	if g := c.Gain(); g > 1-queueDrain {
		t.Fatalf("gain %v after a queued sample, want at most %v", g, 1-queueDrain)
	}
	c.OnSample(100e6, 95e6, window, rtt, rtt)
	if g := c.Gain(); g != cruise {
		t.Fatalf("gain %v after the drain, want %v", g, cruise)
	}
}

// A queued sample does not lower the estimate (a busy CPU also delays probes), it drains.
func TestCapacityQueueLeavesEstimate(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 100e6, math.Inf(1))
	}
	est := c.Estimate()
	for range 30 { // busy and queued, delivering what was sent
		c.OnSample(0.95*est, 0.95*est, window, rtt+10*int64(1e6), rtt)
	}
	if got := c.Estimate(); got < 0.95*est {
		t.Fatalf("estimate %.0f after queued samples at %.0f, want no lower", got, 0.95*est)
	}
}

// A probe that starts over a standing queue (the round trip well above its minimum, the path
// delivering all it is sent) goes half as far above the estimate, at least minProbe: the
// queue it would add to is already partly full. Without a queue the probe is the usual one.
func TestCapacityProbesLessOverAStandingQueue(t *testing.T) {
	probeGain := func(queue int64) float64 {
		c := newCap(t)
		for c.Phase() != PhaseCruise {
			step(c, 100e6, math.Inf(1))
		}
		for range 2 * (CapacityConfig{}).Defaults().CycleLength {
			if c.Gain() > 1 {
				return c.Gain()
			}
			est := c.Estimate()
			c.OnSample(est*c.Gain(), est*c.Gain(), window, rtt+queue, rtt)
		}
		t.Fatal("no probe in two cycles")
		return 0
	}
	plain := probeGain(0)
	if want := 1 + probeExcess(CapacityConfig{}.Defaults().ProbeGain, window, rtt); plain != want {
		t.Fatalf("probe gain %v without a queue, want %v", plain, want)
	}
	if got, want := probeGain(5*int64(1e6)), 1+max((plain-1)/2, minProbe); got != want {
		t.Errorf("probe gain %v over a 5 ms queue, want %v (half of %v)", got, want, plain)
	}
}

// A cellular link that stalls: one sample window holds a few hundred milliseconds in which the
// path delivered nothing, then the next delivers what queued meanwhile. That is no fall in
// its capacity: the estimate stays, the pacing drains for that one window and returns, and the
// path goes on in cruise rather than through startup again. A fall that lasts (two windows in
// a row) still collapses.
func TestCapacityHoldsThroughAStall(t *testing.T) {
	c := newCap(t)
	for c.Phase() != PhaseCruise {
		step(c, 10e6, math.Inf(1))
	}
	for range 16 {
		step(c, 10e6, math.Inf(1))
	}
	est := c.Estimate()
	// a 300 ms window with a 250 ms stall: a sixth delivered, the rest queued
	c.OnSample(0.17*est, est, 3*window, rtt+250*int64(1e6), rtt)
	if c.Estimate() != est || c.Gain() != 0.75 {
		t.Fatalf("in the stalled window: estimate %.0f, gain %v; want %.0f kept and the drain gain", c.Estimate(), c.Gain(), est)
	}
	// the next window delivers the queue and the path's rate
	c.OnSample(1.4*est, 0.75*est, 3*window, rtt+20*int64(1e6), rtt)
	if c.Estimate() < est || c.Phase() != PhaseCruise || c.Gain() < 0.9 {
		t.Fatalf("after the stall: estimate %.0f (was %.0f), %v, gain %v; want the estimate kept, cruise", c.Estimate(), est, c.Phase(), c.Gain())
	}
}

// A queue that overflows (OnOverflow) ends a re-startup at once, and drains the current sample
// in cruise; the first startup, whose estimate is not yet the path's, goes on.
func TestCapacityOverflowEndsARestartup(t *testing.T) {
	c := newCap(t)
	step(c, 50e6, math.Inf(1))
	if c.Phase() != PhaseStartup {
		t.Fatalf("phase %v after one sample, want startup", c.Phase())
	}
	if c.OnOverflow() || c.Phase() != PhaseStartup || c.Gain() != c.cfg.StartupGain {
		t.Fatalf("the first startup ended on an overflow: phase %v, gain %v", c.Phase(), c.Gain())
	}
	for range 30 {
		step(c, 50e6, math.Inf(1))
	}
	if c.Phase() != PhaseCruise {
		t.Fatalf("phase %v after 30 samples, want cruise", c.Phase())
	}
	est := c.Estimate()
	// In cruise: the current sample drains, whatever the cycle's place.
	if !c.OnOverflow() || c.Gain() >= 1 {
		t.Fatalf("cruise after an overflow: gain %v, want below 1", c.Gain())
	}
	if c.OnOverflow() {
		t.Fatal("a second overflow in the same draining sample changed the gain")
	}
	if c.Estimate() != est {
		t.Fatalf("an overflow moved the estimate: %.0f, was %.0f", c.Estimate(), est)
	}
	// The path grows: probes find room and the estimator starts up again; an overflow ends
	// that startup at once, with the estimate it had.
	n := 0
	for ; n < 40 && c.Phase() != PhaseStartup; n++ {
		step(c, 200e6, math.Inf(1))
	}
	if c.Phase() != PhaseStartup {
		t.Fatalf("no startup after %d samples on a path grown fourfold", n)
	}
	est = c.Estimate()
	if !c.OnOverflow() || c.Phase() != PhaseDrain || c.Gain() >= 1 {
		t.Fatalf("re-startup after an overflow: phase %v, gain %v, want drain", c.Phase(), c.Gain())
	}
	if c.Estimate() != est {
		t.Fatalf("an overflow moved the estimate: %.0f, was %.0f", c.Estimate(), est)
	}
	// From there it finds the rate again, as after any drain.
	for n = 0; n < 60 && !within(c.Estimate(), 200e6, 0.01); n++ {
		step(c, 200e6, math.Inf(1))
	}
	if !within(c.Estimate(), 200e6, 0.01) {
		t.Fatalf("estimate %.0f after %d more samples at 200e6", c.Estimate(), n)
	}
}
