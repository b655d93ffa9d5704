package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"braid/internal/mptcp/pmnl"
)

// Uplink is one of this site's paths, for the path managers.
type Uplink struct {
	Name    string
	Addr    netip.Addr
	IfIndex int32
	Backup  bool
}

// Announcer makes the far end of every MPTCP connection a peer opens to this proxy learn this
// site's other uplinks: with the kernel's userspace path manager it sends one ADD_ADDR per
// uplink (of the connection's family) once the connection is established and the peer on it
// has authenticated (Authenticated: the proxy's TLS handshake with a pinned key, or in
// plaintext its source check), never before: an unauthenticated client learns no address.
// The client side (the fullmesh policy of internal/mptcp/pm) then joins every announced
// address from every one of its uplinks.
type Announcer struct {
	uplinks []Uplink
	log     *slog.Logger
	stream  *pmnl.Stream
	client  *pmnl.Client

	mu     sync.Mutex
	st     annState
	counts struct{ announced, failed uint64 }
}

// annState follows the server-side connections on the proxy's peer ports: what the kernel
// says of them (by token) and what the proxy says of their authentication (by addresses),
// which arrive in either order.
type annState struct {
	ports map[uint16]bool
	conns map[uint32]*annConn
	// authed are connections authenticated before their events arrived, with when.
	authed map[[2]netip.AddrPort]time.Time
}

type annConn struct {
	local, remote       netip.AddrPort
	established, authed bool
	announced           bool
}

// maxEarlyAuth bounds annState.authed; an entry older than earlyAuthTTL is dropped.
const (
	maxEarlyAuth = 4096
	earlyAuthTTL = 30 * time.Second
)

func newAnnState(ports []uint16) annState {
	s := annState{ports: map[uint16]bool{}, conns: map[uint32]*annConn{}, authed: map[[2]netip.AddrPort]time.Time{}}
	for _, p := range ports {
		s.ports[p] = true
	}
	return s
}

func unmapAP(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// event takes a path-manager event; it returns the connection to announce on, if it is now
// due.
func (s *annState) event(e pmnl.Event, now time.Time) (token uint32, initial netip.Addr, due bool) {
	switch e.Type {
	case pmnl.EventCreated:
		if !e.ServerSide || !s.ports[e.Local.Port()] {
			return 0, netip.Addr{}, false
		}
		c := &annConn{local: unmapAP(e.Local), remote: unmapAP(e.Remote)}
		k := [2]netip.AddrPort{c.local, c.remote}
		if at, ok := s.authed[k]; ok {
			delete(s.authed, k)
			c.authed = now.Sub(at) < earlyAuthTTL
		}
		s.conns[e.Token] = c
	case pmnl.EventEstablished:
		if c, ok := s.conns[e.Token]; ok {
			c.established = true
			return s.due(e.Token, c)
		}
	case pmnl.EventClosed:
		delete(s.conns, e.Token)
	}
	return 0, netip.Addr{}, false
}

// auth takes the proxy's word that the connection local-remote has authenticated.
func (s *annState) auth(local, remote netip.AddrPort, now time.Time) (token uint32, initial netip.Addr, due bool) {
	local, remote = unmapAP(local), unmapAP(remote)
	for tok, c := range s.conns {
		if c.local == local && c.remote == remote {
			c.authed = true
			return s.due(tok, c)
		}
	}
	// The kernel's events have not arrived yet.
	for k, at := range s.authed {
		if now.Sub(at) >= earlyAuthTTL {
			delete(s.authed, k)
		}
	}
	if len(s.authed) < maxEarlyAuth {
		s.authed[[2]netip.AddrPort{local, remote}] = now
	}
	return 0, netip.Addr{}, false
}

func (s *annState) due(tok uint32, c *annConn) (uint32, netip.Addr, bool) {
	if c.established && c.authed && !c.announced {
		c.announced = true
		return tok, c.local.Addr(), true
	}
	return 0, netip.Addr{}, false
}

// NewAnnouncer subscribes to the path-manager events of the calling thread's namespace; it
// announces on the server-side connections whose local port is one of ports.
func NewAnnouncer(uplinks []Uplink, ports []uint16, log *slog.Logger) (*Announcer, error) {
	a := &Announcer{uplinks: uplinks, log: log, st: newAnnState(ports)}
	var err error
	if a.stream, err = pmnl.Subscribe(pmnl.Options{}); err != nil {
		return nil, err
	}
	if a.client, err = pmnl.Dial(pmnl.Options{}); err != nil {
		a.stream.Close()
		return nil, err
	}
	return a, nil
}

// SetPorts replaces the peer ports (a reload).
func (a *Announcer) SetPorts(ports []uint16) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.ports = map[uint16]bool{}
	for _, p := range ports {
		a.st.ports[p] = true
	}
}

