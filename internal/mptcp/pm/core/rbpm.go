package core

import (
	"sort"
	"time"

	"braid/internal/sched"
)

// RBPM is the rbpm policy: the subflows of fullmesh, and per connection an sched.RBPM over
// them that demotes to backup the subflows whose slowness would fill the peer's receive
// buffer with out-of-order data, and restores them when the buffer holds them (the RBPM
// paper, with braid's re-enable rule: see internal/sched/rbpm.go). The kernel's own scheduler
// then sends only on non-backup subflows while one of them can send, so the backup flag is
// the lever: upstream Linux has no pluggable scheduler.
//
// Decide takes each connection's subflow statistics (RTT, min RTT, window, unacknowledged
// data, delivery rate) and the connection's available buffer, and returns SET_FLAGS actions
// for the subflows whose state changed.
//
// The available buffer is the smaller of two that the out-of-order data must fit in. One is
// the peer's receive window as every subflow sees it (tcpi_snd_wnd carries the MPTCP-level
// window): the paper's receive buffer. The other is this host's MPTCP-level send buffer. The
// kernel frees sent data only when the peer acknowledges it at the data level, and that
// acknowledgement is cumulative: while a chunk is in flight on the slow subflow, everything
// the fast subflows send after it stays in the send buffer. When the send buffer is the
// smaller (a large receive buffer, a sender with the default tcp_wmem), it blocks exactly as
// the paper's receive buffer does. On Linux 6.18, scenario 1 with a 2 MB receive buffer and
// shallow queues had the sender's buffer full (wmem_queued 0.77–0.99 MB of a 0.97 MB sndbuf)
// while the peer's window was about 1 MB.
//
// A subflow's data in flight (the paper's P·MSS) is its largest unacknowledged data over the
// last second (flightWindow), not one poll's.
//
// It never demotes a connection's last active subflow, leaves connections that fell back to
// TCP alone, and leaves subflows from uplinks configured as backup to the manager. Decisions
// are made on every poll (100 ms by default), so within 1 s.
type RBPM struct {
	Fullmesh
	// HoldDown is sched.RBPMConfig.HoldDown: the least time between two changes of a subflow.
	HoldDown time.Duration
	conns    map[uint32]*rbpmConn
	epoch    time.Time
	Counters RBPMCounters
}

// RBPMCounters count the policy's decisions.
type RBPMCounters struct {
	Demotions uint64 `json:"demotions"`
	Restores  uint64 `json:"restores"`
	Fallbacks uint64 `json:"fallbacks_skipped"` // polls that found a connection fallen back to TCP
	Resent    uint64 `json:"resent"`            // requests repeated because the kernel's flag still differed
}

type rbpmConn struct {
	s      *sched.RBPM
	ids    map[tuple]int // stable path IDs
	nextID int
	asked  map[tuple]bool  // the backup flag this policy last asked for
	askAt  map[tuple]int64 // when (ns since the policy's epoch)
	actual map[tuple]bool  // the flag the kernel showed at the last poll (BKUP_LOC)
	flight map[tuple][]flightSample
	// bySendBuf: the subflow was demoted while the send buffer, not the peer's window, was
	// the smaller (braid status says which buffer it would have blocked).
	bySendBuf map[tuple]bool
	paths     []sched.Path
	tuples    []tuple
	window    int // the peer's window
	sndbuf    int // the send buffer (0: unknown)
	avail     int // the smaller of the two
	states    []sched.PathState
}

// flightSample is a subflow's unacknowledged bytes at one poll.
type flightSample struct {
	at    int64 // ns since the policy's epoch
	bytes int
}

// flightWindow is how long a subflow's peak in-flight data counts. A poll sees the window at
// a random point of its saw-tooth: with reno behind a shallow queue the unacknowledged data
// of a fast subflow swings by half within a second, and multiplied by eq. 2's L (9 for a
// 10-fold RTT) that swing alone moved B across the available buffer and back, so the slow
// subflow was demoted and restored a second later. The peak over a second is what the
// subflow really sends per round trip at the top of its saw-tooth.
const flightWindow = int64(time.Second)

// peakFlight records bytes for t at ns and returns the largest of the last flightWindow.
func (c *rbpmConn) peakFlight(t tuple, ns int64, bytes int) int {
	h := append(c.flight[t], flightSample{ns, bytes})
	k := 0
	for k < len(h) && ns-h[k].at > flightWindow {
		k++
	}
	h = append(h[:0], h[k:]...)
	c.flight[t] = h
	peak := 0
	for _, f := range h {
		peak = max(peak, f.bytes)
	}
	return peak
}

