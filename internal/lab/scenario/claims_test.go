package scenario

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// failedNames returns the names of c's failed claims, joined.
func failedNames(c *Claims) string {
	var n []string
	for _, k := range c.Failed() {
		n = append(n, k.Name)
	}
	return strings.Join(n, "; ")
}

func TestClaimsPrintAndErr(t *testing.T) {
	c := &Claims{}
	c.Within("in", 5, 1, 10, "%.0f")
	c.AtLeast("low", 0.5, 1, "%.1f")
	var b bytes.Buffer
	c.Print(&b)
	if !strings.Contains(b.String(), "PASS  in: 5, bound 1 to 10") || !strings.Contains(b.String(), "FAIL  low: 0.5, bound >= 1.0") ||
		!strings.Contains(b.String(), "checks: 1 of 2 FAILED") {
		t.Errorf("printed:\n%s", b.String())
	}
	err := c.Err()
	var f *ClaimsFailed
	if !errors.Is(err, ErrClaims) || !errors.As(errors.Join(errors.New("plot"), err), &f) || len(f.Failed) != 1 || f.Total != 2 {
		t.Errorf("Err: %v", err)
	}
	if (&Claims{}).Err() != nil {
		t.Error("no claims: Err is not nil")
	}
}

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

func TestFedClaims(t *testing.T) {
	good := FedRows{TCP: 36e6, Proxied: 37e6, MPTCP4: 44e6, FreshTCP: 250 * time.Millisecond, FreshMPTCP4: 255 * time.Millisecond}
	cut := CutResult{Before: 44e6, During: 9e6, After: 43e6, Gap: 600 * time.Millisecond, SubflowBack: 300 * time.Millisecond}
	if c := fedClaims(good, cut); c.Err() != nil {
		t.Fatalf("good run: %v", c.Err())
	}
	for name, spoil := range map[string]func(*FedRows, *CutResult){
		"MPTCP-4 no faster than TCP":        func(r *FedRows, _ *CutResult) { r.MPTCP4 = 37e6 },
		"MPTCP-4 beyond both uplinks":       func(r *FedRows, _ *CutResult) { r.MPTCP4 = 51e6 },
		"proxy slows TCP down":              func(r *FedRows, _ *CutResult) { r.Proxied = 30e6 },
		"new connection adds a round trip":  func(r *FedRows, _ *CutResult) { r.FreshMPTCP4 = 390 * time.Millisecond },
		"LTE does not carry during the cut": func(_ *FedRows, c *CutResult) { c.During = 1e6 },
		"transfer stalls":                   func(_ *FedRows, c *CutResult) { c.Gap = time.Second },
		"wired subflow never back":          func(_ *FedRows, c *CutResult) { c.SubflowBack = -1 },
		"rate does not come back":           func(_ *FedRows, c *CutResult) { c.After = 20e6 },
	} {
		r, c := good, cut
		spoil(&r, &c)
		if cl := fedClaims(r, c); len(cl.Failed()) != 1 {
			t.Errorf("%s: failed %q, want one", name, failedNames(cl))
		}
	}
}

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
	for name, c := range map[string]*Claims{
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
