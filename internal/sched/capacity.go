package sched

import (
	"cmp"
	"errors"
	"fmt"
	"math"
)

// ErrCapacityConfig is returned by CapacityConfig.Validate.
var ErrCapacityConfig = errors.New("sched: invalid capacity config")

// CapacityConfig tunes Capacity. Zero fields take the values of Defaults.
type CapacityConfig struct {
	// Initial is the estimate, in bit/s, before the first measurement.
	Initial float64
	// Window is how many busy samples the estimate (their maximum) remembers.
	Window int
	// StartupGain multiplies the estimate while the path's rate is still being found.
	// DrainGain is the gain of the one sample after startup. Once the rate has been found,
	// each cycle of CycleLength samples starts with one sample that probes above the
	// estimate (at most ProbeGain) and one that drains as much below it.
	StartupGain, ProbeGain, DrainGain float64
	CycleLength                       int
	// CruiseGain is the gain of the rest of the cycle: a little below 1, so that a queue
	// left by a probe or by a slightly high estimate (the maximum of noisy samples) drains
	// instead of standing until the next burst overflows it. Every point below 1 is a point
	// of the path left unused for most of the cycle: at 0.98 a constant path carried 0.985 of
	// what the same path paced at its configured capacity did (bench/tunnel, 300 + 100
	// Mbit/s: 0.934 against 0.950 of the sum), the mean gain of a cycle. A queue that grows
	// is drained on its own (the sample after a queued one), so the margin need only cover
	// the noise of a sample, which on a steady path is a few packets in thousands.
	CruiseGain float64
	// BusyShare: a sample counts as busy (the path carried all it was offered up to its pacing
	// rate, so the sample measures the path and not the traffic) when the sender sent at least
	// this share of the pacing rate over the sample's window. It is close to 1: a sample in
	// which the traffic fell a few percent short of the pacing rate (the flows inside limited
	// by their own windows or the sites' CPU) says nothing about the path, and at 0.9 such
	// samples walked a 300 Mbit/s path's estimate down to 256 within 20 s.
	BusyShare float64
	// LossyShare: a sample also counts as busy when the path delivered less than this share
	// of what was sent on it over the window (and at least half the estimate was sent): the
	// path is at its limit (queueing or dropping) even though the pacing rate was not reached.
	LossyShare float64
}

// Defaults returns c with zero fields set: 100 Mbit/s at first (a path is not held back much
// before it is measured), the maximum of 10 samples, gains 2 (startup), at most 1.25 (probe),
// 0.75 (drain) and 0.995 (cruise), cycles of 8, busy at 97 % of the pacing rate or when less
// than 90 % of what was sent arrives.
func (c CapacityConfig) Defaults() CapacityConfig {
	if c.Initial == 0 {
		c.Initial = 100e6
	}
	if c.Window == 0 {
		c.Window = 10
	}
	if c.StartupGain == 0 {
		c.StartupGain = 2
	}
	if c.ProbeGain == 0 {
		c.ProbeGain = 1.25
	}
	if c.DrainGain == 0 {
		c.DrainGain = 0.75
	}
	if c.CycleLength == 0 {
		c.CycleLength = 8
	}
	if c.CruiseGain == 0 {
		c.CruiseGain = 0.995
	}
	if c.BusyShare == 0 {
		c.BusyShare = 0.97
	}
	if c.LossyShare == 0 {
		c.LossyShare = 0.9
	}
	return c
}

// Validate reports whether c (after Defaults) is usable.
func (c CapacityConfig) Validate() error {
	switch {
	case !(c.Initial > 0) || math.IsInf(c.Initial, 0):
		return fmt.Errorf("%w: Initial %v", ErrCapacityConfig, c.Initial)
	case c.Window < 1 || c.Window > 1000:
		return fmt.Errorf("%w: Window %d (1 to 1000)", ErrCapacityConfig, c.Window)
	case !(c.StartupGain >= 1) || !(c.ProbeGain > 1 && c.ProbeGain < 2) || !(c.DrainGain > 0 && c.DrainGain < 1) ||
		math.IsInf(c.StartupGain, 0) || math.IsInf(c.ProbeGain, 0):
		return fmt.Errorf("%w: gains %v, %v, %v", ErrCapacityConfig, c.StartupGain, c.ProbeGain, c.DrainGain)
	case !(c.CruiseGain > 0.5 && c.CruiseGain <= 1):
		return fmt.Errorf("%w: CruiseGain %v (above 0.5, at most 1)", ErrCapacityConfig, c.CruiseGain)
	case c.CycleLength < 2:
		return fmt.Errorf("%w: CycleLength %d (at least 2)", ErrCapacityConfig, c.CycleLength)
	case !(c.BusyShare > 0 && c.BusyShare <= 1) || !(c.LossyShare > 0 && c.LossyShare <= 1):
		return fmt.Errorf("%w: BusyShare %v, LossyShare %v", ErrCapacityConfig, c.BusyShare, c.LossyShare)
	}
	return nil
}

