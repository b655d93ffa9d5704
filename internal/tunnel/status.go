package tunnel

import (
	"sort"
	"sync/atomic"
	"time"

	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
)

// Counters are the tunnel's packet counters; drops are counted by reason, never logged one by
// one.
type Counters struct {
	RxPackets, RxBytes atomic.Uint64 // datagrams received on all uplinks
	TxPackets, TxBytes atomic.Uint64 // datagrams sent
	Delivered          atomic.Uint64 // inner packets written to the device

	DropNoRoute        atomic.Uint64 // inner destination in no peer's routes
	DropNoSession      atomic.Uint64 // no session with the peer yet
	DropNoPath         atomic.Uint64 // every path to the peer is down, or none took the packet within maxSchedWait
	DropSend           atomic.Uint64 // a path's socket buffer was full or the send failed
	DropBadGRE         atomic.Uint64 // truncated, wrong version, reserved bits, or not braid's GRE
	DropBadHeader      atomic.Uint64 // braid header or message malformed
	DropUnknownSession atomic.Uint64 // no session has the packet's key (index)
	DropEarly          atomic.Uint64 // on a session whose handshake response has not arrived yet
	DropReplay         atomic.Uint64 // counter (or handshake) replayed or too old
	DropAuth           atomic.Uint64 // did not authenticate: wrong key or tampered
	DropCleartext      atomic.Uint64 // a data packet in clear, but this tunnel encrypts
	DropUnknownPath    atomic.Uint64 // authenticated, from an address that is none of the peer's paths
	DropBadInner       atomic.Uint64 // inner packet neither IPv4 nor IPv6
	DropSpoofed        atomic.Uint64 // inner source outside the peer's routes
	DropHandshake      atomic.Uint64 // handshake message refused
	DropDevice         atomic.Uint64 // the device refused a write
	DropTooBig         atomic.Uint64 // a packet from the device larger than the tunnel MTU
	DropQueueFull      atomic.Uint64 // a packet read past its peer's send-queue bound (the inner flows' congestion signal)

	DropVersion atomic.Uint64 // handshake refused: no protocol version both sides speak
	// DropHandshakeMAC: an initiation whose MAC is not that of this side's public key (junk,
	// a scan, or a sender that does not know the key); DropHandshakeBusy: one over the
	// handshake worker's budget or queue (hsworker.go).
	DropHandshakeMAC, DropHandshakeBusy atomic.Uint64
	// CookiesSent: initiations without a valid mac2 answered, under load, with a cookie reply
	// instead of a handshake; CookiesReceived: cookie replies this side took for its own
	// initiations; DropCookieReply: cookie replies that were not for an initiation of ours.
	CookiesSent, CookiesReceived, DropCookieReply atomic.Uint64
	// DropHandshakeRate: an initiation with a valid mac2, under load, over its address's
	// budget (hsworker.go).
	DropHandshakeRate atomic.Uint64
	// A packet from an address that is none of the peer's paths that did not open: replayed
	// (DropReplayNewSource) or forged (DropAuthNewSource). Such packets move no path.
	DropReplayNewSource, DropAuthNewSource atomic.Uint64
	DropPathLimit                          atomic.Uint64 // authenticated, on a new path of a peer at its max_paths

	// PathMoves counts paths moved to a new address by their peer's packets, PathsLearned the
	// paths made from them, KeepalivesSent the keepalives of paths that had sent nothing.
	PathMoves, PathsLearned, KeepalivesSent atomic.Uint64
	// UplinkRebinds counts the sockets a following uplink got because its interface's address
	// changed (or the interface came back), UplinkAnnounces the packets that told the peers
	// (follow.go).
	UplinkRebinds, UplinkAnnounces atomic.Uint64
	// Loss recovery (recovery.go): nacks sent and received, packets resent, and nacked
	// packets not resent because they were no longer kept or the resend budget was spent.
	NacksSent, NacksReceived, Resent, ResendMissed, ResendBudget atomic.Uint64
	// Overflows counts the bursts of losses on a path that ended its estimator's startup or
	// drained its cruise early (a queue the pacing overflowed).
	Overflows atomic.Uint64
	// Gap nacks (recovery.go, protocol version 4): sent and received, and the packets resent
	// for them (counted in Resent too).
	GapNacksSent, GapNacksReceived, GapResent atomic.Uint64
	// SparseCopies are the extra copies of sparse flows' packets sent on other paths
	// (Options.SparseFlows); SparseCapped the sparse packets sent once because the peer's
	// budget for copies was spent.
	SparseCopies, SparseCapped atomic.Uint64

	HandshakesSent, HandshakesDone atomic.Uint64
	// HandshakeCopies counts the copies of an answered initiation that came over the other
	// paths (each initiation is sent on every path): expected, not a replay.
	HandshakeCopies atomic.Uint64
}

