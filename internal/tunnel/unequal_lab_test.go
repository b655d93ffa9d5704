package tunnel_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
)

// One TCP flow (cubic) through the tunnel over two paths of unequal delay, 50 Mbit/s at 5 ms and
// 25 Mbit/s at 50 ms one way, in the default configuration: capacities measured, the paced
// scheduler planning its queue (earliest arrival), the reorder buffer on, loss recovery on.
// Without loss it gets at least 0.85 of the sum of the paths alone; with 1 % random loss on each
// path, at least the better path alone. The paths alone are measured in the same lab (plain
// TCP, no tunnel); every figure is the median of the flow's 1 s samples after its first
// (traffic.BulkResult.Steady).
//
// The tunnel has carried one flow before the one measured, as a tunnel in service has: its
// capacity estimator starts from a guess (100 Mbit/s) and learns a path's rate only from the
// traffic the path carries. The first flow's figure is logged, not bounded; the next one's is,
// and one that misses is measured again, up to three in all (labtest.Measure). Its startup paces
// the fast path above its rate for the estimator's first windows; the queue that builds on the
// link ends the inner TCP's slow start (HyStart sees the delay) and usually overflows it, and
// by arrival time alone the slow path is worth using only once cubic's window is deep enough
// into the send queue, some 10 s later. The planner gives the slow path, while it is still
// unmeasured, what the fast one must wait for, so that it is measured in the first seconds
// (docs/scheduling.md, "A path is measured from the first flow"; measured: first flow 0.70 and
// 0.92 of the sum, was 0.60-0.64 in most runs; the next 0.94 and 0.94; with a core held busy,
// 13 runs before and after loss recovery's resends were charged to the path's pacing: first
// flow 0.61-0.92 and 0.63-0.92, second 0.92-0.94 and 0.88-0.94, docs/scheduling.md, "Resends
// are charged to the path").
//
// With 1 % loss, a flow over one path is limited by the loss: cubic's rate goes with
// MSS/(RTT·√p). Through the tunnel the loss is recovered below TCP (recovery.go): the receiver
// reports each gap in a path's numbering and the sender resends the packet on the fastest path,
// so the inner flow sees almost none of it (measured: 31.8-34.7 Mbit/s, 3.1-3.4 times the fast
// path alone at 10.2 Mbit/s).
func TestTunnelUnequalPaths(t *testing.T) {
	for _, loss := range []float64{0, 1} {
		t.Run(fmt.Sprintf("loss %g%%", loss), func(t *testing.T) {
			shapes := []topo.Shape{
				{Rate: 50e6, Delay: 5 * time.Millisecond, Loss: loss},
				{Rate: 25e6, Delay: 50 * time.Millisecond, Loss: loss},
			}
			l := labtest.Up(t, kit.ParallelLinks("uneq", shapes...))
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			sum, best := 0.0, 0.0
			for i, lk := range l.Links() {
				addr := serve(t, l.Host("b"), pickFamily(lk.Spec.B.Addrs, 4))
				// With loss the flow is limited by it, and its rate varies from flow to flow:
				// the paths alone are measured for as long as the tunnel's flows.
				dur := 10 * time.Second
				if loss > 0 {
					dur = 20 * time.Second
				}
				res, err := traffic.Bulk(ctx, ccDial(l.Host("a"), "cubic"), addr, traffic.BulkOptions{Duration: dur})
				if err != nil {
					t.Fatalf("path %d alone: %v", i+1, err)
				}
				t.Logf("path %d alone (%.0f Mbit/s, %v one way), no tunnel: %.1f Mbit/s, %d retransmits",
					i+1, float64(shapes[i].Rate)/1e6, shapes[i].Delay, res.Steady/1e6, res.Retransmits)
				sum += res.Steady
				best = max(best, res.Steady)
			}
			eps := startTunnels(t, l, 4, nil)
			waitUp(t, eps)
			addr := serve(t, eps[1].host, eps[1].inner4)
			drops := make([]uint64, len(l.Links()))
			run := func(flow int) traffic.BulkResult {
				trace := traceEstimates(eps[0].tunnel, eps[1].tunnel, func() []uint64 {
					var d []uint64
					for _, lk := range l.Links() {
						d = append(d, lk.Stats(0).DropQueue)
					}
					return d
				})
				res, err := traffic.Bulk(ctx, ccDial(eps[0].host, "cubic"), addr, traffic.BulkOptions{Duration: 20 * time.Second})
				t.Logf("flow %d, each second: the sender's paths (capacity Mbit/s, phase, RTT ms) and send queue, the receiver's reorder buffer:%s", flow, trace())
				if err != nil {
					t.Fatalf("flow %d through the tunnel: %v", flow, err)
				}
				t.Logf("flow %d through the tunnel: %.1f Mbit/s steady (%.1f over 20 s), %.2f of the sum of the paths alone (%.1f), %.2f of the better one; %d retransmits",
					flow, res.Steady/1e6, res.Goodput/1e6, res.Steady/sum, sum/1e6, res.Steady/best, res.Retransmits)
				var b strings.Builder
				for _, s := range res.Samples {
					fmt.Fprintf(&b, " %.1f", s.BitsPerSecond/1e6)
				}
				// What the links' queues dropped in the flow's direction: a burst or a probe
				// that overflowed a path's queue (docs/scheduling.md, "Bursts into a short
				// queue").
				var q strings.Builder
				for i, lk := range l.Links() {
					st := lk.Stats(0)
					fmt.Fprintf(&q, " path %d %d (the queue's peak so far %.0f KB);", i+1, st.DropQueue-drops[i], float64(st.MaxBacklogBytes)/1e3)
					drops[i] = st.DropQueue
				}
				t.Logf("flow %d, packets the links' queues dropped towards the receiver:%s", flow, q.String())
				c := eps[0].tunnel.Status().Counters
				t.Logf("flow %d, Mbit/s per second:%s; sender: resent %d, resend budget %d, missed %d, drop_no_path %d",
					flow, b.String(), c["resent"], c["resend_budget"], c["resend_missed"], c["drop_no_path"])
				for _, ps := range eps[0].tunnel.Status().Peers {
					for _, p := range ps.Paths {
						t.Logf("flow %d, path %d: capacity %.1f Mbit/s (%s), RTT %v, %d data packets", flow, p.ID, p.Capacity/1e6, p.CapacityPhase, p.RTT, p.TxDataPackets)
					}
				}
				return res
			}
			// The first flow teaches the estimators the paths; the next is judged, up to three
			// in all when one misses (labtest.Measure: the hypervisor takes the CPU at times).
			run(1)
			labtest.Measure(t, func(try int) []string {
				res := run(1 + try)
				if loss == 0 && res.Steady < 0.85*sum {
					return []string{fmt.Sprintf("without loss: %.1f Mbit/s, %.2f of the sum of the paths alone (%.1f), want at least 0.85", res.Steady/1e6, res.Steady/sum, sum/1e6)}
				}
				if loss > 0 && res.Steady < best {
					return []string{fmt.Sprintf("with %g%% loss: %.1f Mbit/s, %.2f of the better path alone (%.1f), want at least that path", loss, res.Steady/1e6, res.Steady/best, best/1e6)}
				}
				return nil
			})
		})
	}
}

