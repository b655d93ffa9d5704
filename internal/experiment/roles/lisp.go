package roles

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/tun"
	"braid/internal/wire/lisp"
)

// LispSite is one of the two LISP sites of LispTopology.
type LispSite struct {
	Name   string
	Router string         // the xTR's host
	Host   string         // the host behind it
	EIDs   []netip.Prefix // the site's EID prefixes
	HostIP []netip.Addr   // the host's EIDs (IPv4, IPv6)
	RLOCs  []netip.Addr   // the xTR's RLOCs, one per uplink
	Ifaces []string       // the uplink interfaces, same order
	Links  []string       // the uplink links, same order
	Key    string
}

// LispSites are the sites of LispTopology: each a host behind an xTR with two RLOCs, each RLOC
// on its own link to the core, where the map server also is.
var LispSites = [2]LispSite{
	{Name: "site1", Router: "xtr1", Host: "h1", Key: "site1-secret",
		EIDs:   []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
		HostIP: []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00:1::1")},
		RLOCs:  []netip.Addr{netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")},
		Ifaces: []string{"rloc1", "rloc2"}, Links: []string{"site1-rloc1", "site1-rloc2"}},
	{Name: "site2", Router: "xtr2", Host: "h2", Key: "site2-secret",
		EIDs:   []netip.Prefix{netip.MustParsePrefix("192.168.2.0/24"), netip.MustParsePrefix("fd00:2::/64")},
		HostIP: []netip.Addr{netip.MustParseAddr("192.168.2.1"), netip.MustParseAddr("fd00:2::1")},
		RLOCs:  []netip.Addr{netip.MustParseAddr("10.0.3.1"), netip.MustParseAddr("10.0.4.1")},
		Ifaces: []string{"rloc1", "rloc2"}, Links: []string{"site2-rloc1", "site2-rloc2"}},
}

// LispMapServer is the map server's address in LispTopology.
var LispMapServer = netip.MustParseAddrPort("10.0.9.1:4342")

// LispEIDSpace is routed into each xTR's TUN device: the EID space of both sites (the local
// site's more specific LAN route wins for its own hosts).
var LispEIDSpace = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fd00::/16")}

// LispTopology returns two multihomed LISP sites and a map server:
//
//	h1 -- xtr1 =rloc1 10.0.1.1= core =10.0.3.1 rloc1= xtr2 -- h2
//	           =rloc2 10.0.2.1=  |   =10.0.4.1 rloc2=
//	                             ms 10.0.9.1
//
// The core routes every RLOC on-link, so all four RLOC pairs are distinct paths; each xTR has
// a default route through each uplink (different metrics) and binds each RLOC's sockets to its
// interface. Links are shaped with delay (rate when set).
func LispTopology(delay time.Duration, rate uint64) *topo.Topology {
	sh := topo.Shape{Delay: delay, Rate: rate}
	return LispSitesTopology("lisp", LispSites[:], func(int, int) (topo.Shape, topo.Shape) { return sh, sh }, sh)
}

// LispSitesTopology is LispTopology for two sites of any number of RLOCs (sites[i] has the
// addresses of LispSites[i], with RLOCs, Ifaces and Links possibly cut short); shape gives the
// shapes of site i's uplink j, from the router to the core and back, and ms the map server's.
func LispSitesTopology(name string, sites []LispSite, shape func(site, j int) (up, down topo.Shape), ms topo.Shape) *topo.Topology {
	pf := netip.MustParsePrefix
	t := &topo.Topology{Name: name, Hosts: []topo.Host{
		{Name: "h1", Routes: []topo.Route{{Dst: pf("0.0.0.0/0"), Via: netip.MustParseAddr("192.168.1.254")}, {Dst: pf("::/0"), Via: netip.MustParseAddr("fd00:1::fe")}}},
		{Name: "h2", Routes: []topo.Route{{Dst: pf("0.0.0.0/0"), Via: netip.MustParseAddr("192.168.2.254")}, {Dst: pf("::/0"), Via: netip.MustParseAddr("fd00:2::fe")}}},
		{Name: "core", Forward: true},
		{Name: "ms", Routes: []topo.Route{{Dst: pf("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.9.2")}}},
	}}
	for i, s := range sites {
		h := topo.Host{Name: s.Router, Forward: true}
		for j, r := range s.RLOCs {
			core := r.Next()
			h.Routes = append(h.Routes, topo.Route{Dst: pf("0.0.0.0/0"), Via: core, Metric: 10 * (j + 1)})
			up, down := shape(i, j)
			t.Links = append(t.Links, topo.Link{Name: s.Links[j], AB: up, BA: down,
				A: topo.Endpoint{Host: s.Router, Ifname: s.Ifaces[j], Addrs: []netip.Prefix{netip.PrefixFrom(r, 30)}},
				B: topo.Endpoint{Host: "core", Ifname: fmt.Sprintf("s%d-%d", i+1, j+1), Addrs: []netip.Prefix{netip.PrefixFrom(core, 30)}}})
		}
		t.Hosts = append(t.Hosts, h)
		lan := topo.Link{Name: s.Name + "-lan",
			A: topo.Endpoint{Host: s.Host, Addrs: []netip.Prefix{netip.PrefixFrom(s.HostIP[0], 24), netip.PrefixFrom(s.HostIP[1], 64)}},
			B: topo.Endpoint{Host: s.Router, Ifname: "lan", Addrs: []netip.Prefix{
				netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i + 1), 254}), 24),
				netip.PrefixFrom(netip.MustParseAddr(s.EIDs[1].Addr().String()+"fe"), 64)}}}
		t.Links = append(t.Links, lan)
	}
	t.Links = append(t.Links, topo.Link{Name: "ms-core", AB: ms, BA: ms,
		A: topo.Endpoint{Host: "ms", Ifname: "core", Addrs: []netip.Prefix{pf("10.0.9.1/30")}},
		B: topo.Endpoint{Host: "core", Ifname: "ms", Addrs: []netip.Prefix{pf("10.0.9.2/30")}}})
	return t
}

