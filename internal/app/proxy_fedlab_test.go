package app

import (
	"context"
	"os"
	"testing"
	"time"

	"braid/internal/experiment/federation"
	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
)

// startFedLab starts the federation's lab (two sites, a server behind the second) with one
// uplink per shape, for a test that runs braid proxy as this test binary; the lab is closed and
// the context cancelled when the test ends. It skips the test where the lab cannot run (and fails
// it there under BRAID_LAB_REQUIRED=1).
func startFedLab(t *testing.T, timeout time.Duration, uplinks ...topo.Shape) (context.Context, *federation.FedLab) {
	t.Helper()
	labtest.Require(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BRAID_TEST_MAIN", "1") // the proxies run this binary as braid
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	f, err := federation.StartFed(ctx, kit.Options{}, self, nil, false, uplinks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return ctx, f
}
