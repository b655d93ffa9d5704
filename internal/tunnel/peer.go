package tunnel

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
	"braid/internal/tunnel/session"
	"braid/internal/tunnel/sparse"
	"braid/internal/wire/mpath"
)

// Handshake and session timing.
const (
	handshakeRetry = 500 * time.Millisecond // resend an unanswered initiation
	rejectAfter    = 3 * time.Minute        // a session older than this is not used to send
	// rekeyAfterMessages starts a new handshake long before the session's counter runs out.
	rekeyAfterMessages = session.RejectAfterMessages - 1<<32
)

// Variables only so that tests can see rekeys in seconds (export_test.go).
var (
	rekeyAfter   = 2 * time.Minute  // the initiator starts a new handshake
	keepPrevious = 10 * time.Second // how long the previous session still opens packets
)

// peer is one remote site: its paths, sessions, reorder buffer and scheduler.
type peer struct {
	t    *Tunnel
	name string
	pub  session.PublicKey
	// routes are the inner prefixes of the peer; a reload replaces them (reload.go).
	routes atomic.Pointer[[]netip.Prefix]
	// cfg is the configuration the peer was made or last reloaded with (reload.go); only
	// Reload, under t.reloadMu, touches it.
	cfg PeerConfig
	// gone: a reload removed the peer; it makes no session any more.
	gone atomic.Bool

	cur   atomic.Pointer[liveSession] // the session packets are sent with
	txSeq atomic.Uint32               // data sequence for the peer's reorder buffer

	// learn: the peer was declared without addresses; its paths are learned from its packets
	// (roam.go), on the uplinks in learnOn, at most maxPaths of them.
	learn bool
	// learnOn: the weight and capacity of paths learned on each uplink (replaced by reloads)
	learnOn     atomic.Pointer[map[*uplink]PathConfig]
	maxPaths    atomic.Int64
	limitWarned atomic.Bool
	keepalive   atomic.Int64 // longest a path stays without sending, ns
	// ro is paths for the readers that do not hold mu (publishPathsLocked).
	ro atomic.Pointer[[]*peerPath]

	mu    sync.Mutex // guards what follows
	paths []*peerPath
	snap  []sched.Path // scratch for the scheduler
	sch   scheduler
	// schedName is sch's name as the site file gives it ("" is paced)
	schedName string
	// flight: the scheduler reasons with each path's data in flight (peerPath.sent); the
	// pacing one does not, and is spared the bookkeeping. measured: it takes a path's
	// measured capacity as its Capacity (paced, and wrr for its weights).
	flight, measured bool
	conn             sched.Conn        // the receiver's buffer, from the last snapshot
	states           []sched.PathState // scratch for the status
	// prev was current before cur; it still opens packets, and may be the session the peer
	// sends on (after initiations that crossed, each side sends on the one it initiated).
	prev *liveSession
	// retired are sessions that were prev, each still opening what is on its way for
	// keepPrevious after it left (at most maxRetired; the oldest goes first).
	retired  []retiredSession
	pending  *liveSession // made as responder, used to send once the initiator is heard on it
	hs       *session.Initiator
	hsIndex  uint32
	hsMAC1   [session.MAC1Len]byte // the mac1 of the initiation in flight
	hsSent   int64
	lastInit session.Timestamp // newest initiation accepted from the peer
	initSeen initCopies        // and its copies over the other paths
	// cipherWarned: the log has said that the peer offers no cipher this side accepts.
	cipherWarned atomic.Bool
	// versionWarned: the log has said that the peer speaks no protocol version this side does.
	versionWarned atomic.Bool
	rb            *reorder.Buffer[*packetBuf]
	released      []*packetBuf
	rxq           rxQueue      // what rb released, on its way to the device (p.mu)
	rxSparse      sparse.Meter // the peer's flows as received (p.mu; Options.SparseFlows)
	outer         atomic.Int64 // outer IP and UDP header bytes: 28, or 48 when a path is IPv6
	q             txQueue      // packets waiting to be sent (the device reader's only)
	// the send queue's depth as of the device reader's last change, for the status
	queuedBytes, queuedPackets atomic.Int64
	queueDrops                 atomic.Uint64 // packets dropped because the queue was full
	rtx                        *recovery
	// rxPath follows the numbering of each of the peer's paths (by the peer's path ID), to
	// see losses (recovery.go); guarded by mu.
	rxPath [256]rxPathSeq
	rxIDs  []uint8 // the path IDs of rxPath that have carried data
	// gapFrom is the first data sequence number not yet asked for in a gap nack (recovery.go;
	// the timers' only)
	gapFrom uint32
}

