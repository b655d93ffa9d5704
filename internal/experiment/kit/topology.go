package kit

import (
	"fmt"
	"net/netip"

	"braid/internal/lab/topo"
)

// KernelLinks is ParallelLinks with kernel (veth) links, each limited to its rate (0: none).
func KernelLinks(name string, rates ...uint64) *topo.Topology {
	shapes := make([]topo.Shape, len(rates))
	for i, r := range rates {
		shapes[i] = topo.Shape{Rate: r}
	}
	tp := ParallelLinks(name, shapes...)
	for i := range tp.Links {
		tp.Links[i].Kernel = true
	}
	return tp
}

// ParallelLinks is two hosts a and b joined by one link per shape; link i has the subnets
// 10.9.<i>.0/24 and fd09:<i>::/64, a is .1/::1 and b .2/::2 on each (the addressing SiteFile
// uses). Each shape applies to both directions.
func ParallelLinks(name string, shapes ...topo.Shape) *topo.Topology {
	tp := &topo.Topology{Name: name, Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	for i, s := range shapes {
		tp.Links = append(tp.Links, topo.Link{
			A:  topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i)), netip.MustParsePrefix(fmt.Sprintf("fd09:%d::1/64", i))}},
			B:  topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i)), netip.MustParsePrefix(fmt.Sprintf("fd09:%d::2/64", i))}},
			AB: s, BA: s,
		})
	}
	return tp
}
