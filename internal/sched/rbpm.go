package sched

import (
	"fmt"
	"math"
	"time"
)

// RBPM is receive-buffer-based path management (Kim, Oh, Lee): it keeps a set of active paths
// whose out-of-order data the receiver's buffer can hold, and schedules over them by expected
// arrival (arrivalPick; MinRTT with RBPMConfig.MinRTTInside). Demoted paths take no data; the
// caller keeps probing them (the tunnel's probes; in the kernel, a backup subflow's last
// figures, bounded by the hold-down) so that their RTT and rate stay known and they can come
// back. A "first appearance" counts as a change: a path's first estimates (slow start, one RTT
// sample) are not judged before a hold-down has passed.
//
// With the Up paths whose RTT is known sorted by RTT, and j slower than i (the paper's eq. 2):
//
//	L(i,j) = floor(RTT_j/RTT_i) − 1 if RTT_j/RTT_i ≥ 2, else 0
//
// is how many extra windows i sends during one round trip of j. The buffer a set A of paths
// needs (eq. 3 and 4), N being A's slowest path and P_i·MSS_i the bytes i sends per round trip:
//
//	B(A) = Σ_{i ∈ A} P_i·MSS_i · L(i,N)
//
// P_i·MSS_i is the path's data in flight (see sendBytes). A path's score (eq. 5, max-min
// normalised over the Up paths; a term whose range is 0 counts 0) is
//
//	Score_i = (BW_i − BW_min)/(BW_max − BW_min) − (RTT_i − RTT_min)/(RTT_max − RTT_min)
//
// with BW the DeliveryRate, else the Capacity, through a max filter that follows a rise at
// once and a fall over about 10 s (kept while the path is idle).
//
// RTT in both is the path's MinRTT when known, else its SRTT. The smoothed RTT includes the
// queue the sender itself builds, and under MinRTT scheduling with deep queues that queue
// moves from path to path within a round trip: in the simulator, SRTTs of three equal
// 5 Mbit/s paths swung between 20 and 300 ms, so eq. 2 found ratios above 2 between equal
// paths and demoted them. The propagation RTT keeps equal paths equal and slow paths slow.
//
// Each decision (every PickConn, or Decide) runs Algorithm 1's recalculation with braid's
// re-enable rule, which cannot flap:
//
//  1. while B(A) > Avail and A has more than one path: demote, among the paths of A whose
//     removal lowers B(A), the one whose bandwidth A misses least (ties: the worse score),
//     unless it is in its hold-down (then nothing is demoted: a better path never goes in
//     its place). The paper demotes the worst score outright; on kernel MPTCP in scenario 2
//     that removed the 3 Mbit/s path (which adds nothing to B: its RTT is within 2× of the
//     slowest) and then the 8 Mbit/s one, whose delivery rate the shared window had kept
//     low, leaving the 2 Mbit/s path alone; eq. 5 weighs 1 Mbit/s like 10 ms;
//  2. otherwise, re-enable at most one demoted path c, best score first, and only if
//     Avail > 2·B(A ∪ {c}), that is, with c counted as active (the paper's rule tests B(A)
//     without c, which is 0 once the slow path is out, and so re-enables it at once);
//  3. after a change nothing else changes for a hold-down (the demoted path's data is still in
//     flight and in the buffer, so the figures do not yet show the new set), except further
//     demotions in the same recalculation (the paper's "goto recalculate") and a rescue;
//     a path changes state at most once per hold-down, max(HoldDown, 4·RTT_max), and a path
//     demoted again within four of its hold-downs after a re-enable has its hold-down doubled
//     (up to 64 times; a later demotion halves it again), so that a path whose estimates swing stops being tried often: the number of
//     state changes grows with the logarithm of the run time, not with it;
//  4. the last active path is never demoted, and when no active path is Up the best demoted
//     Up path comes back at once, so a dead path never leaves the connection without one.
//
// Paths whose RTT is unknown stay active and outside the computation until measured. Without
// a known Avail (Pick) the receiver is taken as unbounded: nothing is demoted and demoted
// paths come back one per hold-down.
type RBPM struct {
	cfg     RBPMConfig
	st      []rbpmState // parallel to the last paths slice
	scratch []rbpmState
	set     []int // scratch: indices of the active set
	cands   []int // scratch: re-enable candidates
	// Changes counts state changes (demotions and re-enables) since the start.
	Changes    uint64
	changedAny bool
	lastChange int64 // ns of the last change of any path
}

