// Package path keeps the state of one tunnel path: whether it is up, its round-trip time, loss
// and delivery rate, all learnt from probes, probe replies, the peer's feedback counters and
// the traffic the path carries.
//
// What this package beats (tunnels.md sections 3, 4 and 8): MPT sends a keepalive every few
// whole seconds and checks liveness once a second, so a silent path is noticed after 11-12 s
// with its sample settings; glorytun notices a dead path in about 500 ms, but only while
// traffic flows, so an idle tunnel never notices. Here every path is probed every
// ProbeInterval (50 ms) whether or not it carries data, and a path from which nothing at all
// (no probe reply, no packet) has been heard for DownAfter (250 ms) is Down.
//
// Not flapping. A path goes Down on silence only, never on loss: a path that answers every
// other probe is Up and lossy, the scheduler's business. Silence is measured with more
// probes when it starts: once a path has been quiet for 1.5 probe intervals it is probed every
// FastProbeInterval (10 ms) until it is heard again, so declaring it Down takes some twenty
// consecutive losses rather than five or six. With 30 % random probe loss on a 20 ms path,
// probing at ProbeInterval alone flaps 28 times in 20 simulated minutes; with the fast probes
// it never does (0.3^20 is 3.5e-11). The extra probes go out only on a path that has already gone quiet, so they cost nothing on
// a healthy path. Coming back Up takes UpAfter answered probes in a row (consecutive probe
// sequence numbers, each answered within the probe timeout); while the path answers, probes
// go out every FastProbeInterval, so recovery takes about ProbeInterval + (UpAfter-1) ×
// FastProbeInterval + RTT (90 ms on a 20 ms path) after the path heals. A Down path is probed
// at ProbeInterval without back-off: that costs what an idle Up path costs anyway, and a
// back-off would add its length to every recovery. A new path, and one whose AdminDown or
// LinkDown was just lifted, starts Down and sends its first UpAfter probes FastProbeInterval
// apart, so it is Up about RTT + 20 ms later if it works, and carries no data if it never
// did.
//
// One-way failures: a packet from the peer proves the path works towards us; only a probe
// reply proves both directions. Down waits for both to fall silent (the rule: a path
// whose probes are lost but whose peer's data still arrives stays Up), so a path broken only
// towards the peer stays Up while the peer keeps sending on it; its Loss then rises to 1,
// which the scheduler sees. Up, on the other hand, needs probe replies: data alone never
// brings a path back.
//
// AdminDown (operator) and LinkDown (local interface or carrier down, reported by the driver)
// take effect at once and stop probing; when they are lifted the path starts over as Down and
// must answer UpAfter probes, because whatever it was before may have changed (a new
// address, a new route).
//
// The package is pure: time is passed in as monotonic nanoseconds, there is no I/O, no
// goroutine, no timer and no lock; the caller owns one Estimator per path and serialises calls
// to it. No method allocates.
//
// Driver loop:
//
//	for {
//		wait until e.NextDeadline() or a packet
//		on a probe reply:        e.OnReply(now, ...); e.OnReceive(now, n)
//		on any other packet:     e.OnReceive(now, n)
//		on sending any packet:   e.OnSend(now, n)  (probes included)
//		if seq, ts, ok := e.NextProbe(now); ok { send probe(seq, ts) }
//		if e.Tick(now) { publish e.Snapshot() }
//	}
package path

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Errors returned by Config.Validate.
var (
	ErrProbeInterval = errors.New("path: probe interval out of range")
	ErrDownAfter     = errors.New("path: DownAfter out of range")
	ErrUpAfter       = errors.New("path: UpAfter out of range")
)

// Never is what NextDeadline returns when no work is due at any time.
const Never int64 = math.MaxInt64

