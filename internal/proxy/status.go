package proxy

import (
	"net/netip"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"braid/internal/metrics"
	"braid/internal/mptcp/info"
)

// Reasons a connection is refused (the label of braid_proxy_refused_total).
const (
	ReasonNoRoute         = "no_route"         // the destination is in none of the tenant's peers' networks
	ReasonPeerUnreachable = "peer_unreachable" // no connection to the peer proxy
	ReasonPeerRefused     = "peer_refused"     // the peer closed before accepting (it does not know our key)
	ReasonAuth            = "auth_failed"      // a peer failed authentication (TLS, pinned keys)
	ReasonMalformed       = "malformed"        // a truncated or invalid request or header
	ReasonTimeout         = "header_timeout"   // the request did not arrive in time
	ReasonAddrType        = "addr_type"        // an address type this proxy does not know
	ReasonCommand         = "command"          // a SOCKS5 command other than CONNECT
	ReasonDstDenied       = "dst_not_allowed"  // the destination is not the tenant's at this site
	ReasonSrcDenied       = "src_not_allowed"  // the claimed source is not the peer's (or tenant's)
	ReasonDstUnreachable  = "dst_unreachable"  // connecting to the destination failed
	ReasonDraining        = "draining"         // the proxy is shutting down
	ReasonOriginalDst     = "original_dst"     // REDIRECT: the original destination is unknown
	ReasonNoSource        = "no_source"        // a peer's header without a source, and the tenant does not allow it
	ReasonUnauthLimit     = "unauth_limit"     // too many connections not yet authenticated (max_unauthenticated)
)

// Reasons lists every refusal reason.
var Reasons = []string{ReasonNoRoute, ReasonPeerUnreachable, ReasonPeerRefused, ReasonAuth, ReasonMalformed, ReasonTimeout,
	ReasonAddrType, ReasonCommand, ReasonDstDenied, ReasonSrcDenied, ReasonDstUnreachable, ReasonDraining, ReasonOriginalDst, ReasonNoSource, ReasonUnauthLimit}

type counters struct {
	out, in             atomic.Uint64 // connections relayed to and from peers
	active              atomic.Int64
	bytesUp, bytesDown  atomic.Uint64 // of finished connections
	poolFailures        atomic.Uint64
	failovers, restores atomic.Uint64 // subflows set to backup by the failover monitor, and back
	destroyed           atomic.Uint64 // dead subflows it closed
	aborted             atomic.Uint64 // live subflows it reset for their unsent backlog on a failover
	refused             map[string]*atomic.Uint64
}

func newCounters() *counters {
	c := &counters{refused: map[string]*atomic.Uint64{}}
	for _, r := range Reasons {
		c.refused[r] = new(atomic.Uint64)
	}
	return c
}

// Status is the proxy's state for `braid status`.
type Status struct {
	Uptime    time.Duration `json:"uptime_ns"`
	Encrypted bool          `json:"encrypted"`
	Draining  bool          `json:"draining"`
	// Unauthenticated connections from would-be peers, and their cap: Unauthenticated from
	// addresses that are no peer's, UnauthenticatedPeers from peers' addresses, each capped at
	// MaxUnauthenticated.
	Unauthenticated      int64          `json:"unauthenticated"`
	UnauthenticatedPeers int64          `json:"unauthenticated_from_peers"`
	MaxUnauthenticated   int            `json:"max_unauthenticated"`
	Tenants              []TenantStatus `json:"tenants"`
	Connections          []ConnStatus   `json:"connections"`
}

// TenantStatus is one tenant's counters.
type TenantStatus struct {
	Name         string            `json:"name"`
	Out          uint64            `json:"out"`
	In           uint64            `json:"in"`
	Active       int64             `json:"active"`
	BytesUp      uint64            `json:"bytes_up"`
	BytesDown    uint64            `json:"bytes_down"`
	PoolReady    map[string]int    `json:"pool_ready"`
	PoolFailures uint64            `json:"pool_failures"`
	Failovers    uint64            `json:"failovers"`
	Restores     uint64            `json:"restores"`
	Destroyed    uint64            `json:"dead_subflows_closed"`
	Aborted      uint64            `json:"backlogged_subflows_reset"`
	Refused      map[string]uint64 `json:"refused"`
}

