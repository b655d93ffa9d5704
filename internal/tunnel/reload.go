package tunnel

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"braid/internal/sched"
)

// Reload (docs/tunnel.md, "Reload") applies a changed site file to a running tunnel: uplinks,
// peers, their paths, routes and capacities, and the scheduler. The packet loops read the
// peers and routes from one immutable table (Tunnel.tab) that a reload replaces whole, so they
// take no lock for it; a peer that stays keeps its sessions, reorder buffer, send queue and
// the state of every path that stays.
//
// What a change means:
//   - a peer whose name and key stay, and whose paths stay fixed or stay learned, is changed
//     in place: its routes, keepalive and max_paths are replaced, a path that stays (same
//     uplink, same remote in the file) keeps its estimator, session and counters and takes the
//     file's new weight and capacity, a path that goes is dropped, a new one is probed at once;
//     no handshake;
//   - a peer whose key changes, or whose paths change from fixed to learned or back, is
//     removed and added: a new peer, which makes a new session;
//   - an uplink whose socket stays (the caller hands the same Conn) stays, and takes its new
//     capacity; one whose socket changes is removed and added, and the paths on it are new;
//   - a scheduler of another name is made anew for every peer; one that plans a send queue
//     (paced) and one that does not cannot replace each other (the device reader is set up
//     for one kind at start): that change needs a restart.
//
// A reload that would fail changes nothing.

// Config is what a reload can change: the whole of the site's uplinks and peers, and the
// scheduler.
type Config struct {
	Uplinks   []Uplink
	Peers     []PeerConfig
	Scheduler string
}

// Change says what a reload did, by name.
type Change struct {
	PeersAdded, PeersRemoved, PeersReplaced, PeersChanged []string
	UplinksAdded, UplinksRemoved, UplinksReplaced         []string
	UplinksChanged                                        []string // a new capacity
	Scheduler                                             bool     // the scheduler changed
}

// Empty reports whether the reload changed nothing.
func (c Change) Empty() bool {
	return len(c.PeersAdded)+len(c.PeersRemoved)+len(c.PeersReplaced)+len(c.PeersChanged)+
		len(c.UplinksAdded)+len(c.UplinksRemoved)+len(c.UplinksReplaced)+len(c.UplinksChanged) == 0 && !c.Scheduler
}

func (c Change) String() string {
	var parts []string
	add := func(what string, names []string) {
		if len(names) > 0 {
			parts = append(parts, what+" "+strings.Join(names, ","))
		}
	}
	add("peers added", c.PeersAdded)
	add("peers removed", c.PeersRemoved)
	add("peers replaced", c.PeersReplaced)
	add("peers changed", c.PeersChanged)
	add("uplinks added", c.UplinksAdded)
	add("uplinks removed", c.UplinksRemoved)
	add("uplinks replaced", c.UplinksReplaced)
	add("uplinks changed", c.UplinksChanged)
	if c.Scheduler {
		parts = append(parts, "scheduler changed")
	}
	if len(parts) == 0 {
		return "nothing changed"
	}
	return strings.Join(parts, "; ")
}

// ErrReloadNeedsRestart is returned for a change a reload cannot apply.
var ErrReloadNeedsRestart = errors.New("tunnel: this change needs a restart")

// peerAction is what a reload does to one peer.
type peerAction int

const (
	peerKeep    peerAction = iota // nothing changed
	peerUpdate                    // changed in place: routes, paths, keepalive, max_paths
	peerReplace                   // removed and added: a new key, or fixed and learned paths swapped
	peerAdd
	peerRemove
)

func (a peerAction) String() string {
	return [...]string{"keep", "update", "replace", "add", "remove"}[a]
}

// peerDiff is the action for the peer named Name.
type peerDiff struct {
	Name   string
	Action peerAction
}

// diffPeers compares the peers before and after a reload (both by name), in the order of the
// new ones, then the removed ones. uplinksReplaced names the uplinks whose socket changes: a
// peer with a path on one changes.
func diffPeers(old, cur []PeerConfig, uplinksReplaced map[string]bool) []peerDiff {
	byName := map[string]PeerConfig{}
	for _, pc := range old {
		byName[pc.Name] = pc
	}
	var out []peerDiff
	seen := map[string]bool{}
	for _, pc := range cur {
		seen[pc.Name] = true
		was, ok := byName[pc.Name]
		switch {
		case !ok:
			out = append(out, peerDiff{pc.Name, peerAdd})
		case !was.PublicKey.Equal(pc.PublicKey) || learns(was) != learns(pc):
			out = append(out, peerDiff{pc.Name, peerReplace})
		case !samePeer(was, pc) || onUplinks(pc, uplinksReplaced):
			out = append(out, peerDiff{pc.Name, peerUpdate})
		default:
			out = append(out, peerDiff{pc.Name, peerKeep})
		}
	}
	for _, pc := range old {
		if !seen[pc.Name] {
			out = append(out, peerDiff{pc.Name, peerRemove})
		}
	}
	return out
}

