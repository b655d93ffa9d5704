package config

import (
	"fmt"
	"net/netip"
	"time"
)

// LBBGP is the [lb.bgp] section: the instance announces its VIPs to upstream routers over
// BGP, so that several instances share the VIPs' traffic by ECMP. Nil when the section is
// absent (the VIPs are then routed to the instance by other means).
type LBBGP struct {
	LocalAS   uint32
	RouterID  netip.Addr     // IPv4
	NextHop   netip.Addr     // next hop of IPv4 VIPs; default: router_id
	NextHop6  netip.Addr     // next hop of IPv6 VIPs (required when there are some)
	Announce  []netip.Prefix // default: each service's VIP as a /32 or /128
	HoldTime  time.Duration
	Drain     time.Duration // on SIGTERM: withdraw, keep forwarding this long, then stop
	Neighbors []LBNeighbor
}

// LBNeighbor is one upstream router.
type LBNeighbor struct {
	Address netip.Addr
	AS      uint32
	Port    uint16
}

type fileLBBGP struct {
	LocalAS  *int64           `toml:"local_as"`
	RouterID *string          `toml:"router_id"`
	NextHop  *string          `toml:"next_hop"`
	NextHop6 *string          `toml:"next_hop6"`
	Announce any              `toml:"announce"`
	HoldTime any              `toml:"hold_time"`
	Drain    any              `toml:"drain"`
	Neighbor []fileLBNeighbor `toml:"neighbor"`
}

type fileLBNeighbor struct {
	Address *string `toml:"address"`
	AS      *int64  `toml:"as"`
	Port    *int64  `toml:"port"`
}

// LB BGP defaults.
const (
	DefaultLBBGPHoldTime = 9 * time.Second
	DefaultLBBGPDrain    = 2 * time.Second
)

// lbBGP loads the [lb.bgp] section; services are the already loaded VIPs.
func (l *loader) lbBGP(f *fileLBBGP) *LBBGP {
	if f == nil {
		return nil
	}
	const obj, p = "lb.bgp", "lb.bgp."
	b := &LBBGP{HoldTime: DefaultLBBGPHoldTime, Drain: DefaultLBBGPDrain}
	as := func(obj, key, path string, v *int64) uint32 {
		if v == nil {
			return 0
		}
		if *v < 1 || *v > 1<<32-1 {
			l.fail(obj, path, "%s %d outside 1..4294967295", key, *v)
			return 0
		}
		return uint32(*v)
	}
	b.LocalAS = as(obj, "local_as", p+"local_as", f.LocalAS)
	if f.RouterID != nil {
		b.RouterID = l.addr(obj, p+"router_id", "router_id", *f.RouterID)
	}
	if f.NextHop != nil {
		b.NextHop = l.addr(obj, p+"next_hop", "next_hop", *f.NextHop)
	}
	if f.NextHop6 != nil {
		b.NextHop6 = l.addr(obj, p+"next_hop6", "next_hop6", *f.NextHop6)
	}
	b.Announce = l.prefixes(obj, p+"announce", "announce", f.Announce)
	l.duration(obj, p+"hold_time", "hold_time", f.HoldTime, &b.HoldTime)
	l.duration(obj, p+"drain", "drain", f.Drain, &b.Drain)
	for i, fn := range f.Neighbor {
		np := fmt.Sprintf("lb.bgp.neighbor[%d]", i)
		o := fmt.Sprintf("bgp neighbor %d", i+1)
		var n LBNeighbor
		if fn.Address != nil {
			n.Address = l.addr(o, np+".address", "address", *fn.Address)
		}
		n.AS = as(o, "as", np+".as", fn.AS)
		n.Port = 179
		if fn.Port != nil {
			n.Port = l.port(o, np+".port", "port", *fn.Port, 1)
		}
		b.Neighbors = append(b.Neighbors, n)
	}
	return b
}

// checkBGP validates lb.BGP and fills in the defaults that depend on other settings
// (next_hop, announce).
func (lb *LB) checkBGP(c *checker) {
	b := lb.BGP
	if b == nil {
		return
	}
	const obj, p = "lb.bgp", "lb.bgp."
	if b.LocalAS == 0 {
		c.report(obj, "missing local_as (this instance's AS number)", p+"local_as", "lb.bgp")
	}
	if !b.RouterID.Is4() {
		c.report(obj, "router_id: want an IPv4 address (usually the instance's address toward its routers)", p+"router_id", "lb.bgp")
	} else if !b.NextHop.IsValid() {
		b.NextHop = b.RouterID
	}
	if b.NextHop.IsValid() && !b.NextHop.Is4() {
		c.report(obj, fmt.Sprintf("next_hop %s is not an IPv4 address", b.NextHop), p+"next_hop", "lb.bgp")
	}
	if b.HoldTime != 0 && (b.HoldTime < 3*time.Second || b.HoldTime > 65535*time.Second) {
		c.report(obj, fmt.Sprintf("hold_time %s outside 3s..65535s (BGP's range)", b.HoldTime), p+"hold_time", "lb.bgp")
	}
	if b.Drain < 0 {
		c.report(obj, "drain must not be negative", p+"drain", "lb.bgp")
	}
	if len(b.Announce) == 0 {
		seen := map[netip.Addr]bool{}
		for _, s := range lb.Services {
			if s.IsValid() && !seen[s.Addr()] {
				seen[s.Addr()] = true
				b.Announce = append(b.Announce, netip.PrefixFrom(s.Addr(), s.Addr().BitLen()))
			}
		}
	}
	for i, pf := range b.Announce {
		path := fmt.Sprintf("%sannounce[%d]", p, i)
		if !pf.IsValid() {
			continue // reported by the loader
		}
		if pf.Masked() != pf {
			c.report(obj, fmt.Sprintf("announce %s has host bits set (did you mean %s?)", pf, pf.Masked()), path, p+"announce")
		}
		covers := false
		for _, s := range lb.Services {
			covers = covers || pf.Contains(s.Addr())
		}
		if !covers {
			c.report(obj, fmt.Sprintf("announce %s holds no service's VIP", pf), path, p+"announce")
		}
		if pf.Addr().Is6() && !b.NextHop6.Is6() {
			c.report(obj, fmt.Sprintf("announce %s is IPv6: set next_hop6 (an IPv6 address of this instance)", pf), p+"next_hop6", "lb.bgp")
		}
	}
	if b.NextHop6.IsValid() && !b.NextHop6.Is6() {
		c.report(obj, fmt.Sprintf("next_hop6 %s is not an IPv6 address", b.NextHop6), p+"next_hop6", "lb.bgp")
	}
	if len(b.Neighbors) == 0 {
		c.report(obj, "no neighbours: add a [[lb.bgp.neighbor]] with address and as for each upstream router", "lb.bgp")
	}
	seen := map[netip.Addr]bool{}
	for i, n := range b.Neighbors {
		np := fmt.Sprintf("lb.bgp.neighbor[%d]", i)
		o := fmt.Sprintf("bgp neighbor %d", i+1)
		if reason := checkHostAddr(n.Address); reason != "" {
			c.report(o, "address "+reason, np+".address", np)
		} else if seen[n.Address] {
			c.report(o, fmt.Sprintf("address %s: another neighbour has it", n.Address), np+".address", np)
		}
		seen[n.Address] = true
		if n.AS == 0 {
			c.report(o, "missing as (the router's AS number)", np+".as", np)
		}
	}
}
