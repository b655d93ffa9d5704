// Package reorder puts one peer's data packets back into sequence order before they reach the
// TUN device, without ever making a flow slower than no reordering at all.
//
// The sender numbers data packets per peer over all paths (a 32-bit sequence that wraps). The
// paths have different delays, so packets arrive permuted; TCP inside the tunnel reads a
// permutation as loss and halves its window. Holding packets back fixes that, but holding them
// too long is worse than not reordering: MPT's fixed 900-packet / 300 ms buffer stalls every
// flow for 300 ms on each real loss and collapses a TCP flow to 47 Mbit/s where no reordering
// gives 300-400 (tunnels.md section 3). So this buffer:
//
//   - passes in-order packets straight through (no copy into the ring, no wait);
//   - holds a packet at most the hold time, which the tunnel sets from the paths' RTT spread
//     (Config.HoldFor), not a fixed worst case, except that a gap a path still delivering may
//     yet bring (SetInFlight) is held up to MaxHold;
//   - on overflow (packets, bytes or sequence window) releases in order up to the next gap
//     instead of dropping (tunnels.md section 8);
//   - delivers late packets (sequence already passed) at once instead of dropping them, because
//     for TCP a late segment is merely a reordering, while a dropped one is a loss and a
//     retransmission (MPT drops them);
//   - drops duplicates it can recognise.
//
// The package is pure: time is passed in as monotonic nanoseconds, there is no I/O, no
// goroutine and no lock; the caller owns one Buffer per peer and serialises calls to it. The
// caller also owns packet memory: the buffer stores an opaque value of type T (a pointer, an
// index into a pool) and hands it back exactly once, or never for a dropped duplicate.
//
// Data structure: a ring of 2^k slots indexed by seq mod 2^k (k chosen so that 2^k >=
// 2·MaxPackets), holding the sequence window [next, next+2^k), plus a FIFO of arrival times so
// that the oldest waiting packet, which sets the deadline, is found in O(1) amortised time.
// Push, Expire and NextDeadline are O(1) amortised and do not allocate.
package reorder

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Errors returned by Config.Validate.
var (
	ErrMaxPackets = errors.New("reorder: MaxPackets out of range")
	ErrMaxBytes   = errors.New("reorder: MaxBytes out of range")
	ErrHold       = errors.New("reorder: hold times out of range")
)

// Limits on Config values. maxPacketsLimit keeps the restart window (4 × ring) far below 2^31,
// where serial-number comparison stops being meaningful.
const (
	maxPacketsLimit = 1 << 20
	// restartConfirm is how many consecutive arrivals behind the window or outside it, close
	// to one another, it takes to believe the peer restarted its sequence (see Push).
	restartConfirm = 8
	// restartDups is how many look-alike duplicates in a row a run drops before it delivers
	// them (see Push).
	restartDups = 2
)

// Config bounds one peer's buffer. Zero fields take the values of Defaults.
type Config struct {
	// MaxPackets is the most packets held at once. The ring is twice this, rounded up to a
	// power of two; it bounds how far ahead of the next expected packet a packet may be held.
	MaxPackets int
	// MaxBytes is the most payload bytes held at once.
	MaxBytes int
	// MinHold and MaxHold clamp the hold time (SetHold, HoldFor). MinHold covers scheduling
	// jitter on equal paths; MaxHold caps the stall a real loss can cause.
	MinHold, MaxHold time.Duration
	// Hold is the hold time until the tunnel has RTT estimates and calls SetHold.
	Hold time.Duration
	// Learn shortens the hold below what SetHold allows to what the reordering seen lately
	// needs: see Buffer.SetHold.
	Learn bool
}

// Defaults returns c with every zero field set to its default: 4096 packets, 4 MiB, hold time
// clamped to [1 ms, 100 ms], starting at 10 ms. 4 MiB is about 33 ms of a 1 Gbit/s flow and
// 6 ms of a 5 Gbit/s one, enough for the RTT spreads MinHold..MaxHold allow at common rates;
// the 100 ms cap keeps a loss from stalling TCP the way MPT's 300 ms does. 4096 packets lets
// the 4 MiB fill with packets down to 1 KiB: with full-size packets the bytes bound first,
// which is the room the receiver reports to the sender (Feedback.ReorderFreeKiB). 1024
// packets (1.4 MiB of 1428-byte packets) overflowed on two equal paths at 4-6 Gbit/s, where
// one path's reader falls a few ms behind the other's on a busy host (docs/tunnel-profile.md,
// "Two paths against one").
func (c Config) Defaults() Config {
	if c.MaxPackets == 0 {
		c.MaxPackets = 4096
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 4 << 20
	}
	if c.MinHold == 0 {
		c.MinHold = time.Millisecond
	}
	if c.MaxHold == 0 {
		c.MaxHold = 100 * time.Millisecond
	}
	if c.Hold == 0 {
		c.Hold = 10 * time.Millisecond
	}
	return c
}

