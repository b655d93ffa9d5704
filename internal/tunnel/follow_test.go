package tunnel

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// The address an uplink binds to among its interface's: global, settled, of the paths'
// family, the current one while it stays.
func TestChooseAddr(t *testing.T) {
	a := netip.MustParseAddr
	global := func(s string) ifAddr { return ifAddr{addr: a(s)} }
	cases := []struct {
		name   string
		cands  []ifAddr
		family int
		cur    string
		want   string
	}{
		{"none", nil, 0, "", ""},
		{"first IPv4", []ifAddr{global("2001:db8::1"), global("192.0.2.1"), global("192.0.2.2")}, 0, "", "192.0.2.1"},
		{"IPv6 when asked", []ifAddr{global("192.0.2.1"), global("2001:db8::1")}, 6, "", "2001:db8::1"},
		{"IPv6 when alone", []ifAddr{global("2001:db8::1")}, 0, "", "2001:db8::1"},
		{"family missing", []ifAddr{global("192.0.2.1")}, 6, "", ""},
		{"current stays", []ifAddr{global("192.0.2.1"), global("192.0.2.9")}, 4, "192.0.2.9", "192.0.2.9"},
		{"current gone", []ifAddr{global("192.0.2.20")}, 4, "192.0.2.9", "192.0.2.20"},
		{"link-local skipped", []ifAddr{global("fe80::1"), global("169.254.1.1")}, 0, "", ""},
		{"scope link skipped", []ifAddr{{addr: a("192.0.2.1"), scope: unix.RT_SCOPE_LINK}, global("192.0.2.2")}, 0, "", "192.0.2.2"},
		{"tentative skipped", []ifAddr{{addr: a("2001:db8::1"), flags: unix.IFA_F_TENTATIVE}, global("2001:db8::2")}, 6, "", "2001:db8::2"},
		{"failed DAD skipped", []ifAddr{{addr: a("2001:db8::1"), flags: unix.IFA_F_DADFAILED}}, 6, "", ""},
	}
	for _, c := range cases {
		var cur, want netip.Addr
		if c.cur != "" {
			cur = a(c.cur)
		}
		if c.want != "" {
			want = a(c.want)
		}
		if got := chooseAddr(c.cands, c.family, cur); got != want {
			t.Errorf("%s: got %v, want %v", c.name, got, want)
		}
	}
}