// Phase is where a Capacity estimator is in its cycle.
type Phase uint8

// Phases of Capacity.
const (
	PhaseStartup Phase = iota // growing by StartupGain per sample until the rate stops growing
	PhaseDrain                // one sample below the estimate, to empty the queue startup built
	PhaseCruise               // cycles that probe, drain, then send a little below the estimate
)

func (p Phase) String() string {
	switch p {
	case PhaseStartup:
		return "startup"
	case PhaseDrain:
		return "drain"
	case PhaseCruise:
		return "cruise"
	}
	return "invalid"
}

// Capacity measures the rate a path can carry, for a tunnel whose paths have no configured
// capacity. It is fed delivery-rate samples (what the peer received on the path over a window,
// from its feedback) together with what was sent over the same window, and gives the rate to
// pace the path at.
//
// It follows the idea of BBR's bottleneck bandwidth: the estimate is the largest delivery rate
// of the last Window busy samples, and the pacing rate is the estimate times a gain that
// sometimes probes above it (to find more capacity) and then drains below it (to empty the
// queue the probe built). A sample is busy when the sender offered the path its pacing rate,
// or when the path delivered clearly less than it was sent: only then can the estimate go
// down; a sample taken while the traffic was lighter than the path (application limited)
// can raise the estimate but never lowers it, so a tunnel that idles keeps its knowledge.
//
// At start the pacing rate grows by StartupGain per busy sample; when three busy samples in a
// row fail to raise the estimate by a quarter, or two in a row are lossy (the path delivered
// clearly less than it was sent, with at least half the estimate sent), the rate has been
// found, and other paths get the traffic this one cannot carry: one draining sample
// follows, then cruise cycles of CycleLength samples: one probing sample at 1+e, one draining
// sample at 1-e, the rest at CruiseGain, where e is what half a bandwidth-delay product of queue can
// absorb over a sample window (0.5 × RTT / window, between 2 % and ProbeGain-1): a sample
// window is much longer than a round trip, and probing harder would overflow the path's queue
// and cost the traffic losses. A probe that finds room is repeated right after its drain, and
// when that one finds room too the path has grown by more than probing can follow: startup
// again. A full sample far below the estimate (the path's capacity fell) drops the estimate
// to it at once, drains, and starts up again, so that the rate is found again quickly when a
// cellular link's capacity comes back. A burst of losses reported between samples (OnOverflow:
// the path's queue overflowed) ends a re-startup at once and drains cruise's current sample.
type Capacity struct {
	cfg     CapacityConfig
	samples []float64 // ring of the last busy (or raising) samples
	next    int
	filled  int
	est     float64
	phase   Phase
	full    float64 // startup: the estimate that last grew by a quarter
	stalls  int     // startup: busy samples since
	lossy   int     // lossy samples in a row
	cycle   int     // cruise: index in the cycle (0 probes, 1 drains)
	excess  float64 // cruise: the probe's gain above 1, and the drain's below
	found   int     // cruise: probes in a row that found room
	drains  int     // drain: samples drained beyond the first
	regrow  bool    // drain: the estimate collapsed; startup follows
	// lastGain is the gain in force during the last sample's window (0 before the first).
	lastGain float64
	// suspect: the last sample looked like a fall in the path's capacity (a collapse); the
	// next one confirms it, or shows a stall that has passed.
	suspect bool
	// cruised: the estimator has reached cruise once (a startup since is a re-startup).
	cruised bool
}

// NewCapacity returns an estimator; zero fields of c take their defaults.
func NewCapacity(c CapacityConfig) (*Capacity, error) {
	c = c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &Capacity{cfg: c, samples: make([]float64, c.Window), est: c.Initial}, nil
}

// Estimate is the current capacity estimate in bit/s.
func (c *Capacity) Estimate() float64 { return c.est }

// Phase is the current phase.
func (c *Capacity) Phase() Phase { return c.phase }

// Measured reports whether a sample has entered the estimate: until then Estimate is the
// configured initial guess, not a measurement.
func (c *Capacity) Measured() bool { return c.filled > 0 }