// Validate reports whether c (after Defaults) can build a Buffer.
func (c Config) Validate() error {
	if c.MaxPackets < 1 || c.MaxPackets > maxPacketsLimit {
		return fmt.Errorf("%w: %d, want 1..%d", ErrMaxPackets, c.MaxPackets, maxPacketsLimit)
	}
	if c.MaxBytes < 1 {
		return fmt.Errorf("%w: %d, want > 0", ErrMaxBytes, c.MaxBytes)
	}
	if c.MinHold < 0 || c.MaxHold < c.MinHold {
		return fmt.Errorf("%w: min %v, max %v", ErrHold, c.MinHold, c.MaxHold)
	}
	if c.Hold < 0 {
		return fmt.Errorf("%w: hold %v", ErrHold, c.Hold)
	}
	return nil
}

// PathRTT is what HoldFor needs to know about one usable path.
type PathRTT struct {
	SRTT, RTTVar time.Duration
}

// holdMargin absorbs what RTT estimates do not see: receive batching and the time between the
// tunnel's Expire calls.
const holdMargin = time.Millisecond

// HoldFor returns the hold time for a peer reached over paths, clamped to [MinHold, MaxHold]:
//
//	hold = max_i(srtt_i + 4·rttvar_i) − min_i(srtt_i) + 1 ms
//
// and 1 ms for a single path: its packets leave and arrive in order, so its jitter delays
// them but does not permute them, and a gap on it is a loss (or a resend on its way, which
// the tunnel's floor covers: SetFloor). Holding its gaps 4·rttvar (100 ms on an LTE link)
// stalled the flow inside on every loss and carried 0.75-0.8 of a plain TCP flow over the
// same link (docs/scheduling.md, "One path: a gap is a loss").
//
// A packet is worth waiting for only as long as a packet sent at the same moment on another
// path can still be on its way, which is the spread of the path delays, not their size. The
// full RTT spread is used rather than half of it because one-way delays are unknown without
// synchronised clocks and the whole difference may lie in the forward direction; 4·rttvar
// covers the slow path's jitter as in TCP's RTO. MLVPN's 2.2 × max(srtt + 4·rttvar) was
// rejected: on two equal 50 ms paths it holds every loss for over 110 ms, the failure mode
// that makes MPT slower than no reordering, while the spread gives about MinHold. Erring
// short costs little because late packets are delivered, not dropped. Paths without an
// estimate (SRTT 0) are ignored; with no estimate at all HoldFor returns the initial Hold.
// HoldFor is a method of Config, not a free function, because the clamp is per configuration.
func (c Config) HoldFor(paths []PathRTT) time.Duration {
	c = c.Defaults()
	var lo, hi time.Duration
	n := 0
	for _, p := range paths {
		if p.SRTT <= 0 {
			continue
		}
		v := max(p.RTTVar, 0)
		if n == 0 || p.SRTT < lo {
			lo = p.SRTT
		}
		if n == 0 || p.SRTT+4*v > hi {
			hi = p.SRTT + 4*v
		}
		n++
	}
	switch n {
	case 0:
		return clamp(c.Hold, c.MinHold, c.MaxHold)
	case 1:
		return clamp(holdMargin, c.MinHold, c.MaxHold)
	}
	return clamp(hi-lo+holdMargin, c.MinHold, c.MaxHold)
}

func clamp(d, lo, hi time.Duration) time.Duration {
	return min(max(d, lo), hi)
}

// Stats counts what the buffer did. Every pushed packet ends up in exactly one of InOrder,
// AfterGap, Late, Stray or Duplicates, or is still held (Packets).
type Stats struct {
	InOrder  uint64 // delivered when its predecessor was: straight through, or once a gap filled
	AfterGap uint64 // delivered by a forced release that declared an earlier gap lost
	Late     uint64 // arrived after its sequence number was passed; delivered at once
	Stray    uint64 // more than 4 rings away from the next expected number; delivered at once
	// Duplicates were dropped: a copy was held, or had been delivered recently enough to
	// remember (within one ring of the next expected sequence number).
	Duplicates uint64
	Lost       uint64 // sequence numbers given up on (gaps skipped by forced releases)
	Timeouts   uint64 // forced releases because the oldest packet waited the hold time
	Overflows  uint64 // forced releases because of MaxPackets, MaxBytes or the sequence window
	Resets     uint64 // sequence restarts detected
	// Waited counts the gaps held past the hold because a path might still bring them
	// (SetInFlight); each is then filled or, at MaxHold, counted in Timeouts and Lost.
	Waited uint64
	// Placed counts the packets the caller delivered itself, out of order (Place).
	Placed uint64
	// Rescued counts the gaps held past the hold for a resend (Rescue); Refilled the gaps so
	// held that a packet then filled in time (the resend or the original).
	Rescued, Refilled uint64
	Packets           int // packets held now
	Bytes             int // bytes held now
}

