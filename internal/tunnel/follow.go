package tunnel

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"braid/internal/tunnel/path"
	"braid/internal/wire/mpath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Uplinks that follow their interface.
//
// An uplink declared by its interface alone (Uplink.Follow) is bound to whatever address the
// interface has now. FollowUplinks listens to the kernel's link and address events (rtnetlink)
// and, for every such uplink, looks at its interface again on each event: when the address the
// socket is bound to is gone and another is there (a DHCP lease renumbered, a modem that
// reconnected with a new address), or the interface was not there and now is (a modem plugged
// in after start), it opens a socket on the new address, hands it to the uplink's paths and
// closes the old one. It then announces the change at once: every path on the uplink sends an
// authenticated packet from the new address, which moves the path at the peer (roam.go) without
// a handshake. A link that goes down (or an interface that goes away) takes its paths out of
// use at once, without waiting for their probes to fail; when it comes back its paths probe
// fast, and it is announced the same way, so that the NATs on its way map it again. A
// renumbering thus costs the time the kernel takes to tell (microseconds) plus one round trip;
// a link that went down costs what it was down, plus a few fast probes.
//
// The events are hints: a look at an interface reads its state whole (LinkByName, AddrList), so
// a lost event (netlink drops them when its buffer overflows) only delays the look to the next
// event or the periodic recheck. Route events matter too: the route of a link that came up
// usually comes a moment after it (routed).

// FollowOptions are what FollowUplinks needs of the machine.
type FollowOptions struct {
	// Netlink reads links and addresses in the tunnel's network namespace.
	Netlink *netlink.Handle
	// Namespace, when set, is the namespace whose events are followed; nil: the calling
	// thread's.
	Namespace *netns.NsHandle
	// Listen opens an uplink's socket on local, bound to the interface ifname.
	Listen func(local netip.AddrPort, ifname string) (Conn, error)
	// Recheck is how often every following uplink is looked at without an event; 0:
	// DefaultRecheck.
	Recheck time.Duration
}

// DefaultRecheck is how often the follower looks at every following uplink without an event:
// the bound on a change whose event was lost.
const DefaultRecheck = 2 * time.Second

// Uplink states the follower reports (UplinkStatus.State).
const (
	uplinkUp        = "up"
	uplinkDown      = "down"       // the link is down (administratively or no carrier)
	uplinkAbsent    = "absent"     // no interface of that name
	uplinkNoAddress = "no address" // the interface has no usable address of the paths' family
	uplinkNoSocket  = "bind failed"
)

// errNoFollower: FollowUplinks was called without what it needs.
var errNoFollower = errors.New("tunnel: FollowUplinks needs a netlink handle and a Listen function")

// FollowUplinks keeps the sockets of the uplinks that follow their interface (Uplink.Follow)
// on the interfaces' addresses until ctx ends, also those a reload adds.
func (t *Tunnel) FollowUplinks(ctx context.Context, o FollowOptions) error {
	if o.Netlink == nil || o.Listen == nil {
		return errNoFollower
	}
	if o.Recheck <= 0 {
		o.Recheck = DefaultRecheck
	}
	f := &follower{t: t, o: o, lost: make(chan struct{}, 1), kick: time.NewTimer(time.Hour)}
	defer f.kick.Stop()
	done := make(chan struct{})
	links, addrs, routes := f.subscribeLinks(done), f.subscribeAddrs(done), f.subscribeRoutes(done)
	defer func() {
		// The subscriptions stop when done closes; what they still send is drained until
		// they close their channels, so that none is left blocked on a send.
		close(done)
		go drainLinks(links)
		go drainAddrs(addrs)
		go drainRoutes(routes)
	}()
	f.all()
	tick := time.NewTicker(o.Recheck)
	defer tick.Stop()
	for {
		routed := false
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick.C:
			f.kicks()
			continue
		case _, ok := <-links:
			if !ok {
				links = nil
			}
		case _, ok := <-addrs:
			if !ok {
				addrs = nil
			}
		case _, ok := <-routes:
			routed = true
			if !ok {
				routes = nil
			}
		case <-f.lost:
		case <-tick.C:
			// A subscription that failed is made again (the recheck covered meanwhile).
			if links == nil {
				links = f.subscribeLinks(done)
			}
			if addrs == nil {
				addrs = f.subscribeAddrs(done)
			}
			if routes == nil {
				routes = f.subscribeRoutes(done)
			}
		}
		// One look per burst of events: drain what else has come.
		for drained := false; !drained; {
			select {
			case _, ok := <-links:
				if !ok {
					links = nil
				}
			case _, ok := <-addrs:
				if !ok {
					addrs = nil
				}
			case _, ok := <-routes:
				routed = true
				if !ok {
					routes = nil
				}
			default:
				drained = true
			}
		}
		f.all()
		if routed {
			f.routed()
		}
	}
}

