package tunnel_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
)

// startSide runs the tunnel of side i (0: a, 1: b) of eps over every link of l and returns the
// function that stops it.
func startSide(t *testing.T, l *lab.Lab, eps [2]*endpoint, i int, mutate func(o *tunnel.Options)) func() error {
	t.Helper()
	ep := eps[i]
	peer, locals := sidePeer(l, eps, i, 4)
	var adjust []func(*tunnel.Options)
	if mutate != nil {
		adjust = append(adjust, mutate)
	}
	tn, stop, err := roles.StartTunnel(context.Background(), ep.host, []netip.Prefix{netip.PrefixFrom(ep.inner4, 24)}, locals,
		tunnel.Options{PrivateKey: ep.priv, MTU: 1400, Reorder: true, Recovery: true, Peers: []tunnel.PeerConfig{peer}}, adjust...)
	if err != nil {
		t.Fatal(err)
	}
	ep.tunnel = tn
	return stop
}

// A site restarts, and an attacker who recorded an initiation of the other site's sends it to
// the restarted one before their own handshake completes (issue 18 item 12). The restarted side
// must not send on a session made from it (the other side has long forgotten its keys): a
// responder session stays pending until the initiator is heard on it, and a side without a
// session keeps initiating. Data must flow again within 3 s of the restart.
func TestTunnelRestartReplayedInitiation(t *testing.T) {
	l := labtest.Up(t, kit.ParallelLinks("rst", topo.Shape{Rate: 50e6, Delay: 5 * time.Millisecond}))
	eps := newEndpoints(t, l)
	var rec *initRecorder
	stopA := startSide(t, l, eps, 0, func(o *tunnel.Options) {
		rec = &initRecorder{Conn: o.Uplinks[0].Conn}
		o.Uplinks[0].Conn = rec
	})
	t.Cleanup(func() {
		if err := stopA(); err != nil {
			t.Errorf("tunnel in a: %v", err)
		}
	})
	stopB := startSide(t, l, eps, 1, nil)
	waitUp(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := serve(t, eps[0].host, eps[0].inner4)
	if f, err := traffic.File(ctx, eps[1].host.Dial, addr, traffic.FileOptions{Size: 1 << 20, Seed: 3}); err != nil || !f.Intact {
		t.Fatalf("b to a before the restart: %v %v", err, f)
	}
	rec.mu.Lock()
	if len(rec.inits) == 0 {
		rec.mu.Unlock()
		t.Fatal("a sent no initiation")
	}
	old, dst := rec.inits[len(rec.inits)-1], rec.dst
	rec.mu.Unlock()

	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	// The replays start before b is back and go on while it starts.
	replayCtx, stopReplay := context.WithCancel(ctx)
	replayed := make(chan struct{})
	go func() {
		defer close(replayed)
		for replayCtx.Err() == nil {
			rec.Conn.Send(old, dst)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	restarted := time.Now()
	stopB = startSide(t, l, eps, 1, nil)
	t.Cleanup(func() {
		if err := stopB(); err != nil {
			t.Errorf("tunnel in b: %v", err)
		}
	})
	time.Sleep(300 * time.Millisecond)
	stopReplay()
	<-replayed

	var err error
	var f traffic.FileResult
	for time.Since(restarted) < 3*time.Second {
		fctx, fcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		f, err = traffic.File(fctx, eps[1].host.Dial, addr, traffic.FileOptions{Size: 64 << 10, Seed: 4})
		fcancel()
		if err == nil && f.Intact {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c := eps[1].tunnel.Status().Counters
	t.Logf("after the restart and the replays: b handshakes sent %d, done %d, drop_replay %d; a file crossed %v after the restart (%v)",
		c["handshakes_sent"], c["handshakes_done"], c["drop_replay"], time.Since(restarted).Round(10*time.Millisecond), err)
	if err != nil || !f.Intact {
		t.Fatalf("no file crossed from the restarted site within 3 s: %v %v", err, f)
	}
}
