package netconf

import (
	"net/netip"
	"strings"
	"testing"
)

func TestScript(t *testing.T) {
	pf := netip.MustParsePrefix
	ic := Intercept{Mode: ModeTProxy, FwMark: 0x1b5, RouteTable: 4755, Tenants: []InterceptTenant{
		{Name: "blue", Sources: []netip.Prefix{pf("10.1.0.0/24"), pf("fd01::/64")}, Destinations: []netip.Prefix{pf("10.2.0.0/24"), pf("fd02::/64")}, Port: 7001},
		{Name: "red", Sources: []netip.Prefix{pf("10.1.1.0/24")}, Destinations: []netip.Prefix{pf("10.2.1.0/24"), pf("fd03::/64")}, Port: 7002},
	}}
	s := ic.Script()
	for _, want := range []string{
		"table inet braid_proxy\ndelete table inet braid_proxy\n",
		"type filter hook prerouting priority mangle; policy accept;",
		"meta l4proto tcp socket transparent 1 meta mark set 0x1b5 accept",
		`meta l4proto tcp ip saddr { 10.1.0.0/24 } ip daddr { 10.2.0.0/24 } tproxy ip to :7001 meta mark set 0x1b5 accept comment "tenant blue"`,
		`meta l4proto tcp ip6 saddr { fd01::/64 } ip6 daddr { fd02::/64 } tproxy ip6 to :7001 meta mark set 0x1b5 accept comment "tenant blue"`,
		`meta l4proto tcp ip saddr { 10.1.1.0/24 } ip daddr { 10.2.1.0/24 } tproxy ip to :7002`,
		`ip daddr { 10.2.0.0/24 } reject with tcp reset comment "tenant blue"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in:\n%s", want, s)
		}
	}
	// Red has no IPv6 source: no IPv6 rule for it (an empty set is not valid nft).
	if strings.Contains(s, "ip6 saddr { 10.") || strings.Contains(s, "{  }") || strings.Count(s, "tproxy ip6") != 1 {
		t.Errorf("wrong IPv6 rules:\n%s", s)
	}
	if strings.Contains(s, "redirect") {
		t.Errorf("tproxy mode has a redirect rule:\n%s", s)
	}
	ic.Mode = ModeRedirect
	s = ic.Script()
	if !strings.Contains(s, `type nat hook prerouting priority dstnat;`) || !strings.Contains(s, `ip daddr { 10.2.0.0/24 } redirect to :7001`) || strings.Contains(s, "tproxy") {
		t.Errorf("redirect script:\n%s", s)
	}
	ic.Mode = ModeNone
	s = ic.Script()
	if strings.Contains(s, "tproxy") || strings.Contains(s, "redirect") || !strings.Contains(s, "socket transparent 1") {
		t.Errorf("none: only the transparent-socket rule:\n%s", s)
	}
}