// liveSession is a session with its birth time.
type liveSession struct {
	s       *session.Session
	created int64
}

// peerPath is one path to the peer.
type peerPath struct {
	id uint8
	up *uplink
	// cookie is the last cookie the peer's responder sent for this path's address, received
	// at cookieAt (0: none); p.mu guards them (hsworker.go).
	cookie   session.Cookie
	cookieAt int64
	// conf is the path's configuration, as the site file last gave it (reload.go); for a
	// learned path, that of its uplink
	conf PathConfig
	// dst is the peer's address on the path now: configured, or learned, and moved by the
	// peer's authenticated packets (roam.go). Read it with remote().
	dst atomic.Pointer[netip.AddrPort]
	// peerID is the peer's ID for this path, as its packets carry it; -1 until one is heard.
	peerID atomic.Int32
	// learned: made from the peer's packets, at learnedAt; movedAt is the last move (zero if
	// none), moves how many, movedLog when a move was last logged. p.mu guards them.
	learned           bool
	learnedAt         time.Time
	movedAt, movedLog time.Time
	moves             uint64
	kaPackets         uint64 // txPackets when the keepalive last looked (timers goroutine)
	kaAt              int64  // and when
	weight            float64
	capacity          uint64
	est               *path.Estimator
	admin             bool // operator set it down
	outer             int  // outer IP and UDP header bytes: 28 on IPv4, 48 on IPv6
	pmtu              *path.PMTU
	tx                pathTx // datagrams queued by the device reader (its goroutine only)

	// measured capacity, when none is configured: fed one sample per delivery-rate window
	capEst  *sched.Capacity
	capN    uint64 // the estimator's RateSamples when the last sample was taken
	capAt   int64  // and when, the start of the next sample's window
	capHist sendHistory
	capBits float64       // delivered over the estimator's windows since the last sample
	capWin  time.Duration // and their length
	// packets the peer reported lost on the path since the last sample, and the path's
	// txPackets when that sample was taken: a burst of losses is an overflow (noteLosses)
	capLost, capPkts uint64

	// loss recovery (recovery.go), guarded by the peer's rtx.mu: the PathSeq of the next data
	// packet, and which data sequence number each recent one carried
	txPathSeq uint32
	rtxLog    []rtxEntry

	sent sentLog // what the scheduler gave the path lately, for its data in flight
	// owed: wire bytes resent on the path (loss recovery, on an uplink reader) that the queue
	// planner has not charged to the path's pacing yet (dispatch does, before each plan)
	owed, owedAt atomic.Int64 // and when the last of them was sent
	base         baseRTT      // its propagation RTT over minutes, for the window-based schedulers

	// receive counters reported to the peer in probe replies
	rxBytes   uint64
	rxPackets uint32
	// data datagrams received (not probes, replies or MTU probes), for the status
	rxDataBytes, rxDataPackets uint64

	txBytes, txPackets, txDrops atomic.Uint64
	// data datagrams sent (the device reader's batches), a subset of txBytes and txPackets
	txDataBytes, txDataPackets atomic.Uint64
}

// scheduler is what the tunnel needs of a path scheduler.
type scheduler interface {
	Pick(now int64, paths []sched.Path, size int) (int, bool)
}

