// Package core is the path manager's decision logic, free of I/O: it follows a namespace's MPTCP
// connections from their events and subflow statistics, asks a policy which subflows each
// connection should have, and returns the commands that get it there. Time is passed in;
// addresses are text ("10.9.0.1", "fd09::1") so that the package needs no network imports.
//
// A subflow goes through these states:
//
//	(wanted, missing) --Create--> joining --SUB_ESTABLISHED--> up
//	joining --no answer within JoinTimeout--> Destroy --> missing (retried after Retry, or
//	  later if the pair never worked: see below)
//	up --unacked data and no ack for DeadAfter--> Destroy --> missing
//	any --SUB_CLOSED or a refused command--> missing
//
// A pair of an uplink and a remote endpoint that has never come up on a connection backs off:
// its second failed join in a row waits 2 JoinTimeouts before the next, then 4, 8, up to
// MaxJoinBackoff (JoinBackoffs). Where one site's uplinks cannot reach some of the other
// site's addresses (an ISP that reaches only its own customers, a firewall), fullmesh's cross
// pairs would otherwise send a SYN every JoinTimeout for the connection's life, on every
// connection. A pair that worked once is retried at once, so that a path that comes back is
// joined within a JoinTimeout.
//
// A retried subflow gets a fresh local port and address ID, because the kernel may still hold
// the old port (FIN_WAIT on a dead path) and binds an ID to one (address, port).
//
// Each slot a policy wants claims one subflow (the initial subflow first). A slot with a
// Modulus wants a subflow whose ports sum to its Residue (A-MPTCP's RLOC-pair placement); its
// port is the next free one of that residue. A Planner may ask for exactly its slots: the
// subflows no slot claims are then destroyed, never the initial one and never while no
// claimed subflow works.
//
// The peer chooses the addresses it announces (ADD_ADDR), and each becomes joins this host
// sends; a hostile peer could make it send them to addresses of its choice, without end (issue
// 18 item 14). So an announcement is taken only for an address a peer can have: not
// unspecified, loopback, multicast, broadcast, nor link-local unless AllowLinkLocal, and of the
// connection's family (AnnounceRefused); a connection takes at most MaxAnnounced distinct
// announced endpoints in its life (AnnounceCapped); and, as RFC 8684 section 3.4.1 says, joins
// to an announced endpoint stop once they fail (JoinAttempts joins that never came up; none
// succeeded before; JoinsAbandoned), until the peer announces it again, which is heeded at
// most once per ReannounceAfter (addr.go).
package core

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Endpoint is an address (text form) and a port; port 0 means "any".
type Endpoint struct {
	Addr string
	Port uint16
}

func (e Endpoint) String() string {
	if len(e.Addr) > 0 && containsColon(e.Addr) {
		return fmt.Sprintf("[%s]:%d", e.Addr, e.Port)
	}
	return fmt.Sprintf("%s:%d", e.Addr, e.Port)
}

func containsColon(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return true
		}
	}
	return false
}

// Uplink is one local path: an address on an interface.
type Uplink struct {
	Name    string
	Addr    string
	IfIndex int32
	Backup  bool // subflows from it start as backup
	V6      bool // the address is IPv6 (subflows only go to remotes of the same family)
}

// EventKind mirrors the kernel's PM events.
type EventKind uint8

const (
	Created EventKind = iota + 1
	Established
	Closed
	Announced
	Removed
	SubEstablished
	SubClosed
	SubPriority
)

// Event is one kernel event, in the terms of this package.
type Event struct {
	Kind       EventKind
	Token      uint32
	Local      Endpoint
	Remote     Endpoint
	LocID      uint8
	RemID      uint8
	Backup     bool
	ServerSide bool
	V6         bool // the event's addresses are IPv6
}

// ActionKind is a command for the kernel.
type ActionKind uint8

const (
	Create ActionKind = iota + 1
	Destroy
	SetBackup
)

