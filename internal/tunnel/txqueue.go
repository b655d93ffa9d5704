package tunnel

import (
	"errors"
	"os"
	"time"

	"braid/internal/sched"
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
// paths' rates, within the spread of the paths' one-way delays plus queueSlack. When every
// peer with packets queued is at its bound, the reader stops reading the device, whose own
// queue then fills and drops (or, for a sender on this host, holds it back through TCP small
// queues), which the inner flows see as congestion. When only some are, their packets are
// dropped (drop_queue_full) and the reader reads on for the others: at a hub, one peer whose
// paths stall or whose sites flood cannot stall the rest.

// planner is a scheduler that plans a queue (sched.Paced).
type planner interface {
	Plan(now int64, paths []sched.Path, sizes []int, out []int) (wake int64, ok bool)
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
}

// txQueue is a peer's send queue; only the device reader touches it.
type txQueue struct {
	pkts  []queued
	bytes int // wire bytes queued
	limit int // wire bytes it may hold, from the last plan
	sizes []int
	out   []int
}

// queueSlack is what the queue may hold beyond the spread of the paths' delays, in time at the
// paths' rates: enough for a round of bursts, not a standing queue.
const queueSlack = 20 * time.Millisecond

// maxQueued bounds a peer's send queue in packets whatever the rates (the buffers it holds).
const maxQueued = 4096

// enqueue takes the packet at b[headroom:headroom+n], of wire bytes on the wire, into p's
// queue, numbered next in the peer's sequence; b belongs to the queue until it is sent.
func (q *txQueue) enqueue(p *peer, b []byte, n, wire int, now int64) {
	q.pkts = append(q.pkts, queued{b: b, n: n, seq: p.txSeq.Add(1), wire: wire, at: now})
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
	wake, ok := p.sch.(planner).Plan(now, p.snap, q.sizes, q.out)
	q.limit = p.queueLimitLocked()
	for k, i := range q.out {
		if i >= 0 {
			p.paths[i].sent.add(now, q.sizes[k])
		}
	}
	paths := p.paths // the paths the plan indexes (a learned path may be added meanwhile)
	p.mu.Unlock()
	keep := q.pkts[:0]
	q.bytes = 0
	for k, e := range q.pkts {
		switch i := q.out[k]; {
		case i >= 0:
			t.emit(tx, p, paths[i], e.b, e.n, e.seq, now)
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
