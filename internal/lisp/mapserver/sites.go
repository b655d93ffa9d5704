package mapserver

import (
	"maps"
	"net/netip"
	"slices"
)

// SiteChange is one difference SetSites applied.
type SiteChange struct {
	What string // "site added", "site removed", "site changed"
	Site string
	// For a changed site: what changed (keys, prefixes, proxy_reply, replay) and the
	// registrations it dropped (prefixes the site no longer owns).
	Changed []string
	Dropped []netip.Prefix
}

// SetSites replaces the configured sites (a reload). A site that stays as it was keeps its
// registrations and its replay state; a changed site keeps the registrations of prefixes it
// still owns (a new key applies to its next registration) and its replay state; a removed
// site's registrations are dropped at once. Each change is logged on one line. On an error
// (a prefix configured for two sites) nothing changes.
func (s *Server) SetSites(sites []Site) ([]SiteChange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.sites.Load()
	byName := map[string]*site{}
	for _, st := range old.list {
		byName[st.Name] = st
	}
	var changes []SiteChange
	next, err := newSiteSet(sites, func(c Site) *site {
		st, ok := byName[c.Name]
		if !ok {
			changes = append(changes, SiteChange{What: "site added", Site: c.Name})
			return nil
		}
		what := siteDiff(st.Site, c)
		if len(what) == 0 {
			return st
		}
		changes = append(changes, SiteChange{What: "site changed", Site: c.Name, Changed: what})
		// The replay state goes with the site: a registration captured before the reload
		// is still a replay after it.
		return &site{Site: c, nonces: st.nonces}
	})
	if err != nil {
		return nil, err
	}
	current := map[string]*site{}
	for _, st := range next.list {
		current[st.Name] = st
	}
	for _, st := range old.list {
		if _, ok := current[st.Name]; !ok {
			changes = append(changes, SiteChange{What: "site removed", Site: st.Name})
		}
	}
	// Registrations follow their site: kept (pointing at its new state) while it owns the
	// prefix, dropped otherwise.
	var gone []netip.Prefix
	dropped := map[string][]netip.Prefix{}
	s.regs.All(func(p netip.Prefix, r *registration) bool {
		st, ok := current[r.site.Name]
		if ok && st.owns(p) {
			r.site = st
			return true
		}
		gone = append(gone, p)
		dropped[r.site.Name] = append(dropped[r.site.Name], p)
		return true
	})
	for _, p := range gone {
		s.regs.Delete(p)
	}
	for i := range changes {
		c := &changes[i]
		c.Dropped = dropped[c.Site]
		args := []any{"site", c.Site}
		if len(c.Changed) > 0 {
			args = append(args, "changed", c.Changed)
		}
		if len(c.Dropped) > 0 {
			args = append(args, "registrations_dropped", c.Dropped)
		}
		s.log.Info("reload: "+c.What, args...)
	}
	s.sites.Store(next)
	return changes, nil
}

// siteDiff names the settings that differ between a and b.
func siteDiff(a, b Site) []string {
	var what []string
	if !maps.EqualFunc(a.Keys, b.Keys, slices.Equal) {
		what = append(what, "keys")
	}
	if !slices.Equal(a.Prefixes, b.Prefixes) {
		what = append(what, "prefixes")
	}
	if a.ProxyReply != b.ProxyReply {
		what = append(what, "proxy_reply")
	}
	if a.TimestampNonces != b.TimestampNonces {
		what = append(what, "replay")
	}
	return what
}

// Sites returns the names of the configured sites.
func (s *Server) Sites() []string {
	var out []string
	for _, st := range s.sites.Load().list {
		out = append(out, st.Name)
	}
	return out
}