// learns reports whether pc's paths are learned (no path has a remote address).
func learns(pc PeerConfig) bool {
	for _, c := range pc.Paths {
		if c.Remote.IsValid() {
			return false
		}
	}
	return true
}

func samePeer(a, b PeerConfig) bool {
	return slices.Equal(a.Routes, b.Routes) && slices.Equal(a.Paths, b.Paths) &&
		a.Keepalive == b.Keepalive && a.MaxPaths == b.MaxPaths
}

func onUplinks(pc PeerConfig, names map[string]bool) bool {
	for _, c := range pc.Paths {
		if names[c.Uplink] {
			return true
		}
	}
	return false
}

// pathKey names a configured path across reloads: its uplink and the remote the file gives
// (a path that has moved since is still the same path).
type pathKey struct {
	uplink string
	remote netip.AddrPort
}

// diffPaths matches the fixed paths of a peer before and after a reload: keep[i] is the index
// in old of the path that cur[i] keeps, -1 for a new path. A path on an uplink in replaced is
// new. Paths not kept are removed.
func diffPaths(old, cur []PathConfig, replaced map[string]bool) (keep []int) {
	at := map[pathKey]int{}
	for i, c := range old {
		at[pathKey{c.Uplink, unmapPort(c.Remote)}] = i
	}
	keep = make([]int, len(cur))
	for i, c := range cur {
		keep[i] = -1
		if j, ok := at[pathKey{c.Uplink, unmapPort(c.Remote)}]; ok && !replaced[c.Uplink] {
			keep[i] = j
			delete(at, pathKey{c.Uplink, unmapPort(c.Remote)})
		}
	}
	return keep
}

// peerPlan is a peer's new state, made before anything changes and applied at once.
type peerPlan struct {
	p         *peer
	pc        PeerConfig
	paths     []*peerPath // in the order of pc's paths (fixed), or the learned ones kept
	learnOn   map[*uplink]PathConfig
	keepalive int64
	maxPaths  int
}

