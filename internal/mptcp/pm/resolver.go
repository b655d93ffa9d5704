package pm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"braid/internal/lisp/lpm"
	"braid/internal/lisp/xtr"
	"braid/internal/mptcp/pm/core"
	"braid/internal/wire/lisp"
)

// ResolverOptions configure the A-MPTCP policy's map-resolver client.
type ResolverOptions struct {
	Resolvers []netip.AddrPort // map-resolvers, tried in turn
	// Source is the ITR-RLOC of the requests: the address replies come back to. Default: the
	// address the system routes toward the first resolver.
	Source  netip.Addr
	Timeout time.Duration // per request; default 1 s
	Retries int           // requests sent again before giving up; default 2
	// MaxAge caps how long a mapping is used before it is asked again, below its TTL, so that
	// mapping changes are followed quickly; default 1 min. While a refresh is under way the
	// old mapping stays in use until its own TTL runs out.
	MaxAge time.Duration
	// RetryFailed is how long a lookup nobody answered stays failed; default 5 s.
	RetryFailed time.Duration
	Logger      *slog.Logger
}

// ResolverCounters count what the resolver did.
type ResolverCounters struct {
	Requests  uint64 `json:"map_requests_sent"`
	Replies   uint64 `json:"map_replies"`
	Negative  uint64 `json:"negative_replies"`
	Timeouts  uint64 `json:"lookups_unanswered"`
	Malformed uint64 `json:"replies_malformed"`
	Stray     uint64 `json:"replies_unexpected"`
	Hits      uint64 `json:"cache_hits"`
	Misses    uint64 `json:"cache_misses"`
	Cached    int    `json:"cached_mappings"`
}

// Resolver resolves EIDs through LISP map-resolvers (ECM Map-Requests, as xTRs and LIG send
// them) into a cache that honours each mapping's TTL. Mapping answers at once from the cache and
// resolves in the background; Run serves the lookups.
type Resolver struct {
	o     ResolverOptions
	log   *slog.Logger
	conn  *net.UDPConn
	src   netip.AddrPort
	write func(b []byte, to netip.AddrPort) // conn's, or a test's

	mu       sync.Mutex
	cache    lpm.Table[*cached]     // guarded by mu
	inflight map[uint64]*lookup     // by nonce; guarded by mu
	byEID    map[netip.Addr]*lookup // guarded by mu
	counters ResolverCounters       // guarded by mu
	wake     chan struct{}
	closed   sync.Once
}

// cached is one mapping (or failure) of the cache.
type cached struct {
	m       core.Mapping
	state   core.MapState
	refresh time.Time // ask again from then on
	dead    time.Time // never used after
	renew   bool      // a refresh is under way
}

type lookup struct {
	eid     netip.Addr
	nonce   uint64
	sent    time.Time
	tries   int
	started bool
}

// ErrNoResolver is returned by NewResolver without a map-resolver.
var ErrNoResolver = errors.New("pm: amptcp needs at least one map-resolver")

// NewResolver opens the resolver's socket in the calling thread's network namespace.
func NewResolver(o ResolverOptions) (*Resolver, error) {
	if len(o.Resolvers) == 0 {
		return nil, ErrNoResolver
	}
	r := newResolver(o)
	src := o.Source
	if !src.IsValid() {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(o.Resolvers[0]))
		if err != nil {
			return nil, fmt.Errorf("pm: no route to the map-resolver %v: %w", o.Resolvers[0], err)
		}
		src = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: src.AsSlice()})
	if err != nil {
		return nil, fmt.Errorf("pm: map-resolver socket on %v: %w", src, err)
	}
	r.conn = c
	r.src = netip.AddrPortFrom(src, uint16(c.LocalAddr().(*net.UDPAddr).Port))
	r.write = func(b []byte, to netip.AddrPort) { c.WriteToUDPAddrPort(b, to) }
	return r, nil
}

// newResolver is a resolver without its socket (o checked).
func newResolver(o ResolverOptions) *Resolver {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Retries <= 0 {
		o.Retries = 2
	}
	if o.MaxAge <= 0 {
		o.MaxAge = time.Minute
	}
	if o.RetryFailed <= 0 {
		o.RetryFailed = 5 * time.Second
	}
	r := &Resolver{o: o, log: o.Logger, inflight: map[uint64]*lookup{}, byEID: map[netip.Addr]*lookup{}, wake: make(chan struct{}, 1)}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	return r
}

