package topo

import "net/netip"

// Pair is two hosts "a" (10.99.0.1, fd99::1) and "b" (10.99.0.2, fd99::2) joined by one
// link shaped s in both directions.
func Pair(s Shape) *Topology {
	return &Topology{
		Name:  "pair",
		Hosts: []Host{{Name: "a"}, {Name: "b"}},
		Links: []Link{{
			A:  Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix("10.99.0.1/24"), netip.MustParsePrefix("fd99::1/64")}},
			B:  Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix("10.99.0.2/24"), netip.MustParsePrefix("fd99::2/64")}},
			AB: s, BA: s,
		}},
	}
}