const (
	// ringSize probe records are kept; a probe is forgotten (and, if unanswered, counted lost)
	// once ringSize newer probes have been sent. Validate makes sure this happens only after
	// the probe timeout.
	ringSize = 256
	ringMask = ringSize - 1

	// maxProbeTimeout caps the probe loss timeout (raised to 2 × ProbeInterval if that is
	// longer): a reply later than this is useless for liveness anyway.
	maxProbeTimeout = int64(time.Second)

	// minFastProbeInterval keeps ringSize probe records covering the 1 s probe timeout.
	minFastProbeInterval = 4 * time.Millisecond

	maxUpAfter = 64

	// lossGain is the EWMA gain per probe outcome (and per packet of feedback): 1/16 gives a
	// memory of about 16 probes, 0.8 s at the default interval.
	lossGain = 1.0 / 16

	// minRTTEpoch: MinRTT is the minimum over the current and the previous epoch, so it
	// forgets a route that no longer exists after 10-20 s.
	minRTTEpoch = int64(10 * time.Second)
)

// Config sets how one path is probed and judged. Zero fields take the values of WithDefaults.
type Config struct {
	// ProbeInterval is how often a probe goes out on a path that is answering (Up or Down).
	ProbeInterval time.Duration
	// FastProbeInterval is how often a probe goes out while the path has been quiet for 1.5
	// ProbeIntervals, and while a Down path is answering (confirming recovery).
	FastProbeInterval time.Duration
	// DownAfter: nothing heard from the peer on this path (no reply and no packet) for this
	// long declares the path Down.
	DownAfter time.Duration
	// UpAfter is how many consecutive probes must be answered to bring a Down path Up.
	UpAfter int
}

// WithDefaults returns c with every zero field set: probes every 50 ms (10 ms while the path
// is quiet or confirming, at most ProbeInterval, at least 4 ms), Down after 250 ms of
// silence, Up after 3 answers in a row.
func (c Config) WithDefaults() Config {
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 50 * time.Millisecond
	}
	if c.FastProbeInterval == 0 {
		c.FastProbeInterval = max(c.ProbeInterval/5, minFastProbeInterval)
		if c.ProbeInterval > 0 && c.FastProbeInterval > c.ProbeInterval {
			c.FastProbeInterval = c.ProbeInterval
		}
	}
	if c.DownAfter == 0 {
		c.DownAfter = 250 * time.Millisecond
	}
	if c.UpAfter == 0 {
		c.UpAfter = 3
	}
	return c
}

// probeTimeoutCap is the longest a probe may wait for its reply before it counts as lost.
func (c Config) probeTimeoutCap() int64 {
	return max(maxProbeTimeout, 2*int64(c.ProbeInterval))
}

// Validate reports whether c (after WithDefaults) can build an Estimator, and if not, why.
func (c Config) Validate() error {
	if c.ProbeInterval <= 0 {
		return fmt.Errorf("%w: ProbeInterval %v, want > 0", ErrProbeInterval, c.ProbeInterval)
	}
	if c.FastProbeInterval < minFastProbeInterval || c.FastProbeInterval > c.ProbeInterval {
		return fmt.Errorf("%w: FastProbeInterval %v, want %v..ProbeInterval (%v): faster probes would be forgotten before their replies are due",
			ErrProbeInterval, c.FastProbeInterval, minFastProbeInterval, c.ProbeInterval)
	}
	if ringSize*int64(c.FastProbeInterval) < c.probeTimeoutCap() {
		return fmt.Errorf("%w: FastProbeInterval %v, want >= %v: %d probe records must cover the probe timeout",
			ErrProbeInterval, c.FastProbeInterval, time.Duration(c.probeTimeoutCap()/ringSize), ringSize)
	}
	if c.DownAfter < 2*c.ProbeInterval {
		return fmt.Errorf("%w: DownAfter %v, want >= 2 × ProbeInterval (%v): otherwise one lost probe takes the path down",
			ErrDownAfter, c.DownAfter, 2*c.ProbeInterval)
	}
	if c.UpAfter < 1 || c.UpAfter > maxUpAfter {
		return fmt.Errorf("%w: %d, want 1..%d", ErrUpAfter, c.UpAfter, maxUpAfter)
	}
	return nil
}