// follower is FollowUplinks' state: one goroutine's.
type follower struct {
	t    *Tunnel
	o    FollowOptions
	lost chan struct{} // a subscription reported an error (events lost)
	// kick fires at the next of kickAt: the uplinks that came up (or were bound anew) are
	// looked at again a moment later (kickAfter), when their routes are there.
	kick   *time.Timer
	kickAt []kickAt
	// warned: the log has said that a bind failed, by uplink, so as not to repeat it
	warned map[string]bool
}

// onError is the subscriptions' error callback: events may have been lost, look again.
func (f *follower) onError(error) {
	select {
	case f.lost <- struct{}{}:
	default:
	}
}

// subscribeLinks subscribes to link events; nil when it failed (the recheck then stands in).
func (f *follower) subscribeLinks(done chan struct{}) chan netlink.LinkUpdate {
	ch := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: f.o.Namespace, ErrorCallback: f.onError}); err != nil {
		f.t.log.Warn("uplinks: no link events; looking every recheck interval", "err", err, "recheck", f.o.Recheck)
		return nil
	}
	return ch
}

// subscribeAddrs subscribes to address events; nil when it failed.
func (f *follower) subscribeAddrs(done chan struct{}) chan netlink.AddrUpdate {
	ch := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{Namespace: f.o.Namespace, ErrorCallback: f.onError}); err != nil {
		f.t.log.Warn("uplinks: no address events; looking every recheck interval", "err", err, "recheck", f.o.Recheck)
		return nil
	}
	return ch
}

func drainLinks(ch chan netlink.LinkUpdate) {
	for ch != nil {
		if _, ok := <-ch; !ok {
			return
		}
	}
}

func drainAddrs(ch chan netlink.AddrUpdate) {
	for ch != nil {
		if _, ok := <-ch; !ok {
			return
		}
	}
}

// subscribeRoutes subscribes to route events; nil when it failed.
func (f *follower) subscribeRoutes(done chan struct{}) chan netlink.RouteUpdate {
	ch := make(chan netlink.RouteUpdate, 64)
	if err := netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{Namespace: f.o.Namespace, ErrorCallback: f.onError}); err != nil {
		f.t.log.Warn("uplinks: no route events; a route that comes after its link waits for the paths' probes", "err", err)
		return nil
	}
	return ch
}

func drainRoutes(ch chan netlink.RouteUpdate) {
	for ch != nil {
		if _, ok := <-ch; !ok {
			return
		}
	}
}

// routed is called when the routes changed: the routes of a link that came up, or of a new
// address, usually come a moment after the event that brought the uplink up (DHCP, ifup), and
// the probes its paths sent meanwhile went nowhere. The paths of the uplinks that are up and
// not usable yet start their probing again (the probes in flight are forgotten, not counted
// lost, so they do not hold the path down for their timeout), and the uplinks are announced.
func (f *follower) routed() {
	for _, u := range f.t.following() {
		if s := u.state.Load(); s != nil && *s == uplinkUp {
			f.t.restart(u)
		}
	}
}

// restart lets u's paths out of LinkDown, makes those that are down start their probing again
// (the probes in flight are forgotten, not counted lost, so they do not hold the path down for
// their timeout) and announces u.
func (t *Tunnel) restart(u *uplink) {
	now := t.now()
	for _, p := range t.peerList() {
		p.mu.Lock()
		for _, pp := range p.paths {
			if pp.up != u {
				continue
			}
			if pp.est.Snapshot().State == path.LinkDown {
				pp.est.SetLinkDown(now, false)
			} else if pp.est.Snapshot().State == path.Down {
				pp.est.SetLinkDown(now, true)
				pp.est.SetLinkDown(now, false)
			}
		}
		p.mu.Unlock()
	}
	t.announce(u)
}

// following returns the uplinks that follow an interface.
func (t *Tunnel) following() []*uplink {
	t.reloadMu.Lock()
	defer t.reloadMu.Unlock()
	var out []*uplink
	for _, u := range t.uplinks {
		if u.follow {
			out = append(out, u)
		}
	}
	return out
}

// all looks at every following uplink's interface.
func (f *follower) all() {
	for _, u := range f.t.following() {
		f.look(u)
	}
}

