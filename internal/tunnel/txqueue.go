package tunnel

import (
	"cmp"
	"errors"
	"os"
	"slices"
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/session"
	"braid/internal/tunnel/sparse"
	"braid/internal/wire/mpath"
)

// The device reader's send queue, for a peer whose scheduler plans a queue (the default,
// paced): packets read from the device wait here, in the order the receiver must see them,
// and each leaves on the path by which it arrives first, as sched.Paced.Plan decides. A
// slower path then takes packets from further down the queue, those the faster paths would
// deliver after the slower path's delay, instead of the next packet in line: every packet
// arrives at about the time the fast path would deliver it, and the receiver's reorder buffer
// holds almost nothing (docs/scheduling.md, "Unequal paths").
//
// The queue is bounded in time: it takes packets while what it holds would drain, at the
// paths' rates, within the spread of the paths' one-way delays plus queueSlack. The bound is
// checked before each read and for each packet a read returned. When every peer is at its
// bound, the reader waits instead of reading. A read returns up to a super-packet's segments
// (64), so it can cross the bound: what a peer's queue cannot take is dropped
// (drop_queue_full), at a site with one peer as at a hub. Those drops are the inner flows'
// congestion signal, and the bound works as an AQM through them: with the tail of a read
// queued instead, a cubic flow's queue stood in the TUN device's ring (1000 packets), where a
// sparse echo waits behind it, and TestTunnelSparseFlows' echo p95 went from 20 ms to 630 ms
// (docs/scheduling.md, "The send queue's bound is a congestion signal"). At a hub the same
// drop keeps one peer whose paths stall or whose sites flood from stalling the rest.

// planner is a scheduler that plans a queue (sched.Paced).
type planner interface {
	Plan(now int64, paths []sched.Path, sizes []int, out []int) (wake int64, ok bool)
	Charge(paths []sched.Path, i, size int)
}

// deadliner is a device whose reads can time out (a TUN device, through the runtime's poller).
type deadliner interface {
	SetReadDeadline(t time.Time) error
}

// queued is one inner packet waiting in a peer's send queue.
type queued struct {
	b    []byte // the packet at b[headroom:headroom+n]
	n    int
	seq  uint32 // its place in the peer's sequence, for the receiver's reorder buffer
	wire int    // its size on the wire
	at   int64  // when it was queued
	// sparse: a sparse flow's packet (Options.SparseFlows), queued ahead of the others and
	// sent on every path of q.copyTo
	sparse bool
}

// txQueue is a peer's send queue; only the device reader touches it.
type txQueue struct {
	pkts  []queued
	bytes int // wire bytes queued
	limit int // wire bytes it may hold, from the last plan
	sizes []int
	out   []int
	// Options.SparseFlows: the flows sent (sparse.Meter), the paths that take copies of
	// their sparse packets as of the last plan, and the budget for sparse packets (wire
	// bytes of the packets and their copies).
	flows  sparse.Meter
	copyTo []int
	budget budget
}

// budget is a token bucket of bytes: rate per second, burst at most; full to begin with.
type budget struct {
	credit, at int64 // bytes, as of at (ns)
	started    bool
}

// take reports whether cost bytes are in the bucket at now, and takes them if so.
func (b *budget) take(now, cost, rate, burst int64) bool {
	switch d := now - b.at; {
	case !b.started || d >= int64(time.Second)*burst/rate:
		b.credit, b.started = burst, true
	case d > 0:
		b.credit = min(b.credit+d*rate/int64(time.Second), burst)
	}
	b.at = now
	if b.credit < cost {
		return false
	}
	b.credit -= cost
	return true
}

// Sparse flows' packets (Options.SparseFlows) go ahead of the others in the queue, and their
// copies bypass the planner: both are bounded by a budget per peer of sparseCopyRate bytes
// per second on the wire (a packet and its copies), at most sparseCopyBurst at once. Flows
// sparse by their own meter send at most 12 kB/s each, so the budget binds only when dozens
// of them are active at once; the packets over it queue and leave like the others, once, and
// are counted (sparse_capped).
const (
	sparseCopyRate  = 125000 // 1 Mbit/s
	sparseCopyBurst = 16384
)

