// Package mapserver is a LISP Map-Server and Map-Resolver (RFC 9301 §8): it takes authenticated
// Map-Registers from the ETRs of configured sites, keeps their mappings until they expire, and
// answers Map-Requests encapsulated in ECMs — itself (proxy reply) or by forwarding them to a
// registered ETR — with negative Map-Replies for space no site holds. Handle is the whole
// protocol as a function of (time, source, datagram) returning datagrams to send, so that it is
// tested without sockets; Serve runs it on a UDP socket.
package mapserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/lisp/limit"
	"braid/internal/lisp/lpm"
	"braid/internal/wire/lisp"
)

// Site is a LISP site the Map-Server serves: its keys and the EID prefixes it may register.
type Site struct {
	Name       string
	Keys       map[uint8][]byte // by Key ID
	Prefixes   []netip.Prefix
	ProxyReply bool // answer Map-Requests for the site even when its registrations do not ask
	// TimestampNonces: the site's xTRs put the time of sending in every non-zero Map-Register
	// nonce (Unix nanoseconds, as braid xtr does), and a registration whose nonce is more than
	// ReplayWindow away from the server's clock is refused. Without it a captured registration
	// can be replayed once its nonce has left the replay window (ten minutes).
	TimestampNonces bool
}

// Config is the server's configuration.
type Config struct {
	// MapServer: take registrations and answer for registered sites. MapResolver: take
	// Map-Requests from ITRs (ECM). Both may be set.
	MapServer, MapResolver bool
	Sites                  []Site
	// Forward is where a resolver without the map-server role sends Map-Requests.
	Forward []netip.AddrPort
	// RegistrationTimeout drops a registration not refreshed for this long (RFC 9301: 3 min),
	// unless it asked to be timed out by its record TTL (T bit).
	RegistrationTimeout time.Duration
	NegativeTTL         uint32 // minutes, for space no site holds (default 15)
	UnregisteredTTL     uint32 // minutes, for a configured site that is not registered (default 1)
	// RatePerSource and BurstPerSource bound the messages taken from one source address
	// (token bucket); 0 disables the limit.
	RatePerSource  float64
	BurstPerSource int
	// RatePerDestination and BurstPerDestination bound the Map-Replies sent to one address
	// (token bucket): a request names where its reply goes (the ITR-RLOC), so without this
	// limit the server reflects floods onto any address. 0 disables the limit.
	RatePerDestination  float64
	BurstPerDestination int
	// MaxAmplification bounds a Map-Reply's length to this many times its request's: records
	// that do not fit are left out (the ITR asks again), and a reply whose first record does
	// not fit is not sent. 0 disables the bound.
	MaxAmplification float64
	// ReplayWindow is how long Map-Register nonces are remembered to refuse replays.
	ReplayWindow time.Duration
	Logger       *slog.Logger
}

// Defaults returns a map-server and map-resolver without sites.
func Defaults() Config {
	return Config{
		MapServer: true, MapResolver: true,
		RegistrationTimeout: 3 * time.Minute,
		NegativeTTL:         15,
		UnregisteredTTL:     1,
		RatePerSource:       1000,
		BurstPerSource:      1000,
		RatePerDestination:  100,
		BurstPerDestination: 200,
		MaxAmplification:    3,
		ReplayWindow:        10 * time.Minute,
	}
}

