package topo

import (
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// goodTopology is a small valid topology built in Go, without defaults filled in.
func goodTopology() *Topology {
	return &Topology{
		Name: "lab",
		Hosts: []Host{
			{Name: "a", Routes: []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.0.2")}}},
			{Name: "r", Forward: true},
			{Name: "b", Routes: []Route{
				{Dst: netip.MustParsePrefix("::/0"), Via: netip.MustParseAddr("fd00:1::1")},
				{Dst: netip.MustParsePrefix("10.0.0.0/24"), Dev: "eth0", Metric: 5},
			}},
		},
		Links: []Link{
			{A: Endpoint{Host: "a", Addrs: pfx("10.0.0.1/30")}, B: Endpoint{Host: "r", Addrs: pfx("10.0.0.2/30")},
				AB: Shape{Rate: 1e6, Delay: time.Millisecond, Loss: 1}},
			{A: Endpoint{Host: "r", Ifname: "eth0"}, B: Endpoint{Host: "b", Addrs: pfx("fd00:1::2/64")}},
			{A: Endpoint{Host: "r", Addrs: pfx("fd00:1::1/64")}, B: Endpoint{Host: "b", Addrs: pfx("fd00:1::3/64")}},
			{A: Endpoint{Host: "a"}, B: Endpoint{Host: "r"}, MTU: 9000},
		},
	}
}

func TestNormalize(t *testing.T) {
	tp := goodTopology()
	tp.Links[2].Name = "a-r-2" // an explicit name that a default must not take
	tp.Normalize()
	type end struct{ host, ifname string }
	want := []struct {
		name string
		a, b end
		mtu  int
	}{
		{"a-r", end{"a", "eth0"}, end{"r", "eth1"}, 1500}, // r's eth0 is taken explicitly by link 1
		{"r-b", end{"r", "eth0"}, end{"b", "eth0"}, 1500},
		{"a-r-2", end{"r", "eth2"}, end{"b", "eth1"}, 1500},
		{"a-r-3", end{"a", "eth1"}, end{"r", "eth3"}, 9000},
	}
	for i, w := range want {
		l := tp.Links[i]
		got := struct {
			name string
			a, b end
			mtu  int
		}{l.Name, end{l.A.Host, l.A.Ifname}, end{l.B.Host, l.B.Ifname}, l.MTU}
		if got != w {
			t.Errorf("link %d: got %+v, want %+v", i, got, w)
		}
		if l.AB.QueuePackets != 0 || l.AB.QueueBytes != 0 {
			t.Errorf("link %d: Normalize filled in queue bounds", i)
		}
	}

	before := *tp
	before.Links = append([]Link(nil), tp.Links...)
	tp.Normalize()
	if !reflect.DeepEqual(before, *tp) {
		t.Errorf("Normalize is not idempotent")
	}
}

func TestValidateGood(t *testing.T) {
	tp := goodTopology()
	orig := goodTopology()
	if err := tp.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !reflect.DeepEqual(tp, orig) {
		t.Errorf("Validate modified the topology")
	}
}

// TestValidateAll builds a topology with many problems and checks that each is reported, once,
// naming its object.
func TestValidateAll(t *testing.T) {
	tp := &Topology{
		Name: "This-Lab-Name-Is-Too-Long",
		Hosts: []Host{
			{Name: "a", Routes: []Route{
				{Dst: netip.MustParsePrefix("10.9.0.0/16"), Via: netip.MustParseAddr("10.1.0.1")}, // not on a link
				{Dst: netip.MustParsePrefix("10.9.0.0/16"), Dev: "eth0"},                          // duplicate dst
				{Dst: netip.MustParsePrefix("10.8.0.0/16")},                                       // neither via nor dev
				{Dst: netip.MustParsePrefix("10.7.0.0/16"), Dev: "nope0"},                         // unknown dev
				{Dst: netip.MustParsePrefix("::/0"), Via: netip.MustParseAddr("10.0.0.2")},        // family
				{Dst: netip.MustParsePrefix("10.6.0.1/16"), Via: netip.MustParseAddr("10.0.0.2")}, // host bits
				{Dst: netip.MustParsePrefix("10.5.0.0/16"), Via: netip.MustParseAddr("10.0.0.1")}, // own address
				{Dst: netip.MustParsePrefix("10.4.0.0/16"), Via: netip.MustParseAddr("10.0.0.2"), Metric: -1},
			}},
			{Name: "b"},
			{Name: "b"},
			{Name: "Bad_Name"},
			{Name: "waytoolonghostname"},
		},
		Links: []Link{
			{A: Endpoint{Host: "a", Addrs: pfx("10.0.0.1/30")}, B: Endpoint{Host: "b", Addrs: pfx("10.0.0.2/30")}},
			{Name: "to-nowhere", A: Endpoint{Host: "a"}, B: Endpoint{Host: "ghost"}},
			{Name: "loop", A: Endpoint{Host: "b"}, B: Endpoint{Host: "b"}},
			{Name: "loop", A: Endpoint{Host: "a"}, B: Endpoint{Host: "b"}}, // duplicate name
			{Name: "ifnames", A: Endpoint{Host: "a", Ifname: "lo"}, B: Endpoint{Host: "b", Ifname: "averyveryverylongname"}},
			{Name: "dupif", A: Endpoint{Host: "a", Ifname: "x0"}, B: Endpoint{Host: "b", Ifname: "y0"}},
			{Name: "dupif2", A: Endpoint{Host: "a", Ifname: "x0"}, B: Endpoint{Host: "b", Ifname: "y1"}},
			{Name: "mtu", A: Endpoint{Host: "a"}, B: Endpoint{Host: "b"}, MTU: 100},
			{Name: "mtu6", A: Endpoint{Host: "a", Addrs: pfx("fd00::1/64")}, B: Endpoint{Host: "b", Addrs: pfx("fd00::2/64")}, MTU: 1000},
			{Name: "shape", A: Endpoint{Host: "a"}, B: Endpoint{Host: "b"},
				AB: Shape{Delay: -time.Millisecond, Jitter: -1, Loss: 101, QueuePackets: -1},
				BA: Shape{Loss: math.NaN(), QueueBytes: -1}},
			{Name: "dupaddr", A: Endpoint{Host: "a", Addrs: pfx("10.0.0.1/30")}, B: Endpoint{Host: "b", Addrs: []netip.Prefix{{}}}},
			{Name: "subnet", A: Endpoint{Host: "a", Addrs: pfx("10.3.0.1/24", "fd03::1/64")}, B: Endpoint{Host: "b", Addrs: pfx("10.3.1.1/24", "fd04::2/64")}},
		},
	}
	want := []struct{ object, reason string }{
		{"topology This-Lab-Name-Is-Too-Long", "must match"},
		{"host b", "duplicate host"},
		{"host Bad_Name", `name "Bad_Name" must match`},
		{"host waytoolonghostname", "longer than 12 characters"},
		{"link to-nowhere", `unknown host "ghost"`},
		{"link loop", "link from host b to itself"},
		{"link loop", "duplicate link name"},
		{"link ifnames", `interface name "lo" on host a is reserved`},
		{"link ifnames", "longer than 15 characters"},
		{"link dupif2", `interface "x0" on host a is also used by link dupif`},
		{"link mtu", "MTU 100 outside 576..65535"},
		{"link mtu6", "below the IPv6 minimum of 1280"},
		{"link shape", "negative delay -1ms from a to b"},
		{"link shape", "negative jitter -1ns from a to b"},
		{"link shape", "loss 101 % outside 0..100 from a to b"},
		{"link shape", "negative queue -1 packets from a to b"},
		{"link shape", "loss NaN % outside 0..100 from b to a"},
		{"link shape", "negative queue -1 bytes from b to a"},
		{"link dupaddr", "address 10.0.0.1 on a eth6 is also on a eth0"},
		{"link dupaddr", "invalid address"},
		{"link subnet", "not in the same IPv4 subnet"},
		{"link subnet", "not in the same IPv6 subnet"},
		{"host a route 10.9.0.0/16", "via 10.1.0.1 is not in a subnet of any address of host a"},
		{"host a route 10.9.0.0/16", "duplicate route: same destination and metric"},
		{"host a route 10.8.0.0/16", "needs via or dev"},
		{"host a route 10.7.0.0/16", `dev "nope0" is not an interface of host a`},
		{"host a route ::/0", "not of the destination's address family"},
		{"host a route 10.6.0.1/16", "host bits set (did you mean 10.6.0.0/16?)"},
		{"host a route 10.5.0.0/16", "via 10.0.0.1 is an address of host a itself"},
		{"host a route 10.4.0.0/16", "metric -1 outside"},
	}

	err := tp.Validate()
	if err == nil {
		t.Fatal("Validate returned nil")
	}
	var got []*Error
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var te *Error
		if !errors.As(e, &te) {
			t.Fatalf("error %v is a %T, not a *Error", e, e)
		}
		got = append(got, te)
	}
	used := make([]bool, len(got))
	for _, w := range want {
		found := false
		for i, g := range got {
			if !used[i] && g.Object == w.object && strings.Contains(g.Reason, w.reason) {
				used[i], found = true, true
				break
			}
		}
		if !found {
			t.Errorf("missing error %q: %q", w.object, w.reason)
		}
	}
	for i, g := range got {
		if !used[i] {
			t.Errorf("unexpected error %v", g)
		}
	}
	if t.Failed() {
		t.Logf("all errors:\n%v", err)
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{File: "lab.toml", Line: 17, Object: "link a-b", Reason: `negative delay "-5ms"`}, `lab.toml:17: link a-b: negative delay "-5ms"`},
		{Error{File: "lab.toml", Line: 3, Column: 7, Reason: "expected ']]'"}, `lab.toml:3:7: expected ']]'`},
		{Error{File: "lab.toml", Reason: "empty"}, "lab.toml: empty"},
		{Error{Object: "host a", Reason: "duplicate host"}, "host a: duplicate host"},
		{Error{Line: 4, Reason: "bad"}, "line 4: bad"},
		{Error{Reason: "bad"}, "bad"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%#v.Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}
