package xtr

import (
	"net/netip"
	"time"
)

// Redundant map-resolvers. Each resolution asks one resolver at a time: the first one in the
// configured order that is not resting after missing an answer. A request a resolver leaves
// unanswered for ResolverTimeout is sent to the next resolver not yet tried by this
// resolution, and the silent one rests: 1 s after its first miss, doubling with every
// further miss up to ResolverBackoff. A resolver whose rest is over is asked again (the next
// resolution tries it first); one answer clears its misses. New flows therefore skip a dead
// resolver without waiting for it, and at most one resolution per rest period pays the
// ResolverTimeout to find out whether it came back.

// MaxResolvers is the largest number of map-resolvers an xTR takes (a resolution remembers
// which of them it tried in one 64-bit mask).
const MaxResolvers = 64

// firstRest is how long a resolver rests after its first missed answer.
const firstRest = time.Second

// resolverHealth is what the xTR remembers of one map-resolver.
type resolverHealth struct {
	misses    int       // unanswered requests in a row
	restUntil time.Time // not asked before this while others are usable
	lastOK    time.Time
	// Logging: "did not answer" at most once per resolverLogEvery, and "answers again" only
	// after a logged "did not answer", so a resolver that answers one request in two under a
	// flood does not fill the log.
	downLogged  bool
	lastDownLog time.Time
	flaps       int // down-and-up changes not logged since the last logged one
}

// resolverLogEvery is the least time between two "did not answer" lines for one resolver.
const resolverLogEvery = 10 * time.Second

// resolverSet is the health of the configured map-resolvers, in configured order. It is pure
// (time is passed in) and not safe for concurrent use: the xTR holds mu.
type resolverSet struct {
	h       []resolverHealth
	maxRest time.Duration
}

func newResolverSet(n int, maxRest time.Duration) resolverSet {
	return resolverSet{h: make([]resolverHealth, n), maxRest: maxRest}
}

// resting reports whether resolver i is resting at now.
func (s *resolverSet) resting(i int, now time.Time) bool { return now.Before(s.h[i].restUntil) }

// pick returns the resolver to ask next for a resolution that already asked the resolvers
// in tried (bit i: resolver i): the first one in order that is not resting and not tried;
// else the untried one whose rest ends first; when every resolver was tried, the choice is
// made again among all of them.
func (s *resolverSet) pick(now time.Time, tried uint64) int {
	all := uint64(1)<<len(s.h) - 1
	if len(s.h) == MaxResolvers {
		all = ^uint64(0)
	}
	if tried&all == all {
		tried = 0
	}
	best := -1
	for i := range s.h {
		if tried&(1<<i) != 0 {
			continue
		}
		if !s.resting(i, now) {
			return i
		}
		if best < 0 || s.h[i].restUntil.Before(s.h[best].restUntil) {
			best = i
		}
	}
	return best
}

// miss records that resolver i left a request unanswered at now and reports whether it was
// usable until then (the caller logs the change once).
func (s *resolverSet) miss(i int, now time.Time) (wentDown bool) {
	h := &s.h[i]
	wentDown = h.misses == 0
	h.misses++
	rest := firstRest
	for k := 1; k < h.misses && rest < s.maxRest; k++ {
		rest *= 2
	}
	h.restUntil = now.Add(min(rest, s.maxRest))
	return wentDown
}

// ok records an answer to a request sent to resolver i and reports whether it had missed
// answers before.
func (s *resolverSet) ok(i int, now time.Time) (cameBack bool) {
	h := &s.h[i]
	cameBack = h.misses > 0
	h.misses, h.restUntil, h.lastOK = 0, time.Time{}, now
	return cameBack
}

// ResolverStatus is the state of one map-resolver as the xTR sees it.
type ResolverStatus struct {
	Address netip.AddrPort `json:"address"`
	// Up: the last request sent to it was answered, or none was left unanswered yet.
	Up bool `json:"up"`
	// Misses is the number of requests in a row it left unanswered; RetryIn how long until
	// it is asked again (0 when it is asked now).
	Misses     int           `json:"misses"`
	RetryIn    time.Duration `json:"retry_in_ns"`
	LastAnswer time.Time     `json:"last_answer"`
}

// resolverStatusLocked returns the resolvers' state. Called with mu held.
func (x *XTR) resolverStatusLocked(now time.Time) []ResolverStatus {
	rs := x.db.Load().Resolvers
	out := make([]ResolverStatus, len(rs))
	for i, a := range rs {
		h := x.resolvers.h[i]
		out[i] = ResolverStatus{Address: a, Up: h.misses == 0, Misses: h.misses, LastAnswer: h.lastOK}
		if x.resolvers.resting(i, now) {
			out[i].RetryIn = h.restUntil.Sub(now)
		}
	}
	return out
}

// attemptTimeout is how long attempt tries (0: the first request) of a resolution waits for an
// answer: ResolverTimeout while another resolver is left to try in the first round, then
// RequestTimeout (RFC 9301: Map-Requests to one destination at most once a second).
func (x *XTR) attemptTimeout(tries int) time.Duration {
	if tries < len(x.db.Load().Resolvers)-1 {
		return x.o.ResolverTimeout
	}
	return x.o.RequestTimeout
}

// askResolverLocked picks the resolver for the next request of e and records it in e.
// Called with mu held.
func (x *XTR) askResolverLocked(now time.Time, e *entry) int {
	r := x.resolvers.pick(now, e.tried)
	e.resolver = r
	e.tried |= 1 << r
	return r
}

// resolverMissLocked records that the request of e was not answered in time. Called with mu
// held.
func (x *XTR) resolverMissLocked(now time.Time, e *entry) {
	x.count(CountResolverTimeouts)
	if e.resolver < 0 || !x.resolvers.miss(e.resolver, now) { // < 0: removed by a reload
		return
	}
	h := &x.resolvers.h[e.resolver]
	if h.downLogged || (!h.lastDownLog.IsZero() && now.Sub(h.lastDownLog) < resolverLogEvery) {
		h.flaps++
		return
	}
	h.downLogged, h.lastDownLog = true, now
	x.log.Warn("map-resolver did not answer: asking the next one", "map_resolver", x.db.Load().Resolvers[e.resolver], "changes_not_logged", h.flaps)
	h.flaps = 0
}

// resolverOKLocked records the answer to the request of e. Called with mu held.
func (x *XTR) resolverOKLocked(now time.Time, e *entry) {
	if e.resolver < 0 { // removed by a reload
		return
	}
	h := &x.resolvers.h[e.resolver]
	if x.resolvers.ok(e.resolver, now) && h.downLogged {
		h.downLogged = false
		x.log.Info("map-resolver answers again", "map_resolver", x.db.Load().Resolvers[e.resolver])
	}
}

// ClearCache empties the map-cache (resolutions in progress stay): the next packet to each
// destination is resolved again, through the resolvers as they are now.
func (x *XTR) ClearCache() {
	x.mu.Lock()
	defer x.mu.Unlock()
	var gone []netip.Prefix
	x.cache.All(func(p netip.Prefix, e *entry) bool {
		if !e.pending {
			gone = append(gone, p)
		}
		return true
	})
	for _, p := range gone {
		x.cacheDeleteLocked(p)
	}
}