// Status is a snapshot of the tunnel for `braid status` and the metrics endpoint.
type Status struct {
	PublicKey string
	Uptime    time.Duration
	MTU       int // the tunnel MTU now
	Counters  map[string]uint64
	Uplinks   []UplinkStatus
	Peers     []PeerStatus
}

// UplinkStatus describes one of the site's uplinks.
type UplinkStatus struct {
	Name      string
	Interface string `json:",omitempty"`
	// Local is the address and port its socket is bound to now ("" when it has none).
	Local string `json:",omitempty"`
	// Follow: the uplink follows its interface's address (follow.go); State is what the
	// follower last saw ("up", "down", "absent", "no address", "bind failed"), Rebinds how
	// many sockets it opened after the first.
	Follow  bool
	State   string `json:",omitempty"`
	Rebinds uint64 `json:",omitempty"`
	// ShardReads counts the reads (system calls, each of one or more datagrams) of each
	// socket of the uplink's group, when it has several (shard.go): how the peers spread.
	ShardReads []uint64 `json:",omitempty"`
}

// PeerStatus describes one peer.
type PeerStatus struct {
	Name       string
	Session    bool
	SessionAge time.Duration
	Cipher     string `json:",omitempty"` // of the current session
	Protocol   int    `json:",omitempty"` // the protocol version of the current session
	// LearnsPaths: the peer was declared without addresses and its paths are learned from
	// its packets (up to MaxPaths); Keepalive is the longest a path stays without sending.
	LearnsPaths bool
	MaxPaths    int `json:",omitempty"`
	Keepalive   time.Duration
	ReorderHold time.Duration
	// Reorder counts what the reorder buffer did with the peer's packets (nil when it is
	// off): Lost are gaps given up on, which the flows inside see as losses.
	Reorder *reorder.Stats `json:",omitempty"`
	// SendQueuePackets and SendQueueBytes (on the wire) wait in the peer's send queue for a
	// path (the default scheduler's queue; txqueue.go).
	SendQueuePackets, SendQueueBytes int
	// SendQueueDrops are the peer's packets dropped because its send queue was full while
	// another peer's was not (the device reader reads on for the others).
	SendQueueDrops uint64
	Scheduler      string
	// PeerBufferFree is the free room of the peer's reorder buffer, bytes, as its latest
	// feedback reported it (the buffer-aware schedulers' available buffer); -1 while unknown
	// or when the peer does not reorder.
	PeerBufferFree int
	// Shard is the socket of each uplink's group that the peer's packets are steered to
	// (shard.go), -1 when the tunnel has one socket per uplink or the peer has none yet.
	Shard int
	Paths []PathStatus
}

// PathStatus describes one path to a peer.
type PathStatus struct {
	ID     int
	Uplink string
	// Local is the uplink's address and port ("" when unknown), Remote the peer's address
	// the path sends to now.
	Local  string `json:",omitempty"`
	Remote string
	// Origin is "configured" (from the site file) or "learned" (from the peer's packets, at
	// LearnedAt); MovedAt is when the peer's packets last moved it to a new address (Moves
	// times in all), nil if never: the path has roamed (How).
	How         string // "configured", "learned" or "roamed": how Remote was found
	Origin      string
	LearnedAt   *time.Time `json:",omitempty"`
	MovedAt     *time.Time `json:",omitempty"`
	Moves       uint64     `json:",omitempty"`
	State       string
	AdminDown   bool
	RTT, RTTVar time.Duration
	Loss        float64
	// Rate is the delivery rate measured by the peer, bit/s, while the path is up and has
	// been measured (RateMeasured); 0 otherwise: a path that is down has no current rate.
	Rate         float64
	RateMeasured bool
	// Capacity is the rate the path is scheduled for, bit/s: configured, or measured (then
	// CapacityPhase names the estimator's phase: startup, drain or cruise). Until the
	// estimator has taken a sample, CapacityMeasured is false and Capacity is its start-up
	// guess, which paces the path but says nothing of it.
	Capacity         float64
	CapacityPhase    string `json:",omitempty"`
	CapacityMeasured bool
	// Unpaced: the path is the peer's one path left and its capacity is measured, so it is
	// not paced at Capacity (which is still measured): the flows meet the link's own queue.
	// As of the scheduler's last decision, as Sched is.
	Unpaced bool `json:",omitempty"`
	// MTU is the path MTU (outer packet size) found by probing, or assumed while MTUSearching.
	MTU                    int
	MTUSearching           bool
	TxPackets, TxBytes     uint64
	TxDrops                uint64
	RxPackets, RxBytes     uint64
	ProbesSent, ProbesLost uint64

	// TxPackets and TxBytes count every datagram (data, probes, replies, MTU probes);
	// TxData* and RxData* count data datagrams only, bytes as sent without the outer IP and
	// UDP headers: what the path carried for the tunnel's users.
	TxDataPackets, TxDataBytes uint64
	RxDataPackets, RxDataBytes uint64

	// With a scheduler that demotes paths (rbpm): Sched is "active" or "demoted", SchedReason
	// why, and SchedRequired and SchedAvailable the buffer the decision needed and had, bytes.
	Sched                         string `json:",omitempty"`
	SchedReason                   string `json:",omitempty"`
	SchedRequired, SchedAvailable int    `json:",omitempty"`
}

