package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Reload (docs/proxy.md, "Reload") applies a changed set of tenants to a running proxy. A
// tenant is known by its name:
//   - a tenant that is no longer there is removed: its listeners close, its pools empty, and
//     its connections (under way, pooled, or waiting for a header) are cut;
//   - a new tenant is added: its listeners open and its pools fill;
//   - a tenant that stays takes its new configuration in place: a listener whose address stays
//     keeps its socket (and the connections accepted on it), one whose address changes is
//     opened anew; a peer whose configuration stays keeps its pool and its connections; a peer
//     that goes, or whose key, addresses, sources or networks change, is cut (its connections,
//     its pooled ones and those waiting for a header) and, when it changed, made anew. New
//     networks and allow-lists apply to the connections that arrive after the reload.
//
// Every listener the reload needs is opened before anything changes: a port that cannot be
// opened (in use, or still held by a tenant the same reload removes) refuses the reload and
// nothing changes.

// Change says what a reload did, by name ("tenant/peer" for peers).
type Change struct {
	TenantsAdded, TenantsRemoved, TenantsChanged []string
	PeersAdded, PeersRemoved, PeersChanged       []string
	// PathManager says the path manager's new settings, when they changed (set by the caller,
	// which runs the path manager).
	PathManager string
}

// Empty reports whether the reload changed nothing.
func (c Change) Empty() bool {
	return len(c.TenantsAdded)+len(c.TenantsRemoved)+len(c.TenantsChanged)+len(c.PeersAdded)+len(c.PeersRemoved)+len(c.PeersChanged) == 0 &&
		c.PathManager == ""
}

func (c Change) String() string {
	var parts []string
	add := func(what string, names []string) {
		if len(names) > 0 {
			parts = append(parts, what+" "+strings.Join(names, ","))
		}
	}
	add("tenants added", c.TenantsAdded)
	add("tenants removed", c.TenantsRemoved)
	add("tenants changed", c.TenantsChanged)
	add("peers added", c.PeersAdded)
	add("peers removed", c.PeersRemoved)
	add("peers changed", c.PeersChanged)
	if c.PathManager != "" {
		parts = append(parts, "path manager: "+c.PathManager)
	}
	if len(parts) == 0 {
		return "nothing changed"
	}
	return strings.Join(parts, "; ")
}

// ErrDraining refuses a reload of a proxy that is shutting down.
var ErrDraining = errors.New("proxy: draining")