// LispMapServerConfig is a map server for both sites of LispTopology.
func LispMapServerConfig() mapserver.Config {
	c := mapserver.Defaults()
	for _, s := range LispSites {
		c.Sites = append(c.Sites, mapserver.Site{Name: s.Name, Keys: map[uint8][]byte{0: []byte(s.Key)}, Prefixes: s.EIDs})
	}
	return c
}

// StartMapServer runs a map server in host h on addr until stop.
func StartMapServer(ctx context.Context, h *lab.Host, addr netip.AddrPort, cfg mapserver.Config) (s *mapserver.Server, stop func() error, err error) {
	s, err = mapserver.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	pc, err := h.ListenPacket("udp", addr.String())
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, pc.(*net.UDPConn)) }()
	return s, func() error { cancel(); return <-done }, nil
}

// LispXTROptions are the options of site i's xTR in LispTopology, without device and uplinks.
func LispXTROptions(i int) xtr.Options { return LispSiteXTROptions(LispSites[i]) }

// LispSiteXTROptions are the options of site s's xTR, without device and uplinks.
func LispSiteXTROptions(s LispSite) xtr.Options {
	o := xtr.Options{EIDs: s.EIDs, Resolvers: []netip.AddrPort{LispMapServer},
		MapServers:    []xtr.MapServer{{Addr: LispMapServer, Key: []byte(s.Key), AlgID: lisp.AlgHMACSHA256}},
		ProbeInterval: 300 * time.Millisecond, DownAfter: time.Second, RegisterInterval: 10 * time.Second,
		RequestTimeout: 500 * time.Millisecond}
	for range s.RLOCs {
		o.Locators = append(o.Locators, xtr.Locator{Priority: 1, Weight: 50})
	}
	return o
}

