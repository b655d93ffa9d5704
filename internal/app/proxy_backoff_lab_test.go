package app

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/demo"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
)

// TestProxyJoinBackoffLab runs braid proxy on the demo's topology, where each ISP reaches only
// its own customers, so that of the four pairs of an uplink and a peer address on each pooled
// connection the two crossing ones never come up, and checks that pm_join_backoff_max reaches
// the proxy's path manager: with the default (30 s) those pairs back off and the proxy opens
// few joins once its connections are up; with "0" they are joined again every join timeout,
// and nothing backs off.
func TestProxyJoinBackoffLab(t *testing.T) {
	labtest.Require(t)
	tp, err := demo.TwoSites()
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1") // the proxies run this binary as braid
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		t.Fatal(err)
	}
	// run starts both proxies with extra in [proxy] and returns the joins r1's proxy opened in
	// 6 s once its connections were up for 3 s, and how many times a pair backed off by then.
	run := func(extra string) (joins, backoffs float64) {
		dir := t.TempDir()
		s1, err := demo.ProxySite(l, 1, k1.String(), k2.Public().String(), extra)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := demo.ProxySite(l, 2, k2.String(), k1.Public().String(), extra)
		if err != nil {
			t.Fatal(err)
		}
		p1, err := roles.StartProxy(l.Host("r1"), self, dir, s1)
		if err != nil {
			t.Fatal(err)
		}
		defer p1.Stop()
		p2, err := roles.StartProxy(l.Host("r2"), self, dir, s2)
		if err != nil {
			t.Fatal(err)
		}
		defer p2.Stop()
		if err := demo.WaitPooled(ctx, p1, p2); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		before := pmCounters(ctx, t, l.Host("r1"))
		time.Sleep(6 * time.Second)
		after := pmCounters(ctx, t, l.Host("r1"))
		if t.Failed() {
			t.Logf("r1:\n%s\nr2:\n%s", p1.Log(), p2.Log())
		}
		return after["braid_pm_subflow_creates_total"] - before["braid_pm_subflow_creates_total"], after["braid_pm_join_backoffs_total"]
	}
	onJoins, onBackoffs := run("")
	offJoins, offBackoffs := run("pm_join_backoff_max = \"0\"\n")
	t.Logf("joins in 6 s: %v with the default backoff (%v backoffs), %v with pm_join_backoff_max = \"0\" (%v backoffs)", onJoins, onBackoffs, offJoins, offBackoffs)
	if onBackoffs == 0 {
		t.Error("with the default pm_join_backoff_max no pair backed off, though two pairs per connection never come up")
	}
	if offBackoffs != 0 {
		t.Errorf("with pm_join_backoff_max = \"0\" pairs backed off %v times", offBackoffs)
	}
	if offJoins < 2*onJoins || offJoins < 8 {
		t.Errorf("joins in 6 s: %v with the backoff off, against %v with it on: want at least twice as many, and 8", offJoins, onJoins)
	}
}

// pmCounters reads the braid_pm_ samples of the proxy's /metrics in h.
func pmCounters(ctx context.Context, t *testing.T, h *lab.Host) map[string]float64 {
	t.Helper()
	m := make(map[string]float64)
	for _, line := range strings.Split(proxyMetrics(ctx, t, h), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[0], "braid_pm_") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m
}