// Gain is the current pacing gain.
func (c *Capacity) Gain() float64 {
	switch {
	case c.suspect:
		return c.cfg.DrainGain
	case c.phase == PhaseStartup:
		return c.cfg.StartupGain
	case c.phase == PhaseDrain:
		return c.cfg.DrainGain
	case c.cycle == 0:
		return 1 + c.excess
	case c.cycle == 1:
		return 1 - c.excess
	}
	return c.cfg.CruiseGain
}

// PacingRate is the rate in bit/s the path should be sent at: Estimate × Gain.
func (c *Capacity) PacingRate() float64 { return c.est * c.Gain() }

// OnSample takes one measurement over a window of length window (ns): delivered is the rate
// in bit/s at which the peer received on the path, sent the rate at which this side sent on
// it, both over (about) the same window; rtt is the path's smoothed round trip and minRTT its
// smallest recent one (0: unknown). Non-finite or negative values are ignored.
func (c *Capacity) OnSample(delivered, sent float64, window, rtt, minRTT int64) {
	if !(delivered >= 0) || math.IsInf(delivered, 0) || !(sent >= 0) || math.IsInf(sent, 0) || window <= 0 || rtt < 0 || minRTT < 0 {
		return
	}
	// Busy means the sender kept up with the pacing rate over the window, or sent the
	// estimate at least: a draining sample counts, and so does a startup sample in which the
	// path was offered its estimate and did not deliver more.
	pace := min(c.PacingRate(), c.est)
	before := c.est
	// The gain of the sample before this one (probeShown).
	prevGain := cmp.Or(c.lastGain, c.Gain())
	c.lastGain = c.Gain()
	// Lossy and queued need a volume worth judging: a few probes on an idle path say nothing,
	// nor does a path sent less than half its estimate (below). Until the first sample has
	// entered, the estimate is the configured guess, not the path's: a path that carries a
	// quarter of it and is offered less than the guess (the slower of two unequal paths,
	// given only what arrives in time) would never be measured, and would be paced and
	// planned at the guess. Then a volume of queuedBits over the window is enough.
	volume := sent >= 0.5*c.est
	if c.filled == 0 {
		volume = sent*float64(window)/1e9 >= queuedBits
	}
	lossy := volume && delivered < c.cfg.LossyShare*sent
	// A queue that grows also says the path is full: it delivered less than it was sent while
	// data waited for it. That is how a path is found full when the scheduler sends it only
	// what arrives in time (it is seldom offered its whole pacing rate), or when the pacing
	// rate is above what the path now carries but too little above it to lose much. A long
	// RTT alone says nothing: the sites' own CPU lengthens it too, and a path that delivered
	// all it was sent was limited by the sender (taking such samples as busy walked the
	// estimate of a 300 Mbit/s path down to 244 in 20 s). Nor does a queue with hardly any
	// data (probes on an idle path), nor one on a path sent less than half its estimate: that
	// traffic says little of the path's rate, and on a long path a window sent more at its end
	// than at its start has sent more than it delivered whatever the rate: a round trip
	// lengthened by a CPU stall would make such samples full, and their maximum would walk the
	// estimate of a slower path, offered only what arrives in time, down to what it was offered.
	queued := queueStands(rtt, minRTT) && sent >= queuedGrowth*delivered &&
		sent*float64(window)/1e9 >= queuedBits && volume
	busy := lossy || queued || sent >= c.cfg.BusyShare*pace
	if lossy {
		c.lossy++
	} else {
		c.lossy = 0
	}
	// The path's capacity fell: it was full (it lost or queued what it was sent) and delivered
	// clearly less than the estimate. The estimate, the maximum of the last Window samples,
	// would keep pacing above the path for seconds, and a cellular link whose capacity dropped
	// fivefold would hold a full queue all that time (round trips of a second under load). On
	// the second such sample in a row (below: a stall shows in one), the estimate falls to
	// what the path delivered (no lower than a sixteenth of itself, so that a sample in an
	// outage does not stop the path), and it drains the queue that built. Noise on a steady
	// path stays far above collapseShare.
	//
	// Only a path that was offered about its estimate can show that: one the scheduler gave
	// less (a slower path, given only what arrives in time, or a path that was idle for part
	// of the window) delivers less than its estimate by the traffic's choice, and the caller's
	// alignment of what was sent with what was delivered is only as good as its round-trip
	// estimate. Collapsed on such a sample (a queue from a CPU stall, or the first burst after
	// an idle spell), the slow path of two unequal ones fell from 25 Mbit/s to 8 and, offered
	// little, stayed in startup there (docs/scheduling.md, "Unequal paths"). So the path must
	// have been sent half its estimate at least (the volume lossy and queued need), and have
	// delivered less than collapseShare of what it was sent (up to the estimate). A path the
	// scheduler already sends less because its queue grows (the planner sees the queue in
	// the path's RTT) still collapses when it delivers clearly less than that.
	//
	// A cellular link also stalls: for a few hundred milliseconds it delivers nothing, then
	// what queued meanwhile, at about its rate before (the recorded LTE traces: after a gap of
	// 150 ms or more the next 500 ms carry a median 0.8-1.4 of the 500 ms before). A window
	// that holds such a stall looks like a fall, and collapsing on it sent the path back
	// through startup after every stall. So a fall must show in two samples in a row: the
	// first one drains below the estimate (the queue of a real fall stops growing) and keeps
	// it; the second collapses, unless the path delivered again.
	if (lossy || queued) && c.filled > 0 && delivered < collapseShare*min(sent, c.est) {
		if !c.suspect {
			c.suspect = true
			return
		}
		c.suspect = false
		clear(c.samples)
		c.est = max(delivered, c.est/16)
		c.samples[0], c.next, c.filled = c.est, 1%len(c.samples), 1
		c.phase, c.drains, c.lossy, c.regrow = PhaseDrain, 0, 0, true
		return
	}
	c.suspect = false
	if busy || delivered > c.est {
		c.samples[c.next] = delivered
		c.next = (c.next + 1) % len(c.samples)
		c.filled = min(c.filled+1, len(c.samples))
		m := 0.0
		for _, s := range c.samples[:c.filled] {
			m = max(m, s)
		}
		if m > 0 {
			c.est = m
		}
	}
	switch c.phase {
	case PhaseStartup:
		if !busy {
			return
		}
		if c.lossy >= 2 { // the path is full: growing the rate further only fills its queue
			c.phase = PhaseDrain
			return
		}
		if c.est >= 1.25*c.full {
			c.full, c.stalls = c.est, 0
			return
		}
		if queued {
			// The rate stopped growing and a queue stands: the path is full, no need to wait
			// for two more samples. (A queue while the rate still grows is the sites' own
			// CPU as often as the path.)
			c.phase = PhaseDrain
			return
		}
		if c.stalls++; c.stalls >= 3 {
			c.phase = PhaseDrain
		}
	case PhaseDrain:
		// A queue still stands (the round trip is well above its minimum): drain for another
		// sample, at most maxDrains in all (a busy CPU lengthens round trips too).
		if queueStands(rtt, minRTT) && c.drains < maxDrains {
			c.drains++
			return
		}
		if c.regrow {
			// The capacity fell to what one sample saw: a cellular link's rate comes back
			// within a second or two, and cruise would probe it back up by a few per cent
			// every cycle (a path paced at a tenth of its rate for many seconds). Startup
			// finds the rate again in a few delivery windows.
			c.phase, c.full, c.stalls, c.regrow = PhaseStartup, c.est, 0, false
			return
		}
		c.phase, c.cycle, c.drains, c.cruised = PhaseCruise, c.cfg.CycleLength-1, 0, true
	case PhaseCruise:
		// A queue that grows (the estimate a little above the path's rate: it is the maximum
		// of noisy samples): drain in the next sample, and probe only a cycle later. A round
		// trip well above the minimum alone is not enough: it also grows when either site's
		// CPU is busy, and draining on it every sample, never probing, walked a 300 Mbit/s
		// path's estimate down to 245 in 20 s.
		if queued {
			c.cycle, c.found, c.excess = 1, 0, max(c.excess, queueDrain)
			return
		}
		// A probe that found room (the estimate rose by most of the excess the window could
		// show: probeShown) is followed, after its drain, by another at once: a path that has
		// grown is found in a few cycles.
		if c.cycle == 0 {
			// A window that would show less than 1 % (a long round trip after a drain) says
			// nothing either way.
			if shown := probeShown(prevGain, 1+c.excess, window, cmp.Or(rtt, minRTT)); shown < 0.01 || c.est < before*(1+0.75*shown) {
				c.found = 0
			} else if c.found++; c.found >= 2 {
				// Twice in a row: the path has grown a lot; find its rate quickly.
				c.phase, c.full, c.stalls, c.found = PhaseStartup, c.est, 0, 0
				return
			}
		}
		c.cycle = (c.cycle + 1) % c.cfg.CycleLength
		if c.cycle == 2 && c.found > 0 {
			c.cycle = 0
		}
		if c.cycle == 0 {
			c.excess = probeExcess(c.cfg.ProbeGain, window, cmp.Or(minRTT, rtt))
			if queueStands(rtt, minRTT) {
				// A queue stands already (the estimate a little above the path, or a burst
				// not yet drained): the probe adds to it, so it probes half as far, at least
				// minProbe (docs/scheduling.md, "Bursts into a short queue").
				c.excess = max(c.excess/2, minProbe)
			}
		}
	}
}