// Status returns a snapshot.
func (t *Tunnel) Status() Status {
	now := t.now()
	st := Status{PublicKey: t.pub.String(), Uptime: time.Since(t.start), Counters: t.stats.snapshot(), MTU: int(t.mtu.Load())}
	st.Uplinks = t.uplinkStatus()
	for _, p := range t.peerList() {
		ps := PeerStatus{Name: p.name, PeerBufferFree: -1,
			SendQueuePackets: int(p.queuedPackets.Load()), SendQueueBytes: int(p.queuedBytes.Load()),
			SendQueueDrops: p.queueDrops.Load(), Shard: t.peerShard(p)}
		if cur := p.cur.Load(); cur != nil {
			ps.Session, ps.SessionAge, ps.Cipher = true, time.Duration(now-cur.created), t.cipherName(cur.s)
			ps.Protocol = int(cur.s.Version)
		}
		ps.LearnsPaths, ps.Keepalive = p.learn, time.Duration(p.keepalive.Load())
		if p.learn {
			ps.MaxPaths = int(p.maxPaths.Load())
		}
		p.mu.Lock()
		if ps.Scheduler = p.schedName; ps.Scheduler == "" {
			ps.Scheduler = "paced"
		}
		if p.rb != nil {
			ps.ReorderHold = p.rb.Hold()
			st := p.rb.Stats()
			ps.Reorder = &st
		}
		if c := p.connLocked(); c.AvailKnown {
			ps.PeerBufferFree = c.Avail
		}
		for i, pp := range p.paths {
			s := pp.est.Snapshot()
			capacity, phase, measured := float64(pp.capacity), "", true
			if pp.capEst != nil {
				capacity, phase, measured = pp.capEst.Estimate(), pp.capEst.Phase().String(), pp.capEst.Measured()
			}
			rate, rateKnown := s.DeliveryRate, s.RateSamples > 0 && s.State == path.Up && !pp.admin
			if !rateKnown {
				rate = 0
			}
			ps.Paths = append(ps.Paths, PathStatus{
				Capacity: capacity, CapacityPhase: phase, CapacityMeasured: measured,
				MTU: pp.pmtu.Value(), MTUSearching: pp.pmtu.Searching(),
				ID: int(pp.id) + 1, Uplink: pp.up.name, Remote: pp.remote().String(), Origin: pp.origin(), How: pp.how(), Moves: pp.moves,
				State: stateName(s.State, pp.admin), AdminDown: pp.admin,
				RTT: s.SRTT, RTTVar: s.RTTVar, Loss: s.Loss, Rate: rate, RateMeasured: rateKnown,
				TxPackets: pp.txPackets.Load(), TxBytes: pp.txBytes.Load(), TxDrops: pp.txDrops.Load(),
				RxPackets: uint64(pp.rxPackets), RxBytes: pp.rxBytes,
				TxDataPackets: pp.txDataPackets.Load(), TxDataBytes: pp.txDataBytes.Load(),
				RxDataPackets: pp.rxDataPackets, RxDataBytes: pp.rxDataBytes,
				ProbesSent: s.ProbesSent, ProbesLost: s.ProbesLost,
			})
			last := &ps.Paths[len(ps.Paths)-1]
			last.Unpaced = i < len(p.snap) && p.snap[i].Up && p.snap[i].PaceRate == unpacedRate
			if l := pp.up.local(); l.IsValid() {
				last.Local = l.String()
			}
			if pp.learned {
				at := pp.learnedAt
				last.LearnedAt = &at
			}
			if !pp.movedAt.IsZero() {
				at := pp.movedAt
				last.MovedAt = &at
			}
			if ss, ok := p.schedStateLocked(i); ok {
				st := &ps.Paths[len(ps.Paths)-1]
				st.Sched, st.SchedReason, st.SchedRequired, st.SchedAvailable = "active", ss.Reason.String(), ss.Required, ss.Avail
				if !ss.Active {
					st.Sched = "demoted"
				}
			}
		}
		p.mu.Unlock()
		st.Peers = append(st.Peers, ps)
	}
	return st
}