// StartXTR runs the xTR of site i in its router: uplink sockets on each RLOC, a TUN device
// "lisp0" into which the EID space is routed, and the options o (LispXTROptions, adjusted).
func StartXTR(ctx context.Context, l *lab.Lab, i int, o xtr.Options) (x *xtr.XTR, stop func() error, err error) {
	return StartSiteXTR(ctx, l, LispSites[i], o)
}

// StartSiteXTR is StartXTR for site s.
func StartSiteXTR(ctx context.Context, l *lab.Lab, s LispSite, o xtr.Options) (x *xtr.XTR, stop func() error, err error) {
	h := l.Host(s.Router)
	closeAll := func() {
		for _, u := range o.Uplinks {
			u.Close()
		}
		if o.Device != nil {
			o.Device.Close()
		}
	}
	for j, a := range s.RLOCs {
		var u *xtr.Uplink
		if err := h.NS.Do(func() (err error) { u, err = xtr.OpenUplink(a, s.Ifaces[j]); return err }); err != nil {
			closeAll()
			return nil, nil, err
		}
		o.Uplinks = append(o.Uplinks, u)
	}
	for _, k := range []string{"ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
		if err := h.NS.Sysctl(k, "0"); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	var dev *tun.Device
	if err := h.NS.Do(func() (err error) { dev, err = tun.OpenOffload("lisp0"); return err }); err != nil {
		closeAll()
		return nil, nil, err
	}
	o.Device = dev
	if o.MTU == 0 {
		o.MTU = 1500 - 56
	}
	if err := tun.Configure(h.NS.Netlink(), "lisp0", o.MTU, nil); err != nil {
		closeAll()
		return nil, nil, err
	}
	for _, p := range LispEIDSpace {
		if err := tun.AddRoute(h.NS.Netlink(), "lisp0", p); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	x, err = xtr.New(o)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	return x, func() error { cancel(); return <-done }, nil
}

// WaitRegistered waits until every xTR has a Map-Notify from its map server.
func WaitRegistered(xs []*xtr.XTR, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ok := true
		for _, x := range xs {
			for _, r := range x.Status().Registrations {
				ok = ok && r.Registered
			}
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("scenario: xTRs not registered within %v", within)
}

// LispLab is a running LispTopology with its map server and xTRs.
type LispLab struct {
	Lab       *lab.Lab
	MapServer *mapserver.Server
	XTRs      [2]*xtr.XTR
	stops     []func() error
}

// StartLisp starts the map server and both xTRs on l and waits for their registrations;
// adjust, if given, changes each xTR's options first. They run until ctx ends or Close.
func StartLisp(ctx context.Context, l *lab.Lab, adjust func(site int, o *xtr.Options)) (*LispLab, error) {
	return StartLispSites(ctx, l, LispSites[:], adjust)
}

// StartLispSites is StartLisp for the sites of a LispSitesTopology.
func StartLispSites(ctx context.Context, l *lab.Lab, sites []LispSite, adjust func(site int, o *xtr.Options)) (*LispLab, error) {
	ll := &LispLab{Lab: l}
	ms, stop, err := StartMapServer(ctx, l.Host("ms"), LispMapServer, LispMapServerConfig())
	if err != nil {
		return nil, err
	}
	ll.MapServer = ms
	ll.stops = append(ll.stops, stop)
	for i, s := range sites {
		o := LispSiteXTROptions(s)
		if adjust != nil {
			adjust(i, &o)
		}
		x, stop, err := StartSiteXTR(ctx, l, s, o)
		if err != nil {
			ll.Close()
			return nil, err
		}
		ll.XTRs[i] = x
		ll.stops = append(ll.stops, stop)
	}
	if err := WaitRegistered(ll.XTRs[:], 10*time.Second); err != nil {
		ll.Close()
		return nil, err
	}
	return ll, nil
}

// Close stops the xTRs and the map server and returns the first error.
func (ll *LispLab) Close() error {
	var first error
	for i := len(ll.stops) - 1; i >= 0; i-- {
		if err := ll.stops[i](); err != nil && first == nil {
			first = err
		}
	}
	ll.stops = nil
	return first
}