// ConnStatus is one live connection.
type ConnStatus struct {
	ID      uint64         `json:"id"`
	Tenant  string         `json:"tenant"`
	Role    string         `json:"role"`
	Peer    string         `json:"peer"`
	Src     netip.AddrPort `json:"src"`
	Dst     netip.AddrPort `json:"dst"`
	Age     time.Duration  `json:"age_ns"`
	BytesUp uint64         `json:"bytes_up"`
	Down    uint64         `json:"bytes_down"`
	MPTCP   bool           `json:"mptcp"` // false: the connection fell back to TCP
	// The connection level (MPTCP_INFO): what this side has written and the peer has not
	// acknowledged yet at the connection level, how long ago its last acknowledgement came,
	// and what MPTCP re-sent at the connection level (after a subflow failed or its data was
	// lost above TCP). Unacknowledged data that stays while every subflow is idle is a
	// connection waiting on MPTCP's own retransmission timer. Undelivered is the part of it
	// that was sent and that no subflow holds any more (in flight or queued): its subflows
	// delivered it, and the peer holds it ahead of a gap (normal on paths of unequal delay,
	// for about the difference of their delays) or dropped it above TCP.
	Unacked      uint64          `json:"unacked_bytes"`
	Undelivered  uint64          `json:"undelivered_bytes"`
	LastAck      time.Duration   `json:"last_ack_ns"`
	BytesRetrans uint64          `json:"bytes_retrans"`
	Subflows     []SubflowStatus `json:"subflows"`
}

// SubflowStatus is one subflow of a live connection.
type SubflowStatus struct {
	Local     netip.AddrPort `json:"local"`
	Remote    netip.AddrPort `json:"remote"`
	RTT       time.Duration  `json:"rtt_ns"`
	BytesSent uint64         `json:"bytes_sent"`
	BytesRecv uint64         `json:"bytes_received"`
	Retrans   uint64         `json:"bytes_retrans"`
	Unacked   uint32         `json:"unacked_segments"` // in flight on this subflow
	NotSent   uint32         `json:"notsent_bytes"`    // queued on it and not sent yet
	LastAck   time.Duration  `json:"last_ack_ns"`      // since its last acknowledgement
	// TCPState is the subflow's TCP state (1: established). The connection's first subflow
	// stays listed after it closed, with the counters it had.
	TCPState uint8 `json:"tcp_state"`
}