// State is a path's state as the scheduler sees it.
type State uint8

const (
	// Down: not heard from for DownAfter, or not yet answered UpAfter probes in a row. Probed.
	Down State = iota
	// Up: heard from within DownAfter. Usable.
	Up
	// AdminDown: taken down by the operator. Not probed.
	AdminDown
	// LinkDown: the local interface or its carrier is down. Not probed.
	LinkDown
)

func (s State) String() string {
	switch s {
	case Down:
		return "down"
	case Up:
		return "up"
	case AdminDown:
		return "admin-down"
	case LinkDown:
		return "link-down"
	}
	return "invalid"
}

// Feedback is the peer's view of this path (tunnel-wire.md, path feedback). Bytes, Packets and
// Lost are cumulative counters since the peer's session started; they may wrap (Packets,
// Lost) or start again from zero (peer restart). ReorderPackets and ReorderKiB are gauges,
// the peer's reorder buffer occupancy when it sent the feedback, and ReorderFreeKiB its free
// room (mpath.NoReorderBound: not bounded).
type Feedback struct {
	Bytes                                     uint64
	Packets, Lost, ReorderPackets, ReorderKiB uint32
	Time                                      uint32 // the peer's clock when it read them, µs (wraps)
	ReorderFreeKiB                            uint32
}

// Snapshot is a copy of a path's state for schedulers and status output.
type Snapshot struct {
	State State
	// SRTT and RTTVar follow RFC 6298 (alpha 1/8, beta 1/4), without the peer's hold time.
	// MinRTT is the smallest sample of the last 10-20 s. All three are 0 before the first
	// sample.
	SRTT, RTTVar, MinRTT time.Duration
	// ProbeTimeout is how long a probe waits for its reply before counting as lost:
	// max(3 × SRTT, 2 × ProbeInterval), capped at max(1 s, 2 × ProbeInterval); the cap
	// until the first RTT sample.
	ProbeTimeout time.Duration
	// Loss is the fraction of probes lost on the round trip, an EWMA over probe outcomes
	// (gain 1/16). It is measured on idle paths too, but covers both directions.
	Loss float64
	// ForwardLoss is the fraction of the packets sent on this path that the peer reports
	// lost (feedback Lost over Packets+Lost), an EWMA in which each packet weighs as much as
	// a probe does in Loss, so that a busy path's estimate follows its latest feedback.
	ForwardLoss float64
	// DeliveryRate is the rate in bit/s at which the peer received bytes on this path, over
	// the last window of at least 2 × ProbeInterval between feedbacks, timed by the peer's
	// clock (so that queueing on the way back does not stretch or shrink the window); 0
	// until measured.
	DeliveryRate float64
	// RateSamples counts DeliveryRate measurements; RateWindow is the length of the latest.
	RateSamples uint64
	RateWindow  time.Duration
	// Local counters, from OnSend and OnReceive.
	BytesSent, BytesReceived     uint64
	PacketsSent, PacketsReceived uint64
	// Probe counters. RepliesIgnored counts replies to unknown, forgotten or cancelled probes
	// or with a wrong echoed timestamp; RepliesLate replies that came after their probe had
	// been counted lost (their RTT is used, the loss stands).
	ProbesSent, ProbesLost                        uint64
	RepliesDuplicate, RepliesIgnored, RepliesLate uint64
	// PeerRestarts counts feedback counter resets; PeerReorderPackets and PeerReorderKiB are
	// the peer's latest reorder buffer occupancy, PeerReorderFreeKiB its free room (the last
	// feedback's ReorderFreeKiB) and PeerFeedbackAt when that feedback arrived (0: none yet).
	PeerRestarts                       uint64
	PeerReorderPackets, PeerReorderKiB uint32
	PeerReorderFreeKiB                 uint32
	PeerFeedbackAt                     int64
	// LastHeard is when the peer was last heard on this path (0: never); Since is when State
	// last changed (the Estimator's creation at first); Transitions counts State changes.
	LastHeard, Since int64
	Transitions      uint64
}

