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
	var newest path.Snapshot
	for _, pp := range p.paths {
		if s := pp.est.Snapshot(); s.PeerFeedbackAt > newest.PeerFeedbackAt {
			newest = s
		}
	}
	if newest.PeerFeedbackAt == 0 || newest.PeerReorderFreeKiB == mpath.NoReorderBound {
		return sched.Conn{}
	}
	return sched.Conn{Avail: int(newest.PeerReorderFreeKiB) << 10, AvailKnown: true}
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
