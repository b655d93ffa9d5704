package tunnel_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// A sparse flow beside a bulk one, over two paths of unequal delay (20 Mbit/s at 5 ms and
// 10 Mbit/s at 40 ms one way): a UDP echo every 10 ms, as a voice call or a game would send,
// while one cubic flow fills the tunnel. With sparse flows (the site files' default) each echo
// goes ahead of the bulk flow's packets in the send queue, crosses on both paths, and the
// first copy is delivered at once: its round trips stay near the fast path's, below half the
// slow path's base RTT at the 95th percentile, no echo is delivered twice, and the bulk flow
// is no slower. Without them (sparse_flows = false), measured in the same lab, the echo waits
// behind the bulk flow's packets in the send queue and in the reorder buffer, as every packet
// does, about the slow path's one-way delay each way (measured: p50 73 ms and p95 85 ms
// without, 14-19 and 21-27 ms with); that run is logged for comparison, and must lose nothing
// either.
//
// A peer of the release before sparse flows speaks protocol version 2, whose receiver holds a
// packet until those numbered before it come and takes three look-alike copies in a row for a
// restarted peer: to it the sender sends sparse packets once and in their turn. The third run
// plays that peer (side b speaking version 2 alone): no copies, no echo answered twice, every
// echo answered.
func TestTunnelSparseFlows(t *testing.T) {
	shapes := []topo.Shape{
		{Rate: 20e6, Delay: 5 * time.Millisecond},
		{Rate: 10e6, Delay: 40 * time.Millisecond},
	}
	const slowBase = 80 * time.Millisecond
	type outcome struct {
		p50, p95 time.Duration
		bulk     float64
		echo     echoResult
		copies   uint64
		placed   uint64
	}
	run := func(t *testing.T, on bool, version session.Version) outcome {
		l := labtest.Up(t, kit.ParallelLinks("sparse", shapes...))
		eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
			o.SparseFlows = on
			if side == 1 && version != session.Current {
				o.Versions = session.Versions(1 << version)
			}
		})
		waitUp(t, eps)
		for _, ep := range eps {
			for _, ps := range ep.tunnel.Status().Peers {
				if ps.Protocol != int(version) {
					t.Fatalf("the session speaks protocol %d, want %d", ps.Protocol, version)
				}
			}
		}
		addr := serve(t, eps[1].host, eps[1].inner4)
		echoAddr := netip.AddrPortFrom(eps[1].inner4, 7)
		stopEcho, twiceAtServer := udpEchoServer(t, eps[1].host, echoAddr)
		defer stopEcho()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// A first flow teaches the estimators the paths (as in TestTunnelUnequalPaths);
		// the echo runs beside the second.
		if _, err := traffic.Bulk(ctx, ccDial(eps[0].host, "cubic"), addr, traffic.BulkOptions{Duration: 5 * time.Second}); err != nil {
			t.Fatalf("first flow: %v", err)
		}
		echo := startUDPEcho(t, eps[0].host, echoAddr, 10*time.Millisecond)
		res, err := traffic.Bulk(ctx, ccDial(eps[0].host, "cubic"), addr, traffic.BulkOptions{Duration: 15 * time.Second})
		er := echo.stop()
		if err != nil {
			t.Fatalf("bulk flow: %v", err)
		}
		o := outcome{p50: kit.Percentile(er.rtts, 0.5), p95: kit.Percentile(er.rtts, 0.95), bulk: res.Steady, echo: er,
			copies: eps[0].tunnel.Status().Counters["sparse_copies"] + eps[1].tunnel.Status().Counters["sparse_copies"]}
		for i, ep := range eps {
			for _, ps := range ep.tunnel.Status().Peers {
				if r := ps.Reorder; r != nil {
					if i == 1 {
						o.placed += r.Placed
					}
					t.Logf("side %d's reorder buffer: %+v", i, *r)
				}
			}
		}
		t.Logf("requests the echo server received twice: %d", twiceAtServer())
		t.Logf("sparse flows %v: echo RTT p50 %v, p95 %v, %d of %d answered, %d answered twice; bulk flow %.1f Mbit/s steady, %d retransmits; %d copies sent, %d echoes placed by the receiver",
			on, o.p50.Round(100*time.Microsecond), o.p95.Round(100*time.Microsecond), len(er.rtts), er.sent, er.twice, res.Steady/1e6, res.Retransmits, o.copies, o.placed)
		if er.twice > 0 {
			t.Errorf("sparse flows %v: %d echoes were answered twice: a copy was delivered", on, er.twice)
		}
		if er.sent == 0 || float64(len(er.rtts)) < 0.99*float64(er.sent) {
			t.Errorf("sparse flows %v: %d of %d echoes answered, want at least 99 %%", on, len(er.rtts), er.sent)
		}
		return o
	}
	var old outcome
	t.Run("on, to a peer of version 2", func(t *testing.T) { old = run(t, true, session.V2) })
	if old.copies != 0 {
		t.Errorf("with a peer of version 2: %d copies sent, want none", old.copies)
	}
	// The echo's delay and the bulk flow's rate, off against on, are measured up to three
	// times (labtest.Measure): in a CI run, with the hypervisor taking the CPU at times, the
	// bulk flow carried 23.6 Mbit/s with sparse flows and 26.7 without. What is counted
	// (copies, placements, echoes answered twice) is checked in every measurement.
	labtest.Measure(t, func(try int) []string {
		var off, on outcome
		t.Run("off", func(t *testing.T) { off = run(t, false, session.Current) })
		t.Run("on", func(t *testing.T) { on = run(t, true, session.Current) })
		if t.Failed() {
			return nil
		}
		if on.copies == 0 || on.placed == 0 {
			t.Errorf("with sparse flows: %d copies sent, %d placed; want both above 0", on.copies, on.placed)
		}
		if off.copies != 0 || off.placed != 0 {
			t.Errorf("without sparse flows: %d copies sent, %d placed; want none", off.copies, off.placed)
		}
		var missed []string
		if on.p95 >= slowBase/2 {
			missed = append(missed, fmt.Sprintf("with sparse flows the echo's p95 RTT is %v, want below half the slow path's base RTT, %v (without: %v)", on.p95, slowBase/2, off.p95))
		}
		if on.bulk < 0.9*off.bulk {
			missed = append(missed, fmt.Sprintf("the bulk flow carried %.1f Mbit/s with sparse flows, %.1f without: want at least 0.9 of it", on.bulk/1e6, off.bulk/1e6))
		}
		return missed
	})
}