// look reads u's interface and binds u anew when its address changed.
func (f *follower) look(u *uplink) {
	t := f.t
	state, addr, index := f.read(u)
	cur := u.sock()
	announce := false
	if addr.IsValid() && (addr != cur.local.Addr() || index != cur.ifindex || cur.conn == nil) {
		local := netip.AddrPortFrom(addr, u.port)
		c, err := f.o.Listen(local, u.iface)
		switch {
		case err != nil:
			state = uplinkNoSocket
			if f.warned == nil {
				f.warned = map[string]bool{}
			}
			if !f.warned[u.name] {
				f.warned[u.name] = true
				t.log.Warn("uplink: cannot bind to its interface's address", "uplink", u.name, "interface", u.iface, "address", local, "err", err)
			}
		case t.rebind(u, &upSock{conn: c, local: local, ifindex: index}):
			delete(f.warned, u.name)
			announce = true
			t.log.Info("uplink bound", "uplink", u.name, "interface", u.iface, "local", local, "was", cur.local)
		}
	}
	prev := u.state.Swap(&state)
	changed := prev == nil || *prev != state
	if changed {
		was := "unknown"
		if prev != nil {
			was = *prev
		}
		t.log.Info("uplink state", "uplink", u.name, "interface", u.iface, "from", was, "to", state, "local", u.local())
	}
	switch {
	case state == uplinkDown || state == uplinkAbsent:
		// The paths of a link that is down, or gone, are out of use at once and not probed
		// (path.Estimator's LinkDown).
		t.setLinkDown(u, true)
	case state != uplinkUp:
	case changed && prev != nil && (*prev == uplinkDown || *prev == uplinkAbsent):
		// Back up: its paths are let out of LinkDown a moment later (kickAfter[0]), and
		// then probe fast. At the very moment the kernel says a link is up its queue may
		// not take packets yet (the carrier is handled apart), and the first ARP request of
		// a probe lost there would cost the kernel's 1 s retransmission.
		f.kickLater(u)
	case announce || changed:
		// Bound anew (or up for the first time): announced now, and again a moment later
		// when its routes are there.
		t.setLinkDown(u, false)
		t.announce(u)
		f.kickLater(u)
	}
}

// kickLater schedules u's kicks (kickAfter).
func (f *follower) kickLater(u *uplink) {
	now := time.Now()
	for _, d := range kickAfter {
		f.kickAt = append(f.kickAt, kickAt{u: u, at: now.Add(d)})
	}
	f.armKick()
}

// kickAfter are when an uplink that came up (or was bound anew) is kicked again (restart):
// its routes come a moment after its link or address (DHCP, ifup), and what its paths sent
// before them went nowhere.
var kickAfter = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}

type kickAt struct {
	u  *uplink
	at time.Time
}

// armKick sets the kick timer to the earliest kick due.
func (f *follower) armKick() {
	if len(f.kickAt) == 0 {
		return
	}
	first := f.kickAt[0].at
	for _, k := range f.kickAt {
		if k.at.Before(first) {
			first = k.at
		}
	}
	f.kick.Reset(max(time.Until(first), 0))
}

// kicks restarts the uplinks whose kick is due.
func (f *follower) kicks() {
	now := time.Now()
	keep := f.kickAt[:0]
	for _, k := range f.kickAt {
		if k.at.After(now) {
			keep = append(keep, k)
			continue
		}
		if s := k.u.state.Load(); s != nil && *s == uplinkUp {
			f.t.restart(k.u)
		}
	}
	f.kickAt = keep
	f.armKick()
}

// read returns the state of u's interface, the address u should be bound to (invalid when
// none) and the interface's index.
func (f *follower) read(u *uplink) (state string, addr netip.Addr, index int) {
	link, err := f.o.Netlink.LinkByName(u.iface)
	if err != nil {
		return uplinkAbsent, netip.Addr{}, 0
	}
	a := link.Attrs()
	list, err := f.o.Netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return uplinkNoAddress, netip.Addr{}, a.Index
	}
	var cands []ifAddr
	for _, x := range list {
		ip, ok := netip.AddrFromSlice(x.IP)
		if !ok {
			continue
		}
		cands = append(cands, ifAddr{addr: ip.Unmap(), scope: x.Scope, flags: x.Flags})
	}
	addr = chooseAddr(cands, f.t.uplinkFamily(u), u.local().Addr())
	switch {
	case a.Flags&net.FlagUp == 0 || (a.OperState != netlink.OperUp && a.OperState != netlink.OperUnknown):
		state = uplinkDown
	case !addr.IsValid():
		state = uplinkNoAddress
	default:
		state = uplinkUp
	}
	return state, addr, a.Index
}