// Status returns the current state, with every live connection's subflows.
func (p *Proxy) Status() Status {
	st := Status{Uptime: time.Since(p.start), Encrypted: p.o.Cert != nil, Draining: p.draining.Load(),
		Unauthenticated: p.unauth.Load(), UnauthenticatedPeers: p.unauthPeers.Load(), MaxUnauthenticated: p.o.MaxUnauthenticated}
	for _, t := range p.tenantList() {
		ts := TenantStatus{Name: t.Name, Out: t.c.out.Load(), In: t.c.in.Load(), Active: t.c.active.Load(),
			BytesUp: t.c.bytesUp.Load(), BytesDown: t.c.bytesDown.Load(), PoolFailures: t.c.poolFailures.Load(),
			Failovers: t.c.failovers.Load(), Restores: t.c.restores.Load(), Destroyed: t.c.destroyed.Load(),
			Aborted: t.c.aborted.Load(), PoolReady: map[string]int{}, Refused: map[string]uint64{}}
		for _, pr := range t.state().peers {
			ts.PoolReady[pr.Name] = len(pr.pool.ready)
		}
		for r, v := range t.c.refused {
			if n := v.Load(); n > 0 {
				ts.Refused[r] = n
			}
		}
		st.Tenants = append(st.Tenants, ts)
	}
	p.mu.Lock()
	live := make([]*conn, 0, len(p.conns))
	for _, c := range p.conns {
		live = append(live, c)
	}
	p.mu.Unlock()
	sort.Slice(live, func(i, j int) bool { return live[i].id < live[j].id })
	for _, c := range live {
		cs := ConnStatus{ID: c.id, Tenant: c.t.Name, Role: c.role, Peer: c.peer, Src: c.src, Dst: c.dst,
			Age: time.Since(c.start), BytesUp: c.up.Load(), Down: c.down.Load()}
		if full, err := info.Full(c.mp); err == nil {
			cs.MPTCP = true
			if full.Info.WriteSeq > full.Info.SndUna {
				cs.Unacked = full.Info.WriteSeq - full.Info.SndUna
			}
			cs.Undelivered = deliveredUnacked(full.Info, full.Subflows)
			cs.LastAck = time.Duration(full.Info.LastAckRecv) * time.Millisecond
			cs.BytesRetrans = full.Info.BytesRetrans
			for _, s := range full.Subflows {
				cs.Subflows = append(cs.Subflows, SubflowStatus{Local: s.Local, Remote: s.Remote, RTT: s.TCP.RTT,
					BytesSent: s.TCP.BytesSent, BytesRecv: s.TCP.BytesReceived, Retrans: s.TCP.BytesRetrans,
					Unacked: s.TCP.Unacked, NotSent: s.TCP.NotsentBytes, LastAck: s.TCP.LastAckRecv, TCPState: s.TCP.State})
			}
		}
		st.Connections = append(st.Connections, cs)
	}
	return st
}

// StatusJSON is the document of GET /status.
func (p *Proxy) StatusJSON() any {
	st := p.Status()
	return struct {
		Role  string  `json:"role"`
		Proxy *Status `json:"proxy"`
	}{"proxy", &st}
}

