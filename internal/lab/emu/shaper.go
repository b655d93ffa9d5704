// Package emu is the lab's user-space link emulator: a delay line between two TUN devices, one in
// each host's network namespace, with a rate limit, one-way delay, jitter, random loss and a
// drop-tail queue in each direction. The kernel here has no netem, so this is what gives the lab
// its WAN links.
//
// Per direction, each packet that arrives at time t with b bytes is handled as a serialiser
// behind a drop-tail queue followed by a propagation delay:
//
//	depart  = max(t, previous depart) + b·8/rate
//	deliver = max(depart + delay + U[0, jitter], previous deliver)
//
// On a trace link (topo.Trace) the serialiser's capacity is the trace's opportunities instead of
// a rate. The replay starts at the shaper's origin (the link's creation), Trace.Offset into the
// trace, and repeats; opportunity j is at origin + trace time(j) - Offset. Each opportunity lets
// topo.TraceOpportunity (1500) bytes leave at its instant, and the rule is byte-accurate:
//
//   - a packet of b bytes waits for the first opportunity at or after max(t, previous depart);
//     it takes ⌈b/1500⌉ opportunities (a super-packet of several segments takes several) and
//     departs at the last of them;
//   - the bytes the last one leaves over can carry the next packet at the same instant, if that
//     packet is already waiting then (queued packets share an opportunity: three 500-byte
//     packets leave on one);
//   - an opportunity that finds the queue empty is lost, as are its leftover bytes: capacity is
//     not banked while the link idles.
//
// So a saturated trace link delivers exactly 1500 bytes per line of the trace, and the bytes it
// delivers per second are the trace's.
//
// A packet is dropped at arrival when the link is cut, at random with the configured loss
// probability, or when the backlog still waiting for the serialiser would exceed the queue bound.
// Deliveries never overtake each other, so jitter does not reorder.
//
// Shaper is that model as a pure function of the arrival time; Link moves packets between the TUN
// devices and sleeps until each delivery time.
package emu

import (
	"math"
	"math/rand/v2"
	"time"

	"braid/internal/lab/topo"
)

// Verdict is what the shaper decided for one packet.
type Verdict uint8

const (
	Pass      Verdict = iota
	DropLoss          // random loss
	DropQueue         // the drop-tail queue was full
	DropDown          // the link is cut
)

// minQueuePackets is the smallest default queue, in MTU-sized packets.
const minQueuePackets = 64

// Shaper decides, for each packet of one link direction, whether it is dropped and when it is
// delivered. Times are monotonic nanoseconds passed in by the caller. Not safe for concurrent use.
type Shaper struct {
	shape       topo.Shape
	mtu         int
	limitPkts   int // 0: no bound in packets
	limitBytes  int // 0: no bound in bytes
	lastDepart  int64
	lastDeliver int64

	// Trace replay (nil trace: the fixed rate). next is the first opportunity of the endless
	// replay not yet used, left the bytes still free in the one the last packet departed on.
	trace  *topo.Trace
	origin int64
	next   int64
	left   int
	down   bool
	rng    *rand.Rand

	// backlog holds the packets that have not left the serialiser yet, in departure order.
	backlog           []backlogEntry
	head, n           int
	occPkts, occBytes int
}

type backlogEntry struct {
	depart      int64
	bytes, segs int32
}

// NewShaper returns a shaper for one direction of a link with the given MTU; seed makes its
// random choices (loss, jitter) reproducible.
func NewShaper(s topo.Shape, mtu int, seed uint64) *Shaper {
	sh := &Shaper{mtu: mtu, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), backlog: make([]backlogEntry, 64)}
	sh.Set(s)
	return sh
}

// Set changes the shape from now on; packets already admitted keep their delivery times.
func (s *Shaper) Set(shape topo.Shape) {
	s.shape = shape
	s.limitPkts, s.limitBytes = QueueLimits(shape, s.mtu)
	tr := shape.Trace
	if !tr.Replayable() {
		tr = nil // a summary cannot shape; Validate refuses it in a topology
	}
	if tr != s.trace {
		s.trace, s.left = tr, 0
		s.next = -1 // found again at the next packet
	}
}

// SetOrigin sets when the trace's replay starts (Trace.Offset into the trace), in the caller's
// monotonic nanoseconds; the default is 0.
func (s *Shaper) SetOrigin(t int64) {
	s.origin, s.left, s.next = t, 0, -1
}

// Shape returns the current shape.
func (s *Shaper) Shape() topo.Shape { return s.shape }

