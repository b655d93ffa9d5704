// Package xtr is a LISP tunnel router (RFC 9300, RFC 9301): as an ITR it takes the packets a
// TUN device receives for remote EIDs, resolves their mappings through map-resolvers into a
// map-cache (with TTLs and negative entries), and encapsulates them on UDP 4341 from one of the
// site's RLOCs to one of the destination's; as an ETR it decapsulates what arrives and writes
// it to the device, registers the site's EID prefixes with map-servers, and answers
// Map-Requests and RLOC-probes for them.
//
// Locators are chosen as RFC 9300 says (lowest priority, then weights, by a hash of the inner
// flow), among the RLOC pairs that answer probes: every pair (local RLOC, remote RLOC) in use is
// probed each ProbeInterval and not used once it has been silent for DownAfter. In placement
// mode (A-MPTCP) a TCP flow's pair is (sport + dport) mod (number of pairs), in the canonical
// order of select.go, so that both directions of a subflow share one pair and N subflows with
// distinct residues use N pairs.
package xtr

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/lisp/limit"
	"braid/internal/lisp/lpm"
	"braid/internal/wire/lisp"
)

// Device is the TUN device, read and written in batches (tun.Device; opened with offloads, a
// batch is the segments of one super-packet).
type Device interface {
	// ReadBatchIdle reads packets into bufs[i][offset:], up to len(bufs), with their lengths
	// in sizes, and returns how many (0 with no error: nothing usable was read); when the
	// device has nothing to read it calls idle (at most once a call) before it waits.
	ReadBatchIdle(bufs [][]byte, offset int, sizes []int, idle func()) (int, error)
	// WriteBatch writes pkts in order, joining what it can; safe for concurrent use.
	WriteBatch(pkts [][]byte) error
	Close() error
}

// Locator is one of the site's RLOCs with its priority and weight.
type Locator struct {
	Priority, Weight uint8
}

// MapServer is a map-server the site registers with.
type MapServer struct {
	Addr       netip.AddrPort
	Key        []byte
	KeyID      uint8
	AlgID      uint8 // lisp.AlgHMACSHA1 or lisp.AlgHMACSHA256
	AuthLen    int   // digest bytes sent; 0: the full digest
	ProxyReply bool  // ask the map-server to answer for the site (P bit)
}

// Options configure an xTR.
type Options struct {
	Device   Device
	MTU      int
	EIDs     []netip.Prefix // the site's EID prefixes
	Uplinks  []*Uplink      // the site's RLOCs, with their sockets
	Locators []Locator      // priority and weight of each uplink, same order
	// Resolvers get Map-Requests (ECM); MapServers get registrations.
	Resolvers        []netip.AddrPort
	MapServers       []MapServer
	RegisterInterval time.Duration // default 60 s
	RegisterTTL      uint32        // record TTL of registrations, minutes (default 10)
	RequestTimeout   time.Duration // before a Map-Request is sent again (default 1 s)
	RequestRetries   int           // Map-Requests sent again before giving up (default 3)
	// With several Resolvers, a request unanswered for ResolverTimeout (default 300 ms, at
	// most RequestTimeout) goes to the next resolver, and the silent one rests from 1 s up to
	// ResolverBackoff (default 30 s), doubling with each miss (resolvers.go).
	ResolverTimeout time.Duration
	ResolverBackoff time.Duration
	ProbeInterval   time.Duration // default 1 s
	DownAfter       time.Duration // default 3 × ProbeInterval
	Placement       bool          // A-MPTCP placement for TCP
	QueuePerEID     int           // packets held while a mapping is resolved (default 16)
	// AnyOuterSource turns off the ETR's check that a packet's outer source is a locator of
	// the mapping of its inner source (resolved first when unknown).
	AnyOuterSource  bool
	MaxCacheEntries int // map-cache bound (default 65536); the entry closest to expiry goes
	MaxPending      int // resolutions at once (default 1024), each holding QueuePerEID packets
	MaxHeldBytes    int // bytes of packets held by all resolutions together (default 8 MiB)
	// The ETR answers RLOC-probes and forwarded Map-Requests at addresses the requests name:
	// at most MaxAmplification (default 3) times the request's length, and at most
	// RatePerDestination (default 100, burst 200) replies per second to one address.
	MaxAmplification    float64
	RatePerDestination  float64
	BurstPerDestination int
	Logger              *slog.Logger
}

