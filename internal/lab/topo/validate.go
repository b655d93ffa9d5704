package topo

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"braid/internal/config/tomlfile"
	"braid/internal/units"
)

// Limits on names. Namespace and interface names built from them must fit the kernel's
// 15-character interface name limit and stay readable in "ip netns list".
const (
	maxTopologyName = 16
	maxHostName     = 12
	maxIfname       = 15 // IFNAMSIZ - 1
	defaultMTU      = 1500
	minMTU          = 576   // the IPv4 minimum datagram every host must accept
	minMTUIPv6      = 1280  // RFC 8200
	maxMTU          = 65535 // the largest IPv4 or non-jumbo IPv6 packet
)

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// Error is one problem in a topology, with where it is: "file:line:col: object: reason".
type Error = tomlfile.Error

// Normalize fills in the defaults of a topology in place:
//
//   - a link without a Name is called "A-B" after its hosts; parallel links between the same
//     pair get the first free name of "A-B-2", "A-B-3", ...;
//   - an Endpoint without an Ifname gets the lowest "eth<N>" not used by the host, in link
//     order, so explicit names are never taken over;
//   - an MTU of 0 becomes 1500.
//
// Queue bounds stay 0: the emulator derives them from the rate and the delay. Normalize is
// idempotent and never reports errors; Validate does.
func (t *Topology) Normalize() {
	used := map[string]map[string]bool{} // host -> interface names already taken
	take := func(host, ifname string) {
		if used[host] == nil {
			used[host] = map[string]bool{}
		}
		used[host][ifname] = true
	}
	taken := map[string]bool{} // link names
	for _, l := range t.Links {
		for _, e := range []Endpoint{l.A, l.B} {
			if e.Ifname != "" {
				take(e.Host, e.Ifname)
			}
		}
		if l.Name != "" {
			taken[l.Name] = true
		}
	}
	next := map[string]int{} // host -> next eth<N> to try
	for i := range t.Links {
		l := &t.Links[i]
		for _, e := range []*Endpoint{&l.A, &l.B} {
			for e.Ifname == "" {
				name := "eth" + strconv.Itoa(next[e.Host])
				next[e.Host]++
				if !used[e.Host][name] {
					e.Ifname = name
					take(e.Host, name)
				}
			}
		}
		if l.Name == "" {
			base := l.A.Host + "-" + l.B.Host
			name := base
			for n := 2; taken[name]; n++ {
				name = base + "-" + strconv.Itoa(n)
			}
			l.Name = name
			taken[name] = true
		}
		if l.MTU == 0 {
			l.MTU = defaultMTU
		}
	}
}

// Validate reports every problem in t as an errors.Join of *Error values, or nil. It checks t
// as Normalize would leave it, without modifying t, so a topology built in Go does not need
// its defaults filled in first. It checks:
//
//   - names: the topology's and the hosts' match ^[a-z][a-z0-9-]*$ and are at most 16 and 12
//     characters long; host and link names are unique;
//   - links: both hosts exist and differ; interface names are at most 15 characters, not
//     "lo", valid for the kernel and unique per host; the MTU is within 576..65535, and at
//     least 1280 if either end has an IPv6 address;
//   - shapes: delay, jitter and queue bounds are not negative, loss is within 0..100; a trace
//     is a parsed one (not a JSON summary), its offset within its period, and not beside a
//     rate; a kernel link has no trace;
//   - addresses: every prefix is valid, no IP address appears twice in the topology, and if
//     both ends of a link have IPv4 (IPv6) addresses, some pair is in the same subnet;
//   - routes: the destination is valid, has no host bits set and is unique in the host; the
//     metric fits in 32 bits; there is a via or a dev; dev is an interface of the host; via
//     is of the destination's family, has no zone, is not the host's own address and is in
//     the subnet of one of the host's addresses (on dev, if given);
//   - NATs: at least one outside interface, each an interface of the host, named once, with an
//     IPv4 address (and an IPv6 one when IPv6 is masqueraded); some interface of the host is
//     not outside; timeouts are whole seconds within 1 s..MaxNATTimeout (or 0).
func (t *Topology) Validate() error {
	n := *t
	n.Links = slices.Clone(t.Links) // Normalize writes only to links
	n.Normalize()
	return joinIssues(n.check())
}