func (k ActionKind) String() string {
	switch k {
	case Create:
		return "create"
	case Destroy:
		return "destroy"
	case SetBackup:
		return "set-backup"
	}
	return fmt.Sprintf("action%d", uint8(k))
}

// Action is one command: create or destroy a subflow, or set its backup flag.
type Action struct {
	Kind    ActionKind
	Token   uint32
	LocalID uint8
	Local   Endpoint
	Remote  Endpoint
	IfIndex int32
	Backup  bool
}

func (a Action) String() string {
	return fmt.Sprintf("%s token %08x id %d %s -> %s backup=%v", a.Kind, a.Token, a.LocalID, a.Local, a.Remote, a.Backup)
}

// Stats are one subflow's TCP statistics, polled by the daemon.
type Stats struct {
	Token       uint32
	Local       Endpoint
	Remote      Endpoint
	Unacked     uint32
	LastAckRecv time.Duration
}

// Slot is a subflow a policy wants: from an uplink to a remote endpoint; with a Modulus, one
// whose ports sum to Residue mod Modulus (A-MPTCP's RLOC-pair placement).
type Slot struct {
	Uplink  int // index into Config.Uplinks
	Remote  Endpoint
	Backup  bool
	Modulus int // 0: any local port
	Residue int
}

// matches reports whether subflow s fills slot (whose uplink address is addr).
func (sl Slot) matches(addr string, s *subflow) bool {
	if s.local.Addr != addr || s.remote != sl.Remote {
		return false
	}
	return sl.Modulus <= 0 || Residue(s.local.Port, s.remote.Port, sl.Modulus) == sl.Residue
}

// Plan is a policy's full answer: the slots, and whether they are all the connection should
// have (Exact: subflows no slot claims are destroyed, never the last working one).
type Plan struct {
	Slots []Slot
	Exact bool
}

// Planner is a policy that may ask for exactly its slots.
type Planner interface {
	Policy
	Plan(c ConnView, uplinks []Uplink) Plan
}

// Forgetter is a policy that keeps per-connection state, dropped when the connection closes.
type Forgetter interface {
	Forget(token uint32)
}

// ConnView is what a policy sees of a connection.
type ConnView struct {
	Token      uint32
	ServerSide bool
	Local      Endpoint   // the initial subflow's
	Remote     Endpoint   // the initial subflow's
	Remotes    []Endpoint // the initial remote, then the peer's announced addresses, sorted by ID
	V6         bool
	Bytes      uint64 // bytes the connection carried (acked + received), as last observed
}

// Policy decides which subflows a connection should have.
type Policy interface {
	Name() string
	Want(c ConnView, uplinks []Uplink) []Slot
}

// Config tunes the manager.
type Config struct {
	Uplinks     []Uplink
	JoinTimeout time.Duration // a join not established by then is destroyed and retried
	DeadAfter   time.Duration // a subflow with unacked data and no ack for this long is dead
	Retry       time.Duration // least time between two creates for one slot
	PortBase    uint16        // local ports of created subflows: PortBase ... PortBase+PortSpan-1
	PortSpan    uint16

	// MaxAnnounced bounds the distinct endpoints a connection takes from the peer's ADD_ADDRs
	// in its life; JoinAttempts is how many joins to an announced endpoint may fail (never
	// come up) before it is given up; ReannounceAfter is the least time after giving up before
	// a new announcement of the endpoint is heeded; AllowLinkLocal takes announced link-local
	// addresses (a site whose peers share a link).
	MaxAnnounced    int
	JoinAttempts    int
	ReannounceAfter time.Duration
	AllowLinkLocal  bool

	// MaxJoinBackoff bounds the wait between joins of a pair that has never come up; negative:
	// no backoff (every pair is retried each Retry, as one that worked).
	MaxJoinBackoff time.Duration
}