// Reload applies tenants; on error nothing changed.
func (p *Proxy) Reload(tenants []Tenant) (Change, error) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	if p.draining.Load() {
		return Change{}, ErrDraining
	}
	old := p.tenantList()
	byName := map[string]*tenant{}
	for _, t := range old {
		byName[t.Name] = t
	}
	type plan struct {
		t                        *tenant
		isNew                    bool
		cfg                      Tenant
		intercept, socks, peerLn listeners
	}
	var plans []plan
	var opened []listeners
	fail := func(err error) (Change, error) {
		for _, l := range opened {
			l.close()
		}
		return Change{}, err
	}
	seen := map[string]bool{}
	for _, tc := range tenants {
		if seen[tc.Name] {
			return fail(fmt.Errorf("proxy: two tenants named %q", tc.Name))
		}
		seen[tc.Name] = true
		pl := plan{cfg: tc, t: byName[tc.Name]}
		var oi, os, op listeners
		if pl.t == nil {
			pl.isNew = true
			pl.t = &tenant{Name: tc.Name, c: newCounters()}
		} else {
			oi, os, op = pl.t.intercept, pl.t.socks, pl.t.peerLn
		}
		var err error
		if pl.intercept, err = p.listenIntercept(tc, oi); err != nil {
			return fail(fmt.Errorf("proxy: tenant %s: %w", tc.Name, err))
		}
		if pl.intercept.key != oi.key {
			opened = append(opened, pl.intercept)
		}
		if pl.socks, err = p.listenSocks(tc, os); err != nil {
			return fail(fmt.Errorf("proxy: tenant %s: %w", tc.Name, err))
		}
		if pl.socks.key != os.key {
			opened = append(opened, pl.socks)
		}
		if pl.peerLn, err = p.listenPeers(tc, op); err != nil {
			return fail(fmt.Errorf("proxy: tenant %s: %w", tc.Name, err))
		}
		if pl.peerLn.key != op.key {
			opened = append(opened, pl.peerLn)
		}
		plans = append(plans, pl)
	}
	// Nothing can fail from here on.
	var ch Change
	var cut []*peer // peers whose connections end
	var gone []*tenant
	var next []*tenant
	for _, pl := range plans {
		t := pl.t
		if pl.isNew {
			ch.TenantsAdded = append(ch.TenantsAdded, t.Name)
			t.st.Store(p.newState(t, pl.cfg, nil))
			if p.o.Cert != nil {
				t.tlsSrv = serverConfig(p, t)
			}
			t.intercept, t.socks, t.peerLn = pl.intercept, pl.socks, pl.peerLn
			if p.running {
				p.startListeners(t, t.intercept, t.socks, t.peerLn)
				for _, pr := range t.state().peers {
					p.startPool(pr)
				}
			}
			next = append(next, t)
			continue
		}
		prev := t.state()
		st := p.newState(t, pl.cfg, prev)
		for _, pr := range st.peers {
			if !prev.has(pr) {
				if slices.ContainsFunc(prev.peers, func(x *peer) bool { return x.Name == pr.Name }) {
					ch.PeersChanged = append(ch.PeersChanged, t.Name+"/"+pr.Name)
				} else {
					ch.PeersAdded = append(ch.PeersAdded, t.Name+"/"+pr.Name)
				}
			}
		}
		for _, pr := range prev.peers {
			if !st.has(pr) {
				cut = append(cut, pr)
				if !slices.ContainsFunc(st.peers, func(x *peer) bool { return x.Name == pr.Name }) {
					ch.PeersRemoved = append(ch.PeersRemoved, t.Name+"/"+pr.Name)
				}
			}
		}
		if !reflect.DeepEqual(withoutPeers(prev.Tenant), withoutPeers(pl.cfg)) {
			ch.TenantsChanged = append(ch.TenantsChanged, t.Name)
		}
		t.st.Store(st)
		// Listeners: the new ones start, the replaced ones close.
		var ni, ns, np listeners
		if pl.intercept.key != t.intercept.key {
			t.intercept.close()
			ni = pl.intercept
		}
		if pl.socks.key != t.socks.key {
			t.socks.close()
			ns = pl.socks
		}
		if pl.peerLn.key != t.peerLn.key {
			t.peerLn.close()
			np = pl.peerLn
		}
		t.intercept, t.socks, t.peerLn = pl.intercept, pl.socks, pl.peerLn
		if p.running {
			p.startListeners(t, ni, ns, np)
			for _, pr := range st.peers {
				if !prev.has(pr) {
					p.startPool(pr)
				}
			}
		}
		next = append(next, t)
	}
	for _, t := range old {
		if !seen[t.Name] {
			gone = append(gone, t)
			ch.TenantsRemoved = append(ch.TenantsRemoved, t.Name)
		}
	}
	p.tenants.Store(&next)
	for _, t := range gone {
		t.intercept.close()
		t.socks.close()
		t.peerLn.close()
		cut = append(cut, t.state().peers...)
	}
	p.cut(gone, cut)
	return ch, nil
}

// cut ends the connections of the tenants gone and of the peers cut: pools emptied, relayed
// connections and those waiting for a header reset.
func (p *Proxy) cut(gone []*tenant, cut []*peer) {
	for _, pr := range cut {
		pr.pool.close()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if slices.Contains(gone, c.t) || c.pr != nil && slices.Contains(cut, c.pr) {
			c.abort()
		}
	}
	for raw, pp := range p.pending {
		if slices.Contains(gone, pp.t) || slices.Contains(cut, pp.pr.Load()) {
			reset(raw)
		}
	}
}

func withoutPeers(t Tenant) Tenant {
	t.Peers = nil
	return t
}