// newScheduler returns the named scheduler; the default is paced, at the configured capacity
// of a path or else at its measured one. The buffer-aware ones (blest, ecf, rbpm) take the
// peer's reorder buffer as the receive buffer: its free room comes back in the feedback.
func newScheduler(name string) (scheduler, error) {
	switch name {
	case "":
		fallthrough
	case "paced":
		return sched.NewPaced(sched.PacedConfig{}.Defaults())
	case "wrr":
		return &sched.WRR{}, nil
	case "minrtt":
		return &sched.MinRTT{}, nil
	case "blest":
		return &sched.BLEST{}, nil
	case "ecf":
		return &sched.ECF{}, nil
	case "rbpm":
		return sched.NewRBPM(sched.RBPMConfig{}), nil
	}
	return nil, fmt.Errorf("tunnel: unknown scheduler %q (paced, wrr, minrtt, blest, ecf or rbpm)", name)
}

// newPeer makes the peer of pc, whose paths leave by the uplinks in ups, with the scheduler
// named schedName.
func newPeer(t *Tunnel, ups map[string]*uplink, pc PeerConfig, schedName string, now int64) (*peer, error) {
	if pc.PublicKey.IsZero() {
		return nil, fmt.Errorf("tunnel: peer %s has no public key", pc.Name)
	}
	p := &peer{t: t, name: pc.Name, pub: pc.PublicKey, cfg: pc, rtx: newRecovery(t.o.Recovery, t.o.MTU)}
	if err := p.setSchedulerLocked(schedName); err != nil {
		return nil, err
	}
	routes := pc.Routes
	p.routes.Store(&routes)
	p.txSeq.Store(randUint32())
	var err error
	if t.o.Reorder {
		rc := t.o.ReorderCfg
		rc.Learn = true
		if p.rb, err = reorder.New[*packetBuf](rc); err != nil {
			return nil, fmt.Errorf("tunnel: peer %s: %w", pc.Name, err)
		}
	}
	keepalive, maxPaths, learn, err := checkPeer(pc)
	if err != nil {
		return nil, err
	}
	p.keepalive.Store(keepalive)
	p.maxPaths.Store(int64(maxPaths))
	p.learn = learn
	learnOn := map[*uplink]PathConfig{}
	for i, cfg := range pc.Paths {
		u := ups[cfg.Uplink]
		if u == nil {
			return nil, fmt.Errorf("tunnel: peer %s path %d: no uplink %q", pc.Name, i+1, cfg.Uplink)
		}
		if p.learn {
			learnOn[u] = cfg
			continue
		}
		pp, err := p.newPath(uint8(i), u, cfg, now)
		if err != nil {
			return nil, fmt.Errorf("tunnel: peer %s path %d: %w", pc.Name, i+1, err)
		}
		p.paths = append(p.paths, pp)
	}
	p.learnOn.Store(&learnOn)
	p.snap = make([]sched.Path, len(p.paths))
	p.setOuterLocked()
	p.publishPathsLocked()
	return p, nil
}

// checkPeer checks pc and returns its keepalive (ns), its bound on learned paths, and whether
// its paths are learned.
func checkPeer(pc PeerConfig) (keepalive int64, maxPaths int, learn bool, err error) {
	if len(pc.Paths) == 0 || len(pc.Paths) > 254 {
		return 0, 0, false, fmt.Errorf("tunnel: peer %s has %d paths (1 to 254)", pc.Name, len(pc.Paths))
	}
	keepalive = int64(pc.Keepalive)
	if keepalive == 0 {
		keepalive = int64(DefaultKeepalive)
	}
	if keepalive < 0 {
		return 0, 0, false, fmt.Errorf("tunnel: peer %s: keepalive %v is negative", pc.Name, pc.Keepalive)
	}
	maxPaths = pc.MaxPaths
	if maxPaths == 0 {
		maxPaths = DefaultMaxPaths
	}
	if maxPaths < 1 || maxPaths > 254 {
		return 0, 0, false, fmt.Errorf("tunnel: peer %s: max paths %d outside 1..254", pc.Name, pc.MaxPaths)
	}
	fixed := 0
	for _, cfg := range pc.Paths {
		if cfg.Remote.IsValid() {
			fixed++
		}
	}
	if fixed != 0 && fixed != len(pc.Paths) {
		return 0, 0, false, fmt.Errorf("tunnel: peer %s: %d of %d paths have no remote address: give every path one, or none (paths learned from the peer's packets)", pc.Name, len(pc.Paths)-fixed, len(pc.Paths))
	}
	return keepalive, maxPaths, fixed == 0, nil
}

