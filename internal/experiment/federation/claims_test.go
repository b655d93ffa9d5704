package federation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/traffic"
)

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

// failedNames returns the names of c's failed claims, joined.
func failedNames(c *kit.Claims) string {
	var n []string
	for _, k := range c.Failed() {
		n = append(n, k.Name)
	}
	return strings.Join(n, "; ")
}

// Figure 5 shows the goodput over time with the cut and the restore marked where they happened.
func TestFedFigure5(t *testing.T) {
	start := time.Now()
	res := CutResult{Start: start, CutTime: start.Add(4 * time.Second)}
	for i := 1; i <= 120; i++ {
		rate := 30e6
		if i > 40 && i <= 80 {
			rate = 10e6
		}
		res.Samples = append(res.Samples, traffic.Sample{At: time.Duration(i) * 100 * time.Millisecond, BitsPerSecond: rate})
	}
	path := filepath.Join(t.TempDir(), "fig5.svg")
	if err := fedFigure5(path, res, 4*time.Second); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">wired uplink cut<", ">wired uplink restored<", ">goodput (Mbit/s)<", ">goodput per 100 ms<"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("figure lacks %s", want)
		}
	}
	if err := fedFigure5(path, CutResult{}, time.Second); err == nil {
		t.Error("a figure without samples was drawn")
	}
}