// Reload applies c (the package comment of reload.go says how); on an error nothing has
// changed. The caller owns the Conns of c's uplinks until Reload returns without an error;
// then the tunnel owns them, and closes those of the uplinks it removed.
func (t *Tunnel) Reload(c Config) (Change, error) {
	t.reloadMu.Lock()
	defer t.reloadMu.Unlock()
	var ch Change
	if t.closing.Load() {
		return ch, errors.New("tunnel: closing")
	}
	if _, err := newScheduler(c.Scheduler); err != nil {
		return ch, err
	}
	if plans(c.Scheduler) != t.queueing {
		return ch, fmt.Errorf("%w: scheduler %q to %q (one plans a send queue, the other does not)", ErrReloadNeedsRestart, schedOrPaced(t.o.Scheduler), schedOrPaced(c.Scheduler))
	}
	ch.Scheduler = c.Scheduler != t.o.Scheduler

	// Uplinks: the same Conn is the same uplink.
	ups := map[string]*uplink{}
	replaced := map[string]bool{}
	var added []*uplink
	for _, u := range c.Uplinks {
		if _, dup := ups[u.Name]; dup {
			return Change{}, fmt.Errorf("tunnel: uplink %q twice", u.Name)
		}
		if err := checkUplink(u); err != nil {
			return Change{}, err
		}
		if u.MTU > t.pktSize-64 {
			// The buffers were sized at start for the largest uplink then: the uplink's paths
			// are probed up to that.
			t.log.Warn("reload: an uplink's MTU is larger than any at start: its paths use at most the largest then", "uplink", u.Name, "mtu", u.MTU, "max", t.pktSize-64)
			u.MTU = t.pktSize - 64
		}
		old := t.uplinks[u.Name]
		for name, o := range t.uplinks {
			if c := o.conn(); c != nil && c == u.Conn && name != u.Name {
				return Change{}, fmt.Errorf("%w: uplink %s has uplink %s's socket (a renamed uplink)", ErrReloadNeedsRestart, u.Name, name)
			}
		}
		switch {
		case old != nil && !old.follow && !u.Follow && old.conn() == u.Conn,
			old != nil && old.follow && u.Follow && old.iface == u.Interface && old.port == u.Port:
			// The same socket, or the same interface followed (its socket is the
			// follower's: follow.go).
			ups[u.Name] = old
		default:
			nu := newUplink(u)
			ups[u.Name] = nu
			added = append(added, nu)
			if old != nil {
				replaced[u.Name] = true
				ch.UplinksReplaced = append(ch.UplinksReplaced, u.Name)
			} else {
				ch.UplinksAdded = append(ch.UplinksAdded, u.Name)
			}
		}
	}
	var removed []*uplink
	for name, u := range t.uplinks {
		if ups[name] != u {
			removed = append(removed, u)
			if ups[name] == nil {
				ch.UplinksRemoved = append(ch.UplinksRemoved, name)
			}
		}
	}
	slices.Sort(ch.UplinksRemoved)

	// Peers: everything new is made before anything changes.
	oldPeers := t.peerList()
	byName := map[string]*peer{}
	var oldCfg []PeerConfig
	for _, p := range oldPeers {
		byName[p.name] = p
		oldCfg = append(oldCfg, p.cfg)
	}
	newCfg := map[string]PeerConfig{}
	for _, pc := range c.Peers {
		if _, dup := newCfg[pc.Name]; dup {
			return Change{}, fmt.Errorf("tunnel: peer %q twice", pc.Name)
		}
		newCfg[pc.Name] = pc
	}
	now := t.now()
	var (
		peers   []*peer
		updates []peerPlan
		gone    []*peer
	)
	for _, d := range diffPeers(oldCfg, c.Peers, replaced) {
		pc := newCfg[d.Name]
		switch d.Action {
		case peerKeep:
			peers = append(peers, byName[d.Name])
			if ch.Scheduler {
				updates = append(updates, peerPlan{p: byName[d.Name], pc: pc, paths: nil})
			}
		case peerUpdate:
			u, err := t.prepareUpdate(byName[d.Name], pc, ups, replaced, now)
			if err != nil {
				return Change{}, err
			}
			peers = append(peers, u.p)
			updates = append(updates, u)
			ch.PeersChanged = append(ch.PeersChanged, d.Name)
		case peerAdd, peerReplace:
			p, err := newPeer(t, ups, pc, c.Scheduler, now)
			if err != nil {
				return Change{}, err
			}
			peers = append(peers, p)
			if d.Action == peerReplace {
				gone = append(gone, byName[d.Name])
				ch.PeersReplaced = append(ch.PeersReplaced, d.Name)
			} else {
				ch.PeersAdded = append(ch.PeersAdded, d.Name)
			}
		case peerRemove:
			gone = append(gone, byName[d.Name])
			ch.PeersRemoved = append(ch.PeersRemoved, d.Name)
		}
	}

	// Nothing can fail from here on.
	for _, nu := range c.Uplinks {
		if u := ups[nu.Name]; t.uplinks[nu.Name] == u {
			capa := nu.Capacity
			if b := u.pace.Load(); b == nil && capa > 0 || b != nil && b.Rate != float64(capa) {
				ch.UplinksChanged = append(ch.UplinksChanged, nu.Name)
				if capa > 0 {
					u.pace.Store(sched.NewBucket(float64(capa)))
				} else {
					u.pace.Store(nil)
				}
			}
		}
	}
	for _, u := range updates {
		u.apply(c.Scheduler, ch.Scheduler)
	}
	t.o.Scheduler = c.Scheduler
	t.tab.Store(newTable(peers))
	for _, p := range gone {
		t.retire(p)
	}
	t.uplinks = ups
	for _, u := range removed {
		u.removed.Store(true)
		if c := u.conn(); c != nil {
			c.Close()
		}
	}
	if t.running {
		for _, u := range added {
			t.startReader(u)
		}
	}
	t.log.Info("tunnel reloaded", "change", ch.String(), "peers", len(peers), "uplinks", len(ups))
	return ch, nil
}

func schedOrPaced(name string) string {
	if name == "" {
		return "paced"
	}
	return name
}