// setSchedulerLocked gives the peer a new scheduler of that name; p.mu is held (or p is not
// published yet).
func (p *peer) setSchedulerLocked(name string) error {
	sch, err := newScheduler(name)
	if err != nil {
		return err
	}
	_, paced := sch.(pacer)
	_, wrr := sch.(*sched.WRR)
	p.sch, p.schedName = sch, name
	p.flight, p.measured = !paced, paced || wrr
	return nil
}

// setOuterLocked sets the peer's outer header size from its paths: IPv6's when one of them is
// IPv6, and for the paths not learned yet, those of their uplink's family (IPv6's when it is
// unknown: a little less for the paced rate, never too much).
func (p *peer) setOuterLocked() {
	outer := 20 + 8
	for _, pp := range p.paths {
		outer = max(outer, pp.outer)
	}
	if p.learn {
		for u := range *p.learnOn.Load() {
			if l := u.local(); !l.IsValid() || !l.Addr().Unmap().Is4() {
				outer = 40 + 8
			}
		}
	}
	p.outer.Store(int64(outer))
}

// learnable returns the configuration of the paths p learns on u; ok is false when it learns
// none there.
func (p *peer) learnable(u *uplink) (PathConfig, bool) {
	c, ok := (*p.learnOn.Load())[u]
	return c, ok && p.learn
}

// newPath makes path id on uplink u to cfg.Remote.
func (p *peer) newPath(id uint8, u *uplink, cfg PathConfig, now int64) (*peerPath, error) {
	t := p.t
	remote := unmapPort(cfg.Remote)
	pp := &peerPath{
		id: id, up: u, conf: cfg, weight: cfg.Weight, capacity: cfg.Capacity,
		est: path.New(t.o.Path, now), capAt: now, outer: 20 + 8,
	}
	pp.dst.Store(&remote)
	pp.peerID.Store(-1)
	if !remote.Addr().Is4() {
		pp.outer = 40 + 8
	}
	mc := t.o.PMTU
	if mc.Max = u.mtu; mc.Max == 0 {
		mc.Max = t.o.MTU + Overhead + pp.outer
	}
	if err := mc.WithDefaults().Validate(); err != nil {
		return nil, err
	}
	pp.pmtu = path.NewPMTU(mc, now)
	if cfg.Capacity == 0 {
		var err error
		if pp.capEst, err = sched.NewCapacity(t.o.CapacityCfg); err != nil {
			return nil, err
		}
	}
	return pp, nil
}

// sampleCapacityLocked gives the path's capacity estimator one sample per capacityWindow:
// the delivery rate over the estimator's windows of that span, with what was sent on the path
// meanwhile. Both are counted as the scheduler paces, in IP bytes on the wire: the peer
// reports datagram payloads, and every datagram also carries outer IP and UDP headers.
func (pp *peerPath) sampleCapacityLocked(now int64, outer int) {
	if pp.capEst == nil {
		return
	}
	sent, pkts := pp.txBytes.Load(), pp.txPackets.Load()
	pp.capHist.record(now, sent, pkts)
	s := pp.est.Snapshot()
	if s.RateSamples == pp.capN {
		return
	}
	pp.capN = s.RateSamples
	pp.capBits += s.DeliveryRate * s.RateWindow.Seconds()
	pp.capWin += s.RateWindow
	// While the estimator looks for the path's rate, or drains the queue its pacing above the
	// path built, every delivery window is a sample: each window it is late overfills the
	// path's queue, or holds the traffic below the path longer than needed.
	if ph := pp.capEst.Phase(); pp.capWin < capacityWindow && ph != sched.PhaseStartup && ph != sched.PhaseDrain {
		return
	}
	// What was sent for the window: the packets the peer counted left about a round trip
	// before the feedback that reports them (sendHistory).
	back := int64(s.SRTT)
	if back <= 0 || back > int64(time.Minute) {
		back = 0
	}
	b0, p0 := pp.capHist.countersAt(pp.capAt-back, now, sent, pkts)
	b1, p1 := pp.capHist.countersAt(now-back, now, sent, pkts)
	if dt, b := now-pp.capAt, b1-b0; dt > 0 && b > 0 {
		wire := (b + (p1-p0)*float64(outer)) / b
		pp.capEst.OnSample(pp.capBits/pp.capWin.Seconds()*wire, b*wire*8*1e9/float64(dt),
			int64(pp.capWin), int64(s.SRTT), int64(s.MinRTT))
	}
	pp.capAt, pp.capBits, pp.capWin = now, 0, 0
	pp.startLossWindowLocked(pkts)
}