// Defaults fills in unset values.
func (c *Config) Defaults() {
	if c.JoinTimeout == 0 {
		c.JoinTimeout = time.Second
	}
	if c.DeadAfter == 0 {
		c.DeadAfter = time.Second
	}
	if c.Retry == 0 {
		c.Retry = 250 * time.Millisecond
	}
	if c.PortBase == 0 {
		c.PortBase = 45000
	}
	if c.PortSpan == 0 {
		c.PortSpan = 5000
	}
	if c.MaxAnnounced == 0 {
		c.MaxAnnounced = 8
	}
	if c.JoinAttempts == 0 {
		// RFC 8684 says one; a lost SYN within JoinTimeout would then lose the path for good
		c.JoinAttempts = 2
	}
	if c.ReannounceAfter == 0 {
		c.ReannounceAfter = 30 * time.Second
	}
	if c.MaxJoinBackoff == 0 {
		c.MaxJoinBackoff = 30 * time.Second
	}
}

type subState uint8

const (
	joining subState = iota + 1
	up
)

type subflow struct {
	state   subState
	id      uint8
	local   Endpoint
	remote  Endpoint
	since   time.Time
	ours    bool
	backup  bool // what this host asked (MP_JOIN B bit or SET_FLAGS)
	peerBk  bool // what the peer signalled
	dead    bool
	uplink  int // -1 when no uplink has its address
	initial bool
}

type tuple struct{ local, remote Endpoint }

type conn struct {
	token       uint32
	serverSide  bool
	established bool
	v6          bool
	local       Endpoint
	remote      Endpoint
	remotes     map[uint8]Endpoint // by the peer's address ID; 0 is the initial remote
	subflows    map[tuple]*subflow
	lastTry     map[Slot]time.Time
	nextID      uint8
	bytes       uint64
	// joins to announced endpoints, by endpoint (it outlives REMOVE_ADDR, so that cycling
	// announcements does not reset it); at most MaxAnnounced entries
	joins map[Endpoint]*joinRecord
	// pairs are the joins of each uplink to each remote endpoint: at most one per uplink and
	// remote the connection has had
	pairs map[pairKey]*pairRecord
}

type pairKey struct {
	uplink int
	remote Endpoint
}

// pairRecord is what the manager knows of joins from one uplink to one remote endpoint.
type pairRecord struct {
	failures int       // joins that never came up, in a row
	worked   bool      // a subflow of the pair came up on this connection
	lastFail time.Time // when the last of them was found failed
}

// pairWait is how long after its last failed join a pair waits before the next: from its
// second failure in a row, 2, 4, 8... join timeouts, at most MaxJoinBackoff; nothing for a pair
// that came up, or with the backoff off. It is worked out from the configuration in force, so
// that a reload that shortens or turns off the backoff applies to the pairs already waiting.
func (m *Manager) pairWait(pr *pairRecord) time.Duration {
	if pr.worked || pr.failures < 2 || m.cfg.MaxJoinBackoff <= 0 {
		return 0
	}
	wait := m.cfg.MaxJoinBackoff
	if shift := pr.failures - 1; shift < 16 {
		wait = min(wait, m.cfg.JoinTimeout<<shift)
	}
	return wait
}

// joinRecord is what the manager knows of joins to one announced endpoint.
type joinRecord struct {
	failures int       // joins that never came up, in a row
	worked   bool      // a join to it came up: it is retried as the initial remote is
	gaveUp   time.Time // when failures reached JoinAttempts (zero: not given up)
}

// Counters count what the manager did.
type Counters struct {
	Events         uint64
	Creates        uint64
	CreateFailures uint64
	Destroys       uint64
	JoinTimeouts   uint64
	DeadSubflows   uint64
	Established    uint64 // subflows that came up
	PortsInUse     uint64 // creates refused because the local port was taken
	Unwanted       uint64 // subflows destroyed because the policy no longer wants them
	JoinBackoffs   uint64 // failed joins of a pair that never worked, after which it waits
	// AnnounceRefused: ADD_ADDRs of an address no peer can have (or of the other family);
	// AnnounceCapped: of a new endpoint beyond MaxAnnounced; JoinsAbandoned: announced
	// endpoints given up after JoinAttempts failed joins.
	AnnounceRefused uint64
	AnnounceCapped  uint64
	JoinsAbandoned  uint64
}