// Authenticated tells the announcer that the peer on the connection local-remote has
// authenticated (Options.Authenticated).
func (a *Announcer) Authenticated(ctx context.Context, local, remote netip.AddrPort) {
	a.mu.Lock()
	tok, initial, due := a.st.auth(local, remote, time.Now())
	a.mu.Unlock()
	if due {
		a.announce(ctx, tok, initial)
	}
}

// Close closes the sockets.
func (a *Announcer) Close() error {
	a.stream.Close()
	return a.client.Close()
}

// Counts returns the announcements made and refused.
func (a *Announcer) Counts() (announced, failed uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts.announced, a.counts.failed
}

// Run follows the events until ctx ends.
func (a *Announcer) Run(ctx context.Context) error {
	for {
		e, err := a.stream.Next(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, pmnl.ErrOverrun) || errors.Is(err, pmnl.ErrMalformed):
			a.log.Warn("path-manager events lost; connections opened meanwhile get no ADD_ADDR", "err", err)
			continue
		case err != nil:
			return err
		}
		a.mu.Lock()
		tok, initial, due := a.st.event(e, time.Now())
		a.mu.Unlock()
		if due {
			a.announce(ctx, tok, initial)
		}
	}
}

func (a *Announcer) announce(ctx context.Context, token uint32, initial netip.Addr) {
	for i, u := range a.uplinks {
		if u.Addr == initial.Unmap() || u.Addr.Is4() != initial.Unmap().Is4() {
			continue
		}
		flags := pmnl.Flags(0)
		if u.Backup {
			flags |= pmnl.FlagBackup
		}
		err := a.client.Announce(ctx, token, pmnl.Addr{ID: uint8(i + 1), Addr: u.Addr, IfIndex: u.IfIndex, Flags: flags})
		a.mu.Lock()
		if err != nil {
			a.counts.failed++
		} else {
			a.counts.announced++
		}
		a.mu.Unlock()
		if err != nil {
			a.log.Warn("announce", "token", fmt.Sprintf("%08x", token), "addr", u.Addr, "err", err)
		}
	}
}

// KernelEndpoints configures the kernel's own path manager instead: every uplink becomes an
// endpoint that opens subflows and is announced, and the limits are raised so that all of them
// are used. The returned function removes exactly what was added.
func KernelEndpoints(ctx context.Context, uplinks []Uplink) (remove func() error, err error) {
	c, err := pmnl.Dial(pmnl.Options{})
	if err != nil {
		return nil, err
	}
	old, err := c.Limits(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	var added []pmnl.Addr
	remove = func() error {
		var errs []error
		for _, a := range added {
			if err := c.DelEndpoint(context.Background(), a.ID, a.Addr); err != nil {
				errs = append(errs, err)
			}
		}
		if err := c.SetLimits(context.Background(), old); err != nil {
			errs = append(errs, err)
		}
		c.Close()
		return errors.Join(errs...)
	}
	if err := c.SetLimits(ctx, pmnl.Limits{AddAddrAccepted: 8, Subflows: 8}); err != nil {
		remove()
		return nil, err
	}
	for i, u := range uplinks {
		flags := pmnl.FlagSignal | pmnl.FlagSubflow
		if u.Backup {
			flags |= pmnl.FlagBackup
		}
		a := pmnl.Addr{ID: uint8(200 + i), Addr: u.Addr, IfIndex: u.IfIndex, Flags: flags}
		if err := c.AddEndpoint(ctx, a); err != nil {
			remove()
			return nil, fmt.Errorf("endpoint %s: %w", u.Addr, err)
		}
		added = append(added, a)
	}
	return remove, nil
}