// Close closes the socket; Run returns. Idempotent.
func (r *Resolver) Close() error {
	var err error
	r.closed.Do(func() {
		if r.conn != nil {
			err = r.conn.Close()
		}
	})
	return err
}

// Counters returns the counters.
func (r *Resolver) Counters() ResolverCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.counters
	c.Cached = r.cache.Len()
	return c
}

// Mapping implements core.MappingSource.
func (r *Resolver) Mapping(eid string) (core.Mapping, core.MapState) {
	a, err := netip.ParseAddr(eid)
	if err != nil {
		return core.Mapping{}, core.MapNone
	}
	return r.MappingAt(time.Now(), a.Unmap())
}

// MappingAt is Mapping at time now.
func (r *Resolver) MappingAt(now time.Time, a netip.Addr) (core.Mapping, core.MapState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, c, ok := r.cache.Lookup(a); ok && now.Before(c.dead) {
		if !now.Before(c.refresh) && !c.renew && c.state != core.MapNoAnswer {
			c.renew = true
			r.startLocked(a)
		}
		if c.state == core.MapNoAnswer && !now.Before(c.refresh) {
			// A failed lookup is tried again once its hold has passed.
			r.startLocked(a)
			return core.Mapping{}, core.MapPending
		}
		r.counters.Hits++
		return c.m, c.state
	}
	if r.byEID[a] == nil {
		r.counters.Misses++
	}
	r.startLocked(a)
	return core.Mapping{}, core.MapPending
}

func (r *Resolver) startLocked(a netip.Addr) {
	if r.byEID[a] != nil {
		return
	}
	l := &lookup{eid: a}
	r.byEID[a] = l
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run sends the lookups and reads the replies until ctx ends or Close.
func (r *Resolver) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	readDone := make(chan error, 1)
	go func() { readDone <- r.readLoop() }()
	go func() {
		<-ctx.Done()
		r.Close()
	}()
	tick := time.NewTicker(r.o.Timeout / 4)
	defer tick.Stop()
	for {
		select {
		case err := <-readDone:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-r.wake:
		case <-tick.C:
		}
		r.send(time.Now())
	}
}

// send starts new lookups, repeats those unanswered for Timeout and gives up on those asked
// Retries+1 times.
func (r *Resolver) send(now time.Time) {
	type out struct {
		to  netip.AddrPort
		msg []byte
	}
	var outs []out
	r.mu.Lock()
	for a, l := range r.byEID {
		if l.started && now.Sub(l.sent) < r.o.Timeout {
			continue
		}
		if l.tries > r.o.Retries {
			delete(r.byEID, a)
			delete(r.inflight, l.nonce)
			r.counters.Timeouts++
			r.log.Debug("no map-resolver answered", "eid", a, "requests", l.tries)
			c := &cached{state: core.MapNoAnswer, refresh: now.Add(r.o.RetryFailed), dead: now.Add(r.o.RetryFailed)}
			if _, old, ok := r.cache.Lookup(a); ok && now.Before(old.dead) && old.state == core.MapFound {
				// A refresh that failed: the mapping stays in use until its TTL runs out.
				old.renew = false
				old.refresh = now.Add(r.o.RetryFailed)
				continue
			}
			r.cache.Insert(netip.PrefixFrom(a, a.BitLen()), c)
			continue
		}
		delete(r.inflight, l.nonce)
		l.nonce = rand.Uint64()
		r.inflight[l.nonce] = l
		l.sent, l.started = now, true
		res := r.o.Resolvers[l.tries%len(r.o.Resolvers)]
		l.tries++
		msg, err := RequestMessage(l.eid, r.src, l.nonce)
		if err != nil {
			continue
		}
		outs = append(outs, out{res, msg})
		r.counters.Requests++
	}
	r.mu.Unlock()
	for _, o := range outs {
		r.write(o.msg, o.to)
	}
}

func (r *Resolver) readLoop() error {
	buf := make([]byte, 65536)
	for {
		n, _, err := r.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		r.reply(time.Now(), buf[:n])
	}
}