// Manager is the state of every connection of a namespace. Not safe for concurrent use.
type Manager struct {
	cfg      Config
	policy   Policy
	conns    map[uint32]*conn
	nextPort uint16
	busy     map[Endpoint]time.Time // local ports the kernel found in use, until then
	Counters Counters
}

// New returns a manager for the uplinks in cfg with the given policy.
func New(cfg Config, p Policy) *Manager {
	cfg.Defaults()
	return &Manager{cfg: cfg, policy: p, conns: map[uint32]*conn{}}
}

// Config returns the configuration in effect (defaults filled in).
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) uplinkOf(addr string) int {
	for i, u := range m.cfg.Uplinks {
		if u.Addr == addr {
			return i
		}
	}
	return -1
}

// Event updates the state from one kernel event and returns what to do now.
func (m *Manager) Event(now time.Time, e Event) []Action {
	m.Counters.Events++
	c := m.conns[e.Token]
	switch e.Kind {
	case Created, Established:
		if c == nil {
			c = &conn{token: e.Token, remotes: map[uint8]Endpoint{}, subflows: map[tuple]*subflow{}, lastTry: map[Slot]time.Time{}, joins: map[Endpoint]*joinRecord{}, pairs: map[pairKey]*pairRecord{}}
			m.conns[e.Token] = c
		}
		c.serverSide, c.v6, c.local, c.remote = e.ServerSide, e.V6, e.Local, e.Remote
		c.remotes[0] = e.Remote
		t := tuple{e.Local, e.Remote}
		if c.subflows[t] == nil {
			c.subflows[t] = &subflow{state: up, local: e.Local, remote: e.Remote, since: now, uplink: m.uplinkOf(e.Local.Addr), initial: true}
		}
		if e.Kind == Established {
			c.established = true
			return m.plan(now, c)
		}
	case Closed:
		delete(m.conns, e.Token)
		if f, ok := m.policy.(Forgetter); ok {
			f.Forget(e.Token)
		}
	case Announced:
		if c != nil {
			r := e.Remote
			if r.Port == 0 {
				r.Port = c.remote.Port
			}
			if e.RemID == 0 || !announceable(r.Addr, c.v6, m.cfg.AllowLinkLocal) {
				m.Counters.AnnounceRefused++
				return nil
			}
			jr := c.joins[r]
			if jr == nil {
				if len(c.joins) >= m.cfg.MaxAnnounced {
					m.Counters.AnnounceCapped++
					return nil
				}
				jr = &joinRecord{}
				c.joins[r] = jr
			} else if !jr.gaveUp.IsZero() && now.Sub(jr.gaveUp) >= m.cfg.ReannounceAfter {
				// announced again (RFC 8684 3.4.1): one more try
				jr.gaveUp, jr.failures = time.Time{}, m.cfg.JoinAttempts-1
			}
			c.remotes[e.RemID] = r
			return m.plan(now, c)
		}
	case Removed:
		if c != nil && e.RemID != 0 {
			delete(c.remotes, e.RemID)
		}
	case SubEstablished:
		if c == nil {
			return nil
		}
		t := tuple{e.Local, e.Remote}
		s := c.subflows[t]
		if s == nil {
			s = &subflow{local: e.Local, remote: e.Remote, id: e.LocID, uplink: m.uplinkOf(e.Local.Addr)}
			c.subflows[t] = s
		}
		if s.state != up || s.dead {
			m.Counters.Established++
		}
		if jr := c.joins[e.Remote]; jr != nil {
			jr.worked, jr.failures, jr.gaveUp = true, 0, time.Time{}
		}
		if s.uplink >= 0 {
			c.pairs[pairKey{s.uplink, e.Remote}] = &pairRecord{worked: true}
		}
		s.state, s.since, s.dead, s.peerBk = up, now, false, e.Backup
		return m.plan(now, c)
	case SubClosed:
		if c == nil {
			return nil
		}
		t := tuple{e.Local, e.Remote}
		if s := c.subflows[t]; s != nil {
			delete(c.subflows, t)
			if s.ours && s.state == joining {
				m.joinFailed(now, c, s.uplink, s.remote)
			}
			if s.uplink >= 0 {
				c.lastTry[Slot{Uplink: s.uplink, Remote: s.remote}] = now
			}
		}
		return m.plan(now, c)
	case SubPriority:
		if c != nil {
			if s := c.subflows[tuple{e.Local, e.Remote}]; s != nil {
				s.peerBk = e.Backup
			}
		}
	}
	return nil
}