// startLossWindowLocked starts counting the path's losses afresh for a new capacity sample,
// which begins when the path has been sent pkts packets. p.mu is held.
func (pp *peerPath) startLossWindowLocked(pkts uint64) {
	pp.capLost, pp.capPkts = 0, pkts
}

// noteLossesLocked counts n packets the peer reported lost on the path (a nack) towards the
// current capacity sample, and tells the estimator when they are a burst: at least
// overflowLost, and at least overflowShare of the packets sent on the path since the sample
// began. Random loss of 1 % reaches that within a window about once in 150; a queue overflowed
// by a startup's pacing at twice its rate loses every other packet. It reports whether the
// estimator changed its gain. p.mu is held.
func (pp *peerPath) noteLossesLocked(n int) bool {
	if pp.capEst == nil || n <= 0 {
		return false
	}
	pp.capLost += uint64(n)
	sent := pp.txPackets.Load() - pp.capPkts
	return pp.capLost >= overflowLost && float64(pp.capLost) >= overflowShare*float64(sent) && pp.capEst.OnOverflow()
}

// overflowLost and overflowShare: what a burst of losses within a capacity sample is
// (noteLossesLocked).
const (
	overflowLost  = 8
	overflowShare = 0.03
)

// capacityWindow is the shortest span of one capacity sample once the path's rate is found:
// the peer's delivery windows are timed by its clock, but when its receive loop runs late a
// 100 ms window is off by a few per cent, and the estimate, a maximum, would take the high
// ones. In startup a few per cent do not matter, and each window counts.
const capacityWindow = 300 * time.Millisecond

// pacer is a scheduler that can say when a path will have room.
type pacer interface {
	Next(now int64, paths []sched.Path, size int) (index int, at int64, ok bool)
}

// pick chooses the path for a packet of size bytes; it returns nil when none is usable. It
// may return a time to wait instead (wait > 0): the caller sleeps and asks again. A pacing
// scheduler says when a path will have room, which paces the device reader to the paths'
// capacity; the others decline while every usable path's window is full or, for BLEST and
// ECF, while waiting for the fast path beats sending on a slow one, and the caller then
// retries after minPaceWait (the windows drain as the data in flight ages).
func (p *peer) pick(now int64, size int) (pp *peerPath, wait int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	up := p.snapshotLocked(now)
	if pc, ok := p.sch.(pacer); ok {
		i, at, ok := pc.Next(now, p.snap, size)
		if !ok {
			return nil, 0
		}
		if at > now {
			return nil, at - now
		}
		return p.paths[i], 0
	}
	var i int
	var ok bool
	if cs, isConn := p.sch.(connScheduler); isConn {
		i, ok = cs.PickConn(now, p.conn, p.snap, size)
	} else {
		i, ok = p.sch.Pick(now, p.snap, size)
	}
	if !ok {
		if up {
			return nil, minPaceWait
		}
		return nil, 0
	}
	pp = p.paths[i]
	pp.sent.add(now, size)
	return pp, 0
}

