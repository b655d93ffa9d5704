package sched

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"time"
)

// The simulator drives a Scheduler over modelled paths, deterministically: one event queue,
// time in nanoseconds, no clock, no goroutine, no randomness. Its model:
//
//   - A sender with unlimited data at the connection level, sending MSS-sized packets
//     numbered by a data sequence number (DSN). It may send DSN d only while
//     d < DATA_ACK + Buffer/MSS (the receiver's window, as last acknowledged): the MPTCP rule
//     that lets a slow path's missing packet stall every path.
//   - Per path, a TCP-like Reno sender: initial window InitCwnd packets, slow start, then
//     +1 packet per window, growing only while the window limits the sending (RFC 7661's
//     validation, as Linux does: a receive-window-limited sender does not inflate it). A
//     drop is noticed when the packets behind it would have been acknowledged (the
//     fast-retransmit time: queueing delay + one round trip); it halves the window at most
//     once per round trip and the packet is resent on the same path. A packet unacknowledged
//     for an RTO (SRTT + max(200 ms, 4·RTTVar), as Linux; 1 s before the first sample) takes
//     the path down, and all its unacknowledged data is re-sent on other paths first
//     (MPTCP's reinjection). SRTT and RTTVar follow RFC 6298; MinRTT is the least sample of
//     the last 150 to 300 s (Linux's window); the delivery rate is the bytes acknowledged
//     between a packet's send and its ack over that time, smoothed by 1/4 and kept while the
//     path is idle.
//   - Per path and direction, a link of Rate bit/s and one-way Delay; data packets
//     (MSS + 52 bytes of headers) wait in a drop-tail queue of Queue packets (the packet being
//     serialised included); acknowledgements come back after Delay without queueing (the
//     paper's reverse links are 100 Mbit/s). A Rate of 0 is a dead link that loses everything.
//   - Probes: every Probe interval each path that is down or has no data in flight sends a
//     64-byte probe through the same queue; its echo is an RTT sample and brings a down path
//     back up. This is how demoted and dead paths stay measured.
//   - A receiver with a buffer of Buffer payload bytes holding out-of-order data; in-order
//     data goes to the application at once. Each ack carries DATA_ACK and the free buffer
//     (Buffer − out-of-order bytes), which is the Conn.Avail the sender's scheduler sees.
//
// A scheduler that declines (ok = false) is asked again at the next event; a tick every 5 ms
// guarantees there is one. A scheduler that names a path with a full window (WRR) holds the
// packet for that path until it has room.

// SimPath is one modelled path.
type SimPath struct {
	Rate  float64       // bit/s; 0 is a dead link
	Delay time.Duration // one way
	Queue int           // drop-tail queue in packets; 0 means 100
}

// SimChange replaces path Path's Rate and Delay at time At.
type SimChange struct {
	At    time.Duration
	Path  int
	Rate  float64
	Delay time.Duration
}

// SimConfig is one simulation.
type SimConfig struct {
	Paths    []SimPath
	Buffer   int           // the receiver's buffer in payload bytes; 0 means unbounded
	Duration time.Duration // simulated time
	Sample   time.Duration // length of a throughput sample; 0 means 1 s
	MSS      int           // 0 means DefaultMSS
	InitCwnd int           // packets; 0 means 10
	Probe    time.Duration // probe interval; 0 means 100 ms
	Changes  []SimChange
	// Estimate, if set, may change the snapshot the scheduler gets (to test bad estimates).
	Estimate func(now int64, paths []Path)
	// Observe, if set, is called after every decision with the snapshot the scheduler saw.
	Observe func(now int64, paths []Path)
}

// SimSample is the throughput over one sample interval ending at At, in bytes/s.
type SimSample struct {
	At      time.Duration
	Goodput float64   // in-order bytes to the application
	PerPath []float64 // payload bytes acknowledged per path
}

// SimResult is what a simulation measured.
type SimResult struct {
	Goodput    float64 // in-order bytes/s over the whole run
	Samples    []SimSample
	Sent       []int64 // payload bytes sent per path, resends included
	Reinjected int64   // packets re-sent on another path after an RTO
	Stalls     int     // samples in which the application got nothing
}

// ErrSimConfig is returned for an unusable SimConfig.
var ErrSimConfig = errors.New("sched: invalid simulation")

const (
	simHeader = 52 // IP + TCP + options, per data packet
	simProbe  = 64
	simTick   = 5 * int64(time.Millisecond)
)

type simEvKind uint8

const (
	evArrive simEvKind = iota // a packet reaches the receiver
	evAck                     // an ack or probe echo reaches the sender
	evLoss                    // the sender notices a drop
	evTick                    // RTO checks, probes, a send attempt
	evSample                  // end of a sample interval
	evChange                  // a SimChange
)