// Slot states. A slot remembers the last sequence number it held even after delivery, which is
// what lets Push recognise a duplicate of a recently delivered packet.
const (
	slotEmpty = iota
	slotHeld
	slotDelivered
)

type slot[T any] struct {
	v     T
	seq   uint32
	size  int32
	state uint8
	// placed: the number's packet was delivered by the caller (Place); held, the slot has
	// nothing to deliver, and a copy that comes later is only a duplicate
	placed bool
	// resent: the number's packet came as a resend (PushResent); its original may still come
	// on the path it was sent on, and is then only a duplicate, not a sign of a restart
	resent bool
	// Rescue: number rseq is missing and its resend may come until runtil (0: not rescued)
	rseq   uint32
	runtil int64
}

// arrival is a FIFO entry: when a held packet arrived. Entries whose packet has since been
// delivered are skipped lazily.
type arrival struct {
	at  int64
	seq uint32
}

// Buffer is one peer's reorder buffer. It is not safe for concurrent use.
type Buffer[T any] struct {
	cfg  Config
	ring []slot[T]
	mask uint32
	// window is how far behind (late) or ahead (overflow release) of next a sequence number is
	// still taken as part of the current stream; beyond it a packet is a stray.
	window int64
	next   uint32 // next expected sequence number; its slot is never held
	start  bool   // next is valid
	hold   int64  // ns: the hold in force
	ceil   int64  // ns: the hold SetHold allows
	floor  int64  // ns: the least hold Learn may settle on (SetFloor)
	// Learn: the longest wait a gap needed lately (ns), decaying by half every learnHalfLife,
	// as of learnAt; late is the longest a late packet showed it needed, decaying alike.
	need, late float64
	learnAt    int64
	// Learn: the last gap given up on by a timeout (Expire): when, and how long the oldest
	// packet it released had waited then; timedOut is false when none has been, or an
	// overflow gave up on a gap since (its late packets say the buffer was short, not the
	// hold).
	lostAt, lostWait int64
	timedOut         bool
	// SetInFlight: the lowest sequence number a path still delivering may yet bring.
	inFlight   uint32
	inFlightOK bool
	// the gap last counted in Stats.Waited
	waitedSeq uint32
	waited    bool

	// Rescue: no gap is held for a resend after rescueEnd (ns)
	rescueEnd int64

	fifo       []arrival // ring of 2 × len(ring); see push for why that is enough
	fifoHead   int
	fifoLen    int
	count, byt int
	placing    bool // within Place: the packet pushed is not to be delivered
	resending  bool // within PushResent

	// Restart detection: the current run of arrivals behind next or outside the window.
	cand     uint32 // highest number of the run
	candLast uint32 // previous number of the run
	candN    int    // length of the run; 0: no run
	candDups int    // look-alike duplicates at the end of the run
	candAt   int64  // arrival of the run's first packet

	st Stats
}

// New returns an empty buffer. Zero fields of c take their defaults.
func New[T any](c Config) (*Buffer[T], error) {
	c = c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	// The ring covers twice MaxPackets so that MaxPackets packets can be held across the gaps
	// that a lossy path leaves between them.
	n := 1 << bits.Len(uint(2*c.MaxPackets-1)) // next power of two >= 2·MaxPackets
	b := &Buffer[T]{
		cfg:    c,
		ring:   make([]slot[T], n),
		mask:   uint32(n - 1),
		window: 4 * int64(n),
		fifo:   make([]arrival, 2*n),
	}
	b.SetHold(c.Hold)
	return b, nil
}