// snapshotLocked fills p.snap for the scheduler and reports whether a path is usable. A path
// that is still Up but has gone quiet for longer than a probe round trip should take is
// avoided while another path is fresh: a path that has just died would otherwise swallow data
// until the estimator declares it down. When no path is up, those that went down on silence
// within lastResortAfter × DownAfter are used rather than none.
func (p *peer) snapshotLocked(now int64) bool {
	fresh := false
	mss := int(p.t.mtu.Load()) + Overhead + int(p.outer.Load())
	var fb feedbackConn
	for i, pp := range p.paths {
		s := pp.est.Snapshot()
		fb.observe(s)
		up := s.State == path.Up && !pp.admin
		quiet := up && now-s.LastHeard > p.quietAfter(s)
		p.snap[i] = sched.Path{
			ID: i, Up: up && !quiet, Weight: pp.weight,
			Capacity: float64(pp.capacity), SRTT: s.SRTT, RTTVar: s.RTTVar,
			MinRTT: s.MinRTT, DeliveryRate: s.DeliveryRate, MSS: mss,
		}
		if _, _, sent, ok := pp.est.Stalled(); ok && now-sent > int64(s.SRTT) {
			// A probe out for longer than the smoothed RTT, with none after it back: the
			// path's round trip is at least that long now (a stall), and what the
			// schedulers give it arrives that much later.
			p.snap[i].SRTT = time.Duration(now - sent)
		}
		if p.flight {
			sp := &p.snap[i]
			sp.InFlight = pp.sent.inFlight(now, s.SRTT)
			sp.MinRTT = pp.base.observe(now, s.MinRTT)
			sp.CWnd = window(float64(pp.capacity), s.DeliveryRate, sp.MinRTT)
		}
		if pp.capEst != nil && p.measured {
			// The measured capacity is found by pacing above it (the estimator's probing
			// phases): unpaced, it stays at its start-up guess. The window-based schedulers
			// reason with the delivery rate instead, or a configured capacity.
			p.snap[i].Capacity, p.snap[i].PaceRate = pp.capEst.Estimate(), pp.capEst.PacingRate()
			p.snap[i].Unmeasured = !pp.capEst.Measured()
			if !p.flight {
				// The queue planner's window: pacing above a rate not yet known (or that has
				// just dropped) fills the path's queue by at most one window.
				sp := &p.snap[i]
				sp.InFlight = pp.sent.inFlight(now, s.SRTT)
				base := pp.base.observe(now, s.MinRTT)
				if base <= 0 {
					base = s.SRTT
				}
				sp.CWnd = probeWindow(pp.capEst, s.DeliveryRate, base)
			}
		}
		if b := pp.up.pace.Load(); b != nil {
			// The paths on one uplink are paced together at its capacity, and none is
			// worth more than the uplink in the shares.
			p.snap[i].Uplink = b
			p.snap[i].Capacity = min(p.snap[i].Capacity, b.Rate)
		}
		fresh = fresh || (up && !quiet)
	}
	p.conn = fb.conn()
	if fresh {
		p.unpaceLastLocked()
		return true
	}
	// every live path is quiet: use them all rather than none
	any := false
	for i, pp := range p.paths {
		s := pp.est.Snapshot()
		p.snap[i].Up = s.State == path.Up && !pp.admin
		any = any || p.snap[i].Up
	}
	if any {
		p.unpaceLastLocked()
		return any
	}
	// None is up: use the paths that went down on silence within the last resort window. A
	// cellular link that stalls for longer than DownAfter holds what it is given in its queue
	// and delivers it when it resumes, as it does a plain flow's packets; dropped here instead
	// (drop_no_path), the flow inside loses a window at once (docs/scheduling.md, "One path
	// through a stall"). A path taken down by the operator or its link is never used.
	recent := int64(lastResortAfter * p.t.o.Path.DownAfter)
	for i, pp := range p.paths {
		s := pp.est.Snapshot()
		if s.State == path.Down && !pp.admin && s.LastHeard > 0 && now-s.LastHeard < recent {
			p.snap[i].Up = true
			any = true
		}
	}
	p.unpaceLastLocked()
	return any
}