// RBPMConfig tunes RBPM. Zero fields take their defaults.
type RBPMConfig struct {
	// HoldDown is the least time between two state changes of one path; the effective time
	// is max(HoldDown, 4·RTT_max). Default 1 s.
	HoldDown time.Duration
	// MinWindow is the least window of a path whose window is unknown, as MinRTT's.
	MinWindow int
	// MinRTTInside schedules the active set with MinRTT instead of by expected arrival: the
	// kernel's case, where RBPM only sets backup flags and the default scheduler runs.
	MinRTTInside bool
}

// Reason says why a path is in its RBPM state.
type Reason uint8

const (
	ReasonNew      Reason = iota // active since it was first seen
	ReasonBlocking               // demoted: the active set's required buffer exceeded the available one
	ReasonRestored               // re-enabled: the buffer holds the active set with it, twice over
	ReasonRescue                 // re-enabled: no active path was Up
	ReasonUnbound                // re-enabled: the receiver's buffer is not known to be bounded
)

func (r Reason) String() string {
	switch r {
	case ReasonNew:
		return "new"
	case ReasonBlocking:
		return "would block the receive buffer"
	case ReasonRestored:
		return "buffer holds it"
	case ReasonRescue:
		return "no active path up"
	case ReasonUnbound:
		return "buffer unbounded"
	}
	return fmt.Sprintf("reason%d", uint8(r))
}

// PathState is one path's RBPM state, for status displays.
type PathState struct {
	ID       int
	Active   bool
	Reason   Reason
	Since    int64   // ns of the last change, or of the path's first appearance
	Score    float64 // eq. 5 at the last decision
	Required int     // B in bytes that the decision compared (with the path, for a re-enable)
	Avail    int     // the available buffer it was compared with
}

func (s PathState) String() string {
	state := "active"
	if !s.Active {
		state = "demoted"
	}
	return fmt.Sprintf("path %d %s (%s; required %d B, available %d B, score %.2f)", s.ID, state, s.Reason, s.Required, s.Avail, s.Score)
}

type rbpmState struct {
	PathState
	changed   bool          // Since is valid
	srtt      time.Duration // last known
	bytes     float64       // P·MSS, last known
	bw        float64       // filtered rate, bit/s
	bwAt      int64         // when bw was last updated
	strikes   uint          // re-demotions soon after a re-enable: the hold-down doubles each
	heldBytes float64       // bytes in flight when it was last demoted
}

// bwWindow is how fast the filtered rate follows a fall.
const bwWindow = int64(10 * time.Second)

// maxStrikes caps the hold-down's doubling at 64 times.
const maxStrikes = 6

// NewRBPM returns an RBPM scheduler.
func NewRBPM(c RBPMConfig) *RBPM {
	if c.HoldDown <= 0 {
		c.HoldDown = time.Second
	}
	return &RBPM{cfg: c}
}

// Pick implements Scheduler for a receiver of unknown buffer.
func (r *RBPM) Pick(now int64, paths []Path, size int) (int, bool) {
	return r.PickConn(now, Conn{}, paths, size)
}

// PickConn implements ConnScheduler: Decide, then MinRTT over the active paths.
func (r *RBPM) PickConn(now int64, c Conn, paths []Path, size int) (int, bool) {
	r.Decide(now, c, paths)
	active := func(i int) bool { return r.st[i].Active }
	if r.cfg.MinRTTInside {
		best := minRTTPick(paths, r.cfg.MinWindow, active)
		return max(best, 0), best >= 0
	}
	best := arrivalPick(paths, size, r.cfg.MinWindow, active)
	return max(best, 0), best >= 0
}

