package lab

import (
	"strings"
	"testing"

	"braid/internal/lab/topo"
)

func TestNATRuleset(t *testing.T) {
	for _, tt := range []struct {
		nat  topo.NAT
		want []string
	}{
		{topo.NAT{Outside: []string{"wan"}}, []string{
			"table inet braid-nat {",
			`oifname "wan" meta nfproto ipv4 masquerade` + "\n",
			`iifname "wan" ct state != { established, related } drop`,
		}},
		{topo.NAT{Outside: []string{"wan0", "wan1"}, RandomPorts: true, IPv6: true}, []string{
			`oifname "wan0" masquerade fully-random` + "\n",
			`oifname "wan1" masquerade fully-random` + "\n",
			`iifname "wan1" ct state != { established, related } drop`,
		}},
	} {
		rules, err := natRuleset(&tt.nat)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tt.want {
			if !strings.Contains(rules, w) {
				t.Errorf("ruleset of %+v lacks %q:\n%s", tt.nat, w, rules)
			}
		}
	}
	if _, err := natRuleset(&topo.NAT{Outside: []string{`w"an`}}); err == nil {
		t.Error("an interface name nft cannot quote was accepted")
	}
}