// unpaceLastLocked lifts the pacing and the planner's window of the one path p.snap gives the
// scheduler, when its capacity is measured and no other path is alive (Up, if quiet): a peer
// with one path, or whose other paths are down. That path may be a quiet one, or one that went
// down on silence and is the last resort (snapshotLocked): in a stall the link holds what it
// is given, as it does a plain flow's packets.
//
// Pacing at a measured capacity is how the planner splits a flow across paths by arrival time;
// with one path there is nothing to split, and the pacing only adds a second bottleneck in
// front of the link, at an estimate that lags the link whenever its rate moves. Over a link
// that stalls 600 ms every 3 s the estimate stayed at 4.5-6.3 Mbit/s of the link's 10 (each
// stall's samples pulled it down, and cruise probes it back up a few per cent a cycle, only
// when the flow inside has data waiting), and the send queue's bound (20 ms at that rate)
// dropped the flow's bursts: a cubic flow carried 0.41-0.70 of a plain flow on the same link.
// Unpaced, the flow inside meets the link's own queue, as a plain flow does: 0.95-0.96, and
// over a constant link 0.95 (0.94 paced; the headers take about 5 %) (docs/scheduling.md,
// "One path: the link's own queue"). The estimator still measures the path (its samples are
// busy: the flow fills the link), so a second path that comes up is planned against a
// current estimate. Capacities configured by the operator are kept as set (they may be
// meant to shape), and so are the window-based schedulers' windows (Options.Flight).
func (p *peer) unpaceLastLocked() {
	if !p.measured || p.flight {
		return
	}
	one := -1
	for i, pp := range p.paths {
		alive := pp.est.Snapshot().State == path.Up && !pp.admin
		if !p.snap[i].Up && !alive {
			continue
		}
		if one >= 0 || !p.snap[i].Up {
			return
		}
		one = i
	}
	if one >= 0 && p.paths[one].capEst != nil {
		p.snap[one].PaceRate, p.snap[one].CWnd = unpacedRate, 0
	}
}

// unpacedRate is the pacing rate of a path that is not paced: more than any path carries.
const unpacedRate = 1e12

// lastResortAfter is how many DownAfter periods a silent path stays the last resort while no
// path is up (2 s with the default DownAfter): long enough for nearly every stall of the
// recorded LTE traces (over one of them the drops fell from 72-274 a side to 1-5), short enough
// that a path that has died stops taking traffic soon after.
const lastResortAfter = 8

// quietAfter is how long a path may stay unheard before it is avoided: one probe interval plus
// a round trip with its variation, plus a little slack for the probe timer.
func (p *peer) quietAfter(s path.Snapshot) int64 {
	return int64(p.t.o.Path.ProbeInterval + s.SRTT + 4*s.RTTVar + 5*time.Millisecond)
}

// handshake starts (or repeats) an initiation on every path when one is due.
func (p *peer) handshake(now int64) {
	p.mu.Lock()
	cur := p.cur.Load()
	need := cur == nil || time.Duration(now-cur.created) > rekeyAfter || cur.s.Sent() > rekeyAfterMessages
	if !need || p.gone.Load() || (p.hs != nil && time.Duration(now-p.hsSent) < handshakeRetry) || len(p.paths) == 0 {
		// A peer whose paths are learned and not known yet is reached when it initiates.
		p.mu.Unlock()
		return
	}
	if p.hs != nil {
		p.t.dropIndex(p.hsIndex)
	}
	idx := p.t.reserveIndex(p)
	hs, msg, err := session.InitiateSpeaking(p.t.priv, p.pub, idx, p.t.o.Ciphers, p.t.o.speaks(), time.Now())
	if err != nil {
		p.t.dropIndex(idx)
		p.mu.Unlock()
		p.t.log.Error("handshake", "peer", p.name, "err", err)
		return
	}
	key := session.MAC1Key(p.pub)
	msg = session.AppendMAC1(msg, &key)
	p.hs, p.hsIndex, p.hsSent = hs, idx, now
	copy(p.hsMAC1[:], msg[len(msg)-session.MAC1Len:])
	// A path holding a fresh cookie closes its copy with mac2 (hsworker.go).
	paths := p.paths
	msgs := make([][]byte, len(paths))
	for i, pp := range paths {
		msgs[i] = msg
		if pp.cookieAt != 0 && time.Duration(now-pp.cookieAt) < session.CookieUseFor {
			msgs[i] = session.AppendMAC2(append(make([]byte, 0, len(msg)+session.MAC2Len), msg...), &pp.cookie)
		}
	}
	p.mu.Unlock()
	p.t.stats.HandshakesSent.Add(1)
	for i, pp := range paths {
		p.t.sendClear(pp, 0, mpath.TypeHandshakeInit, msgs[i])
	}
}