type simEvent struct {
	t    int64
	seq  uint64
	kind simEvKind
	pkt  *simPkt
	// for acks: the receiver's state when it sent the ack
	dataAck int64
	free    int
	sentAt  int64
	change  int
}

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simPkt struct {
	id        uint64
	path      int
	dsn       int64
	probe     bool
	resent    bool
	sentAt    int64
	delivSnap int64 // path's delivered bytes at send
	delivAt   int64 // time of the path's last ack at send
	gone      bool  // no longer outstanding (acked, lost, reinjected)
}

type simLink struct {
	SimPath
	lastDepart int64
	departs    []int64 // departure times of the packets in the queue
	// TCP
	cwnd, ssthresh float64
	srtt, rttvar   int64
	minCur, minOld int64 // least RTT of this 150 s epoch and of the one before
	minEpoch       int64
	recoverUntil   int64
	out            []*simPkt // outstanding, in send order
	inflight       int
	delivered      int64
	lastAck        int64
	rate           float64
	up             bool
	sent           int64
	ackedMark      int64 // delivered at the last sample
	lastProbe      int64
}

type sim struct {
	cfg      SimConfig
	s        Scheduler
	cs       ConnScheduler
	mss      int
	win      int64 // window in packets; 0 unbounded
	links    []simLink
	q        simQueue
	seq      uint64
	nextID   uint64
	now      int64
	sndNxt   int64
	dataAck  int64
	free     int
	freeAt   int64
	reinject []int64
	pending  int // path held by the scheduler's last pick, -1 none
	// receiver
	rcvNxt int64
	ooo    map[int64]bool
	snap   []Path
	res    SimResult
	mark   int64 // rcvNxt at the last sample
}

// Simulate runs cfg with scheduler s and returns what it measured.
func Simulate(cfg SimConfig, s Scheduler) (SimResult, error) {
	if len(cfg.Paths) == 0 || cfg.Duration <= 0 || cfg.Buffer < 0 || s == nil {
		return SimResult{}, fmt.Errorf("%w: %d paths, duration %v, buffer %d", ErrSimConfig, len(cfg.Paths), cfg.Duration, cfg.Buffer)
	}
	for i, p := range cfg.Paths {
		if p.Rate < 0 || math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) || p.Delay < 0 || p.Queue < 0 {
			return SimResult{}, fmt.Errorf("%w: path %d: %+v", ErrSimConfig, i, p)
		}
	}
	if cfg.Sample <= 0 {
		cfg.Sample = time.Second
	}
	if cfg.Probe <= 0 {
		cfg.Probe = 100 * time.Millisecond
	}
	m := &sim{cfg: cfg, s: s, mss: cfg.MSS, pending: -1, ooo: map[int64]bool{}}
	if m.mss <= 0 {
		m.mss = DefaultMSS
	}
	m.cs, _ = s.(ConnScheduler)
	if cfg.Buffer > 0 {
		m.win = max(int64(cfg.Buffer/m.mss), 1)
		m.free = cfg.Buffer
	}
	iw := float64(cfg.InitCwnd)
	if iw <= 0 {
		iw = 10
	}
	m.links = make([]simLink, len(cfg.Paths))
	for i, p := range cfg.Paths {
		if p.Queue == 0 {
			p.Queue = 100
		}
		m.links[i] = simLink{SimPath: p, cwnd: iw, ssthresh: math.Inf(1), up: true, lastProbe: math.MinInt64 / 2}
	}
	m.res.Sent = make([]int64, len(cfg.Paths))
	m.snap = make([]Path, len(cfg.Paths))
	end := int64(cfg.Duration)
	m.push(simEvent{t: 0, kind: evTick})
	m.push(simEvent{t: int64(cfg.Sample), kind: evSample})
	for i, c := range cfg.Changes {
		if c.Path < 0 || c.Path >= len(cfg.Paths) {
			return SimResult{}, fmt.Errorf("%w: change %d names path %d", ErrSimConfig, i, c.Path)
		}
		m.push(simEvent{t: int64(c.At), kind: evChange, change: i})
	}
	for m.q.Len() > 0 {
		e := heap.Pop(&m.q).(simEvent)
		if e.t > end {
			break
		}
		m.now = e.t
		switch e.kind {
		case evArrive:
			m.arrive(e.pkt)
		case evAck:
			m.ack(e)
		case evLoss:
			m.lost(e.pkt)
		case evTick:
			m.tick()
			m.push(simEvent{t: m.now + simTick, kind: evTick})
		case evSample:
			m.sample()
			m.push(simEvent{t: m.now + int64(cfg.Sample), kind: evSample})
		case evChange:
			c := cfg.Changes[e.change]
			m.links[c.Path].Rate, m.links[c.Path].Delay = c.Rate, c.Delay
		}
		m.send()
	}
	m.res.Goodput = float64(m.rcvNxt) * float64(m.mss) / cfg.Duration.Seconds()
	for i := range m.links {
		m.res.Sent[i] = m.links[i].sent
	}
	return m.res, nil
}