// Known reports whether the manager follows the connection with this token.
func (m *Manager) Known(token uint32) bool { return m.conns[token] != nil }

// Failed tells the manager that the kernel refused a. gone reports that the connection no
// longer exists (its token is unknown), so it is forgotten.
func (m *Manager) Failed(now time.Time, a Action, gone bool) {
	c := m.conns[a.Token]
	if c == nil {
		return
	}
	if gone {
		delete(m.conns, a.Token)
		if f, ok := m.policy.(Forgetter); ok {
			f.Forget(a.Token)
		}
		return
	}
	if a.Kind == Create {
		m.Counters.CreateFailures++
		delete(c.subflows, tuple{a.Local, a.Remote})
		m.joinFailed(now, c, m.uplinkOf(a.Local.Addr), a.Remote)
	}
}

// PortInUse tells the manager that the kernel refused a's local port as taken (EADDRINUSE):
// the port is skipped for a while and the slot is tried again at once with the next one.
func (m *Manager) PortInUse(now time.Time, a Action) {
	m.Counters.PortsInUse++
	if m.busy == nil {
		m.busy = map[Endpoint]time.Time{}
	}
	m.busy[a.Local] = now.Add(time.Minute)
	if c := m.conns[a.Token]; c != nil {
		delete(c.subflows, tuple{a.Local, a.Remote})
		for k := range c.lastTry {
			delete(c.lastTry, k)
		}
	}
}

// ObserveBytes records the bytes connection token has carried (acked + received).
func (m *Manager) ObserveBytes(token uint32, bytes uint64) {
	if c := m.conns[token]; c != nil {
		c.bytes = bytes
	}
}

// Observe takes the subflows' statistics (every subflow of the namespace that the daemon
// could see) and marks the dead ones.
func (m *Manager) Observe(stats []Stats) {
	for _, st := range stats {
		c := m.conns[st.Token]
		if c == nil {
			continue
		}
		s := c.subflows[tuple{st.Local, st.Remote}]
		if s == nil || s.state != up {
			continue
		}
		dead := st.Unacked > 0 && st.LastAckRecv > m.cfg.DeadAfter
		if dead && !s.dead {
			m.Counters.DeadSubflows++
		}
		s.dead = dead
	}
}

// Tick returns what to do at time now: joins that timed out and dead subflows are destroyed,
// missing subflows created.
func (m *Manager) Tick(now time.Time) []Action {
	var out []Action
	for _, tok := range m.tokens() {
		out = append(out, m.plan(now, m.conns[tok])...)
	}
	return out
}