// ifAddr is an interface address as the kernel lists it.
type ifAddr struct {
	addr  netip.Addr
	scope int // RT_SCOPE_*
	flags int // IFA_F_*
}

// chooseAddr picks the address an uplink binds to among its interface's: a global one (not
// link-local, not tentative or failed duplicate detection) of family (4, 6, or 0 for either,
// IPv4 first); the current one while it is still there, so that a second address never moves
// the paths; else the first the kernel lists (its primary).
func chooseAddr(cands []ifAddr, family int, cur netip.Addr) netip.Addr {
	usable := func(c ifAddr) bool {
		a := c.addr
		switch {
		case c.scope != unix.RT_SCOPE_UNIVERSE, c.flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0,
			!a.IsValid(), a.IsLoopback(), a.IsLinkLocalUnicast(), a.IsMulticast(), a.IsUnspecified():
			return false
		case family == 4:
			return a.Is4()
		case family == 6:
			return a.Is6()
		}
		return true
	}
	var first4, first6 netip.Addr
	for _, c := range cands {
		if !usable(c) {
			continue
		}
		if c.addr == cur {
			return cur
		}
		switch {
		case c.addr.Is4() && !first4.IsValid():
			first4 = c.addr
		case c.addr.Is6() && !first6.IsValid():
			first6 = c.addr
		}
	}
	if first4.IsValid() {
		return first4
	}
	return first6
}

// setLinkDown marks the paths that leave by u as on a link that is down (or back up).
func (t *Tunnel) setLinkDown(u *uplink, down bool) {
	now := t.now()
	for _, p := range t.peerList() {
		p.mu.Lock()
		for _, pp := range p.paths {
			if pp.up == u {
				pp.est.SetLinkDown(now, down)
			}
		}
		p.mu.Unlock()
	}
}

// uplinkFamily is the address family of the paths that leave by u: 4 or 6 from the remote of
// a configured path on it, 0 when none says (its paths are learned).
func (t *Tunnel) uplinkFamily(u *uplink) int {
	for _, p := range t.peerList() {
		if p.learn {
			continue
		}
		p.mu.Lock() // a reload changes the paths' configuration under it
		fam := 0
		for _, pp := range p.paths {
			if pp.up != u || pp.learned || !pp.conf.Remote.IsValid() {
				continue
			}
			if fam = 6; pp.conf.Remote.Addr().Unmap().Is4() {
				fam = 4
			}
			break
		}
		p.mu.Unlock()
		if fam != 0 {
			return fam
		}
	}
	return 0
}

// rebind gives u the socket sk, starts its reader and closes the one before; false (and sk
// closed) when u is no longer one of the tunnel's uplinks.
func (t *Tunnel) rebind(u *uplink, sk *upSock) bool {
	t.reloadMu.Lock()
	if t.closing.Load() || u.removed.Load() || t.uplinks[u.name] != u {
		t.reloadMu.Unlock()
		sk.conn.Close()
		return false
	}
	old := u.sk.Swap(sk)
	if old.conn != nil {
		u.rebinds.Add(1)
		t.stats.UplinkRebinds.Add(1)
	}
	if t.running {
		t.startReader(u)
	}
	t.reloadMu.Unlock()
	if old.conn != nil {
		old.conn.Close() // its reader sees the uplink has another socket, and stops
	}
	for _, p := range t.peerList() {
		p.mu.Lock()
		p.setOuterLocked()
		p.mu.Unlock()
	}
	return true
}

// announce sends a keepalive at once on every path that leaves by u, from its socket now: the
// peer moves its paths to the new address on it (roam.go), and the NATs on the way map it. A
// peer with no session yet gets its handshake initiation repeated now instead.
func (t *Tunnel) announce(u *uplink) {
	for _, p := range t.peerList() {
		if p.cur.Load() == nil {
			p.mu.Lock()
			if p.hs != nil {
				p.hsSent = t.now() - int64(handshakeRetry) // the timers resend it on their next tick
			}
			p.mu.Unlock()
			continue
		}
		for _, pp := range p.pathList() {
			if pp.up != u {
				continue
			}
			var fb mpath.Feedback
			if t.sendSealed(p, pp, mpath.TypeFeedback, fb.Encode) {
				t.stats.UplinkAnnounces.Add(1)
			}
		}
	}
}

// UplinkConn returns the socket of the named uplink now (nil when it has none, or there is no
// such uplink): what a reload hands back for a following uplink that stays.
func (t *Tunnel) UplinkConn(name string) Conn {
	t.reloadMu.Lock()
	defer t.reloadMu.Unlock()
	if u := t.uplinks[name]; u != nil {
		return u.conn()
	}
	return nil
}