// issue is a problem found by check, with the TOML key paths (such as "link[2].ab.delay") that
// most likely hold the offending value, best first; Parse uses them to find the line.
type issue struct {
	err   *Error
	paths []string
}

func joinIssues(issues []issue) error {
	errs := make([]error, len(issues))
	for i, is := range issues {
		errs[i] = is.err
	}
	return errors.Join(errs...)
}

// check validates a normalized topology. Its key paths index Hosts, Links and Routes exactly
// as the TOML arrays of the same names do.
func (t *Topology) check() []issue {
	c := &checker{
		hosts:     map[string]int{},
		ifaces:    map[ifaceKey]string{},
		addrs:     map[netip.Addr]string{},
		hostAddrs: map[string][]hostAddr{},
		links:     map[string]bool{},
	}
	c.names(t)
	for i := range t.Links {
		c.link(i, &t.Links[i])
	}
	for i := range t.Hosts {
		if c.hosts[t.Hosts[i].Name] == i { // a duplicate host was reported, and its links are the first one's
			c.routes(i, &t.Hosts[i])
			if t.Hosts[i].NAT != nil {
				c.nat(i, &t.Hosts[i])
			}
		}
	}
	return c.issues
}

// checker accumulates issues and what the links declare, for the checks of the routes.
type checker struct {
	issues    []issue
	hosts     map[string]int        // host name -> index of its first definition
	ifaces    map[ifaceKey]string   // -> link name
	addrs     map[netip.Addr]string // -> "host ifname"
	hostAddrs map[string][]hostAddr // host -> its interfaces' addresses
	links     map[string]bool       // link names
}

type ifaceKey struct{ host, ifname string }

// hostAddr is an address of a host together with the interface that carries it.
type hostAddr struct {
	ifname string
	prefix netip.Prefix
}

func (c *checker) report(object, reason string, paths ...string) {
	c.issues = append(c.issues, issue{&Error{Object: object, Reason: reason}, paths})
}

// names checks the names of the topology and its hosts.
func (c *checker) names(t *Topology) {
	obj := "topology " + t.Name
	if !nameRE.MatchString(t.Name) {
		c.report(obj, fmt.Sprintf("name %q must match %s", t.Name, nameRE), "name")
	} else if len(t.Name) > maxTopologyName {
		c.report(obj, fmt.Sprintf("name %q is longer than %d characters", t.Name, maxTopologyName), "name")
	}
	for i, h := range t.Hosts {
		p := fmt.Sprintf("host[%d].name", i)
		obj := "host " + h.Name
		switch {
		case !nameRE.MatchString(h.Name):
			c.report(obj, fmt.Sprintf("name %q must match %s", h.Name, nameRE), p)
		case len(h.Name) > maxHostName:
			c.report(obj, fmt.Sprintf("name %q is longer than %d characters", h.Name, maxHostName), p)
		}
		if _, dup := c.hosts[h.Name]; dup {
			c.report(obj, "duplicate host", p)
			continue
		}
		c.hosts[h.Name] = i
	}
}