// arrivalPick picks, among the paths for which use is true and that have room in their
// window, the one where a packet of size bytes is expected to arrive first:
//
//	arrival = max((InFlight + size)·8/rate, RTT_min) − RTT_min/2
//
// (the data ahead of it drains at the path's rate; the ack comes back in half the base
// RTT), with the rate from DeliveryRate, else Capacity. A path without a rate estimate
// counts as arriving after half its SRTT. Backup paths only when no other has room.
// Spreading by arrival keeps the paths' queues even, which MinRTT does not: it fills the
// lowest-RTT path's queue until that path is no longer lowest, and the difference between
// the queues is reordering the receiver has to hold.
func arrivalPick(paths []Path, size, minWin int, use func(i int) bool) int {
	mw := minWindow(minWin)
	best, bestBackup := -1, -1
	var bestAt, bestBackupAt float64
	for i := range paths {
		p := &paths[i]
		if (use != nil && !use(i)) || !hasRoom(p, mw) {
			continue
		}
		base := baseRTT(p).Seconds()
		at := base / 2
		if rate := rateOf(p); rate > 0 {
			at = max(float64(p.InFlight+size)*8/rate, base) - base/2
		}
		if p.Backup {
			if bestBackup < 0 || at < bestBackupAt {
				bestBackup, bestBackupAt = i, at
			}
			continue
		}
		if best < 0 || at < bestAt {
			best, bestAt = i, at
		}
	}
	if best < 0 {
		return bestBackup
	}
	return best
}

// Active reports whether the path with this ID is active (unknown IDs are).
func (r *RBPM) Active(id int) bool {
	for i := range r.st {
		if r.st[i].ID == id {
			return r.st[i].Active
		}
	}
	return true
}

// States appends every path's state to dst, in the order of the last paths given.
func (r *RBPM) States(dst []PathState) []PathState {
	for i := range r.st {
		dst = append(dst, r.st[i].PathState)
	}
	return dst
}