// OnOverflow tells the estimator that the path's queue overflowed: the peer reported a burst of
// the path's packets lost within the current sample window (the caller decides what a burst is:
// more than random loss explains). A sample window is several round trips long, and the
// estimator learns of a full queue only from the window's sample, which comes a round trip
// after the window ends: a re-startup (gain 2) on a path with a queue of a few tens of ms
// overflows it for the whole window. Measured on the fast path of two unequal ones (50 Mbit/s,
// 5 ms one way, a 96 KB queue), estimated at 44-46 Mbit/s and starting up again from cruise:
// 185-243 packets dropped within one second (docs/scheduling.md, "Resends are charged to the
// path; a burst of losses ends a re-startup").
//
// So a re-startup drains at once, and in cruise the current sample drains (the queue that
// overflowed stands, and the packets resent for the losses join it). The first startup is
// left alone: its estimate is still far below the path or the initial guess, and draining
// below that would pace the path under its rate until cruise probes it back up. It reports
// whether the gain changed.
func (c *Capacity) OnOverflow() bool {
	switch {
	case c.phase == PhaseStartup && c.cruised:
		c.phase, c.drains, c.stalls = PhaseDrain, 0, 0
		return true
	case c.phase == PhaseCruise && c.cycle != 1:
		c.cycle, c.found, c.excess = 1, 0, max(c.excess, queueDrain)
		return true
	}
	return false
}