// Drop reasons and events, the labels of the counters.
const (
	CountRegistered      = "registrations_accepted"
	CountDeregistered    = "deregistrations"
	CountExpired         = "registrations_expired"
	CountNotifySent      = "map_notify_sent"
	CountNotifyAck       = "map_notify_ack_received"
	CountRequests        = "map_requests"
	CountReplies         = "map_replies_sent"
	CountNegative        = "negative_replies_sent"
	CountForwarded       = "map_requests_forwarded"
	DropTruncated        = "drop_truncated"
	DropMalformed        = "drop_malformed"
	DropUnknownType      = "drop_unknown_type"
	DropUnknownAFI       = "drop_unknown_afi"
	DropNotEncapsulated  = "drop_request_not_encapsulated"
	DropRoleDisabled     = "drop_role_disabled"
	DropNoAuth           = "drop_auth_missing"
	DropBadAuth          = "drop_auth_failed"
	DropAuthAlgorithm    = "drop_auth_algorithm"
	DropUnknownKeyID     = "drop_auth_key_id"
	DropUnknownSite      = "drop_no_site_for_prefix"
	DropNotOwned         = "drop_prefix_not_owned"
	DropReplay           = "drop_replayed_nonce"
	DropStale            = "drop_stale_nonce"
	DropNoLocator        = "drop_no_registered_locator"
	DropRateLimited      = "drop_rate_limited"
	DropRateLimitedDst   = "drop_reply_rate_limited"
	DropAmplification    = "drop_reply_too_large"
	CountRecordsCut      = "reply_records_left_out"
	DropNoITRRLOC        = "drop_no_usable_itr_rloc"
	DropInstanceID       = "drop_instance_id"
	DropNoRoute          = "drop_no_map_server"
	DropUnsolicitedReply = "drop_unexpected_message"
)

var counterNames = []string{
	CountRegistered, CountDeregistered, CountExpired, CountNotifySent, CountNotifyAck, CountRequests,
	CountReplies, CountNegative, CountForwarded, DropTruncated, DropMalformed, DropUnknownType,
	DropUnknownAFI, DropNotEncapsulated, DropRoleDisabled, DropNoAuth, DropBadAuth, DropAuthAlgorithm,
	DropUnknownKeyID, DropUnknownSite, DropNotOwned, DropReplay, DropStale, DropNoLocator, DropRateLimited, DropRateLimitedDst, DropAmplification, CountRecordsCut, DropNoITRRLOC,
	DropInstanceID, DropNoRoute, DropUnsolicitedReply,
}

// Packet is a datagram to send.
type Packet struct {
	To   netip.AddrPort
	Data []byte
}

// registration is one registered EID prefix (the key of the table it is stored in). A map
// server holds a million of them, so it keeps only what replies and forwarding need: 88
// bytes, and the locators are shared by every registration with the same locator set from
// one Map-Register, and across refreshes (docs/lisp.md "Scale").
type registration struct {
	site       *site
	etr        netip.AddrPort
	locators   []lisp.Locator // as registered; shared: never modified
	registered int64          // Unix nanoseconds
	expires    int64          // Unix nanoseconds
	ttl        uint32         // record TTL, minutes
	mapVersion uint16
	action     uint8
	proxy      bool
}

type site struct {
	Site
	nonces map[uint64]time.Time // recent Map-Register nonces; guarded by Server.mu
}

// siteSet is the configured sites and the prefixes each may register; immutable.
type siteSet struct {
	configured lpm.Table[*site]
	list       []*site
}

// newSiteSet checks that no prefix is configured twice; keep supplies the state of sites
// that stay (nil: every site is new).
func newSiteSet(sites []Site, keep func(Site) *site) (*siteSet, error) {
	set := &siteSet{}
	names := map[string]bool{}
	for _, c := range sites {
		if names[c.Name] {
			return nil, fmt.Errorf("mapserver: site %s is configured twice", c.Name)
		}
		names[c.Name] = true
		var st *site
		if keep != nil {
			st = keep(c)
		}
		if st == nil {
			st = &site{Site: c, nonces: map[uint64]time.Time{}}
		}
		set.list = append(set.list, st)
		for _, p := range c.Prefixes {
			if other, ok := set.configured.Get(p); ok {
				return nil, fmt.Errorf("mapserver: prefix %v is configured for sites %s and %s", p, other.Name, c.Name)
			}
			set.configured.Insert(p, st)
		}
	}
	return set, nil
}