// SetHold sets how long a packet may wait for the gap before it, clamped to
// [MinHold, MaxHold]. It applies to packets already held, so shortening it releases them on
// the next Expire.
//
// With Config.Learn, d is a ceiling, and the hold in force is what the reordering seen lately
// needs: 5/4 of the longest wait a gap needed before its packet came (a packet that came after
// its gap was given up on counts as needing the whole ceiling), that need halving every
// learnHalfLife (1 s) without a new one, plus holdMargin, at least MinHold. A late packet
// whose gap a timeout gave up on shows how long it actually took: the wait of the packet the
// timeout released plus the time since. When that is beyond the ceiling it raises the
// ceiling to 5/4 of it plus holdMargin (at most MaxHold), decaying alike: d follows the paths'
// RTTs, which do not show the receiver's own lag, one path's reader descheduled for a few ms
// on a busy host while another path's packets arrive (docs/tunnel-profile.md, "Two paths
// against one"). A scheduler that
// spreads packets over paths of unequal delay fills gaps after the paths' spread and keeps the
// hold there; one that sends each packet where it arrives first leaves gaps that are losses,
// which then cost TCP a millisecond or two instead of the spread. The need starts at the
// ceiling.
func (b *Buffer[T]) SetHold(d time.Duration) {
	b.ceil = int64(clamp(d, b.cfg.MinHold, b.cfg.MaxHold))
	b.hold = b.ceil
	if b.cfg.Learn && b.start {
		b.learn(b.learnAt, 0)
	}
}

// SetFloor sets the least hold that Config.Learn may settle on, at least MinHold and at most
// the ceiling SetHold sets: the time a lost packet takes to be sent again, when the sender
// resends what the receiver reports lost. Without it a gap seen after a quiet spell is given up
// on after MinHold, before its resent packet can come. It takes effect at the next SetHold.
func (b *Buffer[T]) SetFloor(d time.Duration) {
	b.floor = int64(max(d, 0))
}

// learnHalfLife is how fast a learnt need for holding fades.
const learnHalfLife = float64(time.Second)

// learn takes a gap's wait into the need (Config.Learn) and sets the hold in force.
func (b *Buffer[T]) learn(now int64, wait int64) {
	b.learnLate(now, wait, 0)
}

// learnLate is learn for a late packet that showed it needed late ns (0: not known).
func (b *Buffer[T]) learnLate(now int64, wait, late int64) {
	if now > b.learnAt {
		f := math.Exp2(-float64(now-b.learnAt) / learnHalfLife)
		b.need *= f
		b.late *= f
		b.learnAt = now
	}
	b.need = max(b.need, float64(wait), float64(late))
	b.late = max(b.late, float64(late))
	ceil := b.ceil
	if b.late > 0 {
		ceil = max(ceil, min(int64(b.late*5/4)+int64(holdMargin), int64(b.cfg.MaxHold)))
	}
	h := int64(b.need*5/4) + int64(holdMargin)
	b.hold = min(max(h, int64(b.cfg.MinHold), b.floor), ceil)
}

// Usual returns how long gaps take to fill lately (Config.Learn): the hold in force without
// SetFloor's floor, at least MinHold and at most the ceiling. Without Learn it is Hold.
func (b *Buffer[T]) Usual() time.Duration {
	if !b.cfg.Learn {
		return time.Duration(b.hold)
	}
	h := int64(b.need*5/4) + int64(holdMargin)
	return time.Duration(min(max(h, int64(b.cfg.MinHold)), b.hold))
}

// Hold returns the current hold time.
func (b *Buffer[T]) Hold() time.Duration { return time.Duration(b.hold) }

// Stats returns the counters and the current occupancy.
func (b *Buffer[T]) Stats() Stats {
	s := b.st
	s.Packets, s.Bytes = b.count, b.byt
	return s
}