// Decide runs one recalculation over paths and returns whether a path changed state.
func (r *RBPM) Decide(now int64, c Conn, paths []Path) bool {
	if r.cfg.HoldDown <= 0 {
		r.cfg.HoldDown = time.Second
	}
	r.sync(now, paths)
	avail := math.Inf(1)
	if c.AvailKnown {
		avail = float64(max(c.Avail, 0))
	}
	var rttMax time.Duration
	for i := range paths {
		p, st := &paths[i], &r.st[i]
		if rtt := baseRTT(p); rtt > 0 {
			st.srtt = rtt
			st.bytes = sendBytes(p)
			if !st.Active {
				// A demoted path has drained; what it would carry again is what it
				// carried when it was demoted (else re-enabling it looks cheap, it
				// fills up, and it is demoted again).
				st.bytes = max(st.bytes, st.heldBytes)
			}
		}
		if bw := rateOf(p); bw > 0 {
			// A max filter that forgets over bwWindow: a rate measured in slow start or
			// while the sender was held back does not make a path look poor, and a path
			// whose rate really fell looks poor within seconds.
			if bw >= st.bw || st.bwAt == 0 {
				st.bw = bw
			} else {
				st.bw -= (st.bw - bw) * min(1, float64(now-st.bwAt)/float64(bwWindow))
			}
			st.bwAt = now
		}
		if p.Up {
			rttMax = max(rttMax, st.srtt)
		}
	}
	hold := int64(max(r.cfg.HoldDown, 4*rttMax))
	r.score(paths)
	// A change takes a round trip of the slowest path to show in the buffer; until then the
	// figures still carry the old set's data and another change would chase them.
	settled := !r.changedAny || now-r.lastChange >= hold
	free := func(i int) bool { st := &r.st[i]; return !st.changed || now-st.Since >= hold<<st.strikes }
	changed := false

	// 4: never without an active Up path.
	anyActive := false
	for i := range paths {
		anyActive = anyActive || (paths[i].Up && r.st[i].Active)
	}
	if !anyActive {
		best := -1
		for i := range paths {
			if paths[i].Up && (best < 0 || r.better(i, best)) {
				best = i
			}
		}
		if best >= 0 {
			r.set = r.activeSet(paths, r.set[:0])
			r.change(now, best, true, ReasonRescue, r.required(r.set, best), avail)
			return true
		}
		return false
	}

	// 1: demote while the active set would block.
	for {
		r.set = r.activeSet(paths, r.set[:0])
		if len(r.set) < 2 || (!settled && !changed) {
			break
		}
		need := r.required(r.set, -1)
		if need <= avail {
			break
		}
		// The path to demote: among those whose removal lowers B, the one whose bandwidth
		// the set misses least (ties: the worse score).
		worst, total := -1, 0.0
		for _, i := range r.set {
			total += r.st[i].bw
		}
		var worstKeep float64
		for _, i := range r.set {
			if r.requiredExcept(r.set, i) >= need {
				continue // not part of the blocking
			}
			keep := total - r.st[i].bw
			if worst < 0 || keep > worstKeep || (keep == worstKeep && r.better(worst, i)) {
				worst, worstKeep = i, keep
			}
		}
		if worst < 0 || !free(worst) {
			// The worst path waits out its hold-down; a better one is not demoted instead.
			break
		}
		if st := &r.st[worst]; st.Reason == ReasonRestored && now-st.Since < 4*hold<<st.strikes {
			// Demoted again soon after coming back: it waits twice as long next time.
			st.strikes = min(st.strikes+1, maxStrikes)
		} else if st.strikes > 0 {
			st.strikes-- // forgiven one step at a time, not at once
		}
		r.change(now, worst, false, ReasonBlocking, need, avail)
		changed = true
	}
	if changed {
		return true
	}

	// 2: re-enable one path, best first, counted as active.
	r.cands = r.cands[:0]
	for i := range paths {
		if settled && paths[i].Up && !r.st[i].Active && r.st[i].srtt > 0 && free(i) {
			r.cands = append(r.cands, i)
		}
	}
	for len(r.cands) > 0 {
		b := 0
		for k := range r.cands {
			if r.better(r.cands[k], r.cands[b]) {
				b = k
			}
		}
		i := r.cands[b]
		r.cands = append(r.cands[:b], r.cands[b+1:]...)
		need := r.required(r.set, i)
		if avail > 2*need {
			reason := ReasonRestored
			if math.IsInf(avail, 1) {
				reason = ReasonUnbound
			}
			r.change(now, i, true, reason, need, avail)
			return true
		}
	}
	return false
}

func (r *RBPM) change(now int64, i int, active bool, why Reason, need, avail float64) {
	st := &r.st[i]
	if !active {
		st.heldBytes = st.bytes
	}
	st.Active, st.Reason, st.Since, st.changed = active, why, now, true
	st.Required = int(min(need, math.MaxInt32))
	st.Avail = int(min(avail, math.MaxInt32))
	r.Changes++
	r.changedAny, r.lastChange = true, now
}

// better reports whether path i ranks above path j: higher score, then higher bandwidth,
// then lower RTT, then lower index.
func (r *RBPM) better(i, j int) bool {
	a, b := &r.st[i], &r.st[j]
	switch {
	case a.Score != b.Score:
		return a.Score > b.Score
	case a.bw != b.bw:
		return a.bw > b.bw
	case a.srtt != b.srtt:
		return a.srtt < b.srtt
	}
	return i < j
}

// activeSet appends the indices of the Up, active paths whose RTT is known.
func (r *RBPM) activeSet(paths []Path, dst []int) []int {
	for i := range paths {
		if paths[i].Up && r.st[i].Active && r.st[i].srtt > 0 {
			dst = append(dst, i)
		}
	}
	return dst
}

// required is B(set ∪ {extra}) in bytes (extra < 0: none), eq. 2 to 4.
func (r *RBPM) required(set []int, extra int) float64 {
	var slow time.Duration
	for _, i := range set {
		slow = max(slow, r.st[i].srtt)
	}
	if extra >= 0 {
		slow = max(slow, r.st[extra].srtt)
	}
	b := 0.0
	add := func(i int) {
		if st := &r.st[i]; st.srtt > 0 {
			b += st.bytes * float64(ooWindows(st.srtt, slow))
		}
	}
	for _, i := range set {
		add(i)
	}
	if extra >= 0 {
		add(extra)
	}
	return b
}

