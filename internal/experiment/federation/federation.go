package federation

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"braid/internal/experiment/roles"
	"braid/internal/lab/topo"
	"braid/internal/proxy/ident"
)

// The federation topology: a client host c at site 1 behind proxy p1, a server host s at site 2
// behind proxy p2, and one or more WAN links between the proxies (the uplinks):
//
//	c --lan-- p1 ==wan0== p2 --lan-- s
//	             ==wan1==
//
// Tenant "blue" has 10.1.0.0/24 and fd01::/64 at site 1, 10.2.0.0/24 and fd02::/64 at site 2;
// tenant "red" has 10.1.1.0/24 and 10.2.1.0/24. c and s have an address in each. WAN link i
// has 10.9.i.1 and fd09:i::1 (p1), 10.9.i.2 and fd09:i::2 (p2). Of the other site's LANs
// only blue's are routed, over wan0 (the plain-TCP baseline); a running proxy intercepts
// them first.
const (
	FedClient4   = "10.1.0.1"
	FedClient6   = "fd01::1"
	FedClientRed = "10.1.1.1"
	FedServer4   = "10.2.0.1"
	FedServer6   = "fd02::1"
	FedServerRed = "10.2.1.1"
	FedSocks     = "10.1.0.254:1080"
	FedMetrics   = roles.ProxyMetrics
	FedBluePort  = 7001
	FedBluePeer  = 7101
	FedRedPort   = 7002
	FedRedPeer   = 7102
)

// FederationTopology returns the topology with one WAN link per shape; kernel makes every link
// a veth pair (fast, rate by TBF only).
func FederationTopology(name string, kernel bool, wan ...topo.Shape) *topo.Topology {
	pf := netip.MustParsePrefix
	tp := &topo.Topology{Name: name, Hosts: []topo.Host{
		{Name: "c", Routes: []topo.Route{
			{Dst: pf("0.0.0.0/0"), Via: netip.MustParseAddr("10.1.0.254")},
			{Dst: pf("::/0"), Via: netip.MustParseAddr("fd01::fe")}}},
		// Tenant blue's site networks are routed over wan0 too: the plain-TCP baseline takes that
		// route when no proxy runs (a running proxy intercepts before forwarding).
		{Name: "p1", Forward: true, Routes: []topo.Route{
			{Dst: pf("10.2.0.0/24"), Via: netip.MustParseAddr("10.9.0.2")},
			{Dst: pf("fd02::/64"), Via: netip.MustParseAddr("fd09::2")}}},
		{Name: "p2", Forward: true, Routes: []topo.Route{
			{Dst: pf("10.1.0.0/24"), Via: netip.MustParseAddr("10.9.0.1")},
			{Dst: pf("fd01::/64"), Via: netip.MustParseAddr("fd09::1")}}},
		{Name: "s", Routes: []topo.Route{
			{Dst: pf("0.0.0.0/0"), Via: netip.MustParseAddr("10.2.0.254")},
			{Dst: pf("::/0"), Via: netip.MustParseAddr("fd02::fe")}}},
	}}
	// The LANs are always kernel links: only the WAN is shaped.
	tp.Links = append(tp.Links, topo.Link{Name: "lan1", Kernel: true,
		A: topo.Endpoint{Host: "c", Ifname: "lan", Addrs: []netip.Prefix{pf("10.1.0.1/24"), pf("10.1.1.1/24"), pf("fd01::1/64")}},
		B: topo.Endpoint{Host: "p1", Ifname: "lan", Addrs: []netip.Prefix{pf("10.1.0.254/24"), pf("10.1.1.254/24"), pf("fd01::fe/64")}}})
	for i, s := range wan {
		tp.Links = append(tp.Links, topo.Link{Name: fmt.Sprintf("wan%d", i), Kernel: kernel, AB: s, BA: s,
			A: topo.Endpoint{Host: "p1", Ifname: fmt.Sprintf("wan%d", i), Addrs: []netip.Prefix{pf(fmt.Sprintf("10.9.%d.1/24", i)), pf(fmt.Sprintf("fd09:%d::1/64", i))}},
			B: topo.Endpoint{Host: "p2", Ifname: fmt.Sprintf("wan%d", i), Addrs: []netip.Prefix{pf(fmt.Sprintf("10.9.%d.2/24", i)), pf(fmt.Sprintf("fd09:%d::2/64", i))}}})
	}
	tp.Links = append(tp.Links, topo.Link{Name: "lan2", Kernel: true,
		A: topo.Endpoint{Host: "s", Ifname: "lan", Addrs: []netip.Prefix{pf("10.2.0.1/24"), pf("10.2.1.1/24"), pf("fd02::1/64")}},
		B: topo.Endpoint{Host: "p2", Ifname: "lan", Addrs: []netip.Prefix{pf("10.2.0.254/24"), pf("10.2.1.254/24"), pf("fd02::fe/64")}}})
	return tp
}