// Server is the Map-Server/Map-Resolver. Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger
	// sites is the configured sites, replaced whole by SetSites (under mu, so that a
	// registration is stored under the site set it was checked against).
	sites atomic.Pointer[siteSet]

	mu   sync.RWMutex
	regs lpm.Table[*registration] // guarded by mu

	limiter     *limit.Limiter // per source
	replies     *limit.Limiter // per reply destination
	logs        *limit.Limiter // log lines about outside events
	logsDropped atomic.Uint64
	counts      map[string]*atomic.Uint64 // fixed set of keys; values atomic
	fwd         atomic.Uint32
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if !cfg.MapServer && !cfg.MapResolver {
		return nil, errors.New("mapserver: neither the map-server nor the map-resolver role is on")
	}
	if !cfg.MapServer && len(cfg.Forward) == 0 {
		return nil, errors.New("mapserver: a map-resolver alone needs map-servers to forward to")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, counts: map[string]*atomic.Uint64{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, n := range counterNames {
		s.counts[n] = new(atomic.Uint64)
	}
	s.limiter = limit.New(cfg.RatePerSource, float64(cfg.BurstPerSource))
	s.replies = limit.New(cfg.RatePerDestination, float64(cfg.BurstPerDestination))
	s.logs = limit.New(10, 20)
	set, err := newSiteSet(cfg.Sites, nil)
	if err != nil {
		return nil, err
	}
	s.sites.Store(set)
	return s, nil
}

func (s *Server) count(name string) { s.counts[name].Add(1) }

// Counters returns every counter by name.
func (s *Server) Counters() map[string]uint64 {
	out := make(map[string]uint64, len(s.counts))
	for k, v := range s.counts {
		out[k] = v.Load()
	}
	return out
}

// Handle processes the datagram b from from at time now and appends what to send to out.
func (s *Server) Handle(now time.Time, from netip.AddrPort, b []byte, out []Packet) []Packet {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	if !s.limiter.Allow(from.Addr(), now) {
		s.count(DropRateLimited)
		return out
	}
	switch lisp.Type(b) {
	case lisp.TypeMapRegister:
		if !s.cfg.MapServer {
			s.count(DropRoleDisabled)
			return out
		}
		return s.register(now, from, b, out)
	case lisp.TypeECM:
		return s.request(now, from, b, out)
	case lisp.TypeMapRequest:
		s.count(DropNotEncapsulated)
	case lisp.TypeMapNotifyAck:
		s.count(CountNotifyAck)
	case lisp.TypeMapReply, lisp.TypeMapNotify:
		s.count(DropUnsolicitedReply)
	default:
		s.count(DropUnknownType)
	}
	return out
}

// decodeDrop counts a decode error by its kind.
func (s *Server) decodeDrop(err error) {
	switch {
	case errors.Is(err, lisp.ErrTruncated):
		s.count(DropTruncated)
	case errors.Is(err, lisp.ErrAFI):
		s.count(DropUnknownAFI)
	default:
		s.count(DropMalformed)
	}
}

func (s *Server) register(now time.Time, from netip.AddrPort, b []byte, out []Packet) []Packet {
	var m lisp.MapRegister
	n, err := m.Decode(b)
	if err != nil {
		s.decodeDrop(err)
		return out
	}
	msg := b[:n]
	if len(m.Records) == 0 {
		s.count(DropMalformed)
		return out
	}
	prefixes := make([]netip.Prefix, len(m.Records))
	for i := range m.Records {
		r := &m.Records[i]
		if r.EID.AFI == lisp.AFILCAF && (r.EID.LCAFType != lisp.LCAFInstanceID || r.EID.InstanceID != 0) {
			s.count(DropInstanceID)
			return out
		}
		p, ok := r.Prefix()
		if !ok {
			s.count(DropMalformed)
			return out
		}
		prefixes[i] = p
	}
	set := s.sites.Load()
	_, st, ok := set.configured.LookupPrefix(prefixes[0])
	if !ok {
		s.count(DropUnknownSite)
		return out
	}
	key, ok := st.Keys[m.KeyID]
	if !ok {
		s.count(DropUnknownKeyID)
		s.logLimited(now, slog.LevelWarn, "map-register refused: authentication", "site", st.Name, "from", from, "key_id", m.KeyID, "err", "unknown key ID")
		return out
	}
	if err := lisp.Verify(msg, key); err != nil {
		switch {
		case errors.Is(err, lisp.ErrNoAuth):
			s.count(DropNoAuth)
		case errors.Is(err, lisp.ErrAlgorithm), errors.Is(err, lisp.ErrAuthLength):
			s.count(DropAuthAlgorithm)
		default:
			s.count(DropBadAuth)
		}
		s.logLimited(now, slog.LevelWarn, "map-register refused: authentication", "site", st.Name, "from", from, "key_id", m.KeyID, "err", err)
		return out
	}
	for _, p := range prefixes {
		if !st.owns(p) {
			s.count(DropNotOwned)
			s.logLimited(now, slog.LevelWarn, "map-register refused: prefix not owned by the site", "site", st.Name, "prefix", p, "from", from)
			return out
		}
	}
	// Freshness. Nonce 0 (no Map-Notify wanted) carries none: RFC 9301 sends every such
	// registration with the same nonce, so it is neither remembered nor refused; a replay of
	// one can only re-install locators the site itself signed (requests are forwarded to those
	// locators, never to the sender's address).
	if m.Nonce != 0 && st.TimestampNonces {
		if d := now.Sub(time.Unix(0, int64(m.Nonce))); d > s.cfg.ReplayWindow || d < -s.cfg.ReplayWindow {
			s.count(DropStale)
			s.logLimited(now, slog.LevelWarn, "map-register refused: nonce is not a current timestamp (a replay, or clocks apart)", "site", st.Name, "from", from, "age", d)
			return out
		}
	}
	s.mu.Lock()
	if s.sites.Load() != set {
		// SetSites replaced the sites since the checks above: check again under the new ones.
		s.mu.Unlock()
		return s.register(now, from, b, out)
	}
	if m.Nonce != 0 {
		if t, seen := st.nonces[m.Nonce]; seen && now.Sub(t) < s.cfg.ReplayWindow {
			s.mu.Unlock()
			s.count(DropReplay)
			s.logLimited(now, slog.LevelWarn, "map-register refused: nonce seen before (a replay)", "site", st.Name, "from", from)
			return out
		}
		st.nonces[m.Nonce] = now
	}
	type change struct {
		prefix netip.Prefix
		locs   []lisp.Locator
	}
	var changed []change
	var shared []lisp.Locator // the locators stored for the previous record
	for i := range m.Records {
		r := &m.Records[i]
		if r.TTL == 0 {
			if s.regs.Delete(prefixes[i]) {
				s.count(CountDeregistered)
			}
			continue
		}
		old, ok := s.regs.Get(prefixes[i])
		// One copy of a locator set for every record of the message that has it, kept
		// across refreshes: a locator's Raw bytes alias the receive buffer, and most sites
		// register all their prefixes with the same locators.
		switch {
		case shared != nil && identicalLocators(shared, r.Locators):
		case ok && identicalLocators(old.locators, r.Locators):
			shared = old.locators
		default:
			shared = cloneLocators(r.Locators)
		}
		expires := now.Add(s.cfg.RegistrationTimeout)
		if m.Flags&lisp.RegTTLTimeout != 0 && r.TTL != 0xffffffff {
			expires = now.Add(time.Duration(r.TTL) * time.Minute)
		}
		if !ok || old.etr != from || !slices.EqualFunc(old.locators, r.Locators, sameLocator) {
			changed = append(changed, change{prefixes[i], shared})
		}
		reg := old
		if !ok {
			reg = &registration{registered: now.UnixNano()}
			s.regs.Insert(prefixes[i], reg)
		}
		// In place for a refresh: readers hold mu.RLock, this holds mu.
		reg.site, reg.etr, reg.locators, reg.expires = st, from, shared, expires.UnixNano()
		reg.ttl, reg.mapVersion, reg.action = r.TTL, r.MapVersion, r.Action
		reg.proxy = m.Flags&lisp.RegProxyReply != 0 || st.ProxyReply
		s.count(CountRegistered)
	}
	s.mu.Unlock()
	// New or changed registrations are logged (refreshes are not: one a minute per site).
	for _, c := range changed {
		locs := make([]string, len(c.locs))
		for j, l := range c.locs {
			locs[j] = fmt.Sprintf("%v/%d/%d", l.Addr.IP, l.Priority, l.Weight)
		}
		s.logLimited(now, slog.LevelInfo, "registration accepted", "site", st.Name, "prefix", c.prefix, "from", from, "locators", locs)
	}
	if m.Flags&lisp.RegWantNotify == 0 {
		return out
	}
	// The solicited Map-Notify: same nonce and key, the records echoed, signed.
	nt := lisp.MapRegister{Type: lisp.TypeMapNotify, Nonce: m.Nonce, KeyID: m.KeyID, AlgID: m.AlgID,
		AuthData: make([]byte, len(m.AuthData)), Records: m.Records}
	for i := range nt.Records {
		for j := range nt.Records[i].Locators {
			nt.Records[i].Locators[j].Flags &^= lisp.LocLocal | lisp.LocProbed
		}
	}
	buf := make([]byte, nt.Len())
	nt.Encode(buf)
	if err := lisp.Sign(buf, key); err != nil {
		return out
	}
	s.count(CountNotifySent)
	return append(out, Packet{To: from, Data: buf})
}

// cloneLocators copies locators out of a decoded message: an LCAF locator's Raw bytes alias
// the receive buffer, which the next datagram overwrites.
func cloneLocators(ls []lisp.Locator) []lisp.Locator {
	out := slices.Clone(ls)
	for i := range out {
		out[i].Addr.Raw = bytes.Clone(out[i].Addr.Raw)
	}
	return out
}

// identicalLocators reports whether a and b are the same locators, field for field.
func identicalLocators(a, b []lisp.Locator) bool {
	return slices.EqualFunc(a, b, func(x, y lisp.Locator) bool {
		return x.Priority == y.Priority && x.Weight == y.Weight && x.MPriority == y.MPriority && x.MWeight == y.MWeight &&
			x.Flags == y.Flags && x.Addr.AFI == y.Addr.AFI && x.Addr.IP == y.Addr.IP && x.Addr.LCAFType == y.Addr.LCAFType &&
			x.Addr.LCAFFlags == y.Addr.LCAFFlags && x.Addr.IIDMaskLen == y.Addr.IIDMaskLen && x.Addr.InstanceID == y.Addr.InstanceID &&
			bytes.Equal(x.Addr.Raw, y.Addr.Raw)
	})
}

func sameLocator(a, b lisp.Locator) bool {
	return a.Addr.IP == b.Addr.IP && a.Priority == b.Priority && a.Weight == b.Weight && a.Flags == b.Flags
}

// logLimited logs unless more than 10 lines a second (bursts of 20) went out already: the
// events it reports (registrations, refused registrations) are triggered from outside. The
// number of lines left out is reported with the next one.
func (s *Server) logLimited(now time.Time, level slog.Level, msg string, args ...any) {
	if !s.logs.Allow(netip.Addr{}, now) {
		s.logsDropped.Add(1)
		return
	}
	if n := s.logsDropped.Swap(0); n > 0 {
		args = append(args, "log_lines_left_out", n)
	}
	s.log.Log(context.Background(), level, msg, args...)
}

func (st *site) owns(p netip.Prefix) bool {
	for _, q := range st.Prefixes {
		if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func (s *Server) request(now time.Time, from netip.AddrPort, b []byte, out []Packet) []Packet {
	var e lisp.ECM
	n, err := e.Decode(b)
	if err != nil {
		s.decodeDrop(err)
		return out
	}
	inner := b[n : n+int(e.Inner.PayloadLen)]
	if lisp.Type(inner) != lisp.TypeMapRequest {
		s.count(DropUnknownType)
		return out
	}
	var req lisp.MapRequest
	if _, err := req.Decode(inner); err != nil {
		s.decodeDrop(err)
		return out
	}
	s.count(CountRequests)
	// The reply goes to the first ITR-RLOC of a family we can reach, at the inner source port.
	var to netip.AddrPort
	for _, a := range req.ITRRLOCs {
		if a.AFI == lisp.AFIIPv4 || a.AFI == lisp.AFIIPv6 {
			to = netip.AddrPortFrom(a.IP, e.Inner.Src.Port())
			break
		}
	}
	if !to.IsValid() || to.Port() == 0 {
		s.count(DropNoITRRLOC)
		return out
	}
	if !s.cfg.MapServer {
		ms := s.cfg.Forward[int(s.fwd.Add(1))%len(s.cfg.Forward)]
		s.count(CountForwarded)
		return append(out, Packet{To: ms, Data: slices.Clone(b[:n+len(inner)])})
	}
	rep := lisp.MapReply{Nonce: req.Nonce, Records: make([]lisp.Record, 0, min(len(req.Records), 8))}
	negative := false
	// The reply may be at most MaxAmplification times the request (the ECM as received).
	budget := int(s.cfg.MaxAmplification * float64(n+len(inner)))
	for i := range req.Records {
		rr := &req.Records[i]
		if rr.EID.AFI == lisp.AFILCAF && (rr.EID.LCAFType != lisp.LCAFInstanceID || rr.EID.InstanceID != 0) {
			s.count(DropInstanceID)
			return out
		}
		q, ok := rr.Prefix()
		if !ok {
			s.count(DropMalformed)
			return out
		}
		s.mu.RLock()
		p, reg, found := s.regs.LookupPrefix(q)
		var rec lisp.Record
		var etr netip.AddrPort
		if found {
			if !reg.proxy && len(req.Records) == 1 && s.cfg.MapServer {
				etr = forwardTarget(reg, from.Addr().Is4())
				if !etr.IsValid() {
					s.mu.RUnlock()
					s.count(DropNoLocator)
					return out
				}
			} else {
				rec = lisp.Record{TTL: reg.ttl, MapVersion: reg.mapVersion, Action: reg.action, Locators: slices.Clone(reg.locators)}
			}
		}
		s.mu.RUnlock()
		switch {
		case etr.IsValid():
			// Forward to the registered ETR, which answers the ITR itself (A=1).
			s.count(CountForwarded)
			return append(out, Packet{To: etr, Data: slices.Clone(b[:n+len(inner)])})
		case found:
			rec.Authoritative = false
			rec.EID = lisp.AddrFrom(p.Addr())
			rec.MaskLen = uint8(p.Bits())
			for j := range rec.Locators {
				rec.Locators[j].Flags &^= lisp.LocLocal | lisp.LocProbed
			}
		default:
			negative = true
			rec = s.negative(q)
		}
		if s.cfg.MaxAmplification > 0 && rep.Len()+rec.Len() > budget {
			if len(rep.Records) == 0 {
				s.count(DropAmplification)
				return out
			}
			s.counts[CountRecordsCut].Add(uint64(len(req.Records) - i))
			break
		}
		rep.Records = append(rep.Records, rec)
	}
	if !s.replies.Allow(to.Addr(), now) {
		s.count(DropRateLimitedDst)
		return out
	}
	buf := make([]byte, rep.Len())
	rep.Encode(buf)
	s.count(CountReplies)
	if negative {
		s.count(CountNegative)
	}
	return append(out, Packet{To: to, Data: buf})
}

// forwardTarget is where a Map-Request for reg goes: a locator of the signed record, never the
// address the registration came from (a replayed registration must not redirect requests to
// its sender). The sender is preferred when it is one of the record's locators; otherwise the
// best reachable locator of the family the request came in on (the family this server can
// send), then of any family.
func forwardTarget(reg *registration, v4 bool) netip.AddrPort {
	var best netip.Addr
	bestPri, bestFam := 256, false
	for _, l := range reg.locators {
		if l.Addr.AFI != lisp.AFIIPv4 && l.Addr.AFI != lisp.AFIIPv6 || l.Priority == 255 || l.Flags&lisp.LocReachable == 0 {
			continue
		}
		a := l.Addr.IP.Unmap()
		if a == reg.etr.Addr() {
			return netip.AddrPortFrom(a, lisp.ControlPort)
		}
		fam := a.Is4() == v4
		if (fam && !bestFam) || (fam == bestFam && int(l.Priority) < bestPri) {
			best, bestPri, bestFam = a, int(l.Priority), fam
		}
	}
	if !best.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(best, lisp.ControlPort)
}

// negative returns the negative record for q: the queried prefix of a configured site that is
// not registered, or the largest prefix around q that no site holds.
func (s *Server) negative(q netip.Prefix) lisp.Record {
	r := lisp.Record{Action: lisp.ActNativelyForward, Authoritative: true}
	set := s.sites.Load()
	if _, _, ok := set.configured.LookupPrefix(q); ok {
		r.TTL, r.EID, r.MaskLen = s.cfg.UnregisteredTTL, lisp.AddrFrom(q.Addr()), uint8(q.Bits())
		return r
	}
	p, ok := set.configured.Uncovered(q.Addr())
	if !ok || p.Bits() > q.Bits() {
		// q itself contains configured space: answer for the queried prefix only.
		p = q
	}
	r.TTL, r.EID, r.MaskLen = s.cfg.NegativeTTL, lisp.AddrFrom(p.Addr()), uint8(p.Bits())
	return r
}

// Expire removes registrations past their time, forgets old nonces and idle rate buckets.
func (s *Server) Expire(now time.Time) {
	s.mu.Lock()
	var gone []netip.Prefix
	s.regs.All(func(p netip.Prefix, r *registration) bool {
		if now.UnixNano() >= r.expires {
			gone = append(gone, p)
		}
		return true
	})
	for _, p := range gone {
		s.regs.Delete(p)
		s.count(CountExpired)
		s.log.Info("registration expired", "prefix", p)
	}
	for _, st := range s.sites.Load().list {
		for n, t := range st.nonces {
			if now.Sub(t) >= s.cfg.ReplayWindow {
				delete(st.nonces, n)
			}
		}
	}
	s.mu.Unlock()
	s.limiter.Prune(now)
	s.replies.Prune(now)
}

// RegisteredPrefixes returns the number of registered EID prefixes.
func (s *Server) RegisteredPrefixes() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.regs.Len()
}

// Registration is one row of the registration table.
type Registration struct {
	Site       string        `json:"site"`
	Prefix     netip.Prefix  `json:"prefix"`
	ETR        string        `json:"etr"`
	ProxyReply bool          `json:"proxy_reply"`
	TTL        uint32        `json:"ttl_minutes"`
	Registered time.Time     `json:"registered"`
	ExpiresIn  time.Duration `json:"expires_in_ns"`
	Locators   []LocatorView `json:"locators"`
}

// LocatorView is a registered locator.
type LocatorView struct {
	Address   netip.Addr `json:"address"`
	Priority  uint8      `json:"priority"`
	Weight    uint8      `json:"weight"`
	Reachable bool       `json:"reachable"`
}

// Registrations returns the registration table, in prefix order.
func (s *Server) Registrations(now time.Time) []Registration {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Registration
	s.regs.All(func(p netip.Prefix, r *registration) bool {
		v := Registration{Site: r.site.Name, Prefix: p, ETR: r.etr.String(), ProxyReply: r.proxy, TTL: r.ttl,
			Registered: time.Unix(0, r.registered), ExpiresIn: time.Duration(r.expires - now.UnixNano())}
		for _, l := range r.locators {
			v.Locators = append(v.Locators, LocatorView{Address: l.Addr.IP, Priority: l.Priority, Weight: l.Weight, Reachable: l.Flags&lisp.LocReachable != 0})
		}
		out = append(out, v)
		return true
	})
	return out
}

// Serve runs the server on conn until ctx ends, with one reader per CPU, and expires
// registrations every second. It closes conn when it returns.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		conn.Close()
	})
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				s.Expire(now)
			}
		}
	})
	errc := make(chan error, runtime.NumCPU())
	for range runtime.NumCPU() {
		wg.Go(func() {
			buf := make([]byte, 65536)
			var out []Packet
			for {
				n, from, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
						cancel()
					}
					return
				}
				out = s.Handle(time.Now(), from, buf[:n], out[:0])
				for _, p := range out {
					conn.WriteToUDPAddrPort(p.Data, p.To)
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("mapserver: %w", err)
	default:
		return nil
	}
}

// Nonce returns a random 64-bit nonce.
func Nonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