// SetDown cuts (true) or restores (false) the direction.
func (s *Shaper) SetDown(down bool) { s.down = down }

// QueueLimits returns the effective queue bounds of a shape: the configured ones, or by default
// one bandwidth-delay product of the round trip (2·delay) at the rate, or at a trace's mean
// rate, at least 64 MTU-sized packets, in bytes. An unlimited rate never queues, so it needs no bound.
func QueueLimits(s topo.Shape, mtu int) (pkts, bytes int) {
	if s.QueuePackets > 0 || s.QueueBytes > 0 {
		return s.QueuePackets, s.QueueBytes
	}
	rate := s.MeanRate() // a trace's mean rate
	if rate == 0 {
		return 0, 0
	}
	bdp := float64(rate) / 8 * 2 * s.Delay.Seconds()
	return 0, max(int(bdp), minQueuePackets*mtu)
}

// Admit decides the fate of a packet of b bytes (IP bytes on the wire, all segments counted) made
// of segs segments, arriving at now. On Pass it returns the delivery time.
func (s *Shaper) Admit(now int64, b, segs int) (deliver int64, v Verdict) {
	if s.down {
		return 0, DropDown
	}
	if s.shape.Loss > 0 {
		p := s.shape.Loss / 100
		if segs > 1 { // a super-packet is lost when any of its segments would be
			p = 1 - math.Pow(1-p, float64(segs))
		}
		if s.rng.Float64() < p {
			return 0, DropLoss
		}
	}
	depart := now
	if s.shape.Rate > 0 || s.trace != nil {
		s.expire(now)
		if s.n > 0 && (s.limitPkts > 0 && s.occPkts+segs > s.limitPkts ||
			s.limitBytes > 0 && s.occBytes+b > s.limitBytes) {
			return 0, DropQueue
		}
		if s.trace != nil {
			depart = s.traceDepart(now, b)
		} else {
			depart = max(now, s.lastDepart) + int64(b)*8e9/int64(s.shape.Rate)
		}
		s.lastDepart = depart
		s.push(backlogEntry{depart: depart, bytes: int32(b), segs: int32(segs)})
	}
	deliver = depart + int64(s.shape.Delay)
	if s.shape.Jitter > 0 {
		deliver += s.rng.Int64N(int64(s.shape.Jitter) + 1)
	}
	deliver = max(deliver, s.lastDeliver)
	s.lastDeliver = deliver
	return deliver, Pass
}

// Backlog returns what waits for the serialiser at now, in packets (segments) and bytes.
func (s *Shaper) Backlog(now int64) (pkts, bytes int) {
	s.expire(now)
	return s.occPkts, s.occBytes
}

func (s *Shaper) expire(now int64) {
	for s.n > 0 && s.backlog[s.head].depart <= now {
		e := s.backlog[s.head]
		s.occPkts -= int(e.segs)
		s.occBytes -= int(e.bytes)
		s.head = (s.head + 1) % len(s.backlog)
		s.n--
	}
}

func (s *Shaper) push(e backlogEntry) {
	if s.n == len(s.backlog) {
		grown := make([]backlogEntry, 2*len(s.backlog))
		for i := range s.n {
			grown[i] = s.backlog[(s.head+i)%len(s.backlog)]
		}
		s.backlog, s.head = grown, 0
	}
	s.backlog[(s.head+s.n)%len(s.backlog)] = e
	s.n++
	s.occPkts += int(e.segs)
	s.occBytes += int(e.bytes)
}

// traceDepart returns when a packet of b bytes arriving at now leaves a trace link's serialiser
// (the rule in the package doc), and takes the opportunities it uses.
func (s *Shaper) traceDepart(now int64, b int) int64 {
	start := max(now, s.lastDepart)
	if s.next < 0 || start > s.lastDepart {
		// The queue ran empty (or the replay is new): what was left of the last opportunity,
		// and every opportunity before start, went unused.
		s.left = 0
		s.next = s.trace.Next(max(0, time.Duration(start-s.origin)+s.trace.Offset))
	}
	if b <= s.left {
		s.left -= b
		return s.lastDepart
	}
	need := b - s.left
	n := int64((need + topo.TraceOpportunity - 1) / topo.TraceOpportunity)
	last := s.next + n - 1
	s.next = last + 1
	s.left = int(n)*topo.TraceOpportunity - need
	return s.origin + int64(s.trace.At(last)-s.trace.Offset)
}
