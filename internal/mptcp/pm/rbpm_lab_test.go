package pm_test

import (
	"context"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/rbpm"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
)

// On a fast path and a slow, long one with a bounded receive buffer (200 KB), the rbpm policy
// sets the slow subflow to backup within a few seconds, the slow path then carries (almost)
// nothing, and the transfer is faster than with the same subflows and no policy.
func TestLabRBPMDemotesTheSlowPath(t *testing.T) {
	labtest.Require(t)
	ms := time.Millisecond
	sc := rbpm.RBPMScenario{Name: "lab", Paths: []topo.Shape{
		{Rate: 10e6, Delay: 10 * ms, QueuePackets: 20},
		{Rate: 1e6, Delay: 100 * ms, QueuePackets: 20},
	}}
	base, rb := uploadBoth(t, sc)
	if rb.DemotedAt[0] >= 0 {
		t.Errorf("the fast path was demoted (%s)", rb.Note)
	}
	if at := rb.DemotedAt[1]; at < 0 || at > 4*time.Second {
		t.Errorf("the slow path was demoted at %v, want within 4 s (%s)", at, rb.Note)
	}
	var slow, all float64
	for k := 4; k < len(rb.PerPath[1]); k++ {
		slow += rb.PerPath[1][k]
		all += rb.PerPath[0][k] + rb.PerPath[1][k]
	}
	if all == 0 || slow > 0.05*all {
		t.Errorf("after the demotion the slow path carried %.0f of %.0f bytes", slow, all)
	}
	// Measured here: about 2.5 times (0.46 vs 1.16 MB/s); the bound leaves room for a noisy machine.
	if rb.Goodput < 1.3*base.Goodput {
		t.Errorf("goodput with the policy %.0f B/s, without %.0f B/s: want at least 1.3 times", rb.Goodput, base.Goodput)
	}
}

// Scenario 1 with a 2 MB receive buffer and shallow queues (rbpm.RBPMShallowS1): the
// peer's window (about 1 MB) holds the fast paths' out-of-order data, but the sender's send
// buffer, which keeps everything sent after the slow subflow's unacknowledged chunk, does not.
// The policy judges by the smaller, demotes the slow subflow and keeps it demoted, and the
// three fast paths then run close to their 15 Mbit/s.
func TestLabRBPMSendBufferBinds(t *testing.T) {
	labtest.Require(t)
	sc := rbpm.RBPMShallowS1()
	base, rb := uploadBoth(t, sc)
	for i := 0; i < 3; i++ {
		if rb.DemotedAt[i] >= 0 {
			t.Errorf("fast path %d was demoted (%s)", i+1, rb.Note)
		}
	}
	if at := rb.DemotedAt[3]; at < 0 || at > 4*time.Second {
		t.Errorf("the slow path was demoted at %v, want within 4 s (%s)", at, rb.Note)
	}
	var slow, all float64
	secs := 0
	for k := 4; k < len(rb.PerPath[3]); k++ {
		for i := range rb.PerPath {
			all += rb.PerPath[i][k]
		}
		slow += rb.PerPath[3][k]
		secs++
	}
	if all == 0 || slow > 0.05*all {
		t.Errorf("after the demotion the slow path carried %.0f of %.0f bytes", slow, all)
	}
	// From the fourth second the fast paths run near their 15 Mbit/s (1.875 MB/s; about
	// 1.75 MB/s measured here); without the policy the connection made 0.81–1.31 MB/s.
	if fast := (all - slow) / float64(max(secs, 1)); fast < 0.8*15e6/8 {
		t.Errorf("after the demotion the fast paths carried %.0f B/s, want at least 80%% of their 1875000", fast)
	}
	if rb.Goodput < 1.1*base.Goodput {
		t.Errorf("goodput with the policy %.0f B/s, without %.0f B/s: want at least 1.1 times", rb.Goodput, base.Goodput)
	}
}

// uploadBoth runs a 12 s upload over sc without the policy (fullmesh), then with rbpm.
func uploadBoth(t *testing.T, sc rbpm.RBPMScenario) (base, rb rbpm.RBPMRow) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const dur = 12 * time.Second
	base, err := rbpm.RBPMKernel(ctx, sc, false, dur, kit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err = rbpm.RBPMKernel(ctx, sc, true, dur, kit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("default: %.0f B/s, per path per second %v", base.Goodput, base.PerPath)
	t.Logf("rbpm:    %.0f B/s, per path per second %v; %s", rb.Goodput, rb.PerPath, rb.Note)
	return base, rb
}