type slotState uint8

const (
	slotEmpty    slotState = iota
	slotPending            // sent, waiting for its reply
	slotAnswered           // answered within the probe timeout
	slotLost               // timed out unanswered
	slotLate               // answered after it had been counted lost
	slotVoid               // cancelled by AdminDown/LinkDown: not counted either way
)

type probe struct {
	sent  int64
	seq   uint32
	ts    uint32
	state slotState
}

// Estimator is the state of one path. Create it with New.
type Estimator struct {
	cfg Config

	state       State
	live        bool // liveness verdict, hidden by adminDown/linkDown
	adminDown   bool
	linkDown    bool
	since       int64
	transitions uint64
	pendingUp   bool // UpAfter answers in a row seen; Tick makes it Up

	lastHeard int64
	heard     bool

	// Probes. Records for seqs [tail, next) may still be pending; older ones are resolved.
	ring         [ringSize]probe
	next, tail   uint32
	lastProbeAt  int64
	runFloor     uint32 // answered runs toward UpAfter count only probes from runFloor on
	lastAnswered bool   // the latest probe outcome since runFloor was an answer
	burst        int    // probes still to send FastProbeInterval apart after a (re)start

	// RTT, in nanoseconds.
	srtt, rttvar        int64
	minCur, minPrev     int64
	minEpoch            int64
	hasRTT              bool
	loss, fwdLoss       float64
	probesSent, lost    uint64
	dups, ignored, late uint64

	// Feedback.
	fb          Feedback // last accepted counters
	fbHave      bool
	fbSeq       uint32 // probe seq of the reply that carried fb
	fbSeqHave   bool
	cand        Feedback // counters that went backwards: a restart if the next ones agree
	candHave    bool
	winBytes    uint64 // rate window start
	winAt       uint32 // the peer's clock, µs
	winRestart  bool
	rate        float64
	rateN       uint64
	rateWin     int64
	restarts    uint64
	reorderPkts uint32
	reorderKiB  uint32
	reorderFree uint32 // the last feedback's ReorderFreeKiB
	fbAt        int64  // when it arrived

	bytesSent, bytesRecv uint64
	pktsSent, pktsRecv   uint64
}

// New returns the state of a new path at time now. The path starts Down and probes at once: it
// becomes Up after UpAfter answered probes (about 2 × FastProbeInterval + RTT), so no data is
// sent into a path that has never worked (a blocked port, a dead uplink). New panics if
// c.WithDefaults() does not Validate; configuration is checked where it is loaded.
func New(c Config, now int64) *Estimator {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		panic(err)
	}
	e := &Estimator{cfg: c, since: now, winRestart: true}
	e.restartProbing(now)
	return e
}

// Config returns the configuration in use, defaults filled in.
func (e *Estimator) Config() Config { return e.cfg }

// State returns the path's current state.
func (e *Estimator) State() State { return e.state }

// probing reports whether probes go out at all.
func (e *Estimator) probing() bool { return !e.adminDown && !e.linkDown }

// quietAt is when an Up path counts as quiet and switches to fast probing.
func (e *Estimator) quietAt() int64 {
	return e.lastHeard + int64(e.cfg.ProbeInterval) + int64(e.cfg.ProbeInterval)/2
}

// probeDue returns when the next probe is due, Never if not probing.
func (e *Estimator) probeDue() int64 {
	if !e.probing() {
		return Never
	}
	normal := e.lastProbeAt + int64(e.cfg.ProbeInterval)
	fast := e.lastProbeAt + int64(e.cfg.FastProbeInterval)
	switch {
	case e.live:
		return min(normal, max(fast, e.quietAt()))
	case e.lastAnswered || e.burst > 0:
		return fast
	}
	return normal
}