func (m *sim) push(e simEvent) {
	m.seq++
	e.seq = m.seq
	heap.Push(&m.q, e)
}

// transmit puts p on its path's link: queued and delivered, or dropped.
func (m *sim) transmit(p *simPkt) {
	l := &m.links[p.path]
	size := simProbe
	if !p.probe {
		size = m.mss + simHeader
		l.out = append(l.out, p)
		l.inflight += m.mss
		l.sent += int64(m.mss)
	}
	p.sentAt, p.delivSnap, p.delivAt = m.now, l.delivered, max(l.lastAck, m.now-max(l.srtt, 1))
	n := 0
	for _, d := range l.departs {
		if d > m.now {
			l.departs[n] = d
			n++
		}
	}
	l.departs = l.departs[:n]
	if l.Rate <= 0 {
		return // a dead link: only the RTO notices
	}
	if len(l.departs) >= l.Queue {
		if !p.probe {
			// Noticed when the packets behind it are acknowledged.
			backlog := max(l.lastDepart-m.now, 0)
			m.push(simEvent{t: m.now + backlog + 2*int64(l.Delay) + int64(time.Millisecond), kind: evLoss, pkt: p})
		}
		return
	}
	depart := max(m.now, l.lastDepart) + int64(float64(size*8)/l.Rate*1e9)
	l.lastDepart = depart
	l.departs = append(l.departs, depart)
	m.push(simEvent{t: depart + int64(l.Delay), kind: evArrive, pkt: p})
}

func (m *sim) arrive(p *simPkt) {
	delay := int64(m.links[p.path].Delay)
	if !p.probe {
		switch {
		case p.dsn == m.rcvNxt:
			m.rcvNxt++
			for m.ooo[m.rcvNxt] {
				delete(m.ooo, m.rcvNxt)
				m.rcvNxt++
			}
		case p.dsn > m.rcvNxt:
			m.ooo[p.dsn] = true
		}
	}
	free := 0
	if m.win > 0 {
		free = m.cfg.Buffer - len(m.ooo)*m.mss
	}
	m.push(simEvent{t: m.now + delay, kind: evAck, pkt: p, dataAck: m.rcvNxt, free: free, sentAt: m.now})
}

func (m *sim) ack(e simEvent) {
	p := e.pkt
	l := &m.links[p.path]
	if e.dataAck > m.dataAck {
		m.dataAck = e.dataAck
	}
	if e.sentAt >= m.freeAt {
		m.free, m.freeAt = e.free, e.sentAt
	}
	l.up = true
	if !p.resent {
		m.rttSample(l, m.now-p.sentAt)
	}
	if p.probe || p.gone {
		return
	}
	p.gone = true
	// Congestion-window validation (RFC 7661, as Linux's tcp_is_cwnd_limited): the window
	// grows only while it limits the sender, not while the receiver's window does.
	limited := float64(len(l.out)+1) >= l.cwnd-2
	if l.cwnd < l.ssthresh {
		limited = float64(2*len(l.out)) > l.cwnd
	}
	for i, q := range l.out {
		if q == p {
			l.out = append(l.out[:i], l.out[i+1:]...)
			break
		}
	}
	l.inflight -= m.mss
	l.delivered += int64(m.mss)
	if dt := m.now - p.delivAt; dt > 0 {
		r := float64(l.delivered-p.delivSnap) * 8 / (float64(dt) / 1e9)
		if l.rate == 0 {
			l.rate = r
		} else {
			l.rate += (r - l.rate) / 4
		}
	}
	l.lastAck = m.now
	switch {
	case !limited:
	case l.cwnd < l.ssthresh:
		l.cwnd++
	default:
		l.cwnd += 1 / l.cwnd
	}
}

// minRTT is the least RTT sample of the last 150 to 300 s (Linux: tcp_min_rtt_wlen = 300 s).
func (l *simLink) minRTT() int64 {
	if l.minOld > 0 && l.minOld < l.minCur {
		return l.minOld
	}
	return l.minCur
}

func (m *sim) rttSample(l *simLink, r int64) {
	if e := m.now / int64(150*time.Second); e != l.minEpoch {
		l.minOld, l.minCur = l.minCur, 0
		if e > l.minEpoch+1 {
			l.minOld = 0 // an epoch without samples
		}
		l.minEpoch = e
	}
	if l.minCur == 0 || r < l.minCur {
		l.minCur = r
	}
	if l.srtt == 0 {
		l.srtt, l.rttvar = r, r/2
		return
	}
	d := l.srtt - r
	if d < 0 {
		d = -d
	}
	l.rttvar += (d - l.rttvar) / 4
	l.srtt += (r - l.srtt) / 8
}

