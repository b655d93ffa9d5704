package core

import (
	"fmt"
	"sort"
)

// This file is the A-MPTCP policy (Coudron et al., "Cross-layer Cooperation to Boost Multipath
// TCP Performance in Cloud Networks", §III): the number of subflows of a connection between two
// LISP sites follows from the sites' locators, and each subflow gets a source port that makes
// the sites' xTRs carry it over its own RLOC pair.
//
// Notation of the paper: l1, l2 are the numbers of host interfaces of the two ends; Σ_r L1^r and
// Σ_r L2^r are the numbers of (usable) locators of all border routers of each site, here a and b.
//
//	N_a = max{l1·l2, a·b}   sites reach their ITRs in a non-deterministic way (ECMP, TE)
//	N_b = a·b               each host interface is bound to one RLOC
//
// Placement: braid's xTRs carry a TCP flow over RLOC pair k = (sport + dport) mod (a·b) (the
// rule of internal/lisp/xtr/select.go), so subflows whose port sums differ mod a·b take
// different pairs. Only the modulus matters here: which pair a residue names depends on the
// sites' canonical order, but distinct residues are distinct pairs either way.

// Routing says which of the paper's formulas applies.
type Routing uint8

const (
	// RoutingAny is the paper's case 1: a host's traffic reaches any of its site's ITRs in a
	// non-deterministic way; N_a = max{l1·l2, a·b}.
	RoutingAny Routing = iota
	// RoutingBound is case 2: each interface is bound to one RLOC; N_b = a·b.
	RoutingBound
)

func (r Routing) String() string {
	if r == RoutingBound {
		return "bound"
	}
	return "any"
}

// SubflowCount returns the number of subflows the paper's formula gives for l1 and l2 host
// interfaces and a and b usable locators at the two sites (0 when a or b is 0: no mapping).
func SubflowCount(r Routing, l1, l2, a, b int) int {
	if a <= 0 || b <= 0 {
		return 0
	}
	n := a * b
	if r == RoutingAny {
		n = max(n, max(l1, 0)*max(l2, 0))
	}
	return n
}

// Residue is the RLOC-pair index k = (sport + dport) mod m of a TCP flow; m must be positive.
func Residue(sport, dport uint16, m int) int {
	return (int(sport) + int(dport)) % m
}

// PortCandidate returns the j-th local port in [base, base+span) whose flow to dport has
// residue r mod m: p = base + ((r − dport − base) mod m) + j·m. ok is false past the range.
func PortCandidate(r int, dport uint16, m int, base, span uint16, j int) (uint16, bool) {
	if m <= 0 || r < 0 || r >= m || j < 0 {
		return 0, false
	}
	off := ((r-int(dport)-int(base))%m + m) % m
	p := int(base) + off + j*m
	if p >= int(base)+int(span) || p > 65535 {
		return 0, false
	}
	return uint16(p), true
}

// MapState is what a mapping lookup gave.
type MapState uint8

const (
	MapPending   MapState = iota // being resolved
	MapFound                     // a mapping with at least one usable locator
	MapNone                      // a negative reply: the address is no EID
	MapNoAnswer                  // no resolver answered
	MapNoLocator                 // a mapping whose locators are all unusable (priority 255)
)

func (s MapState) String() string {
	switch s {
	case MapPending:
		return "pending"
	case MapFound:
		return "found"
	case MapNone:
		return "no mapping"
	case MapNoAnswer:
		return "resolver did not answer"
	case MapNoLocator:
		return "no usable locator"
	}
	return fmt.Sprintf("state%d", uint8(s))
}

// Mapping is what the policy needs of an EID-to-RLOC mapping.
type Mapping struct {
	Prefix string // the EID prefix, for logs
	Usable int    // locators of the best priority below 255 (the set the xTRs place over)
}

// MappingSource resolves EIDs (text addresses) to mappings; it answers at once, from its cache,
// and resolves in the background what it does not hold (MapPending meanwhile).
type MappingSource interface {
	Mapping(eid string) (Mapping, MapState)
}