// udpEchoServer answers every datagram to addr from host h with the same bytes, until stopped.
func udpEchoServer(t *testing.T, h *lab.Host, addr netip.AddrPort) (stop func(), twice func() int) {
	t.Helper()
	c, err := h.ListenPacket("udp4", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var mu sync.Mutex
	seen, dups := map[uint32]bool{}, 0
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			if n >= 4 {
				mu.Lock()
				if seq := binary.BigEndian.Uint32(buf); seen[seq] {
					dups++
				} else {
					seen[seq] = true
				}
				mu.Unlock()
			}
			c.WriteTo(buf[:n], from)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { c.Close(); <-done }) }
	t.Cleanup(stop)
	return stop, func() int { mu.Lock(); defer mu.Unlock(); return dups }
}

type echoResult struct {
	rtts  []time.Duration
	sent  int
	twice int // echoes answered more than once
}

type udpEcho struct {
	c    net.PacketConn
	mu   sync.Mutex
	sent map[uint32]time.Time
	seen map[uint32]bool
	res  echoResult
	quit chan struct{}
	wg   sync.WaitGroup
}

// startUDPEcho sends a 64-byte numbered datagram from host h to addr every interval and
// times the answers, until stop.
func startUDPEcho(t *testing.T, h *lab.Host, addr netip.AddrPort, interval time.Duration) *udpEcho {
	t.Helper()
	c, err := h.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &udpEcho{c: c, sent: map[uint32]time.Time{}, seen: map[uint32]bool{}, quit: make(chan struct{})}
	t.Cleanup(func() { e.stop() })
	dst := net.UDPAddrFromAddrPort(addr)
	e.wg.Add(2)
	go func() {
		defer e.wg.Done()
		tk := time.NewTicker(interval)
		defer tk.Stop()
		msg := make([]byte, 64)
		for seq := uint32(0); ; seq++ {
			binary.BigEndian.PutUint32(msg, seq)
			e.mu.Lock()
			e.sent[seq] = time.Now()
			e.res.sent++
			e.mu.Unlock()
			c.WriteTo(msg, dst)
			select {
			case <-e.quit:
				return
			case <-tk.C:
			}
		}
	}()
	go func() {
		defer e.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			now := time.Now()
			if n < 4 {
				continue
			}
			seq := binary.BigEndian.Uint32(buf)
			e.mu.Lock()
			switch at, ok := e.sent[seq]; {
			case e.seen[seq]:
				e.res.twice++
			case ok:
				e.res.rtts = append(e.res.rtts, now.Sub(at))
				e.seen[seq] = true
			}
			e.mu.Unlock()
		}
	}()
	return e
}

// stop ends the echoes, waits a second for the last answers and returns what came back.
func (e *udpEcho) stop() echoResult {
	select {
	case <-e.quit:
	default:
		close(e.quit)
		time.Sleep(time.Second)
		e.c.Close()
	}
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.res
}