// lost handles a noticed drop: Reno's reduction and a resend on the same path.
func (m *sim) lost(p *simPkt) {
	if p.gone {
		return
	}
	l := &m.links[p.path]
	m.forget(l, p)
	if m.now >= l.recoverUntil {
		l.ssthresh = max(l.cwnd/2, 2)
		l.cwnd = l.ssthresh
		l.recoverUntil = m.now + max(l.srtt, int64(10*time.Millisecond))
	}
	if p.dsn < m.dataAck {
		return
	}
	m.nextID++
	m.transmit(&simPkt{id: m.nextID, path: p.path, dsn: p.dsn, resent: true})
}

func (m *sim) forget(l *simLink, p *simPkt) {
	p.gone = true
	for i, q := range l.out {
		if q == p {
			l.out = append(l.out[:i], l.out[i+1:]...)
			l.inflight -= m.mss
			return
		}
	}
}

// tick checks RTOs and sends probes.
func (m *sim) tick() {
	for i := range m.links {
		l := &m.links[i]
		rto := int64(time.Second)
		if l.srtt > 0 {
			rto = l.srtt + max(int64(200*time.Millisecond), 4*l.rttvar)
		}
		if len(l.out) > 0 && m.now-l.out[0].sentAt > rto {
			for _, p := range l.out {
				p.gone = true
				if p.dsn >= m.dataAck {
					m.reinject = append(m.reinject, p.dsn)
					m.res.Reinjected++
				}
			}
			l.out, l.inflight = l.out[:0], 0
			l.ssthresh, l.cwnd = max(l.cwnd/2, 2), 1
			l.up = false
			if m.pending == i {
				m.pending = -1
			}
		}
		if (len(l.out) == 0 || !l.up) && m.now-l.lastProbe >= int64(m.cfg.Probe) {
			l.lastProbe = m.now
			m.nextID++
			m.transmit(&simPkt{id: m.nextID, path: i, probe: true})
		}
	}
}

func (m *sim) sample() {
	s := SimSample{At: time.Duration(m.now), PerPath: make([]float64, len(m.links))}
	sec := m.cfg.Sample.Seconds()
	s.Goodput = float64(m.rcvNxt-m.mark) * float64(m.mss) / sec
	if m.rcvNxt == m.mark {
		m.res.Stalls++
	}
	m.mark = m.rcvNxt
	for i := range m.links {
		l := &m.links[i]
		s.PerPath[i] = float64(l.delivered-l.ackedMark) / sec
		l.ackedMark = l.delivered
	}
	m.res.Samples = append(m.res.Samples, s)
}

// send sends while the window, the paths and the scheduler allow.
func (m *sim) send() {
	for range 10000 {
		var dsn int64
		resend := len(m.reinject) > 0
		if resend {
			dsn = m.reinject[0]
			if dsn < m.dataAck {
				m.reinject = m.reinject[1:]
				continue
			}
		} else {
			if m.win > 0 && m.sndNxt >= m.dataAck+m.win {
				return
			}
			dsn = m.sndNxt
		}
		i := m.pending
		if i < 0 {
			m.snapshot()
			c := Conn{Avail: m.free, AvailKnown: m.win > 0, Queued: 1 << 30}
			if m.win > 0 {
				c.Queued = int(m.dataAck+m.win-m.sndNxt) * m.mss
			}
			var ok bool
			if m.cs != nil {
				i, ok = m.cs.PickConn(m.now, c, m.snap, m.mss)
			} else {
				i, ok = m.s.Pick(m.now, m.snap, m.mss)
			}
			if m.cfg.Observe != nil {
				m.cfg.Observe(m.now, m.snap)
			}
			if !ok || i < 0 || i >= len(m.links) {
				return
			}
		}
		l := &m.links[i]
		if float64(len(l.out)) >= math.Floor(l.cwnd) {
			m.pending = i
			return
		}
		m.pending = -1
		if resend {
			m.reinject = m.reinject[1:]
		} else {
			m.sndNxt++
		}
		m.nextID++
		m.transmit(&simPkt{id: m.nextID, path: i, dsn: dsn, resent: resend})
	}
}

func (m *sim) snapshot() {
	for i := range m.links {
		l := &m.links[i]
		m.snap[i] = Path{ID: i, Up: l.up, Weight: m.cfg.Paths[i].Rate, SRTT: time.Duration(l.srtt), RTTVar: time.Duration(l.rttvar), MinRTT: time.Duration(l.minRTT()),
			InFlight: l.inflight, DeliveryRate: l.rate, CWnd: int(l.cwnd) * m.mss, MSS: m.mss}
	}
	if m.cfg.Estimate != nil {
		m.cfg.Estimate(m.now, m.snap)
	}
}