func (m *Manager) tokens() []uint32 {
	out := make([]uint32, 0, len(m.conns))
	for t := range m.conns {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (m *Manager) view(c *conn) ConnView {
	v := ConnView{Token: c.token, ServerSide: c.serverSide, Local: c.local, Remote: c.remote, V6: c.v6, Bytes: c.bytes}
	ids := make([]int, 0, len(c.remotes))
	for id := range c.remotes {
		ids = append(ids, int(id))
	}
	sort.Ints(ids)
	for _, id := range ids {
		v.Remotes = append(v.Remotes, c.remotes[uint8(id)])
	}
	return v
}

func (m *Manager) port() uint16 {
	p := m.cfg.PortBase + m.nextPort
	m.nextPort = (m.nextPort + 1) % m.cfg.PortSpan
	return p
}

// allocID returns an address ID (1..255) no current subflow of c uses.
func (m *Manager) allocID(c *conn) (uint8, bool) {
	used := map[uint8]bool{}
	for _, s := range c.subflows {
		used[s.id] = true
	}
	for range 255 {
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1
		}
		if !used[c.nextID] {
			return c.nextID, true
		}
	}
	return 0, false
}

func (m *Manager) plan(now time.Time, c *conn) []Action {
	if c == nil || !c.established {
		return nil
	}
	var out []Action
	// Destroy what is stuck or dead; the slot is then missing and re-created below.
	for _, t := range sortedTuples(c.subflows) {
		s := c.subflows[t]
		stuck := s.state == joining && now.Sub(s.since) >= m.cfg.JoinTimeout
		if !stuck && !s.dead {
			continue
		}
		if stuck {
			m.Counters.JoinTimeouts++
			if s.ours {
				m.joinFailed(now, c, s.uplink, s.remote)
			}
		}
		if s.local.Port != 0 && s.remote.Port != 0 {
			out = append(out, Action{Kind: Destroy, Token: c.token, LocalID: s.id, Local: s.local, Remote: s.remote})
			m.Counters.Destroys++
		}
		// Re-created at once (with a fresh port): a join every JoinTimeout keeps the time from
		// a path's return to its subflow short.
		delete(c.subflows, t)
	}
	// Subflows that came up from a backup uplink without the flag (the initial subflow, joins
	// made by the peer) are switched to backup, and the other way round.
	for _, t := range sortedTuples(c.subflows) {
		s := c.subflows[t]
		if s.state != up || s.uplink < 0 || s.local.Port == 0 || c.serverSide {
			continue
		}
		if want := m.cfg.Uplinks[s.uplink].Backup; want != s.backup {
			s.backup = want
			out = append(out, Action{Kind: SetBackup, Token: c.token, LocalID: s.id, Local: s.local, Remote: s.remote, Backup: want})
		}
	}
	var plan Plan
	if p, ok := m.policy.(Planner); ok {
		plan = p.Plan(m.view(c), m.cfg.Uplinks)
	} else {
		plan.Slots = m.policy.Want(m.view(c), m.cfg.Uplinks)
	}
	// Each slot claims one subflow: the initial subflow first, then those up, then joining.
	order := sortedTuples(c.subflows)
	sort.SliceStable(order, func(i, j int) bool { return rank(c.subflows[order[i]]) < rank(c.subflows[order[j]]) })
	claimed := map[tuple]bool{}
	for _, slot := range plan.Slots {
		u := m.cfg.Uplinks[slot.Uplink]
		have := false
		for _, t := range order {
			if !claimed[t] && slot.matches(u.Addr, c.subflows[t]) {
				claimed[t], have = true, true
				break
			}
		}
		if have {
			continue
		}
		key := slot
		key.Backup = false
		if last, ok := c.lastTry[key]; ok && now.Sub(last) < m.cfg.Retry {
			continue
		}
		if jr := c.joins[slot.Remote]; jr != nil && !jr.gaveUp.IsZero() {
			continue // RFC 8684 3.4.1: no further attempts until announced again
		}
		if pr := c.pairs[pairKey{slot.Uplink, slot.Remote}]; pr != nil && now.Before(pr.lastFail.Add(m.pairWait(pr))) {
			continue
		}
		port, ok := m.portFor(now, u.Addr, slot)
		if !ok {
			continue
		}
		id, ok := m.allocID(c)
		if !ok {
			break
		}
		a := Action{Kind: Create, Token: c.token, LocalID: id, Local: Endpoint{u.Addr, port}, Remote: slot.Remote, IfIndex: u.IfIndex, Backup: slot.Backup}
		t := tuple{a.Local, a.Remote}
		c.subflows[t] = &subflow{state: joining, id: id, local: a.Local, remote: a.Remote, since: now, ours: true, backup: slot.Backup, uplink: slot.Uplink}
		claimed[t] = true
		c.lastTry[key] = now
		m.Counters.Creates++
		out = append(out, a)
	}
	if !plan.Exact {
		return out
	}
	// Subflows no slot wants go, as long as a claimed working subflow stays.
	working := false
	for t := range claimed {
		if s := c.subflows[t]; s != nil && s.state == up && !s.dead {
			working = true
		}
	}
	if !working {
		return out
	}
	for _, t := range order {
		s := c.subflows[t]
		if claimed[t] || s.initial || s.local.Port == 0 || s.remote.Port == 0 {
			continue
		}
		out = append(out, Action{Kind: Destroy, Token: c.token, LocalID: s.id, Local: s.local, Remote: s.remote})
		m.Counters.Destroys++
		m.Counters.Unwanted++
		delete(c.subflows, t)
	}
	return out
}

// joinFailed records a join from uplink to remote that never came up. A pair that never worked
// waits before its next join from its second failure in a row on (2, 4, 8... JoinTimeouts, at
// most MaxJoinBackoff); an announced endpoint is given up after JoinAttempts of them, unless a
// join to it came up before.
func (m *Manager) joinFailed(now time.Time, c *conn, uplink int, remote Endpoint) {
	if uplink >= 0 {
		k := pairKey{uplink, remote}
		pr := c.pairs[k]
		if pr == nil {
			pr = &pairRecord{}
			c.pairs[k] = pr
		}
		if !pr.worked {
			pr.failures++
			pr.lastFail = now
			if m.pairWait(pr) > 0 {
				m.Counters.JoinBackoffs++
			}
		}
	}
	jr := c.joins[remote]
	if jr == nil || jr.worked || !jr.gaveUp.IsZero() {
		return
	}
	jr.failures++
	if jr.failures >= m.cfg.JoinAttempts {
		jr.gaveUp = now
		m.Counters.JoinsAbandoned++
	}
}

// rank orders subflows for claiming slots: the initial one, then working ones, then joins.
func rank(s *subflow) int {
	switch {
	case s.initial:
		return 0
	case s.state == up && !s.dead:
		return 1
	case s.state == up:
		return 3
	}
	return 2
}

// portFor returns a local port on addr for a new subflow of slot: the next of the port range,
// or, for a placed slot, the next port of its residue; ports of known subflows and ports the
// kernel found taken are skipped.
func (m *Manager) portFor(now time.Time, addr string, slot Slot) (uint16, bool) {
	used := map[uint16]bool{}
	for _, c := range m.conns {
		for t := range c.subflows {
			if t.local.Addr == addr {
				used[t.local.Port] = true
			}
		}
	}
	for ep, until := range m.busy {
		if !now.Before(until) {
			delete(m.busy, ep)
		} else if ep.Addr == addr {
			used[ep.Port] = true
		}
	}
	if slot.Modulus <= 0 {
		for range m.cfg.PortSpan {
			if p := m.port(); !used[p] {
				return p, true
			}
		}
		return 0, false
	}
	// Start where the shared cursor is, so that successive connections spread over the range.
	start := int(m.nextPort) / slot.Modulus
	count := int(m.cfg.PortSpan)/slot.Modulus + 1
	for i := range count {
		j := (start + i) % count
		p, ok := PortCandidate(slot.Residue, slot.Remote.Port, slot.Modulus, m.cfg.PortBase, m.cfg.PortSpan, j)
		if ok && !used[p] {
			m.nextPort = uint16((int(p-m.cfg.PortBase) + 1) % int(m.cfg.PortSpan))
			return p, true
		}
	}
	return 0, false
}

func sortedTuples(m map[tuple]*subflow) []tuple {
	out := make([]tuple, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].local != out[j].local {
			return out[i].local.String() < out[j].local.String()
		}
		return out[i].remote.String() < out[j].remote.String()
	})
	return out
}

