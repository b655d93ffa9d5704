package app

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/demo"
	"braid/internal/experiment/kit"
)

// demoResults are what a good demo run measures (the two-sites topology's figures).
func demoResults() ([]demo.PathResult, demo.TunnelResult, demo.ProxyResult) {
	paths := []demo.PathResult{
		{Path: demo.DemoPaths[0], Bottleneck: 50e6, BaseRTT: 30 * time.Millisecond, Goodput: 48e6, RTT: 31 * time.Millisecond, FileSize: 2 << 20, FileIntact: true, GoodputShare: 0.96},
		{Path: demo.DemoPaths[1], Bottleneck: 20e6, BaseRTT: 70 * time.Millisecond, Goodput: 19e6, RTT: 71 * time.Millisecond, FileSize: 2 << 20, FileIntact: true, GoodputShare: 0.95},
	}
	tr := demo.TunnelResult{Goodput: 61e6, FileSize: 2 << 20, FileIntact: true, CutGap: 105 * time.Millisecond, CutIntact: true}
	pr := demo.ProxyResult{Goodput: 64e6, FileSize: 2 << 20, FileIntact: true, Subflows: 2}
	return paths, tr, pr
}

// runDemoChecks runs the exit path of `braid lab demo` on a scenario that "measured" the given
// results: it prints the demo's checks and returns what they make of them.
func runDemoChecks(t *testing.T, paths []demo.PathResult, tr demo.TunnelResult, pr demo.ProxyResult) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	s := kit.Scenario{Name: "demo", Run: func(_ context.Context, w io.Writer, _ kit.Options) error {
		c := demo.DemoChecks(paths, tr, pr)
		c.Print(w)
		return c.Err()
	}}
	ctx := context.Background()
	code = scenarioExit(env{stdout: &o, stderr: &e}, "demo", ctx, s.Run(ctx, &o, kit.Options{}))
	return code, o.String(), e.String()
}

// A demo whose transfer arrived corrupted exits non-zero, prints the failed check and names it
// in its summary; the same run with the file intact exits 0.
func TestDemoCorruptedTransferFails(t *testing.T) {
	paths, tr, pr := demoResults()
	code, out, errOut := runDemoChecks(t, paths, tr, pr)
	if code != exitOK || strings.Contains(out, "FAIL") || !strings.Contains(out, "checks: all 13 passed") {
		t.Fatalf("good run: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, corrupt := range []func(){
		func() { paths[0].FileIntact = false },
		func() { tr.FileIntact = false },
		func() { tr.CutIntact = false },
		func() { pr.FileIntact = false },
	} {
		paths, tr, pr = demoResults()
		corrupt()
		code, out, errOut = runDemoChecks(t, paths, tr, pr)
		if code != exitChecks || !strings.Contains(out, "FAIL") || !strings.Contains(out, "checks: 1 of 13 FAILED") ||
			!strings.Contains(errOut, "1 of 13 checks FAILED") || !strings.Contains(errOut, "intact") {
			t.Errorf("corrupted transfer: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitChecks, out, errOut)
		}
	}
}

// Each bound of the demo fails on both sides of what the links allow.
func TestDemoChecksBounds(t *testing.T) {
	for name, spoil := range map[string]func(p []demo.PathResult, tr *demo.TunnelResult, pr *demo.ProxyResult){
		"path slower than 0.6 of its bottleneck": func(p []demo.PathResult, _ *demo.TunnelResult, _ *demo.ProxyResult) {
			p[1].GoodputShare = 0.5
		},
		"path faster than its bottleneck": func(p []demo.PathResult, _ *demo.TunnelResult, _ *demo.ProxyResult) {
			p[0].GoodputShare = 1.04
		},
		"RTT below the links' delays": func(p []demo.PathResult, _ *demo.TunnelResult, _ *demo.ProxyResult) {
			p[0].RTT = 20 * time.Millisecond
		},
		"tunnel no faster than the best path": func(_ []demo.PathResult, tr *demo.TunnelResult, _ *demo.ProxyResult) { tr.Goodput = 50e6 },
		"tunnel faster than both paths":       func(_ []demo.PathResult, tr *demo.TunnelResult, _ *demo.ProxyResult) { tr.Goodput = 72e6 },
		"ping gap over 1 s when path A is cut": func(_ []demo.PathResult, tr *demo.TunnelResult, _ *demo.ProxyResult) {
			tr.CutGap = 2 * time.Second
		},
		"proxy faster than its paths":        func(_ []demo.PathResult, _ *demo.TunnelResult, pr *demo.ProxyResult) { pr.Goodput = 71e6 },
		"proxy connection on one subflow":    func(_ []demo.PathResult, _ *demo.TunnelResult, pr *demo.ProxyResult) { pr.Subflows = 1 },
		"proxy no faster than the best path": func(_ []demo.PathResult, _ *demo.TunnelResult, pr *demo.ProxyResult) { pr.Goodput = 48e6 },
		"path RTT far above the links' delays": func(p []demo.PathResult, _ *demo.TunnelResult, _ *demo.ProxyResult) {
			p[1].RTT = 200 * time.Millisecond
		},
		"proxy file corrupted": func(_ []demo.PathResult, _ *demo.TunnelResult, pr *demo.ProxyResult) {
			pr.FileIntact = false
		},
	} {
		paths, tr, pr := demoResults()
		spoil(paths, &tr, &pr)
		c := demo.DemoChecks(paths, tr, pr)
		if err := c.Err(); !errors.Is(err, kit.ErrClaims) || len(c.Failed()) != 1 {
			t.Errorf("%s: %d checks failed (%v), want 1", name, len(c.Failed()), err)
		}
	}
}