// traceEstimates samples, once a second until the returned function is called (which stops
// it and returns the samples as text), the capacity estimate, phase and RTT of each of the
// sender's paths, its send queue's depth, the gaps the receiver's reorder buffer gave up on
// (which the flow inside sees as losses) and why, the sender's nacks, resends, send queue drops
// and overflows, and, when linkDrops is set, what each link's queue has dropped so far: what a
// failure of a bound needs to be understood.
func traceEstimates(sender, receiver interface{ Status() tunnel.Status }, linkDrops func() []uint64) func() string {
	var b strings.Builder
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for s := 1; ; s++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			fmt.Fprintf(&b, "\n\t%2ds", s)
			for _, ps := range sender.Status().Peers {
				for _, p := range ps.Paths {
					fmt.Fprintf(&b, "  path %d %5.1f %-7s %4.0f", p.ID, p.Capacity/1e6, p.CapacityPhase, p.RTT.Seconds()*1e3)
				}
				fmt.Fprintf(&b, "  queued %4.0f KB", float64(ps.SendQueueBytes)/1e3)
			}
			for _, ps := range receiver.Status().Peers {
				if r := ps.Reorder; r != nil {
					fmt.Fprintf(&b, "  receiver: lost %d, late %d, timeouts %d, overflows %d, rescued %d", r.Lost, r.Late, r.Timeouts, r.Overflows, r.Rescued)
				}
			}
			c := sender.Status().Counters
			fmt.Fprintf(&b, "  sender: nacks %d resent %d gapresent %d qfull %d overflows %d", c["nacks_received"], c["resent"], c["gap_resent"], c["drop_queue_full"], c["overflows"])
			if linkDrops != nil {
				fmt.Fprintf(&b, "  link drops %v", linkDrops())
			}
		}
	}()
	return func() string {
		close(stop)
		<-done
		return b.String()
	}
}