// AMPTCPCounters count the policy's decisions, per connection.
type AMPTCPCounters struct {
	Placed           uint64 `json:"placed"`               // connections given their LISP subflows
	OutOfScope       uint64 `json:"out_of_scope"`         // destination outside the configured prefixes
	ShortFlows       uint64 `json:"short_flows"`          // closed before carrying MinBytes
	NoMapping        uint64 `json:"no_mapping"`           // negative reply for an end
	NoAnswer         uint64 `json:"resolver_no_answer"`   // no resolver answered
	NoLocator        uint64 `json:"no_usable_locator"`    // a mapping without usable locators
	ClosedInLookup   uint64 `json:"closed_during_lookup"` // connections closed while a lookup was in flight
	Clamped          uint64 `json:"clamped_by_limit"`     // connections given fewer subflows than the formula
	MappingChanges   uint64 `json:"mapping_changes"`      // placed connections whose subflow count changed
	FallbackToKernel uint64 `json:"fallbacks"`            // connections left to the plain mesh, any reason
}

// AMPTCP is the A-MPTCP policy. It is not safe for concurrent use (the Manager's caller
// serialises it).
type AMPTCP struct {
	Routing Routing
	Maps    MappingSource
	// InScope reports whether a remote address is in the configured EID prefixes; nil: all.
	InScope func(remote string) bool
	// MinBytes: connections are augmented once they have carried this many bytes (long flows);
	// 0 at once.
	MinBytes uint64
	// Force, when positive, replaces the formula's count (the paper's "A-MPTCP overridden").
	Force int
	// MaxSubflows bounds the subflows of a connection (the kernel's limit + 1); 0: no bound.
	MaxSubflows int
	// ClientOnly leaves the connections this host accepted to their initiator.
	ClientOnly bool
	// Note is told once per reason and destination why a connection was not augmented or was
	// clamped (the daemon logs it); may be nil.
	Note func(reason, detail string)

	Counters AMPTCPCounters

	conns map[uint32]*amptcpConn
	noted map[string]bool
}

type amptcpConn struct {
	state   MapState // the last outcome; MapFound once placed
	counted bool     // the outcome is in the counters
	n       int      // subflows placed (to count changes)
	bytes   uint64
}

func (p *AMPTCP) Name() string { return "amptcp" }

// Want is Plan without the exactness (core.Policy).
func (p *AMPTCP) Want(c ConnView, uplinks []Uplink) []Slot { return p.Plan(c, uplinks).Slots }

func (p *AMPTCP) conn(tok uint32) *amptcpConn {
	if p.conns == nil {
		p.conns = map[uint32]*amptcpConn{}
	}
	c := p.conns[tok]
	if c == nil {
		c = &amptcpConn{state: MapPending}
		p.conns[tok] = c
	}
	return c
}

func (p *AMPTCP) note(reason, detail string) {
	if p.noted == nil {
		p.noted = map[string]bool{}
	}
	k := reason + "\x00" + detail
	if p.noted[k] || p.Note == nil {
		p.noted[k] = true
		return
	}
	if len(p.noted) < 4096 {
		p.noted[k] = true
	}
	p.Note(reason, detail)
}

// fallback is what the kernel's own path manager would do: one subflow per uplink and peer
// address (the full mesh), not enforced.
func (p *AMPTCP) fallback(c ConnView, uplinks []Uplink) Plan {
	return Plan{Slots: Fullmesh{}.Want(c, uplinks)}
}