// restartProbing sends a probe at once and the next UpAfter-1 FastProbeInterval apart, so a
// new path, or one whose link or admin state just came back, is Up after about RTT +
// (UpAfter-1) × FastProbeInterval instead of waiting ProbeIntervals for its first answers.
func (e *Estimator) restartProbing(now int64) {
	e.lastProbeAt = now - int64(e.cfg.FastProbeInterval)
	e.burst = e.cfg.UpAfter
}

// probeTimeout is max(3 × srtt, 2 × ProbeInterval), capped; the cap until the first RTT sample
// (RFC 6298 starts at 1 s too), so that a long path's first replies are not all late.
func (e *Estimator) probeTimeout() int64 {
	if !e.hasRTT {
		return e.cfg.probeTimeoutCap()
	}
	return min(max(3*e.srtt, 2*int64(e.cfg.ProbeInterval)), e.cfg.probeTimeoutCap())
}

// NextProbe reports whether a probe is due at now. If so it returns the probe's sequence
// number and the timestamp (µs, wrapping) to put in it, and records it as outstanding: the
// caller must send it.
func (e *Estimator) NextProbe(now int64) (seq uint32, ts uint32, due bool) {
	e.expire(now)
	if now < e.probeDue() {
		return 0, 0, false
	}
	if e.next-e.tail >= ringSize {
		// Validate keeps this from happening before the timeout, but a driver that calls
		// NextProbe late and Tick never must not lose the record of an unresolved probe.
		e.resolveLost(&e.ring[e.tail&ringMask])
		e.tail++
		e.advanceTail()
	}
	seq = e.next
	ts = uint32(now / 1000)
	e.ring[seq&ringMask] = probe{sent: now, seq: seq, ts: ts, state: slotPending}
	e.next++
	e.lastProbeAt = now
	e.probesSent++
	if e.burst > 0 {
		e.burst--
	}
	return seq, ts, true
}

// NextDeadline returns the earliest time at which NextProbe or Tick has work: a probe due, a
// probe timing out, the path falling silent for DownAfter, or a pending transition to Up (then
// a time already passed). Never if none.
func (e *Estimator) NextDeadline() int64 {
	if !e.probing() {
		return Never
	}
	d := e.probeDue()
	if e.tail != e.next {
		d = min(d, e.ring[e.tail&ringMask].sent+e.probeTimeout())
	}
	if e.live {
		d = min(d, e.lastHeard+int64(e.cfg.DownAfter))
	} else if e.pendingUp {
		d = min(d, e.lastHeard)
	}
	return d
}

// advanceTail moves tail past resolved probes.
func (e *Estimator) advanceTail() {
	for e.tail != e.next && e.ring[e.tail&ringMask].state != slotPending {
		e.tail++
	}
}

// expire counts probes unanswered for the probe timeout as lost. Probes are sent in sequence
// order and share one timeout, so the oldest pending probe always times out first.
func (e *Estimator) expire(now int64) {
	timeout := e.probeTimeout()
	for e.tail != e.next {
		p := &e.ring[e.tail&ringMask]
		if p.state == slotPending {
			if now < p.sent+timeout {
				return
			}
			e.resolveLost(p)
		}
		e.tail++
	}
}

func (e *Estimator) resolveLost(p *probe) {
	if p.state != slotPending {
		return
	}
	p.state = slotLost
	e.lost++
	e.loss += lossGain * (1 - e.loss)
	if e.counts(p.seq) {
		e.lastAnswered = false
	}
}

// counts reports whether seq was sent since the path last went down, so that it may count
// towards coming back up.
func (e *Estimator) counts(seq uint32) bool { return int32(seq-e.runFloor) >= 0 }

