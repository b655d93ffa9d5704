package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/lb"
	"braid/internal/lb/bgp"
	"braid/internal/metrics"
)

// lbSpeaker announces an instance's VIPs over BGP while the instance serves (a backend is up
// and not drained), withdraws them when it stops serving, and on shutdown withdraws them
// before the data plane stops (drain).
type lbSpeaker struct {
	sp       *bgp.Speaker
	l        *lb.LB
	log      *slog.Logger
	interval time.Duration
	drain    time.Duration

	mu       sync.Mutex
	draining bool
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

func startLBSpeaker(ctx context.Context, cfg *config.LB, l *lb.LB, log *slog.Logger) (*lbSpeaker, error) {
	b := cfg.BGP
	bc := bgp.Config{LocalAS: b.LocalAS, RouterID: b.RouterID, Announce: b.Announce, NextHop: b.NextHop, NextHop6: b.NextHop6,
		HoldTime: b.HoldTime, Logger: log}
	for _, n := range b.Neighbors {
		bc.Neighbors = append(bc.Neighbors, bgp.Neighbor{Address: n.Address, AS: n.AS, Port: n.Port})
	}
	sp, err := bgp.Start(ctx, bc)
	if err != nil {
		return nil, err
	}
	interval := min(cfg.HealthInterval, time.Second)
	s := &lbSpeaker{sp: sp, l: l, log: log, interval: interval, drain: b.Drain}
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.update(lctx)
	s.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				s.update(lctx)
			}
		}
	})
	log.Info("bgp", "local_as", b.LocalAS, "router_id", b.RouterID, "neighbors", len(b.Neighbors), "announce", b.Announce)
	return s, nil
}

// update announces or withdraws after the instance's own health.
func (s *lbSpeaker) update(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return
	}
	if err := s.sp.Announce(ctx, s.l.Serving()); err != nil {
		s.log.Warn("bgp", "err", err)
	}
}

// runContext returns the context the data plane runs under: when ctx ends (SIGTERM), the
// VIPs are withdrawn first, and the data plane keeps forwarding for the drain time, while the
// routers move the instance's flows to the other instances.
func (s *lbSpeaker) runContext(ctx context.Context) context.Context {
	rctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		s.draining = true
		err := s.sp.Announce(context.Background(), false)
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("bgp: withdraw", "err", err)
		}
		s.log.Info("draining: VIPs withdrawn, forwarding until the routers have moved the flows", "drain", s.drain)
		time.Sleep(s.drain)
		cancel()
	}()
	return rctx
}

// Status is the speaker's state for /status.
func (s *lbSpeaker) Status() bgp.Status {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return s.sp.Status(ctx)
}

func (s *lbSpeaker) Stop() {
	s.cancel()
	s.wg.Wait()
	s.sp.Stop()
}

// lbSource is what the status endpoint and the control socket serve.
type lbSource interface {
	WriteMetrics(w *metrics.Writer)
	StatusJSON() any
}

// lbStatusDoc is the balancer's /status with the BGP speaker's state, when it has one.
type lbStatusDoc struct {
	lb.Status
	BGP *bgp.Status `json:"bgp,omitempty"`
}

// lbWithBGP adds the speaker's state to the balancer's status and metrics.
type lbWithBGP struct {
	*lb.LB
	sp *lbSpeaker
}

func (s lbWithBGP) StatusJSON() any {
	st, err := s.LB.Status(true)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	b := s.sp.Status()
	return lbStatusDoc{Status: st, BGP: &b}
}

func (s lbWithBGP) WriteMetrics(w *metrics.Writer) {
	s.LB.WriteMetrics(w)
	b := s.sp.Status()
	announced, up := 0.0, 0.0
	if b.Announced {
		announced = 1
	}
	for _, p := range b.Peers {
		if p.State == "established" {
			up++
		}
	}
	w.Sample("braid_lb_bgp_announced", metrics.Gauge, "1 while the VIPs are announced over BGP.", announced)
	w.Sample("braid_lb_bgp_sessions_established", metrics.Gauge, "BGP sessions in the established state.", up)
}

// printLBBGP prints the speaker's state under 'braid lb status'.
func printLBBGP(w io.Writer, b *bgp.Status) {
	if b == nil {
		return
	}
	state := "withdrawn"
	if b.Announced {
		state = "announced"
	}
	fmt.Fprintf(w, "\nBGP: %v %s\n", b.Prefixes, state)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NEIGHBOR\tAS\tSTATE")
	for _, p := range b.Peers {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.Address, p.AS, p.State)
	}
	tw.Flush()
}

// lbStatelessPortFree refuses, for a backend added at run time, a stateless port that is a
// service's port or another backend's (the site file's check, for the control socket).
func lbStatelessPortFree(l *lb.LB, port uint16) error {
	if port == 0 {
		return nil
	}
	st, err := l.Status(false)
	if err != nil {
		return err
	}
	for _, s := range st.Services {
		if s.Port() == port {
			return fmt.Errorf("stateless port %d is the port of service %s", port, s)
		}
	}
	for _, b := range st.Backends {
		if b.StatelessPort == port {
			return fmt.Errorf("stateless port %d: backend %s has it", port, b.Name)
		}
	}
	return nil
}