// sparse reports whether the inner packet at b[headroom:headroom+n] is a sparse flow's that
// the budget lets ahead (and copy on every path), and takes its cost from the budget.
func (q *txQueue) sparse(t *Tunnel, p *peer, b []byte, n, wire int, now int64) bool {
	if !t.o.SparseFlows || !q.flows.Sparse(now, b[headroom:headroom+n]) {
		return false
	}
	if ls := p.cur.Load(); ls == nil || ls.s.Version < session.V3 {
		// A receiver of version 2 holds a packet that went ahead until the ones numbered
		// before it come (longer than its hold, at times: losses for the flows inside),
		// and delivers some copies (three look-alikes in a row are a restart's sign to it).
		return false
	}
	if q.budget.take(now, int64(max(len(q.copyTo), 1)*wire), sparseCopyRate, sparseCopyBurst) {
		return true
	}
	t.stats.SparseCapped.Add(1)
	return false
}

// queueSlack is what the queue may hold beyond the spread of the paths' delays, in time at the
// paths' rates: enough for a round of bursts, not a standing queue.
const queueSlack = 20 * time.Millisecond

// owedFor is how long resent bytes stay owed to a path's pacing when its round trip is unknown.
const owedFor = 100 * time.Millisecond

// maxQueued bounds a peer's send queue in packets whatever the rates (the buffers it holds).
const maxQueued = 4096

// enqueue takes the packet at b[headroom:headroom+n], of wire bytes on the wire, into p's
// queue, numbered next in the peer's sequence; b belongs to the queue until it is sent.
//
// A sparse flow's packet goes ahead of the others, behind the sparse packets already there:
// its number is still the next, and the receiver delivers it at once rather than in order
// (reorder.Buffer.Place), so it waits neither here behind the bulk flows' queue nor there
// behind their gaps.
func (q *txQueue) enqueue(p *peer, b []byte, n, wire int, now int64) {
	e := queued{b: b, n: n, seq: p.txSeq.Add(1), wire: wire, at: now}
	if e.sparse = q.sparse(p.t, p, b, n, wire, now); e.sparse {
		k := 0
		for k < len(q.pkts) && q.pkts[k].sparse {
			k++
		}
		q.pkts = slices.Insert(q.pkts, k, e)
	} else {
		q.pkts = append(q.pkts, e)
	}
	q.bytes += wire
	q.publish(p)
}

// publish makes the queue's depth visible to the status (which runs on other goroutines).
func (q *txQueue) publish(p *peer) {
	p.queuedBytes.Store(int64(q.bytes))
	p.queuedPackets.Store(int64(len(q.pkts)))
}

// full reports whether the queue takes no more packets.
func (q *txQueue) full() bool {
	return len(q.pkts) >= maxQueued || (q.limit > 0 && q.bytes >= q.limit)
}

