package tunnel_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/tunnel"
	"braid/internal/wire/mpath"
)

// initRecorder wraps an uplink's Conn and keeps a copy of the handshake initiations it sends.
type initRecorder struct {
	tunnel.Conn
	mu    sync.Mutex
	inits [][]byte
	dst   netip.AddrPort
}

func (r *initRecorder) Send(b []byte, dst netip.AddrPort) error {
	if len(b) > 8 && b[8] == mpath.TypeHandshakeInit {
		r.mu.Lock()
		r.inits, r.dst = append(r.inits, bytes.Clone(b)), dst
		r.mu.Unlock()
	}
	return r.Conn.Send(b, dst)
}

func (r *initRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inits)
}

// startTogether runs the tunnels of a and b over every link of l, both started at the same
// moment, the way two sites come up after a shared outage. mutate adjusts each side's options.
func startTogether(t *testing.T, l *lab.Lab, mutate func(side int, o *tunnel.Options)) [2]*endpoint {
	t.Helper()
	eps := newEndpoints(t, l)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := make(chan struct{})
	for i, ep := range eps {
		peer, locals := sidePeer(l, eps, i, 4)
		wg.Go(func() {
			<-start
			tn, stop, err := roles.StartTunnel(context.Background(), ep.host,
				[]netip.Prefix{netip.PrefixFrom(ep.inner4, 24)}, locals,
				tunnel.Options{PrivateKey: ep.priv, MTU: 1400, Reorder: true, Peers: []tunnel.PeerConfig{peer}},
				func(o *tunnel.Options) {
					if mutate != nil {
						mutate(i, o)
					}
				})
			if err != nil {
				errs[i] = err
				return
			}
			ep.tunnel = tn
			t.Cleanup(func() {
				if err := stop(); err != nil {
					t.Errorf("tunnel in %s: %v", ep.host.Name, err)
				}
			})
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return eps
}

// attackCounters are the counters of packets refused as forged, replayed or from strangers.
var attackCounters = []string{"drop_replay", "drop_auth", "drop_unknown_session", "drop_handshake", "drop_unknown_path",
	"drop_replay_new_source", "drop_auth_new_source", "drop_version", "path_moves"}

// Two sites started at the same moment, over two paths of unequal delay, meet each other's
// initiations on both paths (each initiation goes out on every path) and send on sessions whose
// responses may still be on the slower path: none of it may count as an attack. A replayed
// initiation still does.
func TestTunnelCleanStartNoDrops(t *testing.T) {
	labtest.Require(t) // the check after the starts needs them to have run
	const starts = 5
	copies := uint64(0)
	for run := range starts {
		t.Run(fmt.Sprintf("start %d", run+1), func(t *testing.T) {
			l := labtest.Up(t, kit.ParallelLinks("tun",
				topo.Shape{Delay: 2 * time.Millisecond}, topo.Shape{Delay: 8 * time.Millisecond}))
			var recs [2]*initRecorder
			eps := startTogether(t, l, func(side int, o *tunnel.Options) {
				recs[side] = &initRecorder{Conn: o.Uplinks[0].Conn}
				o.Uplinks[0].Conn = recs[side]
			})
			waitUp(t, eps)
			time.Sleep(300 * time.Millisecond) // the copies over the slower path, the first probes
			for _, ep := range eps {
				c := ep.tunnel.Status().Counters
				t.Logf("%s: handshakes sent %d, done %d, copies %d, drop_early %d", ep.host.Name,
					c["handshakes_sent"], c["handshakes_done"], c["handshake_copies"], c["drop_early"])
				for _, k := range attackCounters {
					if c[k] != 0 {
						t.Errorf("%s counted %s %d on a clean start (%v)", ep.host.Name, k, c[k], c)
					}
				}
				copies += c["handshake_copies"]
			}
			if run != starts-1 {
				return
			}
			// An attacker who recorded an initiation (of a, or of b when only b initiated)
			// sends it again from its sender's address on path 1, twice: at least the second
			// (and the first too, if the other side took the original) repeats an initiation
			// the other side has already answered.
			from := 0
			if recs[0].count() == 0 {
				from = 1
			}
			rec, victim := recs[from], eps[1-from]
			rec.mu.Lock()
			if len(rec.inits) == 0 {
				rec.mu.Unlock()
				t.Fatal("neither side sent an initiation")
			}
			init, dst := rec.inits[len(rec.inits)-1], rec.dst
			rec.mu.Unlock()
			before := victim.tunnel.Status().Counters
			for range 2 {
				if err := rec.Conn.Send(init, dst); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			after := victim.tunnel.Status().Counters
			if after["drop_replay"] == before["drop_replay"] {
				t.Errorf("a replayed initiation was not counted: drop_replay %d", after["drop_replay"])
			}
			if after["handshake_copies"] != before["handshake_copies"] {
				t.Errorf("a replayed initiation was taken for a copy over another path: handshake_copies %d -> %d",
					before["handshake_copies"], after["handshake_copies"])
			}
		})
	}
	// Every start sends initiations on both paths: the second copies must have been seen, or
	// this test did not exercise what it is about.
	if copies == 0 {
		t.Error("no initiation arrived over both paths in any start")
	}
}

// The status says what is not known: an idle path's capacity is unmeasured (the estimator's
// start-up guess paces it but is no measurement), and a path that is down has no rate.
func TestTunnelStatusUnmeasuredAndDown(t *testing.T) {
	l := labtest.Up(t, multiPath(2, topo.Shape{Delay: 2 * time.Millisecond}))
	eps := startTunnels(t, l, 4, nil)
	waitUp(t, eps)
	time.Sleep(300 * time.Millisecond) // a few delivery-rate windows of probes
	for _, p := range eps[0].tunnel.Status().Peers[0].Paths {
		if p.CapacityMeasured || p.CapacityPhase == "" {
			t.Errorf("idle path %d: capacity %v measured %v (%s), want an unmeasured estimate", p.ID, p.Capacity, p.CapacityMeasured, p.CapacityPhase)
		}
		if !p.RateMeasured || p.Rate <= 0 {
			t.Errorf("path %d, up for 300 ms: rate %v measured %v, want the probes' delivery rate", p.ID, p.Rate, p.RateMeasured)
		}
	}
	l.Links()[1].Cut()
	deadline := time.Now().Add(2 * time.Second)
	for eps[0].tunnel.Status().Peers[0].Paths[1].State != "down" {
		if time.Now().After(deadline) {
			t.Fatal("the cut path is not down after 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p := eps[0].tunnel.Status().Peers[0].Paths[1]; p.RateMeasured || p.Rate != 0 {
		t.Errorf("down path: rate %v measured %v, want none", p.Rate, p.RateMeasured)
	}
}

// Sites that started together rekey together: each side's initiation crosses the other's, and
// each side receives the other's initiation before the response to its own. Both new sessions
// must survive: traffic keeps flowing across several rekeys and nothing is counted as an
// unknown session, a replay or a forgery.
func TestTunnelSimultaneousRekey(t *testing.T) {
	l := labtest.Up(t, kit.ParallelLinks("tun",
		topo.Shape{Delay: 2 * time.Millisecond}, topo.Shape{Delay: 8 * time.Millisecond}))
	// Restored by a cleanup registered before the tunnels' own, so after they stop.
	t.Cleanup(tunnel.SetRekeyTimers(time.Second, 300*time.Millisecond))
	eps := startTogether(t, l, nil)
	waitUp(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	worst, err := kit.Ping(ctx, eps[0].host, eps[1].host, eps[1].inner4, 4500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		c := ep.tunnel.Status().Counters
		t.Logf("%s: handshakes sent %d, done %d, copies %d, drop_early %d, drop_no_session %d", ep.host.Name,
			c["handshakes_sent"], c["handshakes_done"], c["handshake_copies"], c["drop_early"], c["drop_no_session"])
		if c["handshakes_sent"] < 3 {
			t.Errorf("%s rekeyed %d times in 4.5 s with rekeys every second", ep.host.Name, c["handshakes_sent"])
		}
		for _, k := range attackCounters {
			if c[k] != 0 {
				t.Errorf("%s counted %s %d across simultaneous rekeys (%v)", ep.host.Name, k, c[k], c)
			}
		}
	}
	if worst > 300*time.Millisecond {
		t.Errorf("longest time without a ping reply across the rekeys: %v", worst)
	}
}
