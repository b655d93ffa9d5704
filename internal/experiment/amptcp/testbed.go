package amptcp

import (
	"fmt"
	"time"

	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/lisp/xtr"
)

// AMPTCPSites are the sites of the A-MPTCP paper's testbed (its Fig. 5): a single-homed client
// site (LispSites[0] with its first RLOC only) and a data centre with two RLOCs (LispSites[1]).
func AMPTCPSites() []roles.LispSite {
	c := roles.LispSites[0]
	c.RLOCs, c.Ifaces, c.Links = c.RLOCs[:1], c.Ifaces[:1], c.Links[:1]
	return []roles.LispSite{c, roles.LispSites[1]}
}

// AMPTCPTopology is the testbed on emulated links: the client's RLOC link has clientDown bit/s
// toward the client (and as much back), each data-centre RLOC link dcUp bit/s from the data
// centre (unlimited toward it, where only acknowledgements go); every RLOC link and the map
// server's has the one-way delay given, so a round trip crosses it four times.
func AMPTCPTopology(clientDown, dcUp uint64, delay time.Duration) *topo.Topology {
	return roles.LispSitesTopology("amptcp", AMPTCPSites(), func(site, _ int) (topo.Shape, topo.Shape) {
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
func PrepareAMPTCP(l *lab.Lab, sites []roles.LispSite) error {
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
		if err := roles.SetMPTCPLimits(l.Host(s.Host), 8); err != nil {
			return err
		}
	}
	return nil
}