// Plan returns the connection's subflows: for a placed connection exactly N slots, the initial
// subflow's first, each with the residue of its RLOC pair.
func (p *AMPTCP) Plan(c ConnView, uplinks []Uplink) Plan {
	if p.ClientOnly && c.ServerSide {
		return Plan{}
	}
	st := p.conn(c.Token)
	st.bytes = c.Bytes
	if p.InScope != nil && !p.InScope(c.Remote.Addr) {
		if !st.counted {
			st.counted = true
			p.Counters.OutOfScope++
		}
		return p.fallback(c, uplinks)
	}
	if c.Bytes < p.MinBytes {
		return p.fallback(c, uplinks)
	}
	if p.Maps == nil {
		return p.fallback(c, uplinks)
	}
	lm, ls := p.Maps.Mapping(c.Local.Addr)
	rm, rs := p.Maps.Mapping(c.Remote.Addr)
	state := MapFound
	for _, s := range []MapState{ls, rs} {
		if s != MapFound && (state == MapFound || state == MapPending) {
			state = s
		}
	}
	if state != MapFound {
		if state == MapPending {
			// The mapping of a placed connection is being refreshed: keep its subflows.
			return p.fallback(c, uplinks)
		}
		if st.state != state {
			st.state = state
			p.Counters.FallbackToKernel++
			switch state {
			case MapNone:
				p.Counters.NoMapping++
			case MapNoAnswer:
				p.Counters.NoAnswer++
			case MapNoLocator:
				p.Counters.NoLocator++
			}
			which := c.Remote.Addr
			if ls != MapFound && ls != MapPending {
				which = c.Local.Addr
			}
			p.note(state.String(), which)
		}
		return p.fallback(c, uplinks)
	}
	// Host interfaces: the local uplinks of the connection's family and the peer's addresses.
	var ups []int
	for i, u := range uplinks {
		if u.V6 == c.V6 {
			ups = append(ups, i)
		}
	}
	l1, l2 := max(len(ups), 1), max(len(c.Remotes), 1)
	m := lm.Usable * rm.Usable
	n := SubflowCount(p.Routing, l1, l2, lm.Usable, rm.Usable)
	if p.Force > 0 {
		n = p.Force
	}
	if p.MaxSubflows > 0 && n > p.MaxSubflows {
		p.Counters.Clamped++
		p.note("subflows clamped to the kernel limit", fmt.Sprintf("%d wanted, %d allowed (%s)", n, p.MaxSubflows, rm.Prefix))
		n = p.MaxSubflows
	}
	if st.state != MapFound {
		st.state = MapFound
		p.Counters.Placed++
	} else if st.n != n {
		p.Counters.MappingChanges++
	}
	st.n = n
	// Address pairs: the initial subflow's first, then the others in uplink and peer order.
	type ap struct {
		uplink int
		remote Endpoint
	}
	var pairs []ap
	first := -1
	for _, i := range ups {
		if uplinks[i].Addr == c.Local.Addr {
			first = i
		}
	}
	if first >= 0 {
		pairs = append(pairs, ap{first, c.Remote})
	}
	for _, i := range ups {
		for _, r := range c.Remotes {
			if i == first && r == c.Remote {
				continue
			}
			pairs = append(pairs, ap{i, r})
		}
	}
	if len(pairs) == 0 {
		return Plan{}
	}
	r0 := Residue(c.Local.Port, c.Remote.Port, m)
	out := Plan{Exact: true}
	for i := range n {
		a := pairs[i%len(pairs)]
		out.Slots = append(out.Slots, Slot{Uplink: a.uplink, Remote: a.remote, Backup: uplinks[a.uplink].Backup,
			Modulus: m, Residue: (r0 + i) % m})
	}
	return out
}

// Forget drops a closed connection; one still waiting for its mapping is counted.
func (p *AMPTCP) Forget(tok uint32) {
	st := p.conns[tok]
	if st == nil {
		return
	}
	if st.state == MapPending && (p.MinBytes == 0 || st.bytes >= p.MinBytes) && !st.counted {
		p.Counters.ClosedInLookup++
		p.Counters.FallbackToKernel++
	}
	if st.bytes < p.MinBytes && st.state == MapPending && !st.counted {
		p.Counters.ShortFlows++
	}
	delete(p.conns, tok)
}

// Tokens lists the connections the policy holds state for (tests and status).
func (p *AMPTCP) Tokens() []uint32 {
	out := make([]uint32, 0, len(p.conns))
	for t := range p.conns {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