// dispatch sends what p's scheduler lets go now from p's queue and returns when to come back
// (0: the queue is empty). Packets that waited longer than maxSchedWait, or that no path can
// take, are dropped and counted as drop_no_path; their buffers go back to free.
func (t *Tunnel) dispatch(tx *txState, p *peer, now int64, free *[][]byte) (wake int64) {
	q := &p.q
	if len(q.pkts) == 0 {
		return 0
	}
	if cap(q.sizes) < len(q.pkts) {
		q.sizes = make([]int, len(q.pkts), cap(q.pkts))
		q.out = make([]int, len(q.pkts), cap(q.pkts))
	}
	q.sizes, q.out = q.sizes[:len(q.pkts)], q.out[:len(q.pkts)]
	for k := range q.pkts {
		q.sizes[k] = q.pkts[k].wire
	}
	p.mu.Lock()
	p.snapshotLocked(now)
	for i, pp := range p.paths {
		// What loss recovery resent on the path since the last plan takes its tokens, as
		// the plan's own packets do, unless it was sent a round trip ago or more (the queue
		// was empty meanwhile, and what was resent has left the path's queue).
		if n := pp.owed.Swap(0); n > 0 && i < len(p.snap) && now-pp.owedAt.Load() < int64(cmp.Or(p.snap[i].SRTT, owedFor)) {
			p.sch.(planner).Charge(p.snap, i, int(n))
			pp.sent.add(now, int(n))
		}
	}
	wake, ok := p.sch.(planner).Plan(now, p.snap, q.sizes, q.out)
	q.limit = p.queueLimitLocked()
	q.copyTo = q.copyTo[:0]
	if t.o.SparseFlows {
		for j := range p.snap {
			if p.snap[j].Up && !p.snap[j].Backup {
				q.copyTo = append(q.copyTo, j)
			}
		}
	}
	for k, i := range q.out {
		if i < 0 {
			continue
		}
		p.paths[i].sent.add(now, q.sizes[k])
		if q.pkts[k].sparse {
			// The copies (below) are paced and counted like the packets of the plan.
			for _, j := range q.copyTo {
				if j != i {
					p.paths[j].sent.add(now, q.sizes[k])
					p.sch.(planner).Charge(p.snap, j, q.sizes[k])
				}
			}
		}
	}
	paths := p.paths // the paths the plan indexes (a learned path may be added meanwhile)
	p.mu.Unlock()
	keep := q.pkts[:0]
	q.bytes = 0
	for k, e := range q.pkts {
		switch i := q.out[k]; {
		case i >= 0:
			var flags uint16
			if e.sparse {
				flags = mpath.FlagSparse
			}
			t.emit(tx, p, paths[i], e.b, e.n, e.seq, now, flags)
			if e.sparse {
				// The receiver delivers the first copy that arrives and drops the others
				// as duplicates (their sequence number is the same).
				for _, j := range q.copyTo {
					if j != i {
						t.emit(tx, p, paths[j], e.b, e.n, e.seq, now, flags)
						t.stats.SparseCopies.Add(1)
					}
				}
			}
			*free = append(*free, e.b)
		case !ok || now-e.at > maxSchedWait:
			t.stats.DropNoPath.Add(1)
			*free = append(*free, e.b)
		default:
			keep = append(keep, e)
			q.bytes += e.wire
		}
	}
	clear(q.pkts[len(keep):])
	q.pkts = keep
	q.publish(p)
	if len(q.pkts) == 0 {
		return 0
	}
	return max(wake, now+minPaceWait)
}

// queueLimitLocked is how many wire bytes p's queue may hold: what the Up paths carry, at the
// rates the scheduler paces them, over the spread of their one-way delays plus queueSlack.
func (p *peer) queueLimitLocked() int {
	rate, lo, hi := 0.0, time.Duration(0), time.Duration(0)
	first := true
	for i := range p.snap {
		sp := &p.snap[i]
		if !sp.Up {
			continue
		}
		r := sp.PaceRate
		if !(r > 0) {
			r = sp.Capacity
		}
		if !(r > 0) {
			r = sched.PacedConfig{}.Defaults().DefaultCapacity
		}
		rate += r
		d := sp.MinRTT
		if d <= 0 || d > time.Minute {
			d = sp.SRTT
		}
		d /= 2
		if first || d < lo {
			lo = d
		}
		if first || d > hi {
			hi = d
		}
		first = false
	}
	return int(rate / 8 * (hi - lo + queueSlack).Seconds())
}

// readQueued reads the device into bufs while some peer has packets queued: it waits for the
// device at most until wake, and reports a timeout as 0 packets.
func readQueued(bd BatchDevice, dev Device, dl deadliner, bufs [][]byte, sizes []int, wake int64, now int64) (int, error) {
	if err := dl.SetReadDeadline(time.Now().Add(time.Duration(wake - now))); err != nil {
		return 0, err
	}
	k, err := readSome(bd, dev, bufs, sizes)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, nil
	}
	return k, err
}

// readSome reads one batch (or one packet) from the device.
func readSome(bd BatchDevice, dev Device, bufs [][]byte, sizes []int) (int, error) {
	if bd != nil {
		return bd.ReadBatch(bufs, headroom, sizes)
	}
	n, err := dev.Read(bufs[0][headroom:])
	sizes[0] = n
	if err != nil {
		return 0, err
	}
	return 1, nil
}