// reply takes one datagram from a resolver or an ETR.
func (r *Resolver) reply(now time.Time, b []byte) {
	nonce, rec, err := DecodeReply(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.counters.Malformed++
		return
	}
	l := r.inflight[nonce]
	if l == nil {
		r.counters.Stray++
		return
	}
	delete(r.inflight, nonce)
	delete(r.byEID, l.eid)
	r.counters.Replies++
	if rec.State == core.MapNone {
		r.counters.Negative++
	}
	ttl := max(rec.TTL, time.Second) // TTL 0 means "ask again", not "ask in a loop"
	c := &cached{m: rec.Mapping, state: rec.State, refresh: now.Add(min(ttl, r.o.MaxAge)), dead: now.Add(ttl)}
	p := rec.Prefix
	if !p.Contains(l.eid) {
		// A reply for another prefix than the one asked: keep it for the address only.
		p = netip.PrefixFrom(l.eid, l.eid.BitLen())
	}
	// A more specific entry left by an earlier failure must not hide the new mapping.
	r.cache.Delete(netip.PrefixFrom(l.eid, l.eid.BitLen()))
	r.cache.Insert(p, c)
	if old := r.cache.Len(); old > 65536 {
		r.cache = lpm.Table[*cached]{}
		r.cache.Insert(p, c)
	}
}

// Reply is what a Map-Reply says of the EID asked.
type Reply struct {
	Prefix  netip.Prefix
	Mapping core.Mapping
	State   core.MapState // MapFound, MapNone (negative) or MapNoLocator
	TTL     time.Duration // the record's TTL (an unspecified TTL is a day)
}

// ErrNotReply is returned by DecodeReply for a message that is no usable Map-Reply.
var ErrNotReply = errors.New("pm: not a Map-Reply with an EID record")

// DecodeReply decodes a Map-Reply and its first record into the policy's terms; the usable
// locators are those the xTRs place over (xtr.Usable: best priority below 255).
func DecodeReply(b []byte) (nonce uint64, r Reply, err error) {
	if lisp.Type(b) != lisp.TypeMapReply {
		return 0, Reply{}, ErrNotReply
	}
	var m lisp.MapReply
	if _, err := m.Decode(b); err != nil {
		return 0, Reply{}, fmt.Errorf("%w: %w", ErrNotReply, err)
	}
	if m.Flags&lisp.ReplyProbe != 0 || len(m.Records) == 0 {
		return m.Nonce, Reply{}, ErrNotReply
	}
	rec := &m.Records[0]
	p, ok := rec.Prefix()
	if !ok {
		return m.Nonce, Reply{}, ErrNotReply
	}
	r.Prefix = p
	switch rec.TTL {
	case 0xffffffff:
		r.TTL = 24 * time.Hour
	default:
		r.TTL = time.Duration(rec.TTL) * time.Minute
	}
	var locs []xtr.Loc
	for _, l := range rec.Locators {
		if l.Addr.IP.IsValid() {
			locs = append(locs, xtr.Loc{Addr: l.Addr.IP, Priority: l.Priority, Weight: l.Weight})
		}
	}
	r.Mapping = core.Mapping{Prefix: p.String(), Usable: len(xtr.Usable(locs))}
	switch {
	case len(rec.Locators) == 0:
		r.State = core.MapNone
	case r.Mapping.Usable == 0:
		r.State = core.MapNoLocator
	default:
		r.State = core.MapFound
	}
	return m.Nonce, r, nil
}

// RequestMessage is an ECM-encapsulated Map-Request for eid whose replies go to local (the
// only ITR-RLOC, and the inner source port).
func RequestMessage(eid netip.Addr, local netip.AddrPort, nonce uint64) ([]byte, error) {
	req := lisp.MapRequest{Nonce: nonce, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(local.Addr())},
		Records: []lisp.RequestRecord{{MaskLen: uint8(eid.BitLen()), EID: lisp.AddrFrom(eid)}}}
	src := local.Addr()
	if src.Is4() != eid.Is4() {
		src = netip.IPv6Unspecified()
		if eid.Is4() {
			src = netip.IPv4Unspecified()
		}
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(src, local.Port()), Dst: netip.AddrPortFrom(eid, lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	if e.Encode(b) == 0 {
		return nil, fmt.Errorf("pm: cannot encode a Map-Request for %v", eid)
	}
	return b, nil
}
