package scenario

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/lisp/xtr"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
)

// AMPTCPSites are the sites of the A-MPTCP paper's testbed (its Fig. 5): a single-homed client
// site (LispSites[0] with its first RLOC only) and a data centre with two RLOCs (LispSites[1]).
func AMPTCPSites() []LispSite {
	c := LispSites[0]
	c.RLOCs, c.Ifaces, c.Links = c.RLOCs[:1], c.Ifaces[:1], c.Links[:1]
	return []LispSite{c, LispSites[1]}
}

// AMPTCPTopology is the testbed on emulated links: the client's RLOC link has clientDown bit/s
// toward the client (and as much back), each data-centre RLOC link dcUp bit/s from the data
// centre (unlimited toward it, where only acknowledgements go); every RLOC link and the map
// server's has the one-way delay given, so a round trip crosses it four times.
func AMPTCPTopology(clientDown, dcUp uint64, delay time.Duration) *topo.Topology {
	return LispSitesTopology("amptcp", AMPTCPSites(), func(site, _ int) (topo.Shape, topo.Shape) {
		if site == 0 {
			s := topo.Shape{Rate: clientDown, Delay: delay}
			return s, s
		}
		return topo.Shape{Rate: dcUp, Delay: delay}, topo.Shape{Delay: delay}
	}, topo.Shape{Delay: delay})
}

// AMPTCPXTR adjusts an xTR's options for A-MPTCP: placement mode, and registrations that ask
// the map server to answer Map-Requests itself (the path managers on the hosts are reached
// from the map server; an ETR's own reply to a host of its site would come back to it with its
// own address as the source and be dropped as martian).
func AMPTCPXTR(_ int, o *xtr.Options) {
	o.Placement = true
	for k := range o.MapServers {
		o.MapServers[k].ProxyReply = true
	}
}

// PrepareAMPTCP makes a running LispSitesTopology ready for MPTCP between its two hosts: the
// core routes each site's EID prefixes natively to the site's first RLOC (so that Map-Replies
// reach the path managers on the hosts), and each host's MPTCP limits allow 8 subflows.
func PrepareAMPTCP(l *lab.Lab, sites []LispSite) error {
	core := l.Host("core")
	for _, s := range sites {
		for _, p := range s.EIDs {
			if !p.Addr().Is4() {
				continue
			}
			if err := core.ReplaceRoute(topo.Route{Dst: p, Via: s.RLOCs[0]}); err != nil {
				return fmt.Errorf("scenario: route %v in core: %w", p, err)
			}
		}
		if err := SetMPTCPLimits(l.Host(s.Host), 8); err != nil {
			return err
		}
	}
	return nil
}

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
