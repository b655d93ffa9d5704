package app

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"braid/internal/experiment/demo"
	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
)

// TestProxyNewConnectionLatency runs braid proxy on the demo's topology (two sites, two
// uplinks each, path A's base RTT 30 ms) and checks what a new connection costs: its
// request/response (connecting included) at most one path RTT plus 2 ms above the persistent
// connection's, medians of 20; and at most 4 of the 20 new connections 10 ms slower than the
// persistent one.
//
// The lab delays packets in user space, so other work on the machine (make test runs packages
// side by side) can add milliseconds to single exchanges: in one CI run the persistent
// connection took 36.6 ms instead of 31-33 and 13 of 20 new connections were slow, while four
// runs of the test alone passed. In another, both measurements read the persistent connection at
// 39.7 and 38.6 ms and new ones at 36-130 ms (12 and 9 of 20 slow), the machine 0.79-0.85 of 2
// cores busy, while five runs here just after read 31.8-33.1 and 33.3-48.2 ms (at most 1 of 20
// slow): the lab itself was late on every packet, as when the hypervisor takes the CPU (steal).
// A measurement that misses a bound is therefore made again, up to three in all, each logged
// with the machine's load and the host's CPU shares (steal among them); the test fails when all
// three miss. The fault it was written for (part of the exchange on the slower uplinks) misses
// every time.
func TestProxyNewConnectionLatency(t *testing.T) {
	labtest.Require(t)
	tp, err := demo.TwoSites()
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1") // the proxies run this binary as braid
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	labtest.Measure(t, func(try int) []string {
		busy0, ok0 := kit.MachineBusy()
		t0 := time.Now()
		pr, err := demo.MeasureProxy(ctx, l, true)
		if err != nil {
			t.Fatal(err)
		}
		load := "unknown"
		if busy1, ok1 := kit.MachineBusy(); ok0 && ok1 {
			load = fmt.Sprintf("%.2f of %d cores busy", (busy1-busy0).Seconds()/time.Since(t0).Seconds(), runtime.NumCPU())
		}
		t.Logf("measurement %d (machine: %s): persistent %v, new %v; new connections: %v", try, load, pr.RTT, pr.FirstByte, pr.NewConns)
		return proxyLatencyMisses(pr)
	})
}

// proxyLatencyMisses returns the bounds of TestProxyNewConnectionLatency that pr misses.
func proxyLatencyMisses(pr demo.ProxyResult) []string {
	const pathRTT = 30 * time.Millisecond
	var m []string
	if bound := pr.RTT + pathRTT + 2*time.Millisecond; pr.FirstByte > bound {
		m = append(m, fmt.Sprintf("a new connection's request/response takes %v, more than %v (the persistent connection's %v + one path RTT %v + 2 ms)",
			pr.FirstByte, bound, pr.RTT, pathRTT))
	}
	// A response (or request) with a part on the slower uplinks takes about 20 ms more (path B's
	// one-way delay is 35 ms, A's 15): before the far side gathered the destination's first
	// bytes, 8-10 of 20 new connections did. Without that fault, load alone made 3 of 20 slow
	// in both measurements of one make test run (the machine 1.13-1.20 of 2 cores busy, the
	// medians within their bound): at most 4 stays clear of both.
	slow := 0
	for _, d := range pr.NewConns {
		if d > pr.RTT+10*time.Millisecond {
			slow++
		}
	}
	if slow > 4 {
		m = append(m, fmt.Sprintf("%d of %d new connections took over 10 ms more than the persistent connection's %v: part of the exchange crossed the slower uplinks",
			slow, len(pr.NewConns), pr.RTT))
	}
	return m
}
