package config

import "testing"

// Every role has its own default status address, so that all of them run on one machine with
// their defaults; lb and mapserver once shared 127.0.0.1:9476.
func TestDefaultMetricsDistinct(t *testing.T) {
	roles := map[string]string{
		"tunnel":    TunnelDefaults().Metrics.String(),
		"mapserver": MapserverDefaults().Metrics,
		"pm":        PMDefaults().Metrics,
		"lb":        LBDefaults().Metrics,
		"xtr":       XTRDefaults().Metrics,
		"proxy":     ProxyDefaults().Metrics,
	}
	for _, policy := range []string{"fullmesh", "amptcp", "rbpm"} {
		if m := PMPolicyDefaults(policy).Metrics; m != roles["pm"] {
			t.Errorf("pm policy %s defaults to metrics %s, not the pm's %s", policy, m, roles["pm"])
		}
	}
	owner := map[string]string{}
	for role, addr := range roles {
		if addr == "" {
			t.Errorf("%s has no default metrics address", role)
			continue
		}
		if other, dup := owner[addr]; dup {
			t.Errorf("%s and %s both default to metrics %s", role, other, addr)
		}
		owner[addr] = role
	}
	if TunnelDefaults().Control == LBDefaults().Control {
		t.Errorf("tunnel and lb share the default control socket %s", LBDefaults().Control)
	}
}

func TestControlProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"", true}, {"@braid/tunnel", true}, {"/run/braid/tunnel.sock", true},
		{"@", false}, {"tunnel.sock", false}, {"@" + string(make([]byte, 107)), false},
	} {
		if got := controlProblem(tc.name) == ""; got != tc.ok {
			t.Errorf("controlProblem(%q) accepts: %v, want %v", tc.name, got, tc.ok)
		}
	}
}