// installInitiated makes the session of a completed initiation current.
func (p *peer) installInitiated(now int64, k session.Keys, remoteIdx uint32) {
	p.mu.Lock()
	s := session.New(k, p.hsIndex, remoteIdx)
	p.t.setSession(p.hsIndex, s, p)
	p.hs = nil
	p.rotateLocked(&liveSession{s: s, created: now}, now)
	p.mu.Unlock()
	p.t.log.Info("session up", "peer", p.name, "role", "initiator", "cipher", p.t.cipherName(s))
}

// rotateLocked makes ls current at now. The one before it becomes prev, and the prev before
// that is retired: it opens packets for keepPrevious more, because the peer may have sent on
// it until a moment ago (when initiations cross, the peer sends on the session this side keeps
// as prev, and the rotations of a rekey come a round trip apart). A pending responder session
// other than ls stays pending: when both sites rekey at once, each receives the other's
// initiation before the response to its own, and the peer sends on the session it initiated,
// which is this side's pending one. Dropping it at once, as rotations once did, left each side
// sending on a session the other had dropped, and the tunnel dead until the next rekey.
func (p *peer) rotateLocked(ls *liveSession, now int64) {
	if old := p.prev; old != nil {
		if len(p.retired) == maxRetired {
			p.t.dropIndex(p.retired[0].ls.s.LocalIndex)
			p.retired = append(p.retired[:0], p.retired[1:]...)
		}
		p.retired = append(p.retired, retiredSession{ls: old, until: now + int64(keepPrevious)})
	}
	p.prev = p.cur.Swap(ls)
	if p.pending == ls {
		p.pending = nil
	}
}

// retiredSession is a session kept to open late packets until until.
type retiredSession struct {
	ls    *liveSession
	until int64
}

// maxRetired bounds the retired sessions of a peer: a rekey retires one or two.
const maxRetired = 4

// confirm is called when a packet opened with s: a pending responder session becomes current.
func (p *peer) confirm(s *session.Session) {
	p.mu.Lock()
	if p.pending != nil && p.pending.s == s {
		p.rotateLocked(p.pending, p.t.now())
		p.t.log.Info("session up", "peer", p.name, "role", "responder", "cipher", p.t.cipherName(s))
	}
	p.mu.Unlock()
}

// expire drops sessions past their time.
func (p *peer) expire(now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prev != nil && time.Duration(now-p.prev.created) > rejectAfter+keepPrevious {
		p.t.dropIndex(p.prev.s.LocalIndex)
		p.prev = nil
	}
	for len(p.retired) > 0 && now > p.retired[0].until {
		p.t.dropIndex(p.retired[0].ls.s.LocalIndex)
		p.retired = append(p.retired[:0], p.retired[1:]...)
	}
	if cur := p.cur.Load(); cur != nil && time.Duration(now-cur.created) > rejectAfter {
		p.t.dropIndex(cur.s.LocalIndex)
		p.cur.Store(nil)
		// No rekey came in time (the peer is gone or its handshakes fail): the tunnel to it
		// carries nothing until a new handshake succeeds.
		p.t.log.Warn("session expired", "peer", p.name, "age", time.Duration(now-cur.created).Round(time.Second))
	}
}

func randUint32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}
