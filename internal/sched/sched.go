// Package sched chooses the path for each packet of a multipath tunnel.
//
// Schedulers are pure: each is a struct holding its own state, and Pick is a function of that
// state, the current time (monotonic nanoseconds, passed in) and a snapshot of the paths that
// the control plane builds from its measurements. There is no I/O, no clock, no goroutine and
// no lock; the data path owns one scheduler per peer and serialises calls to it. Pick does not
// allocate once the scheduler has seen the largest path set it will be given.
//
// Three schedulers are provided:
//
//   - WRR: MPT's deterministic weighted round robin, as the interoperable baseline;
//   - Paced, the default: capacity-proportional shares with a token bucket per path, so that no
//     path is sent more than it can carry (glorytun's reason for staying loss-free on shaped
//     links, tunnels.md section 4) and unequal paths aggregate in proportion;
//   - MinRTT: the MPTCP default rule (lowest smoothed RTT with room), a baseline for RBPM.
package sched

import (
	"math"
	"time"
)

// Path is the scheduler's view of one path at the moment of a decision.
type Path struct {
	ID int  // stable identity across snapshots; schedulers key their state on it
	Up bool // usable now; a path that is not Up is never picked
	// Weight is the configured share (MPT's weight_out). 0 means: use Capacity.
	Weight float64
	// Capacity is the path's rate in bit/s, configured or measured; 0 means unknown.
	Capacity float64
	// PaceRate is the rate in bit/s a pacing scheduler sends the path at: a measured capacity
	// times the estimator's probing or draining gain (Capacity.PacingRate). 0 means Capacity.
	PaceRate     float64
	SRTT, RTTVar time.Duration
	InFlight     int // bytes sent and not yet known to have arrived or been lost
}

// Scheduler picks the path for the next packet of size bytes. index is an index into paths;
// ok is false when no path can take the packet now.
type Scheduler interface {
	Pick(now int64, paths []Path, size int) (index int, ok bool)
}

// share is a path's relative weight: Weight if set, else Capacity, else def. Non-finite and
// negative values count as unset so that one bad measurement cannot take a path out or
// poison the sums.
func share(p *Path, def float64) float64 {
	if w := p.Weight; w > 0 && !math.IsInf(w, 0) {
		return w
	}
	if c := p.Capacity; c > 0 && !math.IsInf(c, 0) {
		return c
	}
	return def
}

// WRR is smooth weighted round robin (the nginx algorithm): on each pick every Up path's
// current value grows by its weight, the largest value wins (ties to the lowest index) and
// the winner's value drops by the sum of the weights. Over each cycle of Σw picks every path
// gets exactly w of them, spread as evenly as possible (weights 3:1 give A A B A), which
// keeps the reordering at the receiver small. MPT's scheduling.md §1.3 virtual-clock vector
// gives the same counts per cycle but bunches them (A A A B); the receiver cannot tell, so the
// smoother order is used. Weight 0 falls back to Capacity, then to 1.
//
// State resets to zero whenever the set of paths, their Up flags or their weights change, so
// a path that goes down is skipped from the next pick on and the sequence is deterministic
// from each change.
type WRR struct {
	cur  []float64
	last []wrrKey
}

type wrrKey struct {
	id int
	up bool
	w  float64
}

// Pick implements Scheduler.
func (s *WRR) Pick(now int64, paths []Path, size int) (int, bool) {
	s.sync(paths)
	best, total := -1, 0.0
	for i := range paths {
		if !paths[i].Up {
			continue
		}
		w := s.last[i].w
		s.cur[i] += w
		total += w
		if best < 0 || s.cur[i] > s.cur[best] {
			best = i
		}
	}
	if best < 0 {
		return 0, false
	}
	s.cur[best] -= total
	return best, true
}

func (s *WRR) sync(paths []Path) {
	same := len(paths) == len(s.last)
	for i := 0; same && i < len(paths); i++ {
		p := &paths[i]
		same = s.last[i] == wrrKey{p.ID, p.Up, share(p, 1)}
	}
	if same {
		return
	}
	s.last = s.last[:0]
	s.cur = s.cur[:0]
	for i := range paths {
		p := &paths[i]
		s.last = append(s.last, wrrKey{p.ID, p.Up, share(p, 1)})
		s.cur = append(s.cur, 0)
	}
}

// MinRTT picks the Up path with the lowest SRTT that has room in a simple in-flight limit:
// InFlight < 1.2 × Capacity × SRTT / 8 (the bandwidth-delay product plus 20 % for queueing),
// never less than MinWindow. A path with unknown Capacity has no limit; one with unknown SRTT
// (0) sorts first so that it gets measured, but only up to MinWindow. Ties go to the lowest
// index. When every Up path is full Pick returns ok=false: the caller waits for feedback, as
// an MPTCP sender waits for its congestion windows. It is a baseline for RBPM, not a tuned
// scheduler.
type MinRTT struct {
	// MinWindow is the smallest in-flight limit in bytes; 0 means 64 KiB, enough that a path
	// with a tiny RTT estimate still carries a burst.
	MinWindow int
}

// Pick implements Scheduler.
func (m *MinRTT) Pick(now int64, paths []Path, size int) (int, bool) {
	minWin := float64(m.MinWindow)
	if minWin <= 0 {
		minWin = 64 << 10
	}
	best := -1
	for i := range paths {
		p := &paths[i]
		if !p.Up {
			continue
		}
		limit := math.Inf(1)
		switch {
		case p.SRTT <= 0:
			limit = minWin
		case p.Capacity > 0:
			limit = max(1.2*p.Capacity*p.SRTT.Seconds()/8, minWin)
		}
		if float64(p.InFlight) >= limit {
			continue
		}
		if best < 0 || p.SRTT < paths[best].SRTT {
			best = i
		}
	}
	return max(best, 0), best >= 0
}