// SubflowStats are one subflow's TCP statistics (tcp_info) as the rbpm policy reads them.
type SubflowStats struct {
	Local, Remote Endpoint
	RTT, RTTVar   time.Duration
	MinRTT        time.Duration
	Cwnd          uint32 // packets
	MSS           uint32 // bytes
	Unacked       uint32 // packets
	DeliveryRate  uint64 // bytes/s
	SndWnd        uint32 // the peer's window in bytes (MPTCP level on a subflow)
	LastAckRecv   time.Duration
	Backup        bool // this host asked for backup (sock_diag's BKUP_LOC)
}

// ConnStats is one connection's statistics.
type ConnStats struct {
	Token    uint32
	Fallback bool // fell back to plain TCP: not managed
	// SendBuffer is the connection's MPTCP-level send buffer in bytes (sock_diag's SKMEMINFO
	// sndbuf of the MPTCP socket); 0 if unknown.
	SendBuffer uint32
	Subflows   []SubflowStats
}

// NewRBPM returns the rbpm policy.
func NewRBPM(holdDown time.Duration) *RBPM {
	return &RBPM{HoldDown: holdDown, conns: map[uint32]*rbpmConn{}}
}

func (*RBPM) Name() string { return "rbpm" }

// Forget implements Forgetter.
func (p *RBPM) Forget(token uint32) { delete(p.conns, token) }

// Decide returns the backup-flag changes for the connections in stats, at time now.
func (p *RBPM) Decide(now time.Time, stats []ConnStats, uplinks []Uplink) []Action {
	if p.conns == nil {
		p.conns = map[uint32]*rbpmConn{}
	}
	if p.epoch.IsZero() {
		p.epoch = now
	}
	ns := now.Sub(p.epoch).Nanoseconds()
	seen := map[uint32]bool{}
	var out []Action
	for _, cs := range stats {
		if cs.Fallback {
			p.Counters.Fallbacks++
			delete(p.conns, cs.Token)
			continue
		}
		seen[cs.Token] = true
		c := p.conns[cs.Token]
		if c == nil {
			c = &rbpmConn{s: sched.NewRBPM(sched.RBPMConfig{HoldDown: p.HoldDown}), ids: map[tuple]int{}, asked: map[tuple]bool{},
				askAt: map[tuple]int64{}, actual: map[tuple]bool{}, flight: map[tuple][]flightSample{}, bySendBuf: map[tuple]bool{}}
			p.conns[cs.Token] = c
		}
		out = append(out, p.decideConn(ns, cs, c, uplinks)...)
	}
	for tok := range p.conns {
		if !seen[tok] {
			delete(p.conns, tok) // closed, or no longer visible
		}
	}
	return out
}

