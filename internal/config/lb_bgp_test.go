package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

const lbBGPHead = "[lb]\ninterface = \"wan0\"\n[[lb.service]]\nvip = \"203.0.113.80:443\"\n[[lb.service]]\nvip = \"203.0.113.80:80\"\n[[lb.backend]]\nname = \"web1\"\nmac = \"02:00:00:00:00:01\"\n"

func TestLoadLBBGP(t *testing.T) {
	doc := lbBGPHead + `[lb.bgp]
local_as = 65001
router_id = "10.4.0.2"
drain = "3s"
[[lb.bgp.neighbor]]
address = "10.4.0.1"
as = 65000
[[lb.bgp.neighbor]]
address = "10.5.0.1"
as = 65000
port = 1179
`
	lb, err := LoadLB("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	b := lb.BGP
	if b == nil || b.LocalAS != 65001 || b.RouterID.String() != "10.4.0.2" || b.NextHop != b.RouterID || b.Drain != 3*time.Second ||
		b.HoldTime != DefaultLBBGPHoldTime || len(b.Neighbors) != 2 || b.Neighbors[0].Port != 179 || b.Neighbors[1].Port != 1179 {
		t.Fatalf("bgp %+v", b)
	}
	// The VIP's address once, although two services share it.
	if len(b.Announce) != 1 || b.Announce[0] != netip.MustParsePrefix("203.0.113.80/32") {
		t.Fatalf("announce %v", b.Announce)
	}
	lb, err = LoadLB("site.toml", []byte(strings.Replace(lbBGPHead, "[lb]\n", "[lb]\n", 1)), newEnv())
	if err != nil || lb.BGP != nil {
		t.Fatalf("without [lb.bgp]: %v %+v", err, lb.BGP)
	}
}

func TestLoadLBBGPErrors(t *testing.T) {
	doc := lbBGPHead + `[lb.bgp]
router_id = "2001:db8::1"
announce = ["198.51.100.0/24", "203.0.113.80/24", "nope"]
hold_time = "1s"
[[lb.bgp.neighbor]]
address = "10.4.0.1"
as = 0
[[lb.bgp.neighbor]]
address = "10.4.0.1"
as = 65000
port = 70000
`
	_, err := LoadLB("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`site.toml:10: lb.bgp: missing local_as`,
		`site.toml:11: lb.bgp: router_id: want an IPv4 address`,
		`site.toml:12: lb.bgp: announce 198.51.100.0/24 holds no service's VIP`,
		`site.toml:12: lb.bgp: announce 203.0.113.80/24 has host bits set`,
		`site.toml:12: lb.bgp: announce[2] "nope"`,
		`site.toml:13: lb.bgp: hold_time 1s outside 3s..65535s`,
		`site.toml:16: bgp neighbor 1: as 0 outside 1..4294967295`,
		`site.toml:18: bgp neighbor 2: address 10.4.0.1: another neighbour has it`,
		`site.toml:20: bgp neighbor 2: port 70000 outside 1..65535`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	_, err = LoadLB("site.toml", []byte(lbBGPHead+"[lb.bgp]\nlocal_as = 1\nrouter_id = \"10.0.0.1\"\n"), newEnv())
	if err == nil || !strings.Contains(err.Error(), "site.toml:10: lb.bgp: no neighbours") {
		t.Errorf("no neighbours: %v", err)
	}
}