// link checks link i and records its interfaces and addresses.
func (c *checker) link(i int, l *Link) {
	p := fmt.Sprintf("link[%d]", i)
	obj := "link " + l.Name
	if c.links[l.Name] {
		c.report(obj, "duplicate link name", p+".name")
	}
	c.links[l.Name] = true

	hasIPv6 := false
	for _, end := range []struct {
		e    *Endpoint
		side string // "a" or "b", the TOML key prefix
	}{{&l.A, "a"}, {&l.B, "b"}} {
		hasIPv6 = c.endpoint(l.Name, p, end.side, end.e) || hasIPv6
	}
	if l.A.Host != "" && l.A.Host == l.B.Host {
		c.report(obj, fmt.Sprintf("link from host %s to itself", l.A.Host), p+".b", p)
	}
	for _, fam := range []struct {
		name string
		is4  bool
	}{{"IPv4", true}, {"IPv6", false}} {
		if a, b := familyAddrs(l.A.Addrs, fam.is4), familyAddrs(l.B.Addrs, fam.is4); len(a) > 0 && len(b) > 0 && !shareSubnet(a, b) {
			c.report(obj, fmt.Sprintf("%s %s and %s %s are not in the same %s subnet",
				l.A.Host, joinPrefixes(a), l.B.Host, joinPrefixes(b), fam.name), p+".b_addr", p)
		}
	}

	switch {
	case l.MTU < minMTU || l.MTU > maxMTU:
		c.report(obj, fmt.Sprintf("MTU %d outside %d..%d", l.MTU, minMTU, maxMTU), p+".mtu", p)
	case hasIPv6 && l.MTU < minMTUIPv6:
		c.report(obj, fmt.Sprintf("MTU %d is below the IPv6 minimum of %d", l.MTU, minMTUIPv6), p+".mtu", p)
	}
	if l.Offload < OffloadAuto || l.Offload > OffloadOff {
		c.report(obj, fmt.Sprintf("invalid offload mode %d", l.Offload), p+".offload", p)
	}
	c.shape(obj, p, "ab", l.A.Host, l.B.Host, l.AB)
	c.shape(obj, p, "ba", l.B.Host, l.A.Host, l.BA)
	if l.Kernel {
		if l.Offload != OffloadAuto {
			c.report(obj, "a kernel link has no emulator offload mode", p+".offload", p)
		}
		for _, d := range []struct {
			dir string
			s   Shape
		}{{"ab", l.AB}, {"ba", l.BA}} {
			if d.s.Delay != 0 || d.s.Jitter != 0 || d.s.Loss != 0 || d.s.QueuePackets != 0 || d.s.QueueBytes != 0 {
				c.report(obj, "a kernel link can only be rate-limited (no delay, jitter, loss or queue size)", p+"."+d.dir, p+".kernel", p)
			}
			if d.s.Trace != nil {
				c.report(obj, "a kernel link cannot replay a trace (only the emulator can)", p+"."+d.dir+".trace", p+".trace", p+".kernel", p)
			}
		}
	}
}

// endpoint checks one end of a link and reports whether it has an IPv6 address. p is the
// link's key path and side "a" or "b".
func (c *checker) endpoint(link, p, side string, e *Endpoint) (hasIPv6 bool) {
	obj := "link " + link
	switch _, ok := c.hosts[e.Host]; {
	case e.Host == "":
		c.report(obj, "missing host for end "+side, p+"."+side, p)
	case !ok:
		c.report(obj, fmt.Sprintf("unknown host %q", e.Host), p+"."+side, p)
	}

	ifp := p + "." + side + "_ifname"
	switch {
	case e.Ifname == "lo":
		c.report(obj, fmt.Sprintf("interface name %q on host %s is reserved", e.Ifname, e.Host), ifp, p)
	case len(e.Ifname) > maxIfname:
		c.report(obj, fmt.Sprintf("interface name %q on host %s is longer than %d characters", e.Ifname, e.Host, maxIfname), ifp, p)
	case e.Ifname == "." || e.Ifname == ".." || strings.ContainsAny(e.Ifname, "/: \t\n\r\v\f"):
		// The kernel's dev_valid_name rejects these.
		c.report(obj, fmt.Sprintf("invalid interface name %q on host %s", e.Ifname, e.Host), ifp, p)
	}
	k := ifaceKey{e.Host, e.Ifname}
	if other, dup := c.ifaces[k]; dup {
		c.report(obj, fmt.Sprintf("interface %q on host %s is also used by link %s", e.Ifname, e.Host, other), ifp, p)
	} else {
		c.ifaces[k] = link
	}

	for j, a := range e.Addrs {
		ap := []string{fmt.Sprintf("%s.%s_addr[%d]", p, side, j), p + "." + side + "_addr", p}
		if !a.IsValid() {
			c.report(obj, fmt.Sprintf("invalid address %q on host %s", a, e.Host), ap...)
			continue
		}
		hasIPv6 = hasIPv6 || a.Addr().Is6()
		where := e.Host + " " + e.Ifname
		if other, dup := c.addrs[a.Addr()]; dup {
			c.report(obj, fmt.Sprintf("address %s on %s is also on %s", a.Addr(), where, other), ap...)
		} else {
			c.addrs[a.Addr()] = where
		}
		c.hostAddrs[e.Host] = append(c.hostAddrs[e.Host], hostAddr{e.Ifname, a})
	}
	return hasIPv6
}