// Push takes one arriving packet and appends to out, in order, whatever becomes deliverable;
// it returns the extended out. now is monotonic nanoseconds and must not go backwards between
// calls. Relative to the next expected sequence number n (serial arithmetic, RFC 1982):
//
//   - seq == n: delivered at once, followed by any held packets it makes consecutive;
//   - n < seq < n+ring: held (a duplicate of a held packet is dropped); if that exceeds
//     MaxPackets or MaxBytes, the first gap is declared lost and the run after it released,
//     until within bounds;
//   - n+ring <= seq <= n+4·ring: the window moves forward just enough to hold seq, releasing
//     in order and declaring skipped numbers lost;
//   - n−4·ring <= seq < n: late, delivered at once; dropped as a duplicate if the slot
//     remembers delivering this very number (only within one ring behind n);
//   - otherwise a stray, delivered at once.
//
// Restart rule. A peer that restarts its sequence (MPT does on restart; MPT itself guesses
// "seq <= 50") sends numbers the buffer has already delivered (look-alike duplicates) or far
// outside the window (strays). A run of such arrivals, with no arrival in the forward window
// in between, at least restartConfirm (8) long, each within one ring of the highest, and
// lasting at least the hold time, is taken as a restart: everything held is released in
// order, the delivered-memory is forgotten and n becomes the highest number of the run + 1.
// Plain late packets (numbers that were declared lost) are what a slow path produces when the
// hold time is short, and can come in long runs, so they neither start nor break a run; a
// single straggler is too short a run, and while the old stream lives, its in-window arrivals
// break the run. A restart to a number one to four rings behind n therefore shows as late
// packets, delivered, until the new stream reaches the delivered-memory.
//
// Look-alike duplicates are dropped, except that after restartDups (2) of them in a row, with
// nothing but look-alikes and strays in between, further ones are delivered as late: a
// restarting peer loses
// at most two packets, and three network duplicates in a row, which would be delivered, do
// not occur (a true duplicate delivered costs TCP nothing anyway).
func (b *Buffer[T]) Push(now int64, seq uint32, size int, v T, out []T) []T {
	if !b.start {
		b.start = true
		b.next = seq
		b.need, b.learnAt = float64(b.ceil), now
	}
	size = min(max(size, 0), 1<<31-1)
	d := int64(int32(seq - b.next))
	ring := int64(len(b.ring))
	switch {
	case d == 0:
		b.candN = 0
		rescued := b.rescuedAt(seq, now)
		if rescued {
			b.st.Refilled++
		}
		out = b.give(out, v)
		b.markDelivered(seq)
		b.next++
		b.st.InOrder++
		if b.count > 0 {
			// A gap filled by a resend (Rescue) waited for a stall or a loss, not for
			// reordering: its wait says nothing of how long gaps need.
			if b.cfg.Learn && !rescued && !b.unlearnt() {
				if e, ok := b.oldest(); ok {
					b.learn(now, now-e.at)
				}
			}
			out = b.drain(out, false)
		}
		return out
	case d > 0 && d < ring:
		b.candN = 0
		return b.insert(now, seq, size, v, out)
	case d >= ring && d <= b.window:
		b.candN = 0
		b.st.Overflows++
		b.timedOut = false
		out = b.skipTo(seq-uint32(ring-1), out)
		out = b.drain(out, true)
		// seq is now within the ring, or next if the drain reached it.
		return b.Push(now, seq, size, v, out)
	case d < 0 && -d <= b.window:
		if -d <= ring {
			s := &b.ring[seq&b.mask]
			if s.seq == seq && s.state == slotDelivered && (s.placed || s.resent || b.resending) {
				// A copy of a sparse flow's packet (Place): sent on every path, so
				// copies are the rule, not a sign of a restarted peer. Nor is the
				// original of a resend, which its stalled path brings at last (after a
				// stall, a run of them read as a restart and the third was delivered),
				// nor a resend that comes after its original.
				b.st.Duplicates++
				return out
			}
			if s.seq == seq && s.state == slotDelivered {
				// A look-alike: a duplicate, or a restarted peer reusing numbers.
				grew := b.extendRun(now, seq)
				restarting := grew && b.candDups >= restartDups
				if grew {
					b.candDups++
				}
				if !restarting {
					b.st.Duplicates++
					return b.maybeRestart(now, out)
				}
				b.st.Late++
				return b.maybeRestart(now, b.give(out, v))
			}
			if s.state != slotHeld {
				s.seq, s.state, s.placed, s.resent = seq, slotDelivered, b.placing, b.resending
			}
		}
		// A plain late packet, most likely from a path slower than the hold time allows; it
		// neither starts nor breaks a restart run, but it does end a row of look-alikes.
		b.candDups = 0
		b.st.Late++
		if b.cfg.Learn && !b.unlearnt() {
			var late int64
			if b.timedOut && now >= b.lostAt {
				late = b.lostWait + now - b.lostAt
			}
			b.learnLate(now, b.ceil, late)
		}
		return b.give(out, v)
	}
	b.extendRun(now, seq)
	b.st.Stray++
	return b.maybeRestart(now, b.give(out, v))
}

// PushResent is Push for a packet that its path sent after a higher-numbered one: a resend
// of a packet reported lost (or, rarely, one the sender's plan moved back). It fills its gap,
// or is delivered late, like any packet. While the buffer holds gaps for resends (SetFloor
// above 0) its wait teaches Config.Learn like any packet's: on paths short enough for a resend
// to come in time, resends that came late showed the hold too short (without them the fast
// path of TestTunnelUnequalPaths carried half its rate). Without a floor the caller has given
// up waiting for resends (they cannot come within MaxHold), and a late one teaches nothing:
// on a single LTE path, learning from them held every later gap the whole MaxHold.
func (b *Buffer[T]) PushResent(now int64, seq uint32, size int, v T, out []T) []T {
	b.resending = true
	out = b.Push(now, seq, size, v, out)
	b.resending = false
	return out
}

