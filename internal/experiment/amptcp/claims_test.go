package amptcp

import (
	"strings"
	"testing"

	"braid/internal/experiment/kit"
)

func TestAMPTCPClaims(t *testing.T) {
	am := []amptcpRatio{{2 << 20, 0.52}, {3 << 20, 0.55}}
	mp := []amptcpRatio{{2 << 20, 1.02}, {3 << 20, 0.97}}
	if c := amptcpClaims(am, mp); c.Err() != nil || len(c.List) != 3 {
		t.Fatalf("good run: %v (%d claims)", c.Err(), len(c.List))
	}
	if c := amptcpClaims([]amptcpRatio{{2 << 20, 0.52}, {3 << 20, 0.65}}, mp); !strings.Contains(failedNames(c), "worst: 3072 KB") {
		t.Errorf("A-MPTCP at 0.65 of TCP: failed %q", failedNames(c))
	}
	if c := amptcpClaims(am, []amptcpRatio{{2 << 20, 1.02}, {3 << 20, 0.85}}); !strings.Contains(failedNames(c), "lowest: 3072 KB") {
		t.Errorf("MPTCP at 0.85 of TCP: failed %q", failedNames(c))
	}
	if c := amptcpClaims(nil, nil); len(c.List) != 0 {
		t.Error("claims without files of 2 MB")
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