// shape checks the shape of one direction, dir being "ab" or "ba".
func (c *checker) shape(obj, p, dir, from, to string, s Shape) {
	bad := func(field, reason string) {
		c.report(obj, fmt.Sprintf("%s from %s to %s", reason, from, to),
			p+"."+dir+"."+field, p+"."+field, p+"."+dir, p)
	}
	if s.Delay < 0 {
		bad("delay", fmt.Sprintf("negative delay %v", s.Delay))
	}
	if s.Jitter < 0 {
		bad("jitter", fmt.Sprintf("negative jitter %v", s.Jitter))
	}
	if !(s.Loss >= 0 && s.Loss <= 100) { // also catches NaN
		bad("loss", fmt.Sprintf("loss %v %% outside 0..100", s.Loss))
	}
	if s.QueuePackets < 0 {
		bad("queue_packets", fmt.Sprintf("negative queue %d packets", s.QueuePackets))
	}
	if s.QueueBytes < 0 {
		bad("queue_bytes", fmt.Sprintf("negative queue %d bytes", s.QueueBytes))
	}
	if s.Trace != nil {
		switch {
		case s.Rate != 0:
			bad("trace", fmt.Sprintf("both a rate (%s) and a %s", units.FormatRate(s.Rate), s.Trace))
		case !s.Trace.Replayable():
			bad("trace", fmt.Sprintf("%s holds no timestamps (a summary, not a parsed trace)", s.Trace))
		case s.Trace.Offset < 0 || s.Trace.Offset >= s.Trace.Period():
			bad("trace_offset", fmt.Sprintf("trace offset %v outside the period %v of %s", s.Trace.Offset, s.Trace.Period(), s.Trace))
		}
	}
}

// routes checks the routes of host i against the interfaces and addresses of its links.
func (c *checker) routes(i int, h *Host) {
	own := c.hostAddrs[h.Name]
	// The kernel keeps one route per destination and metric: a backup route differs in metric.
	type routeKey struct {
		dst    netip.Prefix
		metric int
	}
	dsts := map[routeKey]bool{}
	for j, r := range h.Routes {
		p := fmt.Sprintf("host[%d].route[%d]", i, j)
		obj := fmt.Sprintf("host %s route %s", h.Name, r.Dst)
		if !r.Dst.IsValid() {
			c.report(obj, "missing or invalid destination", p+".dst", p)
		} else {
			if r.Dst != r.Dst.Masked() {
				c.report(obj, fmt.Sprintf("destination has host bits set (did you mean %s?)", r.Dst.Masked()), p+".dst", p)
			}
			if k := (routeKey{r.Dst, r.Metric}); dsts[k] {
				c.report(obj, "duplicate route: same destination and metric", p+".dst", p)
			} else {
				dsts[k] = true
			}
		}
		if r.Metric < 0 || int64(r.Metric) > math.MaxUint32 {
			c.report(obj, fmt.Sprintf("metric %d outside 0..%d", r.Metric, uint32(math.MaxUint32)), p+".metric", p)
		}
		if _, ok := c.ifaces[ifaceKey{h.Name, r.Dev}]; r.Dev != "" && !ok {
			c.report(obj, fmt.Sprintf("dev %q is not an interface of host %s", r.Dev, h.Name), p+".dev", p)
		}
		switch {
		case !r.Via.IsValid() && r.Dev == "":
			c.report(obj, "needs via or dev", p)
		case !r.Via.IsValid():
		case r.Via.Zone() != "":
			c.report(obj, fmt.Sprintf("via %s has a zone; use dev instead", r.Via), p+".via", p)
		case r.Dst.IsValid() && r.Via.Is4() != r.Dst.Addr().Is4():
			c.report(obj, fmt.Sprintf("via %s is not of the destination's address family", r.Via), p+".via", p)
		default:
			onLink, isOwn := false, false
			for _, a := range own {
				if r.Dev == "" || a.ifname == r.Dev {
					onLink = onLink || a.prefix.Contains(r.Via)
				}
				isOwn = isOwn || a.prefix.Addr() == r.Via
			}
			switch {
			case isOwn:
				c.report(obj, fmt.Sprintf("via %s is an address of host %s itself", r.Via, h.Name), p+".via", p)
			case !onLink && r.Dev != "":
				c.report(obj, fmt.Sprintf("via %s is not in a subnet of %s on host %s", r.Via, r.Dev, h.Name), p+".via", p)
			case !onLink:
				c.report(obj, fmt.Sprintf("via %s is not in a subnet of any address of host %s", r.Via, h.Name), p+".via", p)
			}
		}
	}
}