// unlearnt reports whether the packet being pushed teaches Config.Learn nothing: a resend while
// no floor is set (PushResent).
func (b *Buffer[T]) unlearnt() bool { return b.resending && b.floor == 0 }

// give appends v, the packet being pushed, to out, unless the caller delivered it (Place).
func (b *Buffer[T]) give(out []T, v T) []T {
	if b.placing {
		return out
	}
	return append(out, v)
}

// Place is Push for a packet that the caller delivers itself, at once and out of order (a
// sparse flow's, which need not wait for other flows' gaps): seq takes its place in the
// sequence as if the packet were held and delivered in turn, so that the packets around it
// keep their order and a copy of it is dropped. The packets it releases are appended to out.
// dup reports that seq was a duplicate (held or recently delivered already): the caller
// should drop its packet rather than deliver it.
func (b *Buffer[T]) Place(now int64, seq uint32, out []T) (_ []T, dup bool) {
	dups := b.st.Duplicates
	b.placing = true
	var zero T
	out = b.Push(now, seq, 0, zero, out)
	b.placing = false
	if b.st.Duplicates != dups {
		return out, true
	}
	b.st.Placed++
	return out, false
}

// Seen reports whether seq is held, or was delivered recently enough for Push to drop a copy
// of it as a duplicate.
func (b *Buffer[T]) Seen(seq uint32) bool {
	if !b.start {
		return false
	}
	d := int64(int32(seq - b.next))
	if d >= int64(len(b.ring)) || -d > int64(len(b.ring)) || d == 0 {
		return false
	}
	s := &b.ring[seq&b.mask]
	return s.seq == seq && (s.state == slotHeld || d < 0 && s.state == slotDelivered)
}

// extendRun adds seq to the current run of restart candidates, or starts a new run, and
// reports whether seq is a new member. A repeat of the previous number is not: that is a plain
// duplicate, not a new stream.
func (b *Buffer[T]) extendRun(now int64, seq uint32) bool {
	switch {
	case b.candN > 0 && seq == b.candLast:
		return false
	case b.candN > 0 && abs32(seq-b.cand) < int64(len(b.ring)):
		b.candN++
		if int32(seq-b.cand) > 0 {
			b.cand = seq
		}
	default:
		b.cand, b.candN, b.candAt, b.candDups = seq, 1, now, 0
	}
	b.candLast = seq
	return true
}

func (b *Buffer[T]) maybeRestart(now int64, out []T) []T {
	if b.candN >= restartConfirm && now-b.candAt >= b.hold {
		out = b.restart(out)
	}
	return out
}

func abs32(d uint32) int64 {
	x := int64(int32(d))
	if x < 0 {
		return -x
	}
	return x
}

// insert holds a packet ahead of next, then enforces the bounds.
func (b *Buffer[T]) insert(now int64, seq uint32, size int, v T, out []T) []T {
	s := &b.ring[seq&b.mask]
	if s.state == slotHeld {
		// Only seq itself can occupy this slot inside the window.
		b.st.Duplicates++
		return out
	}
	if b.fifoLen == len(b.fifo) {
		// Entries of delivered packets are dropped lazily, from the head. Dropping them
		// leaves room: the entries from the oldest held packet on are distinct sequence
		// numbers in a span of less than two rings.
		b.oldest()
		if b.fifoLen == len(b.fifo) {
			// Cannot happen; should the invariant break, release early rather than lose a
			// deadline, and take seq again from the top.
			out = b.forceOldest(out)
			return b.Push(now, seq, size, v, out)
		}
	}
	if b.rescuedAt(seq, now) {
		b.st.Refilled++
	}
	*s = slot[T]{v: v, seq: seq, size: int32(size), state: slotHeld, placed: b.placing, resent: b.resending}
	b.count++
	b.byt += size
	if !b.placing {
		// A placed number waits for nothing (its packet is delivered): it has no deadline,
		// and goes when the gaps before it fill or a held packet after it gives up on them.
		i := b.fifoHead + b.fifoLen
		if i >= len(b.fifo) {
			i -= len(b.fifo)
		}
		b.fifo[i] = arrival{at: now, seq: seq}
		b.fifoLen++
	}
	for b.count > 0 && (b.count > b.cfg.MaxPackets || b.byt > b.cfg.MaxBytes) {
		b.st.Overflows++
		b.timedOut = false
		out = b.releaseFirstRun(out)
	}
	return out
}

// markDelivered remembers that seq was delivered without passing through the ring.
func (b *Buffer[T]) markDelivered(seq uint32) {
	s := &b.ring[seq&b.mask]
	var zero T
	s.v, s.seq, s.state, s.placed, s.resent = zero, seq, slotDelivered, b.placing, b.resending
}