// forwardLossSample folds n packets with the given lost fraction into ForwardLoss, each
// packet weighing as much as one probe does in Loss.
func (e *Estimator) forwardLossSample(frac float64, n uint64) {
	g := lossGain
	if n > 1 {
		g = 1 - math.Pow(1-lossGain, float64(min(n, 1024)))
	}
	e.fwdLoss += g * (frac - e.fwdLoss)
}

// OnReply takes the answer to probe seq, received at now: echoedTS is the timestamp the probe
// carried, holdMicros the time the peer held it before answering, fb the peer's feedback.
// Replies to probes never sent, forgotten, or cancelled, or whose timestamp does not match,
// are ignored; duplicates are counted and ignored. A reply after its probe was counted lost
// still gives an RTT sample and proves the path alive, but does not undo the loss. OnReply
// does not count the reply's bytes: call OnReceive for it as for any packet.
func (e *Estimator) OnReply(now int64, seq, echoedTS, holdMicros uint32, fb Feedback) {
	e.expire(now)
	// seq must lie in the last ringSize probes sent.
	if d := e.next - seq; d == 0 || d > ringSize {
		e.ignored++
		return
	}
	p := &e.ring[seq&ringMask]
	if p.seq != seq || p.ts != echoedTS || p.state == slotEmpty || p.state == slotVoid {
		e.ignored++
		return
	}
	switch p.state {
	case slotAnswered, slotLate:
		e.dups++
		return
	case slotPending:
		p.state = slotAnswered
		e.loss -= lossGain * e.loss
		if e.counts(seq) {
			e.lastAnswered = true
			if !e.live && e.runLength(seq) >= e.cfg.UpAfter {
				e.pendingUp = true
			}
		}
		e.advanceTail()
	case slotLost:
		p.state = slotLate
		e.late++
	}
	e.heardAt(now)
	if elapsed, hold := now-p.sent, int64(holdMicros)*1000; hold < elapsed {
		// A hold time as long as the whole round trip is impossible; such a reply proves
		// the path alive but its timing is not trusted.
		e.rttSample(now, elapsed-hold)
	}
	if !e.fbSeqHave || int32(seq-e.fbSeq) > 0 {
		// An older reply overtaken by a newer one carries older counters.
		e.fbSeq, e.fbSeqHave = seq, true
		e.OnFeedback(now, fb)
	}
}

// Stalled reports the oldest probe still unanswered among those sent after the newest one
// answered (after), and when it was sent. A path delivers in order, so a reply overdue while
// no later probe has come back means that what was sent on the path since after is held up
// (a cellular link's stall, a queue building under a drop of its capacity), not that one
// probe was lost: a lost probe is followed by answered ones. ok is false when every probe
// since the newest answered one has been answered, or none has been answered yet.
func (e *Estimator) Stalled() (seq, after uint32, sent int64, ok bool) {
	if !e.fbSeqHave || e.next-e.fbSeq > ringSize {
		return 0, 0, 0, false
	}
	for s := e.fbSeq + 1; s != e.next; s++ {
		if p := &e.ring[s&ringMask]; p.seq == s && (p.state == slotPending || p.state == slotLost) {
			return s, e.fbSeq, p.sent, true
		}
	}
	return 0, 0, 0, false
}

// ProbeRing is how many of a path's latest probes the Estimator keeps: Stalled's sequence
// numbers are within ProbeRing of the newest probe sent.
const ProbeRing = ringSize

// runLength returns the length of the run of answered probes around seq, counting only
// probes since runFloor and stopping once UpAfter is reached.
func (e *Estimator) runLength(seq uint32) int {
	n := 1
	for s := seq - 1; n < e.cfg.UpAfter && e.counts(s) && e.next-s <= ringSize; s-- {
		if p := &e.ring[s&ringMask]; p.seq != s || p.state != slotAnswered {
			break
		}
		n++
	}
	for s := seq + 1; n < e.cfg.UpAfter && s != e.next; s++ {
		if p := &e.ring[s&ringMask]; p.seq != s || p.state != slotAnswered {
			break
		}
		n++
	}
	return n
}

