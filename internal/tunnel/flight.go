package tunnel

import (
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/path"
	"braid/internal/wire/mpath"
)

// sentLog is what the scheduler has given one path over the last seconds, for its data in
// flight: the bytes sent within the last smoothed RTT. A packet sent longer ago than the RTT
// has arrived, or been lost, by now; the RTT is measured through the same queue, so the
// estimate follows the queue the tunnel builds. The peer's byte counts would tell the same,
// but only once per probe interval and without the losses.
//
// Slots open at most every sentSlot; each holds its start time and the total given to the
// path before it. sentSlots of them cover at least sentSlots·sentSlot of sending (2 s), more
// than a round trip the schedulers reason about. Only the device reader writes, under the
// peer's lock.
type sentLog struct {
	at     [sentSlots]int64
	before [sentSlots]uint64
	n      int // slots in use
	head   int // the next slot to open
	total  uint64
}

const (
	sentSlots = 1024
	sentSlot  = int64(2 * time.Millisecond)
)

// add counts bytes given to the path at now.
func (l *sentLog) add(now int64, bytes int) {
	last := (l.head + sentSlots - 1) % sentSlots
	if l.n == 0 || now-l.at[last] >= sentSlot {
		l.at[l.head], l.before[l.head] = now, l.total
		l.head = (l.head + 1) % sentSlots
		l.n = min(l.n+1, sentSlots)
	}
	l.total += uint64(bytes)
}