// prepareUpdate makes the new paths of p, changed in place to pc, without touching p.
func (t *Tunnel) prepareUpdate(p *peer, pc PeerConfig, ups map[string]*uplink, replaced map[string]bool, now int64) (peerPlan, error) {
	keepalive, maxPaths, learn, err := checkPeer(pc)
	if err != nil {
		return peerPlan{}, err
	}
	u := peerPlan{p: p, pc: pc, keepalive: keepalive, maxPaths: maxPaths, learnOn: map[*uplink]PathConfig{}}
	for i, c := range pc.Paths {
		up := ups[c.Uplink]
		if up == nil {
			return peerPlan{}, fmt.Errorf("tunnel: peer %s path %d: no uplink %q", pc.Name, i+1, c.Uplink)
		}
		if learn {
			u.learnOn[up] = c
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if learn {
		// The learned paths on an uplink that stays, stay.
		u.paths = []*peerPath{}
		for _, pp := range p.paths {
			if _, ok := u.learnOn[pp.up]; ok && ups[pp.up.name] == pp.up {
				u.paths = append(u.paths, pp)
			}
		}
		return u, nil
	}
	var oldConf []PathConfig
	for _, pp := range p.paths {
		oldConf = append(oldConf, pp.conf)
	}
	keep := diffPaths(oldConf, pc.Paths, replaced)
	used := map[uint8]bool{}
	for _, j := range keep {
		if j >= 0 {
			used[p.paths[j].id] = true
		}
	}
	for i, j := range keep {
		if j >= 0 {
			u.paths = append(u.paths, p.paths[j])
			continue
		}
		// A new path takes the ID it has in the file when no kept path holds it, so that a
		// site file read afresh numbers its paths the same way.
		id := uint8(i)
		for used[id] {
			id++
		}
		used[id] = true
		pp, err := p.newPath(id, ups[pc.Paths[i].Uplink], pc.Paths[i], now)
		if err != nil {
			return peerPlan{}, fmt.Errorf("tunnel: peer %s path %d: %w", pc.Name, i+1, err)
		}
		u.paths = append(u.paths, pp)
	}
	return u, nil
}

// apply makes the update p's state; a new scheduler is made when changed says so.
func (u peerPlan) apply(schedName string, changed bool) {
	p := u.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if changed {
		p.setSchedulerLocked(schedName) // checked by Reload
	}
	if u.paths == nil && u.learnOn == nil {
		return // only the scheduler
	}
	routes := u.pc.Routes
	p.routes.Store(&routes)
	p.keepalive.Store(u.keepalive)
	p.maxPaths.Store(int64(u.maxPaths))
	p.learnOn.Store(&u.learnOn)
	for i, pp := range u.paths {
		c := pp.conf
		if p.learn {
			c = u.learnOn[pp.up]
			c.Remote = pp.conf.Remote
		} else {
			c = u.pc.Paths[i]
		}
		// The file's weight and capacity, where they changed: a weight set at run time
		// ('braid tunnel path weight') stays until the file changes it.
		if c.Weight != pp.conf.Weight {
			pp.weight = c.Weight
		}
		if c.Capacity != pp.conf.Capacity {
			pp.capacity = c.Capacity
			if c.Capacity > 0 {
				pp.capEst = nil
			} else if pp.capEst == nil {
				if est, err := sched.NewCapacity(p.t.o.CapacityCfg); err == nil {
					pp.capEst, pp.capAt = est, p.t.now()
				}
			}
		}
		pp.conf = c
	}
	p.paths = u.paths
	p.snap = make([]sched.Path, len(p.paths))
	p.cfg = u.pc
	p.setOuterLocked()
	p.publishPathsLocked()
}

// retire takes a removed peer out of service: it makes no more sessions, sends nothing more,
// and the packets of its sessions are dropped as of an unknown session.
func (t *Tunnel) retire(p *peer) {
	p.mu.Lock()
	p.gone.Store(true)
	p.cur.Store(nil)
	p.hs, p.prev, p.pending, p.retired = nil, nil, nil, nil
	p.mu.Unlock()
	t.mu.Lock()
	for idx, ref := range t.sessions {
		if ref.peer == p {
			delete(t.sessions, idx)
		}
	}
	t.publishSessions()
	t.mu.Unlock()
}

// pathLocked returns the path whose ID (1-based, as the status shows it) is id; p.mu is held.
func (p *peer) pathLocked(id int) *peerPath {
	for _, pp := range p.paths {
		if int(pp.id)+1 == id {
			return pp
		}
	}
	return nil
}

// pathByID returns the path of ours whose ID is id (as our packets carry it), nil if none;
// without p.mu. IDs are indices into the paths until a reload removes one.
func (p *peer) pathByID(id uint8) *peerPath {
	for _, pp := range p.pathList() {
		if pp.id == id {
			return pp
		}
	}
	return nil
}

// freeIDLocked is the lowest path ID no path of p has; p.mu is held, and p has fewer than 255
// paths.
func (p *peer) freeIDLocked() uint8 {
	var used [256]bool
	for _, pp := range p.paths {
		used[pp.id] = true
	}
	id := 0
	for used[id] {
		id++
	}
	return uint8(id)
}
