package topo

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// natHosts is a site behind a NAT router in front of a public host; cases append the nat table
// of the router (host[1]) at the end of the document, so their line numbers start at 22.
const natHosts = `
[[host]]
name = "site"
route = [ { dst = "default", via = "192.168.1.1" } ]
[[host]]
name = "public"
[[link]]
a = "site"
b = "cpe"
a_addr = "192.168.1.2/24"
b_addr = "192.168.1.1/24"
[[link]]
a = "cpe"
b = "public"
a_ifname = "wan"
a_addr = ["198.51.100.2/24", "2001:db8::2/64"]
b_addr = ["198.51.100.1/24", "2001:db8::1/64"]
[[link]]
a = "cpe"
b = "public"
a_ifname = "wan6"
a_addr = "2001:db8:1::2/64"
b_addr = "2001:db8:1::1/64"
[[host]]
name = "cpe"
`

func TestParseNAT(t *testing.T) {
	for _, tt := range []struct {
		name string
		doc  string
		want NAT
	}{
		{"inline, defaults", `nat = { outside = "wan" }`, NAT{Outside: []string{"wan"}}},
		{"table, every key", `
[host.nat]
outside = ["wan"]
random_ports = true
ipv6 = true
udp_timeout = "30s"
udp_stream_timeout = "90s"
`, NAT{Outside: []string{"wan"}, RandomPorts: true, IPv6: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 90 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tp, err := Parse("nat.toml", []byte(natHosts+tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			h := tp.Hosts[2]
			if h.NAT == nil || !reflect.DeepEqual(*h.NAT, tt.want) {
				t.Errorf("nat of %s = %+v, want %+v", h.Name, h.NAT, tt.want)
			}
		})
	}
	n := NAT{UDPTimeout: 20 * time.Second}
	if u, s := n.UDPTimeouts(); u != 20*time.Second || s != 20*time.Second {
		t.Errorf("UDPTimeouts of udp_timeout 20s alone = %v, %v; want 20s for both", u, s)
	}
	n.UDPStreamTimeout = time.Minute
	if u, s := n.UDPTimeouts(); u != 20*time.Second || s != time.Minute {
		t.Errorf("UDPTimeouts = %v, %v; want 20s, 1m", u, s)
	}
}

func TestParseNATErrors(t *testing.T) {
	for _, tt := range []struct {
		name   string
		nat    string
		line   int // of the error, counted from the first line of nat after its leading newline (1)
		reason string
	}{
		{"no outside", `nat = { random_ports = true }`, 1, "host cpe nat: needs outside: the interfaces on the public side (its interfaces: eth0, wan, wan6)"},
		{"unknown outside", `
[host.nat]
random_ports = true
outside = ["wan", "wan0"]`, 3, `host cpe nat: outside "wan0" is not an interface of host cpe (its interfaces: eth0, wan, wan6)`},
		{"outside twice", `nat = { outside = ["wan", "wan"] }`, 1, `outside "wan" is named twice`},
		{"outside not a string", `nat = { outside = 3 }`, 1, "outside must be an interface name or a list of them, not an integer"},
		{"outside element not a string", `nat = { outside = ["wan", true] }`, 1, "outside[1] must be a string (an interface name), not a boolean"},
		{"outside without IPv4", `nat = { outside = "wan6" }`, 1, "host cpe nat: outside wan6 has no IPv4 address to masquerade with"},
		{"IPv6 without an address", `
[host.nat]
outside = "eth0"
ipv6 = true`, 3, "outside eth0 has no IPv6 address to masquerade with (ipv6 = true)"},
		{"negative timeout", `
[host.nat]
outside = "wan"
udp_timeout = "-30s"`, 3, `host cpe nat: negative udp_timeout "-30s"`},
		{"timeout in milliseconds", `
[host.nat]
outside = "wan"

udp_stream_timeout = "1500ms"`, 4, "host cpe nat: udp_stream_timeout 1.5s is not a whole number of seconds"},
		{"timeout too long", `nat = { outside = "wan", udp_timeout = "25h" }`, 1, "udp_timeout 25h0m0s is over 24h0m0s"},
		{"timeout not a duration", `nat = { outside = "wan", udp_timeout = "long" }`, 1, `invalid udp_timeout "long"`},
		{"unknown key", `nat = { outside = "wan", timeout = "30s" }`, 1, `unknown key "host[2].nat.timeout"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := strings.Count(natHosts, "\n")
			nat := strings.TrimPrefix(tt.nat, "\n")
			_, err := Parse("nat.toml", []byte(natHosts+nat+"\n"))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			first := strings.SplitN(err.Error(), "\n", 2)[0]
			line := base + tt.line
			if !strings.HasPrefix(first, "nat.toml:"+strconv.Itoa(line)+":") || !strings.Contains(first, tt.reason) {
				t.Errorf("error %q, want it at nat.toml:%d and to contain %q", err, line, tt.reason)
			}
			var te *Error
			if !errors.As(err, &te) || te.Line != line {
				t.Errorf("error %#v, want a *Error at line %d", te, line)
			}
		})
	}
}

// Every interface outside: reported once the outside interfaces themselves are fine.
func TestValidateNATNothingInside(t *testing.T) {
	tp := goodNATTopology()
	tp.Hosts[1].NAT.Outside = []string{"wan", "lan"}
	err := tp.Validate()
	if err == nil || !strings.Contains(err.Error(), "host cpe nat: every interface of host cpe is outside: nothing is behind the NAT") {
		t.Errorf("Validate: %v", err)
	}
}

// goodNATTopology is a site behind a NAT router cpe, built in Go.
func goodNATTopology() *Topology {
	return &Topology{
		Name: "nat",
		Hosts: []Host{
			{Name: "site"},
			{Name: "cpe", NAT: &NAT{Outside: []string{"wan"}, RandomPorts: true, UDPTimeout: 5 * time.Second}},
			{Name: "public"},
		},
		Links: []Link{
			{A: Endpoint{Host: "site", Addrs: pfx("192.168.1.2/24")}, B: Endpoint{Host: "cpe", Ifname: "lan", Addrs: pfx("192.168.1.1/24")}},
			{A: Endpoint{Host: "cpe", Ifname: "wan", Addrs: pfx("198.51.100.2/24")}, B: Endpoint{Host: "public", Addrs: pfx("198.51.100.1/24")}},
		},
	}
}

func TestValidateNAT(t *testing.T) {
	if err := goodNATTopology().Validate(); err != nil {
		t.Fatalf("a valid NAT topology: %v", err)
	}
	for _, tt := range []struct {
		name   string
		change func(n *NAT)
		want   string
	}{
		{"no outside", func(n *NAT) { n.Outside = nil }, "host cpe nat: needs outside: the interfaces on the public side (its interfaces: lan, wan)"},
		{"unknown outside", func(n *NAT) { n.Outside = []string{"eth0"} }, `host cpe nat: outside "eth0" is not an interface of host cpe`},
		{"sub-second timeout", func(n *NAT) { n.UDPTimeout = 500 * time.Millisecond }, "udp_timeout 500ms is not a whole number of seconds"},
		{"negative stream timeout", func(n *NAT) { n.UDPStreamTimeout = -time.Second }, "negative udp_stream_timeout -1s"},
		{"IPv6 without an address", func(n *NAT) { n.IPv6 = true }, "outside wan has no IPv6 address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tp := goodNATTopology()
			tt.change(tp.Hosts[1].NAT)
			err := tp.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