// uplinkStatus describes the uplinks, by name.
func (t *Tunnel) uplinkStatus() []UplinkStatus {
	t.reloadMu.Lock()
	ups := make([]*uplink, 0, len(t.uplinks))
	for _, u := range t.uplinks {
		ups = append(ups, u)
	}
	t.reloadMu.Unlock()
	sort.Slice(ups, func(i, j int) bool { return ups[i].name < ups[j].name })
	out := make([]UplinkStatus, 0, len(ups))
	for _, u := range ups {
		us := UplinkStatus{Name: u.name, Interface: u.iface, Follow: u.follow, Rebinds: u.rebinds.Load()}
		if sk := u.sock(); sk.conn != nil && sk.local.IsValid() {
			us.Local = sk.local.String()
		}
		if s := u.state.Load(); s != nil {
			us.State = *s
		}
		us.ShardReads = u.shardCounts()
		out = append(out, us)
	}
	return out
}

func stateName(s path.State, admin bool) string {
	if admin {
		return "admin-down"
	}
	return s.String()
}

func (c *Counters) snapshot() map[string]uint64 {
	return map[string]uint64{
		"rx_packets": c.RxPackets.Load(), "rx_bytes": c.RxBytes.Load(),
		"tx_packets": c.TxPackets.Load(), "tx_bytes": c.TxBytes.Load(), "delivered": c.Delivered.Load(),
		"drop_no_route": c.DropNoRoute.Load(), "drop_no_session": c.DropNoSession.Load(),
		"drop_no_path": c.DropNoPath.Load(), "drop_send": c.DropSend.Load(),
		"drop_bad_gre": c.DropBadGRE.Load(), "drop_bad_header": c.DropBadHeader.Load(),
		"drop_unknown_session": c.DropUnknownSession.Load(), "drop_replay": c.DropReplay.Load(),
		"drop_auth": c.DropAuth.Load(), "drop_cleartext": c.DropCleartext.Load(), "drop_unknown_path": c.DropUnknownPath.Load(),
		"drop_bad_inner": c.DropBadInner.Load(), "drop_spoofed": c.DropSpoofed.Load(),
		"drop_handshake": c.DropHandshake.Load(), "drop_device": c.DropDevice.Load(), "drop_too_big": c.DropTooBig.Load(),
		"drop_queue_full": c.DropQueueFull.Load(),
		"handshakes_sent": c.HandshakesSent.Load(), "handshakes_done": c.HandshakesDone.Load(),
		"handshake_copies": c.HandshakeCopies.Load(), "drop_early": c.DropEarly.Load(),
		"drop_version":       c.DropVersion.Load(),
		"drop_handshake_mac": c.DropHandshakeMAC.Load(), "drop_handshake_busy": c.DropHandshakeBusy.Load(),
		"cookies_sent": c.CookiesSent.Load(), "cookies_received": c.CookiesReceived.Load(), "drop_cookie_reply": c.DropCookieReply.Load(), "drop_handshake_rate": c.DropHandshakeRate.Load(), "drop_replay_new_source": c.DropReplayNewSource.Load(),
		"drop_auth_new_source": c.DropAuthNewSource.Load(), "drop_path_limit": c.DropPathLimit.Load(),
		"path_moves": c.PathMoves.Load(), "paths_learned": c.PathsLearned.Load(), "keepalives_sent": c.KeepalivesSent.Load(),
		"uplink_rebinds": c.UplinkRebinds.Load(), "uplink_announces": c.UplinkAnnounces.Load(),
		"nacks_sent": c.NacksSent.Load(), "nacks_received": c.NacksReceived.Load(), "resent": c.Resent.Load(),
		"resend_missed": c.ResendMissed.Load(), "resend_budget": c.ResendBudget.Load(), "overflows": c.Overflows.Load(),
		"gap_nacks_sent": c.GapNacksSent.Load(), "gap_nacks_received": c.GapNacksReceived.Load(), "gap_resent": c.GapResent.Load(),
		"sparse_copies": c.SparseCopies.Load(), "sparse_capped": c.SparseCapped.Load(),
	}
}

// SetAdminDown takes a path out of use (true) or back (false); it is effective for the next
// packet. peerName and id (1-based) name the path.
func (t *Tunnel) SetAdminDown(peerName string, id int, down bool) bool {
	for _, p := range t.peerList() {
		if p.name != peerName {
			continue
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if pp := p.pathLocked(id); pp != nil {
			pp.admin = down
			return true
		}
		return false
	}
	return false
}

// SetWeight sets a path's weight (0: from measured capacity); effective for the next packet.
func (t *Tunnel) SetWeight(peerName string, id int, w float64) bool {
	for _, p := range t.peerList() {
		if p.name != peerName {
			continue
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if pp := p.pathLocked(id); pp != nil {
			pp.weight = w
			return true
		}
		return false
	}
	return false
}
