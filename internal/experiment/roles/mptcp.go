package roles

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
)

// SetMPTCPLimits sets the kernel's MPTCP limits of host h (subflows, ADD_ADDRs accepted).
func SetMPTCPLimits(h *lab.Host, n uint32) error {
	return h.NS.Do(func() error {
		c, err := pmnl.Dial(pmnl.Options{})
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.SetLimits(ctx, pmnl.Limits{Subflows: n, AddAddrAccepted: n})
	})
}

// HostUplink returns the uplink of host h that has address a, for a path manager.
func HostUplink(l *lab.Lab, h *lab.Host, a netip.Addr) (core.Uplink, error) {
	for _, lk := range l.Links() {
		for _, ep := range []topo.Endpoint{lk.Spec.A, lk.Spec.B} {
			if ep.Host != h.Name {
				continue
			}
			for _, p := range ep.Addrs {
				if p.Addr() != a {
					continue
				}
				nl, err := h.NS.Netlink().LinkByName(ep.Ifname)
				if err != nil {
					return core.Uplink{}, err
				}
				return core.Uplink{Name: ep.Ifname, Addr: a.String(), IfIndex: int32(nl.Attrs().Index), V6: a.Is6()}, nil
			}
		}
	}
	return core.Uplink{}, fmt.Errorf("scenario: %s has no address %v", h.Name, a)
}

// PMOptions say how StartPM runs a path manager.
type PMOptions struct {
	Uplinks []core.Uplink
	Policy  core.Policy
	// Resolvers, when set, give the policy (a *core.AMPTCP) a map-resolver client whose
	// mappings are asked again after MaxAge.
	Resolvers []netip.AddrPort
	MaxAge    time.Duration
}

// StartPM runs a path manager in host h until stop.
func StartPM(ctx context.Context, h *lab.Host, o PMOptions) (d *pm.Daemon, stop func() error, err error) {
	var res *pm.Resolver
	if len(o.Resolvers) > 0 {
		if err := h.NS.Do(func() (err error) {
			res, err = pm.NewResolver(pm.ResolverOptions{Resolvers: o.Resolvers, Timeout: 300 * time.Millisecond, MaxAge: o.MaxAge})
			return err
		}); err != nil {
			return nil, nil, err
		}
		if a, ok := o.Policy.(*core.AMPTCP); ok {
			a.Maps = res
		}
	}
	if err := h.NS.Do(func() (err error) {
		d, err = pm.New(pm.Options{Uplinks: o.Uplinks, Policy: o.Policy, Resolver: res, Poll: 50 * time.Millisecond})
		return err
	}); err != nil {
		if res != nil {
			res.Close()
		}
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	return d, func() error {
		cancel()
		err := <-done
		if cerr := h.NS.Do(d.Close); err == nil {
			err = cerr
		}
		return err
	}, nil
}

// MPTCPDial dials from host h, with MPTCP or plain TCP.
func MPTCPDial(h *lab.Host, multipath bool) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		var c net.Conn
		err := h.NS.Spawn(func() (err error) {
			var d net.Dialer
			d.SetMultipathTCP(multipath)
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
}

// MPTCPListen listens with MPTCP on address in host h.
func MPTCPListen(h *lab.Host, address string) (net.Listener, error) {
	var ln net.Listener
	err := h.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", address)
		return err
	})
	return ln, err
}