func (o *Options) defaults() {
	if o.RegisterInterval == 0 {
		o.RegisterInterval = time.Minute
	}
	if o.RegisterTTL == 0 {
		o.RegisterTTL = 10
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = time.Second
	}
	if o.RequestRetries == 0 {
		o.RequestRetries = 3
	}
	if o.ResolverTimeout == 0 {
		o.ResolverTimeout = 300 * time.Millisecond
	}
	o.ResolverTimeout = min(o.ResolverTimeout, o.RequestTimeout)
	if o.ResolverBackoff == 0 {
		o.ResolverBackoff = 30 * time.Second
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = time.Second
	}
	if o.DownAfter == 0 {
		o.DownAfter = 3 * o.ProbeInterval
	}
	if o.QueuePerEID == 0 {
		o.QueuePerEID = 16
	}
	if o.MaxCacheEntries == 0 {
		o.MaxCacheEntries = 65536
	}
	if o.MaxPending == 0 {
		o.MaxPending = 1024
	}
	if o.MaxHeldBytes == 0 {
		o.MaxHeldBytes = 8 << 20
	}
	if o.MaxAmplification == 0 {
		o.MaxAmplification = 3
	}
	if o.RatePerDestination == 0 {
		o.RatePerDestination = 100
	}
	if o.BurstPerDestination == 0 {
		o.BurstPerDestination = 200
	}
	if o.MTU == 0 {
		o.MTU = 1500 - 36
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// pair is the state of one (local RLOC, remote RLOC) path. Data loops read it without locks.
type pair struct {
	local     int
	remote    netip.Addr
	up        atomic.Bool
	heard     atomic.Int64 // unix nanoseconds of the last probe reply (or creation)
	rtt       atomic.Int64 // nanoseconds, last probe
	txPackets atomic.Uint64
	txBytes   atomic.Uint64
	rxPackets atomic.Uint64
	lastProbe time.Time // guarded by XTR.mu
}

// entry is a map-cache entry.
type entry struct {
	prefix   netip.Prefix
	negative bool
	action   uint8
	ttl      uint32
	expires  time.Time
	locs     []lisp.Locator
	remote   []Loc   // Usable(locs): the placement set
	all      []Loc   // locators with priority < 255
	pairs    []*pair // for each local uplink i and remote r in all: pairs[i*len(all)+r]
	used     atomic.Bool
	// Resolution in progress (pending entries carry no mapping yet).
	pending bool
	queue   [][]byte
	held    []heldPacket // decapsulated packets from this EID waiting for its mapping
	bytes   int          // in queue and held
	nonce   uint64
	tries   int
	sent    time.Time
	query   netip.Addr
	srcEID  netip.Addr
	// The resolver the outstanding request went to, and the resolvers this resolution
	// asked (bit i: Resolvers[i]).
	resolver int
	tried    uint64
}

// XTR is a running tunnel router.
type XTR struct {
	o   Options
	log *slog.Logger
	// db is the site's EID prefixes, map-resolvers and map-servers (Options' EIDs,
	// Resolvers and MapServers are those at start): replaced whole by SetMapping, under mu,
	// together with regs.
	db      atomic.Pointer[database]
	locals  []Loc // own locators (priority, weight), index = uplink
	usableL []Loc // Usable(locals)

	mu        sync.RWMutex
	cache     lpm.Table[*entry]   // guarded by mu
	pairs     map[pairKey]*pair   // guarded by mu
	probes    map[uint64]probe    // outstanding RLOC-probes by nonce; guarded by mu
	regs      []registrationState // per map-server; guarded by mu
	regTurn   int
	regNonce  uint64            // last Map-Register nonce; guarded by mu
	pending   int               // pending entries in cache; guarded by mu
	byNonce   map[uint64]*entry // entries with a request outstanding, by its nonce; guarded by mu
	heldBytes int               // bytes of packets in queue and held of all entries; guarded by mu
	resolvers resolverSet       // map-resolver health; guarded by mu

	replies *limit.Limiter // per reply destination
	counts  map[string]*atomic.Uint64
	closing atomic.Bool
}

type pairKey struct {
	local  int
	remote netip.Addr
}

type probe struct {
	key  pairKey
	sent time.Time
}

type registrationState struct {
	nonce      uint64
	sent       time.Time
	retries    int // unconfirmed sends since the last periodic one
	lastNotify time.Time
	uplink     int
}

// randomNonce draws a Map-Request or RLOC-probe nonce from crypto/rand: the nonce is all that
// ties a Map-Reply to its request, so an off-path attacker must not be able to predict it.
func randomNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// Counter names.
const (
	CountTxPackets       = "tx_packets"
	CountRxPackets       = "rx_packets"
	CountRequests        = "map_requests_sent"
	CountReplies         = "map_replies_received"
	CountNegative        = "negative_replies_received"
	CountRegisters       = "map_registers_sent"
	CountNotifies        = "map_notifies_received"
	CountProbesSent      = "rloc_probes_sent"
	CountProbeReplies    = "rloc_probe_replies_received"
	CountRequestsIn      = "map_requests_answered"
	DropNoMapping        = "drop_unresolved"
	DropNegative         = "drop_negative_mapping"
	DropNoPath           = "drop_no_live_rloc_pair"
	DropQueueFull        = "drop_resolution_queue_full"
	DropNotIP            = "drop_not_ip"
	DropNotUnicast       = "drop_not_unicast"
	DropOwnEID           = "drop_destination_is_local_eid"
	DropDecap            = "drop_bad_data_header"
	DropNotOurEID        = "drop_inner_destination_not_local"
	DropForeignEID       = "drop_request_for_foreign_eid"
	DropSend             = "drop_send_error"
	DropControl          = "drop_bad_control_message"
	DropUnexpected       = "drop_unexpected_control_message"
	DropNotifyAuth       = "drop_map_notify_auth"
	DropReplyRecord      = "drop_map_reply_record"
	DropSpoofedSource    = "drop_inner_source_is_local_eid"
	DropOuterSource      = "drop_outer_source_not_a_locator"
	DropPendingFull      = "drop_too_many_resolutions"
	DropCacheFull        = "drop_map_cache_full"
	DropReplyRateLimited = "drop_reply_rate_limited"
	DropITRRLOCFamily    = "drop_itr_rloc_other_family"
	DropECMSource        = "drop_ecm_not_from_map_server"
	CountCacheEvicted    = "map_cache_evicted"
	DropTooBig           = "drop_too_big"
	CountCacheExpired    = "map_cache_expired"
	CountResolveFailed   = "resolutions_failed"
	// CountResolverTimeouts counts Map-Requests a map-resolver left unanswered in time (the
	// resolution went on with the next resolver).
	CountResolverTimeouts = "map_resolver_timeouts"
)

var counterNames = []string{CountTxPackets, CountRxPackets, CountRequests, CountReplies, CountNegative,
	CountRegisters, CountNotifies, CountProbesSent, CountProbeReplies, CountRequestsIn, DropNoMapping,
	DropNegative, DropNoPath, DropQueueFull, DropNotIP, DropNotUnicast, DropOwnEID, DropDecap, DropNotOurEID, DropForeignEID, DropSend,
	DropControl, DropUnexpected, DropNotifyAuth, DropReplyRecord, DropSpoofedSource, DropOuterSource,
	DropPendingFull, DropCacheFull, CountCacheEvicted, DropReplyRateLimited, DropITRRLOCFamily, DropECMSource, DropTooBig, CountCacheExpired, CountResolveFailed, CountResolverTimeouts}

// New checks o and returns an xTR; Run starts it.
func New(o Options) (*XTR, error) {
	o.defaults()
	switch {
	case o.Device == nil:
		return nil, errors.New("xtr: no device")
	case len(o.Uplinks) == 0:
		return nil, errors.New("xtr: no RLOC")
	case len(o.Locators) != len(o.Uplinks):
		return nil, errors.New("xtr: one locator setting per RLOC")
	case len(o.EIDs) == 0:
		return nil, errors.New("xtr: no EID prefix")
	case len(o.Resolvers) == 0:
		return nil, errors.New("xtr: no map-resolver")
	case len(o.Resolvers) > MaxResolvers:
		return nil, fmt.Errorf("xtr: %d map-resolvers: at most %d", len(o.Resolvers), MaxResolvers)
	}
	o.Locators = slices.Clone(o.Locators) // SetLocators changes them
	x := &XTR{o: o, log: o.Logger, pairs: map[pairKey]*pair{}, probes: map[uint64]probe{}, byNonce: map[uint64]*entry{}, counts: map[string]*atomic.Uint64{},
		regs: make([]registrationState, len(o.MapServers)), resolvers: newResolverSet(len(o.Resolvers), o.ResolverBackoff), replies: limit.New(o.RatePerDestination, float64(o.BurstPerDestination))}
	for _, n := range counterNames {
		x.counts[n] = new(atomic.Uint64)
	}
	x.db.Store(newDatabase(o.EIDs, o.Resolvers, o.MapServers))
	for i, u := range o.Uplinks {
		x.locals = append(x.locals, Loc{Addr: u.Addr, Priority: o.Locators[i].Priority, Weight: o.Locators[i].Weight})
	}
	x.usableL = Usable(x.locals)
	if len(x.usableL) == 0 {
		return nil, errors.New("xtr: every RLOC has priority 255")
	}
	return x, nil
}

// ErrLocators is returned by SetLocators for settings it cannot take.
var ErrLocators = errors.New("xtr: want one priority and weight per RLOC, at least one below priority 255")

// SetLocators changes the priorities and weights of the site's RLOCs at run time (an RLOC
// taken out of service gets priority 255) and registers the new mapping at once, so that the
// mapping system, and through it the sites that look the mapping up, follow.
func (x *XTR) SetLocators(locs []Locator) error {
	if len(locs) != len(x.locals) {
		return ErrLocators
	}
	next := slices.Clone(x.locals)
	for i, l := range locs {
		next[i].Priority, next[i].Weight = l.Priority, l.Weight
	}
	usable := Usable(next)
	if len(usable) == 0 {
		return ErrLocators
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, l := range locs {
		// In place: the data loops read the addresses of x.locals without the lock.
		x.locals[i].Priority, x.locals[i].Weight = l.Priority, l.Weight
		x.o.Locators[i] = l
	}
	x.usableL = usable
	for k := range x.regs {
		x.regs[k].sent = time.Time{} // register at the next tick
	}
	x.log.Info("locators changed; registering", "locators", locs)
	return nil
}

func (x *XTR) count(name string) { x.counts[name].Add(1) }

// Counters returns the counters by name.
func (x *XTR) Counters() map[string]uint64 {
	out := make(map[string]uint64, len(x.counts))
	for k, v := range x.counts {
		out[k] = v.Load()
	}
	return out
}

// localIndex returns the uplink index of local RLOC address a, or -1.
func (x *XTR) localIndex(a netip.Addr) int {
	for i, l := range x.locals {
		if l.Addr == a {
			return i
		}
	}
	return -1
}

// install puts a Map-Reply record into the map-cache and returns the queued packets of the
// pending entries it replaces, and the decapsulated packets they held that the new mapping
// verifies. Called with mu held.
func (x *XTR) installLocked(now time.Time, r *lisp.Record) (queued, verified [][]byte) {
	p, ok := r.Prefix()
	if !ok {
		return nil, nil
	}
	// A copy: an LCAF locator's Raw bytes alias the receive buffer.
	e := &entry{prefix: p, ttl: r.TTL, locs: slices.Clone(r.Locators)}
	for i := range e.locs {
		e.locs[i].Addr.Raw = bytes.Clone(e.locs[i].Addr.Raw)
	}
	ttl := time.Duration(r.TTL) * time.Minute
	if r.TTL == 0xffffffff {
		ttl = 24 * time.Hour
	}
	e.expires = now.Add(ttl)
	if len(r.Locators) == 0 {
		e.negative, e.action = true, r.Action
	}
	for _, l := range r.Locators {
		if l.Priority == 255 || (l.Addr.AFI != lisp.AFIIPv4 && l.Addr.AFI != lisp.AFIIPv6) {
			continue
		}
		// Only RLOCs of a family we have an uplink of.
		if !slices.ContainsFunc(x.locals, func(m Loc) bool { return m.Addr.Is4() == l.Addr.IP.Is4() }) {
			continue
		}
		e.all = append(e.all, Loc{Addr: l.Addr.IP, Priority: l.Priority, Weight: l.Weight})
	}
	if !e.negative && len(e.all) == 0 {
		e.negative, e.action = true, lisp.ActDrop
	}
	e.remote = Usable(e.all)
	for i := range x.locals {
		for _, r := range e.all {
			k := pairKey{i, r.Addr}
			pr := x.pairs[k]
			if pr == nil {
				pr = &pair{local: i, remote: r.Addr}
				pr.up.Store(true) // optimistic until probes say otherwise
				pr.heard.Store(now.UnixNano())
				x.pairs[k] = pr
			}
			if x.locals[i].Addr.Is4() != r.Addr.Is4() {
				pr.up.Store(false)
			}
			e.pairs = append(e.pairs, pr)
		}
	}
	// A resolution for a more specific EID may come back with a covering prefix: the
	// pending entries it covers are released too, and the decapsulated packets they held are
	// delivered when their outer source is a locator of the new mapping.
	var gone []netip.Prefix
	var held []heldPacket
	// Pending entries are all in byNonce (at most MaxPending): no walk of the whole cache.
	for _, old := range x.byNonce {
		if q := old.prefix; old.pending && p.Contains(q.Addr()) && q.Bits() >= p.Bits() {
			queued = append(queued, old.queue...)
			held = append(held, old.held...)
			gone = append(gone, q)
		}
	}
	for _, q := range gone {
		x.cacheDeleteLocked(q)
	}
	if r.TTL == 0 {
		// "Remove now": nothing to cache, and the held packets have nowhere to go.
		x.cacheDeleteLocked(p)
		x.counts[DropNoMapping].Add(uint64(len(queued)))
		x.counts[DropOuterSource].Add(uint64(len(held)))
		return nil, nil
	}
	verified = x.verifyHeld(e, held)
	if _, ok := x.cache.Get(p); !ok && !x.roomForEntryLocked() {
		x.counts[DropCacheFull].Add(1 + uint64(len(queued)+len(verified)))
		return nil, nil
	}
	x.cacheDeleteLocked(p)
	x.cache.Insert(p, e)
	return queued, verified
}

// verifyHeld returns the held packets whose outer source is a locator of e, and counts the
// others.
func (x *XTR) verifyHeld(e *entry, held []heldPacket) (ok [][]byte) {
	for _, h := range held {
		if !e.negative && e.hasLocator(h.from) {
			ok = append(ok, h.pkt)
		} else {
			x.count(DropOuterSource)
		}
	}
	return ok
}

// cacheDeleteLocked removes the entry of p, keeping the pending accounting and the nonce
// index right.
func (x *XTR) cacheDeleteLocked(p netip.Prefix) {
	if old, ok := x.cache.Get(p); ok {
		if old.pending {
			x.pending--
		}
		if x.byNonce[old.nonce] == old {
			delete(x.byNonce, old.nonce)
		}
		x.heldBytes -= old.bytes
		x.cache.Delete(p)
	}
}

// setNonceLocked gives entry e (in the cache) the nonce of a new request.
func (x *XTR) setNonceLocked(e *entry, n uint64) {
	if x.byNonce[e.nonce] == e {
		delete(x.byNonce, e.nonce)
	}
	e.nonce = n
	x.byNonce[n] = e
}

// roomForPendingLocked reports whether another resolution may start: at most MaxPending
// at once, so that traffic to (or spoofed from) many EIDs cannot grow the cache and its held
// packets without bound.
func (x *XTR) roomForPendingLocked() bool {
	return x.pending < x.o.MaxPending && x.roomForEntryLocked()
}

// roomForEntryLocked makes room for one more map-cache entry when the cache holds
// MaxCacheEntries: the resolved entry closest to expiry goes. It reports false when every
// entry is pending.
func (x *XTR) roomForEntryLocked() bool {
	if x.cache.Len() < x.o.MaxCacheEntries {
		return true
	}
	var victim netip.Prefix
	var at time.Time
	x.cache.All(func(q netip.Prefix, e *entry) bool {
		if !e.pending && (!victim.IsValid() || e.expires.Before(at)) {
			victim, at = q, e.expires
		}
		return true
	})
	if !victim.IsValid() {
		return false
	}
	x.cacheDeleteLocked(victim)
	x.count(CountCacheEvicted)
	return true
}

// EntryStatus is a map-cache entry as `braid xtr` shows it.
type EntryStatus struct {
	Prefix    netip.Prefix    `json:"prefix"`
	Negative  bool            `json:"negative,omitempty"`
	Action    string          `json:"action,omitempty"`
	Pending   bool            `json:"pending,omitempty"`
	TTL       uint32          `json:"ttl_minutes"`
	ExpiresIn time.Duration   `json:"expires_in_ns"`
	Locators  []LocatorStatus `json:"locators,omitempty"`
}

// LocatorStatus is a remote locator of an entry.
type LocatorStatus struct {
	Address  netip.Addr `json:"address"`
	Priority uint8      `json:"priority"`
	Weight   uint8      `json:"weight"`
	Up       bool       `json:"up"` // some pair to it answers probes
}

// PairStatus is one RLOC pair.
type PairStatus struct {
	Local     netip.Addr    `json:"local"`
	Remote    netip.Addr    `json:"remote"`
	Up        bool          `json:"up"`
	RTT       time.Duration `json:"rtt_ns"`
	TxPackets uint64        `json:"tx_packets"`
	TxBytes   uint64        `json:"tx_bytes"`
	RxPackets uint64        `json:"rx_packets"`
}

// Status is the xTR's state.
type Status struct {
	Counters      map[string]uint64    `json:"counters"`
	Cache         []EntryStatus        `json:"map_cache"`
	Pairs         []PairStatus         `json:"pairs"`
	Registrations []RegistrationStatus `json:"registrations"`
	Resolvers     []ResolverStatus     `json:"map_resolvers"`
}

// RegistrationStatus is the state of registration with one map-server.
type RegistrationStatus struct {
	MapServer  netip.AddrPort `json:"map_server"`
	Registered bool           `json:"registered"`
	LastNotify time.Time      `json:"last_notify"`
}

// ActionName names a negative mapping's action.
func ActionName(a uint8) string {
	switch a {
	case lisp.ActNoAction:
		return "no-action"
	case lisp.ActNativelyForward:
		return "natively-forward"
	case lisp.ActSendMapRequest:
		return "send-map-request"
	case lisp.ActDrop:
		return "drop"
	case lisp.ActPolicyDenied:
		return "drop-policy-denied"
	case lisp.ActAuthFailure:
		return "drop-auth-failure"
	}
	return "unknown"
}

// Status returns a snapshot of the xTR's state.
func (x *XTR) Status() Status {
	now := time.Now()
	st := Status{Counters: x.Counters()}
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.cache.All(func(p netip.Prefix, e *entry) bool {
		es := EntryStatus{Prefix: p, Negative: e.negative, Pending: e.pending, TTL: e.ttl}
		if !e.pending {
			es.ExpiresIn = e.expires.Sub(now)
		}
		if e.negative {
			es.Action = ActionName(e.action)
		}
		for _, l := range e.locs {
			ls := LocatorStatus{Address: l.Addr.IP, Priority: l.Priority, Weight: l.Weight}
			for i := range x.locals {
				if pr := x.pairs[pairKey{i, l.Addr.IP}]; pr != nil && pr.up.Load() {
					ls.Up = true
				}
			}
			es.Locators = append(es.Locators, ls)
		}
		st.Cache = append(st.Cache, es)
		return true
	})
	for _, pr := range x.pairs {
		st.Pairs = append(st.Pairs, PairStatus{Local: x.locals[pr.local].Addr, Remote: pr.remote, Up: pr.up.Load(),
			RTT: time.Duration(pr.rtt.Load()), TxPackets: pr.txPackets.Load(), TxBytes: pr.txBytes.Load(), RxPackets: pr.rxPackets.Load()})
	}
	slices.SortFunc(st.Pairs, func(a, b PairStatus) int {
		if c := compareAddr(a.Local, b.Local); c != 0 {
			return c
		}
		return compareAddr(a.Remote, b.Remote)
	})
	st.Resolvers = x.resolverStatusLocked(now)
	for i, ms := range x.db.Load().MapServers {
		r := x.regs[i]
		st.Registrations = append(st.Registrations, RegistrationStatus{MapServer: ms.Addr, LastNotify: r.lastNotify,
			Registered: !r.lastNotify.IsZero() && now.Sub(r.lastNotify) < 3*x.o.RegisterInterval})
	}
	return st
}