// WriteMetrics writes the Prometheus exposition: per tenant, and per live connection and
// subflow.
func (p *Proxy) WriteMetrics(w *metrics.Writer) {
	st := p.Status()
	w.Sample("braid_proxy_unauthenticated", metrics.Gauge, "Connections from would-be peers not yet authenticated, from addresses that are no peer's.", float64(st.Unauthenticated))
	w.Sample("braid_proxy_unauthenticated_from_peers", metrics.Gauge, "Connections not yet authenticated from peers' own addresses (a cap of their own).", float64(st.UnauthenticatedPeers))
	w.Sample("braid_proxy_unauthenticated_max", metrics.Gauge, "The cap on connections not yet authenticated (max_unauthenticated).", float64(st.MaxUnauthenticated))
	for _, t := range st.Tenants {
		w.Sample("braid_proxy_connections_total", metrics.Counter, "Connections relayed, by direction (out: to a peer).", float64(t.Out), "tenant", t.Name, "direction", "out")
		w.Sample("braid_proxy_connections_total", metrics.Counter, "Connections relayed, by direction (out: to a peer).", float64(t.In), "tenant", t.Name, "direction", "in")
		w.Sample("braid_proxy_connections_active", metrics.Gauge, "Connections being relayed.", float64(t.Active), "tenant", t.Name)
		w.Sample("braid_proxy_bytes_total", metrics.Counter, "Payload bytes of finished connections, by direction (up: client to server).", float64(t.BytesUp), "tenant", t.Name, "direction", "up")
		w.Sample("braid_proxy_bytes_total", metrics.Counter, "Payload bytes of finished connections, by direction (up: client to server).", float64(t.BytesDown), "tenant", t.Name, "direction", "down")
		w.Sample("braid_proxy_failovers_total", metrics.Counter, "Subflows set to backup because their path stopped acknowledging.", float64(t.Failovers), "tenant", t.Name)
		w.Sample("braid_proxy_failover_restores_total", metrics.Counter, "Subflows taken back into use after their path recovered.", float64(t.Restores), "tenant", t.Name)
		w.Sample("braid_proxy_dead_subflows_closed_total", metrics.Counter, "Subflows closed by the failover monitor after staying dead.", float64(t.Destroyed), "tenant", t.Name)
		w.Sample("braid_proxy_backlogged_subflows_reset_total", metrics.Counter, "Live subflows reset on a failover because their unsent data would have delayed what the dead subflow held.", float64(t.Aborted), "tenant", t.Name)
		w.Sample("braid_proxy_pool_failures_total", metrics.Counter, "Failed attempts to pre-establish a connection to a peer.", float64(t.PoolFailures), "tenant", t.Name)
		for _, name := range sortedKeys(t.PoolReady) {
			w.Sample("braid_proxy_pool_ready", metrics.Gauge, "Pre-established connections ready, per peer.", float64(t.PoolReady[name]), "tenant", t.Name, "peer", name)
		}
		for _, r := range Reasons {
			w.Sample("braid_proxy_refused_total", metrics.Counter, "Connections refused, by reason.", float64(t.Refused[r]), "tenant", t.Name, "reason", r)
		}
	}
	for _, c := range st.Connections {
		id := strconv.FormatUint(c.ID, 10)
		w.Sample("braid_proxy_connection_bytes", metrics.Gauge, "Payload bytes of a live connection, by direction.", float64(c.BytesUp), "conn", id, "tenant", c.Tenant, "role", c.Role, "direction", "up")
		w.Sample("braid_proxy_connection_bytes", metrics.Gauge, "Payload bytes of a live connection, by direction.", float64(c.Down), "conn", id, "tenant", c.Tenant, "role", c.Role, "direction", "down")
		w.Sample("braid_proxy_connection_subflows", metrics.Gauge, "Subflows of a live connection's MPTCP connection.", float64(len(c.Subflows)), "conn", id, "tenant", c.Tenant)
		if c.MPTCP {
			w.Sample("braid_proxy_connection_unacked_bytes", metrics.Gauge, "Bytes a live connection has written and its peer has not acknowledged at the MPTCP level.", float64(c.Unacked), "conn", id, "tenant", c.Tenant)
			w.Sample("braid_proxy_connection_last_ack_seconds", metrics.Gauge, "Time since a live connection's last MPTCP-level acknowledgement.", c.LastAck.Seconds(), "conn", id, "tenant", c.Tenant)
		}
		for _, s := range c.Subflows {
			l, r := s.Local.String(), s.Remote.String()
			w.Sample("braid_proxy_subflow_rtt_seconds", metrics.Gauge, "Smoothed RTT of a subflow.", s.RTT.Seconds(), "conn", id, "local", l, "remote", r)
			w.Sample("braid_proxy_subflow_bytes_sent", metrics.Gauge, "Bytes sent on a subflow (retransmissions included).", float64(s.BytesSent), "conn", id, "local", l, "remote", r)
			w.Sample("braid_proxy_subflow_bytes_received", metrics.Gauge, "Bytes received on a subflow.", float64(s.BytesRecv), "conn", id, "local", l, "remote", r)
			w.Sample("braid_proxy_subflow_bytes_retrans", metrics.Gauge, "Bytes retransmitted on a subflow.", float64(s.Retrans), "conn", id, "local", l, "remote", r)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// deliveredUnacked is how much of what a connection sent at the MPTCP level (mptcpi_bytes_sent,
// and not acknowledged there: mptcpi_bytes_acked) no established subflow holds any more, in
// flight (tcpi_unacked segments) or queued (tcpi_notsent_bytes). 0 on kernels without the
// connection's byte counts.
func deliveredUnacked(ci info.ConnInfo, subs []info.Subflow) uint64 {
	if ci.BytesSent <= ci.BytesAcked {
		return 0
	}
	var held uint64
	for _, s := range subs {
		if s.TCP.State == tcpEstablished {
			held += uint64(s.TCP.Unacked)*uint64(max(s.TCP.SndMSS, 1)) + uint64(s.TCP.NotsentBytes)
		}
	}
	return (ci.BytesSent - ci.BytesAcked) - min(held, ci.BytesSent-ci.BytesAcked)
}
