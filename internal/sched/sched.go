// Package sched chooses the path for each packet of a multipath tunnel.
//
// Schedulers are pure: each is a struct holding its own state, and Pick is a function of that
// state, the current time (monotonic nanoseconds, passed in) and a snapshot of the paths that
// the control plane builds from its measurements. There is no I/O, no clock, no goroutine and
// no lock; the data path owns one scheduler per peer and serialises calls to it. Pick does not
// allocate once the scheduler has seen the largest path set it will be given.
//
// The schedulers provided:
//
//   - WRR: MPT's deterministic weighted round robin, as the interoperable baseline;
//   - Paced, the default: capacity-proportional shares with a token bucket per path, so that no
//     path is sent more than it can carry (glorytun's reason for staying loss-free on shaped
//     links, tunnels.md section 4) and unequal paths aggregate in proportion, and a Bucket
//     per uplink that the paths leaving by it share, so that together they stay within it;
//   - MinRTT: the MPTCP default rule (lowest smoothed RTT with room in the window, backup
//     paths only when no other can send), a baseline for RBPM;
//   - BLEST and ECF: MPTCP's receive-window-aware schedulers, which wait for the fast path
//     rather than send on a slow one that would block the receiver (blest.go, ecf.go);
//   - RBPM: receive-buffer-based path management: paths whose slowness would fill the
//     receiver's buffer with out-of-order data are demoted, MinRTT runs over the rest
//     (rbpm.go).
//
// The receive-buffer-aware ones need the connection's state as well as the paths': they
// implement ConnScheduler, and their Pick assumes an unbounded receiver.
//
// sim.go is a deterministic simulator of paths, TCP-like senders and a bounded receiver that
// drives any Scheduler, for tests and for the figures in docs/scheduling.md.
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
	// MinRTT is the path's recent minimum RTT (its propagation delay, without the queue the
	// sender builds; tcpi_min_rtt); 0 means unknown. RBPM uses it, else SRTT.
	MinRTT   time.Duration
	InFlight int // bytes sent and not yet known to have arrived or been lost
	// DeliveryRate is the rate in bit/s at which the path's data was last acknowledged
	// (tcpi_delivery_rate, or the tunnel's receive rate); 0 means unknown.
	DeliveryRate float64
	// CWnd is the congestion window in bytes: the path takes data while InFlight < CWnd.
	// 0 means unknown: the window is then derived from Capacity (or DeliveryRate) and SRTT.
	CWnd int
	// MSS is the path's segment size in bytes; 0 means DefaultMSS.
	MSS int
	// Unmeasured: Capacity is a capacity estimator's start-up guess, the path not yet having
	// carried the traffic to measure it by. Paced's Plan gives such a path a packet that every
	// measured path would make wait, within the path's CWnd, so that it is measured while the
	// inner flow's window is still too small to reach it by arrival time alone.
	Unmeasured bool
	// Backup paths take data only when no other Up path can (MPTCP's backup flag).
	// WRR and Paced ignore it.
	Backup bool
	// Uplink is the token bucket of the uplink the path leaves by, shared with every other
	// path on that uplink (of every peer); nil when the uplink's capacity is unknown. Only
	// Paced uses it: a path is sent a packet only when its own bucket and its uplink's both
	// hold it, so paths that share an uplink together stay within the uplink's rate.
	Uplink *Bucket
}

// DefaultMSS stands in for an unknown Path.MSS: a TCP segment in a 1500-byte packet.
const DefaultMSS = 1448

func (p *Path) mss() int {
	if p.MSS > 0 {
		return p.MSS
	}
	return DefaultMSS
}

// Conn is the connection-level state that the receive-buffer-aware schedulers need.
type Conn struct {
	// Avail is the receiver's free buffer in bytes as last reported (the advertised window:
	// the buffer less the out-of-order data it holds). Only meaningful when AvailKnown.
	Avail      int
	AvailKnown bool
	// Queued is the data in bytes waiting at the connection level, not yet given to a path
	// (ECF's k); 0 when unknown.
	Queued int
}

// ConnScheduler is a Scheduler that also takes the connection's state.
type ConnScheduler interface {
	Scheduler
	PickConn(now int64, c Conn, paths []Path, size int) (index int, ok bool)
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

// MinRTT picks the Up path with the lowest SRTT that has room in its window, the out-of-tree
// MPTCP kernel's default rule with upstream's backup rule (upstream ranks by the time to drain
// each subflow's send queue, which a snapshot of windows cannot give): a path takes data while InFlight < CWnd; without a CWnd the window is
// 1.2 × Capacity × SRTT / 8 (the bandwidth-delay product plus 20 % for queueing; DeliveryRate
// stands in for an unknown Capacity), never less than MinWindow. A path with neither rate has
// no limit; one with unknown SRTT (0) sorts first so that it gets measured, but only up to
// MinWindow. Ties go to the lowest index. Backup paths are considered only when no other Up
// path has room. When every Up path is full Pick returns ok=false: the caller waits for
// feedback, as an MPTCP sender waits for its congestion windows.
type MinRTT struct {
	// MinWindow is the smallest in-flight limit in bytes; 0 means 64 KiB, enough that a path
	// with a tiny RTT estimate still carries a burst.
	MinWindow int
}

// Pick implements Scheduler.
func (m *MinRTT) Pick(now int64, paths []Path, size int) (int, bool) {
	best := minRTTPick(paths, m.MinWindow, nil)
	return max(best, 0), best >= 0
}

// minWindow is the window of a path whose window cannot be derived.
func minWindow(w int) float64 {
	if w <= 0 {
		return 64 << 10
	}
	return float64(w)
}

// pathWindow is p's in-flight limit in bytes (see MinRTT).
func pathWindow(p *Path, minWin float64) float64 {
	if p.CWnd > 0 {
		return float64(p.CWnd)
	}
	if p.SRTT <= 0 {
		return minWin
	}
	rate := p.Capacity
	if !(rate > 0) || math.IsInf(rate, 0) {
		rate = p.DeliveryRate
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
		return math.Inf(1)
	}
	return max(1.2*rate*p.SRTT.Seconds()/8, minWin)
}

// hasRoom reports whether p is Up and has room in its window.
func hasRoom(p *Path, minWin float64) bool {
	return p.Up && float64(p.InFlight) < pathWindow(p, minWin)
}

// minRTTPick is MinRTT's rule over the paths for which use (nil: all) is true; -1 if none.
func minRTTPick(paths []Path, minWin int, use func(i int) bool) int {
	mw := minWindow(minWin)
	best, bestBackup := -1, -1
	for i := range paths {
		p := &paths[i]
		if (use != nil && !use(i)) || !hasRoom(p, mw) {
			continue
		}
		if p.Backup {
			if bestBackup < 0 || p.SRTT < paths[bestBackup].SRTT {
				bestBackup = i
			}
			continue
		}
		if best < 0 || p.SRTT < paths[best].SRTT {
			best = i
		}
	}
	if best < 0 {
		return bestBackup
	}
	return best
}
