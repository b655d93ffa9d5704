package tunnel_test

import (
	"context"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/rbpm"
	"braid/internal/lab/labtest"
	"braid/internal/traffic"
	"braid/internal/tunnel"
)

// On the RBPM paper's scenario 1 (three 5 Mbit/s 10 ms paths and a 1 Mbit/s 100 ms one, with
// 100-packet queues) and a 200 KB reorder buffer, the rbpm scheduler demotes the slow path,
// keeps the fast ones, says so in the status, keeps probing the demoted path, and carries a
// TCP flow at well above what the flow gets with the slow path in use. When every fast path
// dies, the demoted path comes back and carries the flow.
func TestTunnelRBPMDemotesSlowPath(t *testing.T) {
	sc := rbpm.RBPMScenarios()[0]
	l := labtest.Up(t, kit.ParallelLinks("rbpm", sc.Paths...))
	eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
		o.Scheduler = "rbpm"
		o.ReorderCfg.MaxBytes = rbpm.RBPMBuffer
	})
	waitUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := traffic.Bulk(ctx, eps[0].host.Dial, addr, traffic.BulkOptions{Duration: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := eps[0].tunnel.Status().Peers[0]
	t.Logf("goodput %.0f B/s; peer buffer free %d B", res.Goodput/8, st.PeerBufferFree)
	for _, p := range st.Paths {
		t.Logf("path %d: %s (%s; required %d B, available %d B), rtt %v, rate %.0f bit/s, %d probes", p.ID, p.Sched, p.SchedReason, p.SchedRequired, p.SchedAvailable, p.RTT, p.Rate, p.ProbesSent)
		want := "active"
		if p.ID-1 == sc.Slow {
			want = "demoted"
		}
		if p.Sched != want {
			t.Errorf("path %d is %q, want %q", p.ID, p.Sched, want)
		}
		if p.State != "up" {
			t.Errorf("path %d is %s: a demoted path is still probed and up", p.ID, p.State)
		}
	}
	if st.Scheduler != "rbpm" || st.PeerBufferFree < 0 || st.PeerBufferFree > rbpm.RBPMBuffer {
		t.Errorf("peer status: scheduler %q, peer buffer free %d (bound %d)", st.Scheduler, st.PeerBufferFree, rbpm.RBPMBuffer)
	}
	// The slow path alone carries 125 kB/s and the four paths in round robin about 400 kB/s
	// (braid lab repro rbpm); the fast paths together carry up to 1.8 MB/s.
	if res.Goodput/8 < 800e3 {
		t.Errorf("goodput %.0f B/s, want at least 800 kB/s with the slow path demoted", res.Goodput/8)
	}

	// Every fast path dies: the demoted path is rescued and carries the flow.
	for i, lk := range l.Links() {
		if i != sc.Slow {
			lk.Cut()
		}
	}
	res, err = traffic.Bulk(ctx, eps[0].host.Dial, addr, traffic.BulkOptions{Duration: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	slow := eps[0].tunnel.Status().Peers[0].Paths[sc.Slow]
	t.Logf("fast paths cut: goodput %.0f B/s; slow path %s (%s)", res.Goodput/8, slow.Sched, slow.SchedReason)
	if slow.Sched != "active" || res.Goodput/8 < 40e3 {
		t.Errorf("with the fast paths cut: slow path %q (%s), goodput %.0f B/s; want it active and carrying the flow", slow.Sched, slow.SchedReason, res.Goodput/8)
	}
}