// requiredExcept is B(set without skip).
func (r *RBPM) requiredExcept(set []int, skip int) float64 {
	var slow time.Duration
	for _, i := range set {
		if i != skip {
			slow = max(slow, r.st[i].srtt)
		}
	}
	b := 0.0
	for _, i := range set {
		if st := &r.st[i]; i != skip && st.srtt > 0 {
			b += st.bytes * float64(ooWindows(st.srtt, slow))
		}
	}
	return b
}

// ooWindows is L of eq. 2: the extra windows a path of RTT fast sends in one RTT of slow.
func ooWindows(fast, slow time.Duration) int64 {
	if fast <= 0 || slow < 2*fast {
		return 0
	}
	return int64(slow/fast) - 1
}

// score sets every Up path's eq. 5 score; other paths keep their last one.
func (r *RBPM) score(paths []Path) {
	bwMin, bwMax := math.Inf(1), 0.0
	var rttMin, rttMax time.Duration
	for i := range paths {
		st := &r.st[i]
		if !paths[i].Up || st.srtt <= 0 {
			continue
		}
		bwMin, bwMax = min(bwMin, st.bw), max(bwMax, st.bw)
		if rttMin == 0 || st.srtt < rttMin {
			rttMin = st.srtt
		}
		rttMax = max(rttMax, st.srtt)
	}
	for i := range paths {
		st := &r.st[i]
		if !paths[i].Up || st.srtt <= 0 {
			continue
		}
		s := 0.0
		if bwMax > bwMin {
			s += (st.bw - bwMin) / (bwMax - bwMin)
		}
		if rttMax > rttMin {
			s -= float64(st.srtt-rttMin) / float64(rttMax-rttMin)
		}
		st.Score = s
	}
}

// maxRTT bounds a believable RTT: Linux reports min_rtt as ~0U µs (71 minutes) before the
// first sample, and an RTT that large would stretch every hold-down for hours.
const maxRTT = time.Minute

// baseRTT is the RTT RBPM reasons with: MinRTT, else SRTT; 0 if neither is believable.
func baseRTT(p *Path) time.Duration {
	for _, v := range [...]time.Duration{p.MinRTT, p.SRTT} {
		if v > 0 && v <= maxRTT {
			return v
		}
	}
	return 0
}

// sendBytes is P·MSS: the bytes p sends per round trip. The paper takes the congestion
// window; braid takes the data in flight, which is what the path really has outstanding
// (the window over-estimates whenever the receiver's window, not the congestion window,
// limits the sender, and a window that grew in slow start stays large). An idle path counts
// rate × RTT, else its window.
func sendBytes(p *Path) float64 {
	if p.InFlight > 0 {
		return float64(p.InFlight)
	}
	if rate, rtt := rateOf(p), baseRTT(p); rate > 0 && rtt > 0 {
		return rate * rtt.Seconds() / 8
	}
	return float64(max(p.CWnd, 0))
}

// rateOf is p's bandwidth for the score: DeliveryRate, else Capacity; 0 if unknown.
func rateOf(p *Path) float64 {
	for _, v := range [...]float64{p.DeliveryRate, p.Capacity} {
		if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			return v
		}
	}
	return 0
}

// sync lines the per-path state up with paths, matching by ID. New paths start active, and
// their arrival counts as a change: their first estimates (slow start, one RTT sample) are
// not judged before a hold-down has passed.
func (r *RBPM) sync(now int64, paths []Path) {
	same := len(paths) == len(r.st)
	for i := 0; same && i < len(paths); i++ {
		same = r.st[i].ID == paths[i].ID
	}
	if same {
		return
	}
	r.scratch = r.scratch[:0]
	for i := range paths {
		st := rbpmState{PathState: PathState{ID: paths[i].ID, Active: true, Since: now}, changed: true}
		for _, old := range r.st {
			if old.ID == paths[i].ID {
				st = old
				break
			}
		}
		r.scratch = append(r.scratch, st)
	}
	r.st, r.scratch = r.scratch, r.st
}