// take delivers the held packet in s.
func (b *Buffer[T]) take(s *slot[T], out []T) []T {
	if !s.placed {
		out = append(out, s.v)
	}
	var zero T
	s.v = zero // drop the reference so the caller's memory is not kept alive
	s.state = slotDelivered
	b.count--
	b.byt -= int(s.size)
	return out
}

// drain delivers the held packets consecutive from next.
func (b *Buffer[T]) drain(out []T, forced bool) []T {
	for b.count > 0 {
		s := &b.ring[b.next&b.mask]
		if s.state != slotHeld || s.seq != b.next {
			break
		}
		out = b.take(s, out)
		if forced {
			b.st.AfterGap++
		} else {
			b.st.InOrder++
		}
		b.next++
	}
	return out
}

// skipTo moves next forward to to, delivering held packets on the way and declaring the
// missing numbers lost.
func (b *Buffer[T]) skipTo(to uint32, out []T) []T {
	for b.next != to {
		if b.count == 0 {
			b.st.Lost += uint64(to - b.next)
			b.next = to
			break
		}
		s := &b.ring[b.next&b.mask]
		if s.state == slotHeld && s.seq == b.next {
			out = b.take(s, out)
			b.st.AfterGap++
		} else {
			b.st.Lost++
		}
		b.next++
	}
	return out
}

// releaseFirstRun declares the gap at next lost and delivers the run of held packets after it.
// The buffer must not be empty.
func (b *Buffer[T]) releaseFirstRun(out []T) []T {
	for {
		s := &b.ring[b.next&b.mask]
		if s.state == slotHeld && s.seq == b.next {
			break
		}
		b.st.Lost++
		b.next++
	}
	return b.drain(out, true)
}

// oldest returns the FIFO entry of the packet that has waited longest, dropping entries of
// packets already delivered.
func (b *Buffer[T]) oldest() (arrival, bool) {
	for b.fifoLen > 0 {
		e := b.fifo[b.fifoHead]
		s := &b.ring[e.seq&b.mask]
		if s.state == slotHeld && s.seq == e.seq {
			return e, true
		}
		b.fifoHead++
		if b.fifoHead == len(b.fifo) {
			b.fifoHead = 0
		}
		b.fifoLen--
	}
	return arrival{}, false
}

// forceOldest releases everything up to and including the oldest held packet.
func (b *Buffer[T]) forceOldest(out []T) []T {
	e, ok := b.oldest()
	if !ok {
		return out
	}
	out = b.skipTo(e.seq, out)
	return b.drain(out, true)
}

// NextDeadline returns when Expire next has work: the arrival of the oldest held packet plus
// the hold time (MaxHold while a path may still bring the gap, as SetInFlight last said). ok
// is false when nothing is held.
func (b *Buffer[T]) NextDeadline() (at int64, ok bool) {
	e, ok := b.oldest()
	if !ok {
		return 0, false
	}
	at = e.at + b.hold
	if b.pending() {
		at = e.at + max(b.hold, int64(b.cfg.MaxHold))
	}
	if s := &b.ring[b.next&b.mask]; s.rseq == b.next && s.runtil > at {
		at = s.runtil // the gap at next is held for its resend until then (Rescue)
	}
	return at, true
}

// SetInFlight tells the buffer the lowest sequence number that one of the peer's paths, still
// delivering, may yet bring: the least, over the paths that delivered lately, of the last
// number each delivered plus one (a path delivers its own packets in order, so it can bring no
// number below that). ok is false when no path has delivered lately.
//
// A gap at or above it may still be on its way on that path, behind the packets the path
// delivered so far: Expire then holds it up to MaxHold rather than the hold in force. The hold
// is learnt from the paths' round trips and the gaps of the recent past, which do not show a
// slow path whose packets are late now (its reader descheduled on a busy host, its queue
// growing); giving up on such a gap is a loss for TCP inside, and the packet arrives anyway, a
// few ms later, as a late one. A gap below it can come only as a resend (every path has
// moved past it), and keeps the hold.
func (b *Buffer[T]) SetInFlight(lowest uint32, ok bool) {
	b.inFlight, b.inFlightOK = lowest, ok
}

// pending reports whether the gap at next may still come on a path (SetInFlight).
func (b *Buffer[T]) pending() bool {
	return b.inFlightOK && int32(b.next-b.inFlight) >= 0
}