func (p *RBPM) decideConn(ns int64, cs ConnStats, c *rbpmConn, uplinks []Uplink) []Action {
	subs := make([]SubflowStats, 0, len(cs.Subflows))
	for _, s := range cs.Subflows {
		configuredBackup := false
		for _, u := range uplinks {
			if u.Addr == s.Local.Addr && u.Backup {
				configuredBackup = true
			}
		}
		if !configuredBackup && s.Local.Port != 0 && s.Remote.Port != 0 {
			subs = append(subs, s)
		}
	}
	// A stable order, so that the scheduler's state lines up from poll to poll.
	sort.Slice(subs, func(i, j int) bool {
		a, b := tuple{subs[i].Local, subs[i].Remote}, tuple{subs[j].Local, subs[j].Remote}
		if a.local != b.local {
			return a.local.String() < b.local.String()
		}
		return a.remote.String() < b.remote.String()
	})
	c.paths, c.tuples, c.window, c.sndbuf = c.paths[:0], c.tuples[:0], 0, int(cs.SendBuffer)
	measured := false // a subflow has RTT samples, so its window (even 0) is real
	for _, s := range subs {
		measured = measured || s.RTT > 0
		t := tuple{s.Local, s.Remote}
		id, ok := c.ids[t]
		if !ok {
			c.nextID++
			id = c.nextID
			c.ids[t] = id
			// A subflow found backup (left so by an earlier run) is restored if RBPM wants it.
			c.asked[t] = s.Backup
		}
		mss := int(s.MSS)
		if mss == 0 {
			mss = sched.DefaultMSS
		}
		// Every listed subflow counts as up: a slow path behind a deep queue goes seconds
		// without an ack and is exactly the one to judge; dead subflows are the manager's
		// (it destroys them, and they leave the list).
		// The bandwidth is tcpi_delivery_rate (sched.RBPM keeps its maximum for a while).
		// cwnd/RTT was tried as a floor and over-estimated the slow paths whose windows grew
		// in slow start: in scenario 2 the 2 Mbit/s subflow then looked like 7 Mbit/s.
		c.paths = append(c.paths, sched.Path{ID: id, Up: true, SRTT: s.RTT, RTTVar: s.RTTVar, MinRTT: s.MinRTT,
			InFlight: c.peakFlight(t, ns, int(s.Unacked)*mss), CWnd: int(s.Cwnd) * mss, MSS: mss, DeliveryRate: float64(s.DeliveryRate) * 8})
		c.tuples = append(c.tuples, t)
		c.actual[t] = s.Backup
		c.window = max(c.window, int(s.SndWnd))
	}
	c.avail = c.window
	if c.sndbuf > 0 {
		c.avail = min(c.avail, c.sndbuf)
	}
	for t := range c.ids {
		found := false
		for _, u := range c.tuples {
			found = found || u == t
		}
		if !found {
			delete(c.ids, t)
			delete(c.asked, t)
			delete(c.askAt, t)
			delete(c.actual, t)
			delete(c.flight, t)
			delete(c.bySendBuf, t)
		}
	}
	if len(c.paths) == 0 {
		return nil
	}
	c.s.Decide(ns, sched.Conn{Avail: c.avail, AvailKnown: measured}, c.paths)
	c.states = c.s.States(c.states[:0])
	var out []Action
	for i, st := range c.states {
		t := c.tuples[i]
		want := !st.Active
		changed := want != c.asked[t]
		// A request the kernel refused or lost (the flag it shows still differs a second
		// later) is sent again.
		resend := !changed && want != c.actual[t] && ns-c.askAt[t] >= int64(time.Second)
		if !changed && !resend {
			continue
		}
		c.asked[t], c.askAt[t] = want, ns
		switch {
		case resend:
			p.Counters.Resent++
		case want:
			p.Counters.Demotions++
			c.bySendBuf[t] = c.sndbuf > 0 && c.sndbuf < c.window
		default:
			p.Counters.Restores++
		}
		out = append(out, Action{Kind: SetBackup, Token: cs.Token, Local: t.local, Remote: t.remote, Backup: want})
	}
	return out
}

// RBPMSubflow is one subflow's RBPM state, for braid status.
type RBPMSubflow struct {
	Local    string  `json:"local"`
	Remote   string  `json:"remote"`
	Active   bool    `json:"active"`
	Reason   string  `json:"reason"`
	Score    float64 `json:"score"`
	Required int     `json:"required_bytes"`
	Avail    int     `json:"available_bytes"`
}

// RBPMConn is one connection's RBPM state.
type RBPMConn struct {
	Token      uint32        `json:"token"`
	Window     int           `json:"peer_window_bytes"`
	SendBuffer int           `json:"send_buffer_bytes,omitempty"`
	Subflows   []RBPMSubflow `json:"subflows"`
}

// Status lists the connections' RBPM states, by token.
func (p *RBPM) Status() []RBPMConn {
	toks := make([]uint32, 0, len(p.conns))
	for t := range p.conns {
		toks = append(toks, t)
	}
	sort.Slice(toks, func(i, j int) bool { return toks[i] < toks[j] })
	var out []RBPMConn
	for _, tok := range toks {
		c := p.conns[tok]
		rc := RBPMConn{Token: tok, Window: c.window, SendBuffer: c.sndbuf}
		for i, st := range c.states {
			if i >= len(c.tuples) {
				break
			}
			reason := st.Reason.String()
			if st.Reason == sched.ReasonBlocking && c.bySendBuf[c.tuples[i]] {
				reason = "would block the send buffer"
			}
			rc.Subflows = append(rc.Subflows, RBPMSubflow{Local: c.tuples[i].local.String(), Remote: c.tuples[i].remote.String(),
				Active: st.Active, Reason: reason, Score: st.Score, Required: st.Required, Avail: st.Avail})
		}
		out = append(out, rc)
	}
	return out
}
