package mplb

import (
	"strings"
	"testing"

	"braid/internal/experiment/kit"
)

func TestMPLBClaims(t *testing.T) {
	sizes := []int64{1e6, 10e6}
	pt := func(rate float64, single int) mplbPoint {
		return mplbPoint{times: []float64{1, 1, 1}, rates: []float64{rate, rate, rate}, single: single}
	}
	unaware := []mplbPoint{pt(48, 3), pt(47, 3)}
	aware := []mplbPoint{pt(77, 0), pt(86, 0)}
	if c := mplbClaims(sizes, unaware, aware); c.Err() != nil {
		t.Fatalf("good run: %v", c.Err())
	}
	for name, c := range map[string]*kit.Claims{
		"no gain":              mplbClaims(sizes, unaware, []mplbPoint{pt(77, 0), pt(60, 0)}),
		"beyond the two links": mplbClaims(sizes, unaware, []mplbPoint{pt(77, 0), pt(101, 0)}),
		"a join lost":          mplbClaims(sizes, unaware, []mplbPoint{pt(77, 1), pt(86, 0)}),
		"unaware keeps joins":  mplbClaims(sizes, []mplbPoint{pt(48, 3), pt(47, 0)}, aware),
	} {
		if len(c.Failed()) != 1 {
			t.Errorf("%s: failed %q, want one", name, failedNames(c))
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