// nat checks the NAT of host i against the interfaces and addresses of its links.
func (c *checker) nat(i int, h *Host) {
	n := h.NAT
	p := fmt.Sprintf("host[%d].nat", i)
	obj := "host " + h.Name + " nat"
	var ifnames []string
	for k := range c.ifaces {
		if k.host == h.Name {
			ifnames = append(ifnames, k.ifname)
		}
	}
	slices.Sort(ifnames)
	has := func(ifname string) bool { return slices.Contains(ifnames, ifname) }
	theirs := "it has none"
	if len(ifnames) > 0 {
		theirs = "its interfaces: " + strings.Join(ifnames, ", ")
	}
	if len(n.Outside) == 0 {
		c.report(obj, "needs outside: the interfaces on the public side ("+theirs+")", p+".outside", p, fmt.Sprintf("host[%d]", i))
	}
	seen := map[string]bool{}
	for j, o := range n.Outside {
		op := []string{fmt.Sprintf("%s.outside[%d]", p, j), p + ".outside", p}
		switch {
		case seen[o]:
			c.report(obj, fmt.Sprintf("outside %q is named twice", o), op...)
			continue
		case !has(o):
			c.report(obj, fmt.Sprintf("outside %q is not an interface of host %s (%s)", o, h.Name, theirs), op...)
			continue
		}
		seen[o] = true
		var v4, v6 bool
		for _, a := range c.hostAddrs[h.Name] {
			if a.ifname == o && a.prefix.IsValid() {
				v4, v6 = v4 || a.prefix.Addr().Is4(), v6 || a.prefix.Addr().Is6()
			}
		}
		if !v4 {
			c.report(obj, fmt.Sprintf("outside %s has no IPv4 address to masquerade with", o), op...)
		}
		if n.IPv6 && !v6 {
			c.report(obj, fmt.Sprintf("outside %s has no IPv6 address to masquerade with (ipv6 = true)", o), append(op[:1:1], p+".ipv6", p)...)
		}
	}
	if len(seen) > 0 && len(seen) == len(ifnames) {
		c.report(obj, fmt.Sprintf("every interface of host %s is outside: nothing is behind the NAT", h.Name), p+".outside", p)
	}
	for _, tm := range []struct {
		key string
		d   time.Duration
	}{{"udp_timeout", n.UDPTimeout}, {"udp_stream_timeout", n.UDPStreamTimeout}} {
		switch d := tm.d; {
		case d == 0:
		case d < 0:
			c.report(obj, fmt.Sprintf("negative %s %v", tm.key, d), p+"."+tm.key, p)
		case d%time.Second != 0:
			c.report(obj, fmt.Sprintf("%s %v is not a whole number of seconds (the kernel counts seconds)", tm.key, d), p+"."+tm.key, p)
		case d > MaxNATTimeout:
			c.report(obj, fmt.Sprintf("%s %v is over %v", tm.key, d, MaxNATTimeout), p+"."+tm.key, p)
		}
	}
}

func familyAddrs(ps []netip.Prefix, is4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.IsValid() && p.Addr().Is4() == is4 {
			out = append(out, p)
		}
	}
	return out
}

// shareSubnet reports whether some address of a and some address of b are in the same subnet,
// with the same prefix length.
func shareSubnet(a, b []netip.Prefix) bool {
	for _, pa := range a {
		for _, pb := range b {
			if pa.Masked() == pb.Masked() {
				return true
			}
		}
	}
	return false
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
