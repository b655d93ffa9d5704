package app

import (
	"context"
	"testing"
	"time"

	"braid/internal/experiment/demo"
	"braid/internal/lab/labtest"
)

// TestProxyNewConnectionLatency runs braid proxy on the demo's topology (two sites, two
// uplinks each, path A's base RTT 30 ms) and checks what a new connection costs: its
// request/response (connecting included) at most one path RTT plus 2 ms above the persistent
// connection's, medians of 20; and at most 2 of the 20 new connections 10 ms slower than the
// persistent one.
func TestProxyNewConnectionLatency(t *testing.T) {
	labtest.Require(t)
	tp, err := demo.TwoSites()
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1") // the proxies run this binary as braid
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pr, err := demo.MeasureProxy(ctx, l, true)
	if err != nil {
		t.Fatal(err)
	}
	const pathRTT = 30 * time.Millisecond
	t.Logf("persistent %v, new %v; new connections: %v", pr.RTT, pr.FirstByte, pr.NewConns)
	if bound := pr.RTT + pathRTT + 2*time.Millisecond; pr.FirstByte > bound {
		t.Errorf("a new connection's request/response takes %v, more than %v (the persistent connection's %v + one path RTT %v + 2 ms)",
			pr.FirstByte, bound, pr.RTT, pathRTT)
	}
	// A response (or request) with a part on the slower uplinks takes about 20 ms more (path B's
	// one-way delay is 35 ms, A's 15): before the far side gathered the destination's first
	// bytes, 8-10 of 20 new connections did.
	slow := 0
	for _, d := range pr.NewConns {
		if d > pr.RTT+10*time.Millisecond {
			slow++
		}
	}
	if slow > 2 {
		t.Errorf("%d of %d new connections took over 10 ms more than the persistent connection's %v: part of the exchange crossed the slower uplinks",
			slow, len(pr.NewConns), pr.RTT)
	}
}