// A round trip minQueue (or a quarter) above the minimum is a standing queue; the sample
// after drains it at least queueDrain below the estimate.
const (
	minQueue     = int64(2e6)
	queuedBits   = 64 << 13 // 64 KiB: the least sent over a window for a queue to count as busy
	queuedGrowth = 1.03     // sent over delivered for a queue to count as growing
	queueDrain   = 0.05
	// collapseShare: two full samples in a row that delivered less than this share of the
	// estimate are a fall in the path's capacity, not noise or a stall. maxDrains: the most samples drained after the
	// first while a queue stands.
	collapseShare = 0.8
	maxDrains     = 3
)

// queueStands reports whether a round trip rtt shows a standing queue over the minimum minRTT
// (0: unknown, no queue): more than minQueue, or a quarter of the minimum, above it.
func queueStands(rtt, minRTT int64) bool {
	return minRTT > 0 && rtt > minRTT+max(minQueue, minRTT/4)
}

// minProbe is the least a probe over a standing queue goes above the estimate: what a sample
// window can still show (a window that would show less than 1 % says nothing).
const minProbe = 0.01

// probeShown is how far above the estimate a probe's sample shows its delivery when the path
// has room: the probe's gain starts when the sample before is taken, and what it sends reaches
// the peer's delivery windows a round trip later, so the first rtt of a window of length
// window shows the gain before (prev) and the rest the probe's. A probe found room when its
// sample rose by 0.75 of that. At 0.9 of the whole excess, the 25 Mbit/s path of two unequal
// ones (50 ms one way, 300 ms windows) paced at 12 Mbit/s with data waiting for it found 9 %
// of a 16.7 % probe each cycle, and the repeated probe right after its drain (whose low gain
// the window still shows) less: it took 18 s to reach 22.5 Mbit/s, never starting up again.
// On a short path a window shows almost all of the probe: 0.75 of its excess.
func probeShown(prev, probe float64, window, rtt int64) float64 {
	lag := min(float64(rtt)/float64(window), 0.75)
	return max(prev*lag+probe*(1-lag)-1, 0)
}

// probeExcess is how far above the estimate one sample window probes: what a queue of half a
// bandwidth-delay product can take over the window (the window is much longer than the round
// trip, and a longer probe would overflow the queue), at most ProbeGain-1, at least 2 %.
func probeExcess(gain float64, window, rtt int64) float64 {
	return min(max(0.5*float64(rtt)/float64(window), 0.02), gain-1)
}
