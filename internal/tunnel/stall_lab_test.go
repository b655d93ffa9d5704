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

// stallTrace is a link of 10 Mbit/s (833 packets of 1500 bytes a second) that stops for
// 300 ms every 1.5 s, as a cellular link does when its trace has no transmit opportunity.
func stallTrace(t *testing.T) *topo.Trace { return gapTrace(t, 1200, 300) }

// gapTrace is a link of 10 Mbit/s that delivers for busy ms and then stops for gap ms, over and
// over.
func gapTrace(t *testing.T, busy, gap int) *topo.Trace {
	var b strings.Builder
	for ms := 1; ms <= busy; ms++ {
		if ms%6 != 0 {
			fmt.Fprintln(&b, ms)
		}
	}
	fmt.Fprintln(&b, busy+gap)
	tr, err := topo.ParseTrace(fmt.Sprintf("gap%d-%d.up", busy, gap), []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// One TCP flow (cubic) through the tunnel over a constant path (20 Mbit/s, 10 ms one way) and a
// path that stalls (10 Mbit/s with 300 ms without delivery every 1.5 s, 30 ms one way), in the
// default configuration. What the stalling path was given before the sender saw the stall
// arrives 300 ms late: the receiver's reorder buffer would give its gaps up (the inner TCP sees
// losses) or hold the flow for them. The receiver asks for the numbers that waited longer than
// its gaps usually take (gap nacks, recovery.go) and the sender resends them on the constant
// path; the sender's schedulers, once a probe reply is overdue, give the stalled path nothing
// new (snapshotLocked). So the flow gets at least what the constant path alone carries
// through the tunnel, measured in the same lab: the stall does not drag the flow below it.
func TestTunnelStalledPath(t *testing.T) {
	shapes := []topo.Shape{
		{Rate: 20e6, Delay: 10 * time.Millisecond},
		{Trace: stallTrace(t), Delay: 30 * time.Millisecond},
	}
	tp := kit.ParallelLinks("stall", shapes...)
	// The stall is the flow's direction only: replies and ACKs come back at a constant rate.
	tp.Links[1].BA = topo.Shape{Rate: 10e6, Delay: 30 * time.Millisecond}
	l := labtest.Up(t, tp)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	addr := serve(t, l.Host("b"), pickFamily(l.Links()[0].Spec.B.Addrs, 4))
	alone, err := traffic.Bulk(ctx, ccDial(l.Host("a"), "cubic"), addr, traffic.BulkOptions{Duration: 10 * time.Second})
	if err != nil {
		t.Fatalf("the constant path alone: %v", err)
	}
	t.Logf("the constant path alone, no tunnel: %.1f Mbit/s, %d retransmits", alone.Steady/1e6, alone.Retransmits)
	eps := startTunnels(t, l, 4, nil)
	waitUp(t, eps)
	in := serve(t, eps[1].host, eps[1].inner4)
	var segments, retransmits int64
	run := func(flow int) traffic.BulkResult {
		trace := traceEstimates(eps[0].tunnel, eps[1].tunnel, nil)
		res, err := traffic.Bulk(ctx, ccDial(eps[0].host, "cubic"), in, traffic.BulkOptions{Duration: 15 * time.Second})
		t.Logf("flow %d, each second:%s", flow, trace())
		if err != nil {
			t.Fatalf("flow %d through the tunnel: %v", flow, err)
		}
		segments += res.Bytes / int64(mss(tunnelMTU))
		retransmits += res.Retransmits
		c, rc := eps[0].tunnel.Status().Counters, eps[1].tunnel.Status().Counters
		r := eps[1].tunnel.Status().Peers[0].Reorder
		t.Logf("flow %d through the tunnel: %.1f Mbit/s steady (%.1f over 15 s), %.2f of the constant path alone; %d retransmits; receiver sent %d gap nacks, held %d gaps for a resend (%d filled), gave up %d gaps (%d numbers), %d packets late, %d duplicates; sender resent %d (%d for gap nacks, %d over the budget, %d no longer kept)",
			flow, res.Steady/1e6, res.Goodput/1e6, res.Steady/alone.Steady, res.Retransmits, rc["gap_nacks_sent"], r.Rescued, r.Refilled, r.Timeouts, r.Lost, r.Late, r.Duplicates, c["resent"], c["gap_resent"], c["resend_budget"], c["resend_missed"])
		return res
	}
	// The constant path carries fewer payload bytes through the tunnel than without it: each
	// inner segment (MTU 1400) gains the tunnel's overhead and outer IPv4 and UDP headers, where
	// the plain flow's segments fill the link's 1500 bytes. The floor is what the constant path
	// alone carries at the tunnel's payload share of each byte it sends. The first flow teaches
	// the estimators the paths; the next is judged, up to three in all when one misses
	// (labtest.Measure: the hypervisor takes the CPU at times).
	want := alone.Steady * payloadShare(tunnelMTU, tunnelMTU+tunnel.Overhead+20+8) / payloadShare(1500, 1500)
	run(1)
	labtest.Measure(t, func(try int) []string {
		if res := run(1 + try); res.Steady < want {
			return []string{fmt.Sprintf("%.1f Mbit/s through the tunnel, %.2f of the constant path alone (%.1f), want at least what that path carries through the tunnel (%.1f)", res.Steady/1e6, res.Steady/alone.Steady, alone.Steady/1e6, want/1e6)}
		}
		return nil
	})
	// What the stall delays must reach the inner flow in time: when the receiver gives its
	// gaps up instead (no gap nacks), the flows resent about 1.5 % of their segments here; with them,
	// 0.16-0.34 %.
	if share := float64(retransmits) / float64(max(segments, 1)); share > 0.01 {
		t.Errorf("the flows resent %d of %d segments (%.2f %%), want at most 1 %%", retransmits, segments, 100*share)
	}
}

// mss is the payload of a full TCP/IPv4 segment with timestamps in a packet of mtu bytes.
func mss(mtu int) int { return mtu - 20 - 20 - 12 }

// payloadShare is the share of a packet of wire bytes on the link that is TCP payload, for a
// TCP/IPv4 segment (with timestamps) of mtu bytes.
func payloadShare(mtu, wire int) float64 {
	return float64(mss(mtu)) / float64(wire)
}

// One TCP flow (cubic) through the tunnel over its only path, a link of 10 Mbit/s and 30 ms one
// way that stops delivering in both directions for 600 ms every 3 s, as a cellular link does in a
// coverage gap, with the deep queue of a cellular base station (1000 packets). The stall is longer
// than DownAfter (250 ms), so each side declares the path down in every stall. A plain flow's
// packets wait in the link's queue through it; the tunnel used to drop what the flow sent while no
// path was up (drop_no_path: 72-274 packets a side in a 30 s flow over one recorded LTE trace) and
// the flow inside lost a window at once. With no path up, a path that went down on silence within
// the last 2 s is used (snapshotLocked), so the tunnel drops (almost) nothing in the stalls.
// Measured on 2026-12-03: before, 221-244 packets dropped and 0.49-0.64 of the path alone (three
// runs); with the rule, none dropped and 0.72-0.82 in four. The rest was the pacing: the path
// paced at its measured capacity, which each stall pulled down to 4.5-6.3 Mbit/s of the link's 10,
// and the send queue's bound (20 ms at that rate) dropping the flow's bursts. The one path left is
// not paced (unpaceLastLocked), and the flow meets the link's own queue as a plain flow does:
// 0.94 of a plain flow on the same link in three runs alone, 0.86 once after other tests (the
// headers alone cost some 5 %). The test wants the path unpaced and at least 0.8 (the old code
// reached 0.82 once, so the ratio alone would not always tell; the status does).
func TestTunnelOnePathStall(t *testing.T) {
	shape := topo.Shape{Trace: gapTrace(t, 2400, 600), Delay: 30 * time.Millisecond, QueuePackets: 1000}
	l := labtest.Up(t, kit.ParallelLinks("gap", shape))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const dur = 15 * time.Second
	alone, err := traffic.Bulk(ctx, ccDial(l.Host("a"), "cubic"), serve(t, l.Host("b"), pickFamily(l.Links()[0].Spec.B.Addrs, 4)), traffic.BulkOptions{Duration: dur})
	if err != nil {
		t.Fatalf("the path alone: %v", err)
	}
	t.Logf("the path alone, no tunnel: %.1f Mbit/s (%.1f over %v), %d retransmits", alone.Steady/1e6, alone.Goodput/1e6, dur, alone.Retransmits)
	eps := startTunnels(t, l, 4, nil)
	waitUp(t, eps)
	in := serve(t, eps[1].host, eps[1].inner4)
	// The status and the drops are checked in every flow; the rate, up to three flows when one
	// misses (labtest.Measure: the hypervisor takes the CPU at times).
	labtest.Measure(t, func(try int) []string {
		trace := traceEstimates(eps[0].tunnel, eps[1].tunnel, nil)
		before, rbefore := eps[0].tunnel.Status().Counters, eps[1].tunnel.Status().Counters
		res, err := traffic.Bulk(ctx, ccDial(eps[0].host, "cubic"), in, traffic.BulkOptions{Duration: dur})
		t.Logf("flow %d, each second:%s", try, trace())
		if err != nil {
			t.Fatalf("through the tunnel: %v", err)
		}
		sc, rc := eps[0].tunnel.Status().Counters, eps[1].tunnel.Status().Counters
		sd, rd := sc["drop_no_path"]-before["drop_no_path"], rc["drop_no_path"]-rbefore["drop_no_path"]
		t.Logf("flow %d through the tunnel: %.1f Mbit/s (%.1f over %v), %.2f of the path alone; %d retransmits; drop_no_path: sender %d, receiver %d",
			try, res.Steady/1e6, res.Goodput/1e6, dur, res.Goodput/alone.Goodput, res.Retransmits, sd, rd)
		if p := eps[0].tunnel.Status().Peers[0].Paths[0]; !p.Unpaced {
			t.Errorf("the one path is paced (at %.1f Mbit/s, %s): want it unpaced", p.Capacity/1e6, p.CapacityPhase)
		}
		if d := sd + rd; d > 10 {
			t.Errorf("the tunnel dropped %d packets for want of a path up (sender %d, receiver %d), want at most 10: the link holds them through a stall", d, sd, rd)
		}
		if res.Goodput < 0.8*alone.Goodput {
			return []string{fmt.Sprintf("%.1f Mbit/s through the tunnel over %v, %.2f of the path alone (%.1f), want at least 0.8", res.Goodput/1e6, dur, res.Goodput/alone.Goodput, alone.Goodput/1e6)}
		}
		return nil
	})
}
