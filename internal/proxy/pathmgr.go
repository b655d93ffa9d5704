package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

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
// uplink (of the connection's family) as soon as the connection is established. The client
// side (the fullmesh policy of internal/mptcp/pm) then joins every announced address from every
// one of its uplinks.
type Announcer struct {
	uplinks []Uplink
	ports   map[uint16]bool
	log     *slog.Logger
	stream  *pmnl.Stream
	client  *pmnl.Client

	mu     sync.Mutex
	counts struct{ announced, failed uint64 }
}

// NewAnnouncer subscribes to the path-manager events of the calling thread's namespace; it
// announces on the server-side connections whose local port is one of ports.
func NewAnnouncer(uplinks []Uplink, ports []uint16, log *slog.Logger) (*Announcer, error) {
	a := &Announcer{uplinks: uplinks, ports: map[uint16]bool{}, log: log}
	for _, p := range ports {
		a.ports[p] = true
	}
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
	local := map[uint32]netip.AddrPort{} // server-side connections on our ports, by token
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
		switch e.Type {
		case pmnl.EventCreated:
			if e.ServerSide && a.ports[e.Local.Port()] {
				local[e.Token] = e.Local
			}
		case pmnl.EventEstablished:
			if l, ok := local[e.Token]; ok {
				a.announce(ctx, e.Token, l.Addr())
			}
		case pmnl.EventClosed:
			delete(local, e.Token)
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