// inFlight is the bytes given within rtt before now: from the oldest slot that opened inside
// that span (the slot that straddles its start is left out, an error of less than one slot's
// bytes).
func (l *sentLog) inFlight(now int64, rtt time.Duration) int {
	if l.n == 0 || rtt <= 0 {
		return 0
	}
	from := now - int64(rtt)
	// Slots are in time order from the oldest, (head − n); find the first at or after from.
	lo, hi := 0, l.n
	for lo < hi {
		mid := (lo + hi) / 2
		if l.at[(l.head-l.n+mid+sentSlots)%sentSlots] >= from {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == l.n {
		return 0
	}
	return int(l.total - l.before[(l.head-l.n+lo+sentSlots)%sentSlots])
}

// baseRTT is a path's propagation RTT for the schedulers: the smallest of the path
// estimator's MinRTT over the last 150 to 300 s (Linux's tcp_min_rtt_wlen is 300 s). The
// estimator's own minimum covers 10 to 20 s, and under a standing queue of that length (the
// window-based schedulers keep a path's queue full) it rises with the queue: RBPM then saw
// equal paths at RTT ratios above 2 and demoted one of them. A longer RTT after a route
// change shows after at most 300 s.
type baseRTT struct {
	cur, prev time.Duration
	epoch     int64
}

const baseRTTEpoch = int64(150 * time.Second)

// observe takes the estimator's MinRTT at now (0: none yet) and returns the base RTT.
func (b *baseRTT) observe(now int64, minRTT time.Duration) time.Duration {
	if minRTT <= 0 {
		return min(b.cur, b.prev)
	}
	if b.cur == 0 {
		b.cur, b.prev, b.epoch = minRTT, minRTT, now
	}
	if now-b.epoch >= baseRTTEpoch {
		b.prev, b.cur, b.epoch = b.cur, minRTT, now
	}
	b.cur = min(b.cur, minRTT)
	return min(b.cur, b.prev)
}

// window is a path's in-flight limit for the window-based schedulers, bytes: 1.2 × its rate
// (configured capacity, else delivery rate) × its base RTT, at least minWindow; 0 (let the
// scheduler derive it) while neither is known. The tunnel has no congestion window of its
// own, and the schedulers' fallback, the rate times the smoothed RTT, grows with the queue
// the tunnel itself builds: the path's queue then fills until the link drops, and the inner
// TCP halves its window. Bounded by the base RTT, the queue stays near 20 % of the path's
// bandwidth-delay product; the device reader waits when every window is full, and the host's
// queue pushes back on the inner TCP instead of a loss. The rate can grow by a fifth per
// delivery-rate window, and minWindow lets a path start.
func window(capacity, delivery float64, base time.Duration) int {
	rate := capacity
	if !(rate > 0) {
		rate = delivery
	}
	if !(rate > 0) || base <= 0 {
		return 0
	}
	return max(int(rate*(1.2*base.Seconds()+windowSlack.Seconds())/8), minWindow)
}

// windowSlack is the delay beyond 1.2 base RTTs a window covers: the tunnel's own timers
// (2 ms), scheduling and the emulator add a few milliseconds that on a 20 ms path alone eat
// the fifth of headroom the rate needs to grow.
const windowSlack = 10 * time.Millisecond

// minWindow is the smallest window: 16 KiB, eleven full packets, lets a path without a rate
// estimate start (at 13 Mbit/s on a 10 ms round trip) without a queue of a quarter second on
// a 2 Mbit/s link, which the schedulers' own 64 KiB floor would allow.
const minWindow = 16 << 10

// connScheduler is a scheduler that needs the receiver's free buffer.
type connScheduler interface {
	PickConn(now int64, c sched.Conn, paths []sched.Path, size int) (int, bool)
}

// statesScheduler is a scheduler that keeps paths active or demotes them (RBPM).
type statesScheduler interface {
	States(dst []sched.PathState) []sched.PathState
}

// connLocked is the receiver's state for the buffer-aware schedulers: the free room of its
// reorder buffer, as the newest feedback on any path reported it.
func (p *peer) connLocked() sched.Conn {
	var c feedbackConn
	for _, pp := range p.paths {
		c.observe(pp.est.Snapshot())
	}
	return c.conn()
}

// feedbackConn picks the newest feedback's free room out of the paths' snapshots.
type feedbackConn struct {
	at   int64
	free uint32
}

func (c *feedbackConn) observe(s path.Snapshot) {
	if s.PeerFeedbackAt > c.at {
		c.at, c.free = s.PeerFeedbackAt, s.PeerReorderFreeKiB
	}
}

func (c feedbackConn) conn() sched.Conn {
	if c.at == 0 || c.free == mpath.NoReorderBound {
		return sched.Conn{}
	}
	return sched.Conn{Avail: int(c.free) << 10, AvailKnown: true}
}

// reorderFreeKiB is the free room of p's reorder buffer for the feedback, in KiB:
// mpath.NoReorderBound when p does not reorder. Called with p.mu held.
func (t *Tunnel) reorderFreeKiB(p *peer) uint32 {
	if p.rb == nil {
		return mpath.NoReorderBound
	}
	free := max(t.o.ReorderCfg.Defaults().MaxBytes-p.rb.Stats().Bytes, 0) >> 10
	return uint32(min(free, mpath.NoReorderBound-1))
}

// schedStateLocked is path i's standing with a scheduler that demotes paths (RBPM); ok is
// false for the others.
func (p *peer) schedStateLocked(i int) (st sched.PathState, ok bool) {
	ss, ok := p.sch.(statesScheduler)
	if !ok {
		return st, false
	}
	p.states = ss.States(p.states[:0])
	for _, s := range p.states {
		if s.ID == i {
			return s, true
		}
	}
	return sched.PathState{ID: i, Active: true}, true
}

// probeWindow is the window of a path whose capacity is measured, under the queue planner:
// two round trips (plus probeWindowSlack) at the estimated rate (the delivery rate until a sample has been taken),
// the window BBR keeps for the same reason, so that the estimator's startup and probes, which
// pace above the path's rate, fill the path's queue by at most one bandwidth-delay product.
// Until the path has a rate and a round trip, the window is 64 KiB: a path starts as TCP does,
// and its delivery rate, and with it the window, grows from what it carries.
func probeWindow(c *sched.Capacity, delivery float64, base time.Duration) int {
	rate := delivery
	if c.Measured() {
		rate = max(rate, c.Estimate())
	}
	if !(rate > 0) || base <= 0 {
		return 4 * minWindow
	}
	return max(int(rate*(2*base.Seconds()+probeWindowSlack.Seconds())/8), 4*minWindow)
}

// probeWindowSlack is what the window adds for the time the sites themselves hold data (their
// batching and scheduling: on a fast path with a base RTT of 100 µs, the data in flight over the
// smoothed RTT is several times the base BDP): enough for 1.25 MB at 5 Gbit/s, and 12 KB at
// 50 Mbit/s, which a queue of one BDP absorbs.
const probeWindowSlack = 2 * time.Millisecond