// SubflowStatus is one subflow as the manager sees it.
type SubflowStatus struct {
	ID         uint8  `json:"id"`
	Local      string `json:"local"`
	Remote     string `json:"remote"`
	State      string `json:"state"`       // joining, up, dead
	Backup     bool   `json:"backup"`      // asked by this host
	PeerBackup bool   `json:"peer_backup"` // signalled by the peer
	Ours       bool   `json:"created_by_pm"`
}

// ConnStatus is one connection as the manager sees it.
type ConnStatus struct {
	Token       uint32          `json:"token"`
	ServerSide  bool            `json:"server_side"`
	Established bool            `json:"established"`
	Remotes     []string        `json:"remotes"`
	Subflows    []SubflowStatus `json:"subflows"`
}

// Status lists the connections, by token.
func (m *Manager) Status() []ConnStatus {
	var out []ConnStatus
	for _, tok := range m.tokens() {
		c := m.conns[tok]
		cs := ConnStatus{Token: tok, ServerSide: c.serverSide, Established: c.established}
		for _, r := range m.view(c).Remotes {
			cs.Remotes = append(cs.Remotes, r.String())
		}
		for _, t := range sortedTuples(c.subflows) {
			s := c.subflows[t]
			st := "up"
			if s.state == joining {
				st = "joining"
			} else if s.dead {
				st = "dead"
			}
			cs.Subflows = append(cs.Subflows, SubflowStatus{ID: s.id, Local: s.local.String(), Remote: s.remote.String(), State: st, Backup: s.backup, PeerBackup: s.peerBk, Ours: s.ours})
		}
		out = append(out, cs)
	}
	return out
}

