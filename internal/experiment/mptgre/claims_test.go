package mptgre

import (
	"strings"
	"testing"

	"braid/internal/experiment/kit"
)

func mptgreFixture() ([]combo, map[string]*mptgreRun, [3]*mptgreRun) {
	combos := []combo{{4, 4}, {6, 6}}
	res := map[string]*mptgreRun{}
	for _, c := range combos {
		for _, p := range []int{1, 2} {
			res[c.String()+"/"+string(rune('0'+p))] = &mptgreRun{throughput: []float64{600e6}, fileIntact: true}
		}
	}
	var b [3]*mptgreRun
	b[1] = &mptgreRun{throughput: []float64{92e6}, fileIntact: true}
	b[2] = &mptgreRun{throughput: []float64{180e6}, fileIntact: true}
	return combos, res, b
}

func TestMPTGREClaims(t *testing.T) {
	combos, res, b := mptgreFixture()
	if c := mptgreClaims(combos, res, b, 100e6); c.Err() != nil {
		t.Fatalf("good run fails: %v", c.Err())
	}
	for name, spoil := range map[string]func(map[string]*mptgreRun, [3]*mptgreRun){
		"corrupt transfer":           func(r map[string]*mptgreRun, _ [3]*mptgreRun) { r["IPv6 over IPv6/2"].fileIntact = false },
		"two paths no more than one": func(_ map[string]*mptgreRun, b [3]*mptgreRun) { b[2].throughput = []float64{100e6} },
		"one path beyond its link":   func(_ map[string]*mptgreRun, b [3]*mptgreRun) { b[1].throughput = []float64{101e6} },
		"one path far below its link": func(_ map[string]*mptgreRun, b [3]*mptgreRun) {
			b[1].throughput, b[2].throughput = []float64{60e6}, []float64{110e6}
		},
		"two paths beyond both links": func(_ map[string]*mptgreRun, b [3]*mptgreRun) { b[2].throughput = []float64{201e6} },
	} {
		combos, res, b := mptgreFixture()
		spoil(res, b)
		if c := mptgreClaims(combos, res, b, 100e6); len(c.Failed()) == 0 {
			t.Errorf("%s: no check failed", name)
		}
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
