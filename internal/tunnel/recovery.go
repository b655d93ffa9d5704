package tunnel

import (
	"math/bits"
	"sync"
	"time"

	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// Loss recovery (docs/scheduling.md, "Loss recovery"). A loss on one path need not reach the
// flows inside the tunnel: the receiver sees it at once, because each path numbers its data
// packets (DataPrefix.PathSeq) and the packets of one path arrive in order, and it reports the
// gap in a nack on its fastest path. The sender keeps the last recoverySlots inner packets of
// each peer and sends the ones reported again, once each, on its fastest path. The receiver's
// reorder buffer holds the packets behind the gap meanwhile: the resent packet arrives about
// one round trip of the fastest path after the loss, and the inner TCP sees neither the loss
// nor a reordering. Without it, TCP inside the tunnel takes a random loss on any path as
// congestion and halves its window: one lossy path caps the whole flow at what a single lossy
// path carries.
//
// What recovery does not do: it resends a packet once (a lost resend is the inner TCP's to
// recover), and only within recoveryBurst and one resend per recoveryShare data packets, so
// that a path losing much (a failing link, a queue overflowing) cannot double the traffic.
// A gap longer than maxNackRun is an outage, not a random loss, and is left to the inner TCP.

const (
	// recoverySlots is how many of a peer's latest inner packets the sender keeps for resending
	// (a power of two): at 1 Gbit/s of 1400-byte packets, about 45 ms of traffic, more than the
	// detection and nack of a loss take on paths of common delays.
	recoverySlots = 4096
	recoveryMask  = recoverySlots - 1
	// maxNackRun is the longest gap in a path's numbering that a receiver reports.
	maxNackRun = 64
	// recoveryShare and recoveryBurst bound resending: one resend per recoveryShare data
	// packets sent, banked up to recoveryBurst; a new peer starts with the bank full, for the
	// losses of its paths' first windows.
	recoveryShare = 8
	recoveryBurst = 256
	// recoveryMargin is what a resend takes beyond the fastest path's round trip: the nack's
	// and the resend's way through both tunnels' loops and sockets.
	recoveryMargin = 2 * time.Millisecond
)

// recovery keeps a peer's latest inner packets for resending. Both the device reader (which
// records what it sends) and the uplink readers (which resend on a nack) use it.
type recovery struct {
	mu     sync.Mutex
	on     bool
	slots  []rtxSlot // by data sequence number mod recoverySlots
	data   []byte    // slotSize bytes per slot
	size   int       // slotSize
	credit float64   // resends allowed now
}

type rtxSlot struct {
	seq    uint32
	n      int32 // bytes of the inner packet; 0: nothing kept
	resent bool
}

// rtxEntry maps one PathSeq of a path to the data sequence number it carried.
type rtxEntry struct {
	ps, seq uint32
	ok      bool
}

func newRecovery(on bool, mtu int) *recovery {
	return &recovery{on: on, size: mtu, credit: recoveryBurst}
}

// record numbers a data packet on pp and, with recovery on, keeps inner (the packet of data
// sequence number seq) for resending when keep is set (not for a resend itself).
func (r *recovery) record(pp *peerPath, seq uint32, inner []byte, keep bool) uint32 {
	r.mu.Lock()
	ps := pp.txPathSeq
	pp.txPathSeq++
	if r.on {
		if pp.rtxLog == nil {
			pp.rtxLog = make([]rtxEntry, recoverySlots)
		}
		pp.rtxLog[ps&recoveryMask] = rtxEntry{ps: ps, seq: seq, ok: true}
		if keep {
			if r.slots == nil {
				r.slots = make([]rtxSlot, recoverySlots)
				r.data = make([]byte, recoverySlots*r.size)
			}
			s := &r.slots[seq&recoveryMask]
			s.seq, s.n, s.resent = seq, 0, false
			if len(inner) <= r.size {
				off := int(seq&recoveryMask) * r.size
				s.n = int32(copy(r.data[off:off+r.size], inner))
			}
			r.credit = min(r.credit+1.0/recoveryShare, recoveryBurst)
		}
	}
	r.mu.Unlock()
	return ps
}

// Outcomes of take.
const (
	resendOK     = iota
	resendMissed // no longer kept (or never: too large, sent before recovery was on)
	resendDone   // already resent once
	resendBudget // over the resend budget
)

// take copies into dst the packet that PathSeq ps of pp carried, if it may be resent, and
// marks it resent.
func (r *recovery) take(pp *peerPath, ps uint32, dst []byte) (seq uint32, n int, outcome int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on || pp.rtxLog == nil || r.slots == nil {
		return 0, 0, resendMissed
	}
	e := pp.rtxLog[ps&recoveryMask]
	if !e.ok || e.ps != ps {
		return 0, 0, resendMissed
	}
	n, outcome = r.takeLocked(e.seq, dst)
	return e.seq, n, outcome
}

// takeSeq is take for the packet of data sequence number seq (a gap nack's).
func (r *recovery) takeSeq(seq uint32, dst []byte) (n int, outcome int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on || r.slots == nil {
		return 0, resendMissed
	}
	return r.takeLocked(seq, dst)
}

func (r *recovery) takeLocked(seq uint32, dst []byte) (n int, outcome int) {
	s := &r.slots[seq&recoveryMask]
	switch {
	case s.seq != seq || s.n == 0:
		return 0, resendMissed
	case s.resent:
		return 0, resendDone
	case r.credit < 1:
		return 0, resendBudget
	}
	r.credit--
	s.resent = true
	off := int(seq&recoveryMask) * r.size
	return copy(dst, r.data[off:off+int(s.n)]), resendOK
}

// rxPathSeq follows the numbering of one of the peer's paths at the receiver.
type rxPathSeq struct {
	next    uint32
	started bool
	// The highest data sequence number the path delivered, and when it last delivered one:
	// what the reorder buffer may still expect from it (peer.inFlightLocked).
	lastSeq uint32
	lastAt  int64
}

// inFlightLocked is what the reorder buffer's SetInFlight takes: the lowest data sequence
// number that a path which delivered data within the last live ns may still bring (the last
// it delivered plus one; its packets arrive in order), and whether any did. p.mu is held.
func (p *peer) inFlightLocked(now, live int64) (lowest uint32, ok bool) {
	for _, id := range p.rxIDs {
		r := &p.rxPath[id]
		if r.lastAt == 0 || now-r.lastAt > live {
			continue // nothing in order delivered lately (now is never 0)
		}
		if s := r.lastSeq + 1; !ok || int32(s-lowest) < 0 {
			lowest, ok = s, true
		}
	}
	return lowest, ok
}

// onData takes a data packet that arrived on the path at now, its PathSeq ps and data sequence
// number seq, and returns the gap in the path's numbering before it to report, if any.
// ordered is false for a sparse flow's packet, which was sent ahead of its turn: it says
// nothing of which numbers the path may still bring (inFlightLocked).
func (r *rxPathSeq) onData(ps, seq uint32, now int64, ordered bool) (first uint32, count int) {
	if ordered {
		r.lastAt = now
	}
	if !r.started {
		r.started, r.next = true, ps+1
		if ordered {
			r.lastSeq = seq
		} else {
			r.lastSeq = seq - 1<<30 // nothing delivered in order yet: lastAt stays 0
		}
		return 0, 0
	}
	if ordered && int32(seq-r.lastSeq) > 0 {
		r.lastSeq = seq
	}
	d := int64(int32(ps - r.next))
	switch {
	case d == 0:
		r.next++
	case d > 0:
		first, count = r.next, int(d)
		r.next = ps + 1
		if d > maxNackRun {
			count = 0 // an outage, or the peer restarted its numbering
		}
	case d < -maxNackRun:
		r.next = ps + 1 // the peer restarted its numbering
	}
	// d < 0 otherwise: reordered within the path, or a gap reported that filled after all.
	return first, count
}

// fastestRTT is the shortest smoothed RTT of paths (0 without any).
func fastestRTT(paths []reorder.PathRTT) time.Duration {
	var lo time.Duration
	for _, p := range paths {
		if p.SRTT > 0 && (lo == 0 || p.SRTT < lo) {
			lo = p.SRTT
		}
	}
	return lo
}

// fastest returns the Up path with the shortest smoothed RTT, nil when none is up.
func (p *peer) fastest() *peerPath {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *peerPath
	var bestRTT time.Duration
	for _, pp := range p.paths {
		if pp.admin {
			continue
		}
		s := pp.est.Snapshot()
		if s.State != path.Up {
			continue
		}
		r := s.SRTT
		if r <= 0 {
			r = s.MinRTT
		}
		if best == nil || r < bestRTT {
			best, bestRTT = pp, r
		}
	}
	return best
}

// nack reports a gap in the numbering of the peer's path from (its ID) on this side's fastest
// path.
func (t *Tunnel) nack(p *peer, from uint8, first uint32, count int) {
	pp := p.fastest()
	if pp == nil {
		return
	}
	k := mpath.Nack{First: first, Count: uint16(count), Path: from}
	if t.sendSealed(p, pp, mpath.TypeNack, k.Encode) {
		t.stats.NacksSent.Add(1)
	}
}

// Gap nacks (protocol version 4). A path that stalls (a cellular link with no transmit
// opportunity for a few hundred ms) loses nothing and so shows no gap in its own numbering,
// while the packets numbered after what it holds arrive on the other paths: the receiver's
// reorder buffer waits, and gives the gaps up after its hold, which the inner TCP takes as
// losses. The receiver sees the stall first, as gaps that wait longer than its gaps usually
// take to fill (reorder.Buffer.Overdue: the hold that the reordering seen lately needs, at
// least minGapWait), and names their data sequence numbers in gap nacks on its fastest path;
// the sender resends those it keeps, once each and within loss recovery's budget, on its
// fastest path, and the receiver holds the gaps past the hold until the resends can come
// (reorder.Buffer.Rescue). The originals, when the stall ends, are duplicates and dropped.
const (
	// minGapWait is the least a gap waits before the receiver asks for it: below it, the
	// paths' own jitter fills gaps, and a resend would only double the packet.
	minGapWait = 10 * time.Millisecond
	// maxGapNacked is the most numbers one peer's receiver asks for on one timer tick.
	maxGapNacked = 256
)

// gapNacks reports whether p's session speaks gap nacks (protocol version 4).
func (p *peer) gapNacks() bool {
	ls := p.cur.Load()
	return ls != nil && ls.s.Version >= session.V4
}

// overdueLocked asks p's reorder buffer for the numbers missing longer than gaps usually take
// to fill and not asked for yet, holds their gaps for a resend until rescue ns from now, and
// appends to out the gap nacks that name them. p.mu is held.
func (p *peer) overdueLocked(now, rescue int64, gaps []uint32, out []mpath.GapNack) ([]uint32, []mpath.GapNack) {
	wait := max(int64(p.rb.Usual()), int64(minGapWait))
	gaps = p.rb.Overdue(now, wait, p.gapFrom, maxGapNacked, gaps[:0])
	for _, x := range gaps {
		p.rb.Rescue(x, now+rescue)
		if n := len(out); n > 0 && x-out[n-1].First < 64 {
			out[n-1].Missing |= 1 << (63 - (x - out[n-1].First))
		} else {
			out = append(out, mpath.GapNack{First: x, Missing: 1 << 63})
		}
		p.gapFrom = x + 1
	}
	return gaps, out
}

// sendGapNacks sends ks on p's fastest path.
func (t *Tunnel) sendGapNacks(p *peer, ks []mpath.GapNack) {
	if len(ks) == 0 {
		return
	}
	pp := p.fastest()
	if pp == nil {
		return
	}
	for i := range ks {
		if t.sendSealed(p, pp, mpath.TypeGapNack, ks[i].Encode) {
			t.stats.GapNacksSent.Add(1)
		}
	}
}

// onGapNack resends what a gap nack names, each packet on this side's fastest path.
func (t *Tunnel) onGapNack(p *peer, k mpath.GapNack) {
	t.stats.GapNacksReceived.Add(1)
	if k.Missing == 0 || !p.gapNacks() {
		t.stats.DropBadHeader.Add(1)
		return
	}
	pp := p.fastest()
	if pp == nil {
		t.stats.DropNoPath.Add(1)
		return
	}
	pb := t.getBuf()
	defer t.putBuf(pb)
	for m := k.Missing; m != 0; {
		i := bits.LeadingZeros64(m)
		m &^= 1 << (63 - i)
		seq := k.First + uint32(i)
		n, outcome := p.rtx.takeSeq(seq, pb.b[headroom:])
		if t.mayResend(outcome) && t.resend(p, pp, pb.b, n, seq) {
			t.stats.Resent.Add(1)
			t.stats.GapResent.Add(1)
		}
	}
}

// mayResend counts a take's outcome and reports whether the packet is to be resent.
func (t *Tunnel) mayResend(outcome int) bool {
	switch outcome {
	case resendMissed:
		t.stats.ResendMissed.Add(1)
	case resendBudget:
		t.stats.ResendBudget.Add(1)
	}
	return outcome == resendOK
}

// onNack resends what a nack reports lost, each packet on this side's fastest path.
func (t *Tunnel) onNack(p *peer, k mpath.Nack) {
	t.stats.NacksReceived.Add(1)
	lost := p.pathByID(k.Path) // without p.mu: a learned path may be added meanwhile (roam.go)
	if lost == nil || k.Count == 0 {
		t.stats.DropBadHeader.Add(1)
		return
	}
	p.mu.Lock()
	if lost.noteLossesLocked(min(int(k.Count), maxNackRun)) {
		t.stats.Overflows.Add(1)
	}
	p.mu.Unlock()
	pp := p.fastest() // once per nack: every packet it names goes the same way
	if pp == nil {
		t.stats.DropNoPath.Add(1)
		return
	}
	pb := t.getBuf()
	defer t.putBuf(pb)
	for i := range min(int(k.Count), maxNackRun) {
		seq, n, outcome := p.rtx.take(lost, k.First+uint32(i), pb.b[headroom:])
		if t.mayResend(outcome) && t.resend(p, pp, pb.b, n, seq) {
			t.stats.Resent.Add(1)
		}
	}
}

// owe counts a datagram of n bytes resent on the path at now for the queue planner to charge.
func (pp *peerPath) owe(now int64, n int) {
	pp.owed.Add(int64(n + pp.outer))
	pp.owedAt.Store(now)
}

// resend seals the inner packet at b[headroom:headroom+n], number seq of the peer's sequence,
// and sends it on pp alone. It goes at once, outside the queue planner's pacing, and is owed
// to it: the next plan charges it to the path (dispatch), as the copies of sparse packets are.
// Uncharged, the resends for a burst of losses on a path paced at its rate came on top of that
// rate, into the queue that had just overflowed: on the fast path of two unequal ones, 133
// resends within one second of a startup's overflow, and 51 gaps the receiver gave up
// (docs/scheduling.md, "Resends are charged to the path; a burst of losses ends a re-startup").
func (t *Tunnel) resend(p *peer, pp *peerPath, b []byte, n int, seq uint32) bool {
	ls := p.cur.Load()
	if ls == nil {
		return false
	}
	counter, err := ls.s.NextCounter()
	if err != nil {
		return false
	}
	g := greBraid
	g.Key = ls.s.RemoteIndex
	g.Encode(b[:greLen])
	h := mpath.Header{Type: mpath.TypeData, Path: pp.id, Counter: counter}
	if t.o.Cleartext {
		h.Flags = mpath.FlagClear
	}
	const aadLen = greLen + mpath.HeaderLen
	h.Encode(b[greLen:aadLen])
	pre := mpath.DataPrefix{Seq: seq, PathSeq: p.rtx.record(pp, seq, nil, false)}
	pre.Encode(b[aadLen:headroom])
	out := t.getBuf()
	defer t.putBuf(out)
	var pkt []byte
	if t.o.Cleartext {
		copy(out.b, b[:headroom+n])
		tag := ls.s.Sign(out.b[headroom+n:headroom+n], out.b[greLen:aadLen], out.b[:headroom+n])
		pkt = out.b[:headroom+n+len(tag)]
	} else {
		copy(out.b[:aadLen], b[:aadLen])
		sealed := ls.s.Seal(out.b[aadLen:aadLen], b[greLen:aadLen], b[:aadLen], b[aadLen:headroom+n])
		pkt = out.b[:aadLen+len(sealed)]
	}
	t.send(p, pp, pkt)
	pp.owe(t.now(), len(pkt))
	return true
}
