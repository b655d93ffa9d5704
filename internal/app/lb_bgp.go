package app

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"braid/internal/config"
	"braid/internal/lb"
	"braid/internal/lb/bgp"
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
