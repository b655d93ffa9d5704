package rbpm

import (
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/kit"
)

func TestRBPMClaims(t *testing.T) {
	rows := func(gain float64, demoted bool) []RBPMRow {
		var out []RBPMRow
		for _, sc := range RBPMScenarios() {
			at := make([]time.Duration, len(sc.Paths))
			for i := range at {
				at[i] = -1
			}
			if demoted {
				at[sc.Slow] = 2 * time.Second
			}
			out = append(out, RBPMRow{Scenario: sc.Name, Config: RBPMKernelDefault, Goodput: 500e3},
				RBPMRow{Scenario: sc.Name, Config: RBPMKernelPolicy, Goodput: 500e3 * gain, DemotedAt: at})
		}
		return out
	}
	if c := rbpmClaims(rows(1.2, true)); c.Err() != nil || len(c.List) != 4 {
		t.Fatalf("good run: %v (%d claims)", c.Err(), len(c.List))
	}
	if c := rbpmClaims(rows(0.8, true)); len(c.Failed()) != 2 {
		t.Errorf("policy slower: failed %q", failedNames(c))
	}
	if c := rbpmClaims(rows(1.2, false)); len(c.Failed()) != 2 {
		t.Errorf("slow path never demoted: failed %q", failedNames(c))
	}
}

// failedNames returns the names of c's failed claims, joined.
func failedNames(c *kit.Claims) string {
	var n []string
	for _, k := range c.Failed() {
		n = append(n, k.Name)
	}
	return strings.Join(n, "; ")
}