// rttSample updates srtt and rttvar as RFC 6298 section 2 does, and MinRTT.
func (e *Estimator) rttSample(now, r int64) {
	if !e.hasRTT {
		e.srtt, e.rttvar, e.hasRTT = r, r/2, true
		e.minCur, e.minPrev, e.minEpoch = r, r, now
		return
	}
	dev := e.srtt - r
	if dev < 0 {
		dev = -dev
	}
	e.rttvar += (dev - e.rttvar) / 4
	e.srtt += (r - e.srtt) / 8
	if now-e.minEpoch >= minRTTEpoch {
		e.minPrev, e.minCur, e.minEpoch = e.minCur, r, now
	}
	e.minCur = min(e.minCur, r)
}

func (e *Estimator) heardAt(now int64) {
	if !e.heard || now > e.lastHeard {
		e.lastHeard, e.heard = now, true
	}
}

// OnFeedback takes the peer's feedback counters from a feedback message received at now.
// OnReply calls it for the feedback in replies. Counters that go backwards are taken for a
// reordered, stale message and skipped, unless the next feedback confirms them: then the peer
// restarted, and the counters start again from the first of the two, without a rate or loss
// sample spanning the restart.
func (e *Estimator) OnFeedback(now int64, fb Feedback) {
	e.reorderPkts, e.reorderKiB, e.reorderFree, e.fbAt = fb.ReorderPackets, fb.ReorderKiB, fb.ReorderFreeKiB, now
	if !e.fbHave {
		e.fb, e.fbHave = fb, true
		e.startWindow(fb)
		return
	}
	if backwards(e.fb, fb) {
		if !e.candHave || backwards(e.cand, fb) {
			e.cand, e.candHave = fb, true
			return
		}
		e.restarts++
		e.fb = e.cand
		e.startWindow(e.cand)
	}
	e.candHave = false
	if e.winRestart {
		e.startWindow(fb)
	}
	if n := uint64(fb.Packets-e.fb.Packets) + uint64(fb.Lost-e.fb.Lost); n > 0 {
		e.forwardLossSample(float64(fb.Lost-e.fb.Lost)/float64(n), n)
	}
	// A window longer than half the clock's wrap (35 min) is not measured.
	if dt := int64(fb.Time-e.winAt) * 1000; dt >= 2*int64(e.cfg.ProbeInterval) && dt < 1<<31*1000 {
		e.rate = float64(fb.Bytes-e.winBytes) * 8 * 1e9 / float64(dt)
		e.rateN++
		e.rateWin = dt
		e.winBytes, e.winAt = fb.Bytes, fb.Time
	}
	e.fb = fb
}

func (e *Estimator) startWindow(fb Feedback) {
	e.winBytes, e.winAt, e.winRestart = fb.Bytes, fb.Time, false
}

// backwards reports whether to looks older than from: a counter decreased (serial-number
// arithmetic for the wrapping 32-bit ones), or more packets than bytes arrived.
func backwards(from, to Feedback) bool {
	dp := to.Packets - from.Packets
	return to.Bytes < from.Bytes || int32(dp) < 0 || int32(to.Lost-from.Lost) < 0 ||
		uint64(dp) > to.Bytes-from.Bytes
}

// OnReceive records an authenticated packet of bytes bytes (data or control, probe replies
// included) received from the peer on this path at now: the path works towards us.
func (e *Estimator) OnReceive(now int64, bytes int) {
	e.heardAt(now)
	e.bytesRecv += uint64(bytes)
	e.pktsRecv++
}

// OnSend records a packet of bytes bytes (probes included) sent on this path.
func (e *Estimator) OnSend(now int64, bytes int) { e.OnSendBatch(now, bytes, 1) }