// Expire releases every packet that has waited the hold time by now, together with everything
// before it in sequence order (declaring the gaps lost) and the run after it, and appends them
// to out in order. A gap that a path may still bring (SetInFlight) is held up to MaxHold.
func (b *Buffer[T]) Expire(now int64, out []T) []T {
	if b.cfg.Learn && b.start {
		b.learn(now, 0)
	}
	for {
		e, ok := b.oldest()
		if !ok || e.at+b.hold > now {
			return out
		}
		if b.pending() && e.at+int64(b.cfg.MaxHold) > now {
			if !b.waited || b.waitedSeq != b.next {
				b.st.Waited++
				b.waited, b.waitedSeq = true, b.next
			}
			return out
		}
		if b.rescuedAt(b.next, now) {
			return out
		}
		b.st.Timeouts++
		b.lostAt, b.lostWait, b.timedOut = now, now-e.at, true
		// Give up on the gaps up to the oldest packet, but not past a gap still held for its
		// resend: the loop comes back to it, at next, and holds there.
		out = b.skipTo(b.rescueBefore(e.seq, now), out)
		out = b.drain(out, true)
	}
}

// Overdue appends to out, in order, the sequence numbers missing before the packets that have
// waited at least wait ns by now, from from (when it lies within the ring ahead of the next
// expected number; else from that number), at most limit of them, and returns it. These are the gaps that took longer to fill than gaps
// usually do: a path holding them has stalled or lost them without a later packet of its own
// to show it, and the caller may ask the sender for them again (and hold them, Rescue).
func (b *Buffer[T]) Overdue(now, wait int64, from uint32, limit int, out []uint32) []uint32 {
	if !b.start || b.count == 0 || limit <= 0 {
		return out
	}
	var hi uint32
	found := false
	for i, j := 0, b.fifoHead; i < b.fifoLen; i++ {
		e := b.fifo[j]
		if e.at > now-wait {
			break
		}
		if s := &b.ring[e.seq&b.mask]; s.state == slotHeld && s.seq == e.seq && (!found || int32(e.seq-hi) > 0) {
			hi, found = e.seq, true
		}
		if j++; j == len(b.fifo) {
			j = 0
		}
	}
	if !found {
		return out
	}
	x := b.next
	if d := int32(from - x); d > 0 && int64(d) < int64(len(b.ring)) {
		x = from
	}
	for n := 0; int32(hi-x) > 0 && n < limit; x++ {
		if s := &b.ring[x&b.mask]; s.state != slotHeld || s.seq != x {
			out = append(out, x)
			n++
		}
	}
	return out
}

// Rescue holds the gap of number seq, missing now, until until (monotonic ns) even past the
// hold: the caller has asked the sender for it again (Overdue), and the resend takes a round
// trip. A number not missing, or outside the sequence window ahead, is ignored. The resend's
// wait does not count as a need for holding (Config.Learn).
func (b *Buffer[T]) Rescue(seq uint32, until int64) {
	d := int64(int32(seq - b.next))
	if !b.start || d < 0 || d >= int64(len(b.ring)) {
		return
	}
	s := &b.ring[seq&b.mask]
	if s.state == slotHeld && s.seq == seq {
		return
	}
	if s.rseq != seq || s.runtil == 0 {
		b.st.Rescued++
	}
	s.rseq, s.runtil = seq, until
	b.rescueEnd = max(b.rescueEnd, until)
}

// rescuedAt reports whether the gap of number seq is held for a resend at now (Rescue).
func (b *Buffer[T]) rescuedAt(seq uint32, now int64) bool {
	if now >= b.rescueEnd {
		return false
	}
	s := &b.ring[seq&b.mask]
	return s.rseq == seq && s.runtil > now
}

// rescueBefore returns the first number from next to, not including, to whose gap is held for
// a resend at now, or to when none is.
func (b *Buffer[T]) rescueBefore(to uint32, now int64) uint32 {
	if now >= b.rescueEnd {
		return to
	}
	for x := b.next; x != to; x++ {
		if s := &b.ring[x&b.mask]; s.state != slotHeld && b.rescuedAt(x, now) {
			return x
		}
	}
	return to
}

// Flush releases everything held, in order, declaring the gaps lost. The next expected
// sequence number moves past the last released packet. Use it when the peer goes away.
func (b *Buffer[T]) Flush(out []T) []T {
	for b.count > 0 {
		out = b.releaseFirstRun(out)
	}
	b.fifoHead, b.fifoLen = 0, 0
	return out
}

// restart handles a peer that restarted its sequence: release what is held, forget what was
// delivered (old numbers would otherwise look like duplicates of new ones) and continue after
// the highest stray of the run.
func (b *Buffer[T]) restart(out []T) []T {
	out = b.Flush(out)
	clear(b.ring)
	b.next = b.cand + 1
	b.candN = 0
	b.st.Resets++
	return out
}
