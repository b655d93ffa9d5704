package xtr

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"braid/internal/lisp/lpm"
)

// database is the site's own mapping and where it goes: its EID prefixes, the map-resolvers
// its ITR asks and the map-servers its ETR registers with. Immutable.
type database struct {
	eids       lpm.Table[bool]
	EIDs       []netip.Prefix
	Resolvers  []netip.AddrPort
	MapServers []MapServer
}

func newDatabase(eids []netip.Prefix, resolvers []netip.AddrPort, servers []MapServer) *database {
	db := &database{EIDs: slices.Clone(eids), Resolvers: slices.Clone(resolvers), MapServers: slices.Clone(servers)}
	for _, p := range eids {
		db.eids.Insert(p, true)
	}
	return db
}

// Mapping is what SetMapping changes in a running xTR.
type Mapping struct {
	EIDs       []netip.Prefix
	Resolvers  []netip.AddrPort
	MapServers []MapServer
	Locators   []Locator // priority and weight of each RLOC, in the order of Options.Uplinks
}

// MappingChange is one difference SetMapping applied.
type MappingChange struct {
	What   string // e.g. "eid prefix added", "map-server removed"
	Detail string
}

// ErrMapping is returned by SetMapping for a mapping it cannot take; nothing changed.
var ErrMapping = errors.New("xtr: mapping refused")

// SetMapping replaces the site's database mapping (its EID prefixes, the priorities and
// weights of its RLOCs), its map-resolvers and its map-servers at run time (a reload). The
// map-cache stays, except entries that overlap a new EID prefix of the site; RLOC pairs and
// their probes stay; a map-server that stays keeps its registration state, unless its key
// changed. When the EIDs or locators changed, the site registers at once with every
// map-server, so that the mapping system follows; a prefix removed from the site is left to
// expire at the map-servers (the registration no longer lists it). Each change is logged.
func (x *XTR) SetMapping(m Mapping) ([]MappingChange, error) {
	switch {
	case len(m.EIDs) == 0:
		return nil, fmt.Errorf("%w: no EID prefix", ErrMapping)
	case len(m.Resolvers) == 0:
		return nil, fmt.Errorf("%w: no map-resolver", ErrMapping)
	case len(m.Resolvers) > MaxResolvers:
		return nil, fmt.Errorf("%w: %d map-resolvers: at most %d", ErrMapping, len(m.Resolvers), MaxResolvers)
	case len(m.Locators) != len(x.o.Uplinks):
		return nil, fmt.Errorf("%w: %d locator settings for %d RLOCs", ErrMapping, len(m.Locators), len(x.o.Uplinks))
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	next := slices.Clone(x.locals)
	for i, l := range m.Locators {
		next[i].Priority, next[i].Weight = l.Priority, l.Weight
	}
	usable := Usable(next)
	if len(usable) == 0 {
		return nil, ErrLocators
	}
	old := x.db.Load()
	var changes []MappingChange
	note := func(what, detail string) {
		changes = append(changes, MappingChange{What: what, Detail: detail})
		x.log.Info("reload: "+what, "detail", detail)
	}
	for _, p := range m.EIDs {
		if !slices.Contains(old.EIDs, p) {
			note("eid prefix added", p.String())
		}
	}
	for _, p := range old.EIDs {
		if !slices.Contains(m.EIDs, p) {
			note("eid prefix removed", p.String())
		}
	}
	for i, l := range m.Locators {
		if x.o.Locators[i] != l {
			note("locator changed", fmt.Sprintf("%v priority %d weight %d", x.locals[i].Addr, l.Priority, l.Weight))
		}
	}
	mappingChanged := len(changes) > 0
	for _, r := range m.Resolvers {
		if !slices.Contains(old.Resolvers, r) {
			note("map-resolver added", r.String())
		}
	}
	for _, r := range old.Resolvers {
		if !slices.Contains(m.Resolvers, r) {
			note("map-resolver removed", r.String())
		}
	}
	// Registration state by map-server: kept for one whose settings are all the same.
	regs := make([]registrationState, len(m.MapServers))
	for k, ms := range m.MapServers {
		j := slices.IndexFunc(old.MapServers, func(o MapServer) bool { return o.Addr == ms.Addr })
		switch {
		case j < 0:
			note("map-server added", ms.Addr.String())
		case !sameMapServer(old.MapServers[j], ms):
			note("map-server changed", ms.Addr.String())
		default:
			regs[k] = x.regs[j]
			if mappingChanged {
				regs[k].sent = time.Time{} // register the new mapping at the next tick
			}
		}
	}
	for _, ms := range old.MapServers {
		if !slices.ContainsFunc(m.MapServers, func(o MapServer) bool { return o.Addr == ms.Addr }) {
			note("map-server removed", ms.Addr.String())
		}
	}
	db := newDatabase(m.EIDs, m.Resolvers, m.MapServers)
	// Cached mappings over the site's own new EIDs are of no use any more.
	var stale []netip.Prefix
	x.cache.All(func(p netip.Prefix, e *entry) bool {
		for _, own := range m.EIDs {
			if p.Overlaps(own) && !slices.Contains(old.EIDs, own) {
				stale = append(stale, p)
				break
			}
		}
		return true
	})
	for _, p := range stale {
		x.cacheDeleteLocked(p)
	}
	for i, l := range m.Locators {
		// In place: the data loops read the addresses of x.locals without the lock.
		x.locals[i].Priority, x.locals[i].Weight = l.Priority, l.Weight
		x.o.Locators[i] = l
	}
	x.usableL = usable
	x.regs = regs
	if !slices.Equal(old.Resolvers, m.Resolvers) {
		x.remapResolversLocked(old.Resolvers, m.Resolvers)
	}
	x.db.Store(db)
	return changes, nil
}

// remapResolversLocked carries the health of the map-resolvers that stay over to their places
// in the new list, and the resolutions in progress too: a request outstanding at a resolver
// that stays is still its, one at a removed resolver is no one's (resolver -1: its answer or
// timeout changes no resolver's health), and the resolvers a resolution tried are renumbered.
// Called with mu held.
func (x *XTR) remapResolversLocked(old, now []netip.AddrPort) {
	where := make([]int, len(old)) // old index -> new index, -1 when removed
	next := newResolverSet(len(now), x.resolvers.maxRest)
	for i, a := range old {
		where[i] = slices.Index(now, a)
		if where[i] >= 0 {
			next.h[where[i]] = x.resolvers.h[i]
		}
	}
	x.resolvers = next
	x.cache.All(func(_ netip.Prefix, e *entry) bool {
		if !e.pending {
			return true
		}
		var tried uint64
		for i := range old {
			if e.tried&(1<<i) != 0 && where[i] >= 0 {
				tried |= 1 << where[i]
			}
		}
		e.tried = tried
		if e.resolver >= 0 && e.resolver < len(where) {
			e.resolver = where[e.resolver]
		}
		return true
	})
}

func sameMapServer(a, b MapServer) bool {
	return a.Addr == b.Addr && bytes.Equal(a.Key, b.Key) && a.KeyID == b.KeyID && a.AlgID == b.AlgID &&
		a.AuthLen == b.AuthLen && a.ProxyReply == b.ProxyReply
}