// OnSendBatch records packets packets of bytes bytes in all sent on this path.
func (e *Estimator) OnSendBatch(now int64, bytes, packets int) {
	e.bytesSent += uint64(bytes)
	e.pktsSent += uint64(packets)
}

// Tick counts timed-out probes as lost and runs the state machine at now: an Up path not heard
// from for DownAfter goes Down, a Down path that answered UpAfter probes in a row goes Up. It
// reports whether State changed.
func (e *Estimator) Tick(now int64) (changed bool) {
	e.expire(now)
	if !e.probing() {
		return false
	}
	switch {
	case e.live && now-e.lastHeard >= int64(e.cfg.DownAfter):
		e.goDown()
	case !e.live && e.pendingUp:
		e.live, e.pendingUp = true, false
		e.winRestart = true
	default:
		return false
	}
	return e.update(now)
}

// goDown drops the liveness verdict: only probes sent from now on count towards coming back.
func (e *Estimator) goDown() {
	e.live, e.pendingUp, e.lastAnswered = false, false, false
	e.runFloor = e.next
}

// update recomputes State from the flags and records a change.
func (e *Estimator) update(now int64) bool {
	s := Down
	switch {
	case e.adminDown:
		s = AdminDown
	case e.linkDown:
		s = LinkDown
	case e.live:
		s = Up
	}
	if s == e.state {
		return false
	}
	e.state, e.since = s, now
	e.transitions++
	return true
}

// SetAdminDown takes the path down (or lifts that) at now, on the operator's order, and
// reports whether State changed.
func (e *Estimator) SetAdminDown(now int64, down bool) (changed bool) {
	if e.adminDown == down {
		return false
	}
	e.adminDown = down
	return e.setFlag(now, down)
}

// SetLinkDown records at now that the local link of the path went down (or came back), and
// reports whether State changed.
func (e *Estimator) SetLinkDown(now int64, down bool) (changed bool) {
	if e.linkDown == down {
		return false
	}
	e.linkDown = down
	return e.setFlag(now, down)
}

func (e *Estimator) setFlag(now int64, down bool) bool {
	if down {
		// Outstanding probes are cancelled, neither answered nor lost: the path was not
		// given the chance to answer them.
		for s := e.tail; s != e.next; s++ {
			if p := &e.ring[s&ringMask]; p.state == slotPending {
				p.state = slotVoid
			}
		}
		e.tail = e.next
		e.goDown()
	} else if e.probing() {
		e.restartProbing(now)
	}
	return e.update(now)
}

// Snapshot returns a copy of the path's state.
func (e *Estimator) Snapshot() Snapshot {
	s := Snapshot{
		State:              e.state,
		ProbeTimeout:       time.Duration(e.probeTimeout()),
		Loss:               e.loss,
		ForwardLoss:        e.fwdLoss,
		DeliveryRate:       e.rate,
		RateSamples:        e.rateN,
		RateWindow:         time.Duration(e.rateWin),
		BytesSent:          e.bytesSent,
		BytesReceived:      e.bytesRecv,
		PacketsSent:        e.pktsSent,
		PacketsReceived:    e.pktsRecv,
		ProbesSent:         e.probesSent,
		ProbesLost:         e.lost,
		RepliesDuplicate:   e.dups,
		RepliesIgnored:     e.ignored,
		RepliesLate:        e.late,
		PeerRestarts:       e.restarts,
		PeerReorderPackets: e.reorderPkts,
		PeerReorderKiB:     e.reorderKiB,
		PeerReorderFreeKiB: e.reorderFree,
		PeerFeedbackAt:     e.fbAt,
		Since:              e.since,
		Transitions:        e.transitions,
	}
	if e.heard {
		s.LastHeard = e.lastHeard
	}
	if e.hasRTT {
		s.SRTT, s.RTTVar = time.Duration(e.srtt), time.Duration(e.rttvar)
		s.MinRTT = time.Duration(min(e.minCur, e.minPrev))
	}
	return s
}