// FedSite describes one proxy's site file.
type FedSite struct {
	Side       int // 1 (p1) or 2 (p2)
	Uplinks    int // WAN links used as uplinks (0: all of Links)
	Links      int // WAN links in the topology
	Key        ident.PrivateKey
	PeerKey    ident.PublicKey
	Plaintext  bool
	Mode       string // tproxy (default) or redirect
	PM         string // braid (default), kernel, none
	PMPolicy   string // braid's policy: the proxy's default, fullmesh, rbpm
	Pool       int    // -1: 0 (no pool); 0: the default
	NoMPTCP    bool   // plain TCP between the proxies: path_manager none and one uplink (the "proxied TCP" baseline uses this with Uplinks 1)
	Drain      time.Duration
	ExtraBlue  []string // more networks claimed for the peer of tenant blue (tests of isolation)
	PeerAddrs  []string // peer addresses; default the peer's wan0 address
	MetricsOff bool
}

// Bytes returns the TOML of the site file.
func (f FedSite) Bytes() []byte {
	me, other := f.Side, 3-f.Side
	var b bytes.Buffer
	mode := f.Mode
	if mode == "" {
		mode = "tproxy"
	}
	pmName := f.PM
	if pmName == "" {
		pmName = "braid"
	}
	fmt.Fprintf(&b, "[proxy]\nmode = %q\npath_manager = %q\n", mode, pmName)
	if f.PMPolicy != "" {
		fmt.Fprintf(&b, "pm_policy = %q\n", f.PMPolicy)
	}
	if f.Plaintext {
		b.WriteString("plaintext = true\n")
	} else {
		fmt.Fprintf(&b, "private_key = %q\n", f.Key.String())
	}
	switch {
	case f.Pool < 0:
		b.WriteString("pool = 0\n")
	case f.Pool > 0:
		fmt.Fprintf(&b, "pool = %d\n", f.Pool)
	}
	if f.Drain > 0 {
		fmt.Fprintf(&b, "drain_timeout = %q\n", f.Drain.String())
	}
	if f.MetricsOff {
		b.WriteString("metrics = \"\"\n")
	} else {
		fmt.Fprintf(&b, "metrics = %q\n", FedMetrics)
	}
	ups := f.Uplinks
	if ups == 0 {
		ups = f.Links
	}
	for i := 0; i < ups; i++ {
		fmt.Fprintf(&b, "[[proxy.uplink]]\nname = \"wan%d\"\ninterface = \"wan%d\"\naddress = \"10.9.%d.%d\"\n", i, i, i, me)
	}
	peerAddrs := f.PeerAddrs
	if len(peerAddrs) == 0 {
		peerAddrs = []string{fmt.Sprintf("10.9.0.%d", other)}
	}
	tenant := func(name string, port, peerPort int, own, theirs []string, socks string) {
		fmt.Fprintf(&b, "[[proxy.tenant]]\nname = %q\nnetworks = [%s]\nport = %d\npeer_port = %d\n", name, quoteAll(own), port, peerPort)
		if socks != "" {
			fmt.Fprintf(&b, "socks = %q\n", socks)
		}
		var addrs []string
		for _, a := range peerAddrs {
			addrs = append(addrs, netip.AddrPortFrom(netip.MustParseAddr(a), uint16(peerPort)).String())
		}
		fmt.Fprintf(&b, "  [[proxy.tenant.peer]]\n  name = \"site%d\"\n  address = [%s]\n  networks = [%s]\n", other, quoteAll(addrs), quoteAll(theirs))
		if !f.Plaintext {
			fmt.Fprintf(&b, "  public_key = %q\n", f.PeerKey.String())
		}
	}
	nets := func(side int) []string {
		return []string{fmt.Sprintf("10.%d.0.0/24", side), fmt.Sprintf("fd0%d::/64", side)}
	}
	socks := ""
	if me == 1 {
		socks = FedSocks
	}
	tenant("blue", FedBluePort, FedBluePeer, nets(me), append(nets(other), f.ExtraBlue...), socks)
	tenant("red", FedRedPort, FedRedPeer, []string{fmt.Sprintf("10.%d.1.0/24", me)}, []string{fmt.Sprintf("10.%d.1.0/24", other)}, "")
	return b.Bytes()
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}
