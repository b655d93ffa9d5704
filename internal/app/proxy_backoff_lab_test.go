package app

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
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
// the proxy's path manager, at start and by a reload: with the default (30 s) those pairs back
// off and the proxy opens few joins once its connections are up; after a reload (SIGHUP) with
// "0" they are joined again every join timeout, the ones already waiting included, and nothing
// more backs off.
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
	dir := t.TempDir()
	site := func(side int, extra string) []byte {
		own, peer := k1, k2
		if side == 2 {
			own, peer = k2, k1
		}
		b, err := demo.ProxySite(l, side, own.String(), peer.Public().String(), extra)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p1, err := roles.StartProxy(l.Host("r1"), self, dir, site(1, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Stop()
	p2, err := roles.StartProxy(l.Host("r2"), self, dir, site(2, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("r1:\n%s\nr2:\n%s", p1.Log(), p2.Log())
		}
	}()
	if err := demo.WaitPooled(ctx, p1, p2); err != nil {
		t.Fatal(err)
	}
	// window returns the joins r1's proxy opened in 6 s and the pairs that backed off in them.
	window := func() (joins, backoffs float64) {
		before := pmCounters(ctx, t, l.Host("r1"))
		time.Sleep(6 * time.Second)
		after := pmCounters(ctx, t, l.Host("r1"))
		return after["braid_pm_subflow_creates_total"] - before["braid_pm_subflow_creates_total"],
			after["braid_pm_join_backoffs_total"] - before["braid_pm_join_backoffs_total"]
	}
	time.Sleep(3 * time.Second) // the connections' first joins
	onJoins, onBackoffs := window()

	if err := os.WriteFile(p1.File, site(1, "pm_join_backoff_max = \"0\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p1.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	const applied = "path manager: pm_policy fullmesh, pm_join_timeout 1s, pm_join_backoff_max 0s"
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p1.Log(), applied); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload did not report %q", applied)
		}
	}
	offJoins, offBackoffs := window()
	t.Logf("joins by r1 in 6 s: %v with the default backoff (%v backoffs), %v after a reload to pm_join_backoff_max = \"0\" (%v backoffs)", onJoins, onBackoffs, offJoins, offBackoffs)
	if onBackoffs == 0 {
		t.Error("with the default pm_join_backoff_max no pair backed off, though two pairs per connection never come up")
	}
	if offBackoffs != 0 {
		t.Errorf("after the reload to pm_join_backoff_max = \"0\" pairs backed off %v times", offBackoffs)
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