// Fullmesh is the policy of one subflow per local uplink and remote address, on the
// connections this host opened (the server side waits for the client's joins).
type Fullmesh struct{}

func (Fullmesh) Name() string { return "fullmesh" }

func (Fullmesh) Want(c ConnView, uplinks []Uplink) []Slot {
	if c.ServerSide {
		return nil
	}
	var out []Slot
	for i, u := range uplinks {
		if u.V6 != c.V6 {
			continue
		}
		for _, r := range c.Remotes {
			out = append(out, Slot{Uplink: i, Remote: r, Backup: u.Backup})
		}
	}
	return out
}

// Policies lists the policies by name.
var Policies = map[string]Policy{"fullmesh": Fullmesh{}}

// ErrUplinks is returned by Reconfigure for a set of uplinks other than the manager's.
var ErrUplinks = errors.New("pm: the uplinks (names, addresses, interfaces) are fixed at start")

// Reconfigure replaces the timers, ports, uplink backup flags and the policy of a running
// manager (a reload). The connections and their subflows stay; the next Tick applies the
// new settings to them (a changed backup flag is signalled, a policy that wants fewer
// subflows has the others closed). The uplinks themselves must stay as they are.
func (m *Manager) Reconfigure(cfg Config, p Policy) error {
	cfg.Defaults()
	if len(cfg.Uplinks) != len(m.cfg.Uplinks) {
		return ErrUplinks
	}
	for i, u := range cfg.Uplinks {
		o := m.cfg.Uplinks[i]
		if u.Name != o.Name || u.Addr != o.Addr || u.IfIndex != o.IfIndex || u.V6 != o.V6 {
			return ErrUplinks
		}
	}
	m.cfg, m.policy = cfg, p
	m.nextPort %= m.cfg.PortSpan
	return nil
}
