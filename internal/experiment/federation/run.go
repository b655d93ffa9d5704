package federation

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

// FedConfig is one way of carrying site 1's TCP to site 2 (the paper's four configurations and
// their variants).
type FedConfig struct {
	Name    string
	Proxy   bool   // false: plain TCP routed over wan0, no proxy
	MPTCP   bool   // false: MPTCP disabled in the proxies' namespaces (plain TCP between them)
	PM      string // the proxies' path manager: braid or none
	Policy  string // braid's policy (pm_policy): "" for the proxy's default, fullmesh, rbpm
	Uplinks int    // uplinks in each site file
	Pool    int    // 0: the default; -1: no pool
}

// The paper's four configurations (§V), with braid's path manager for MPTCP-4.
var (
	FedPlainTCP   = FedConfig{Name: "TCP (no proxy)"}
	FedProxiedTCP = FedConfig{Name: "proxied TCP (MPTCP off)", Proxy: true, PM: "none", Uplinks: 1}
	FedMPTCP1     = FedConfig{Name: "MPTCP-1", Proxy: true, MPTCP: true, PM: "none", Uplinks: 1}
	FedMPTCP4     = FedConfig{Name: "MPTCP-4", Proxy: true, MPTCP: true, PM: "braid", Uplinks: 2}
)

// FedLab is a running federation topology with a traffic server on s and, per configuration,
// its proxies.
type FedLab struct {
	L      *lab.Lab
	Links  int
	bin    string
	env    []string
	dir    string
	P1, P2 *roles.ProxyProc
	stop   func()
}

// FedServerAddr is the traffic server of a FedLab.
const FedServerAddr = FedServer4 + ":5201"

// StartFed brings up the federation topology with one WAN link per shape and a traffic server
// on s. bin is the braid binary the proxies run as, env what its processes get added.
func StartFed(ctx context.Context, o kit.Options, bin string, env []string, kernel bool, wan ...topo.Shape) (*FedLab, error) {
	l, err := lab.Up(ctx, FederationTopology("fed", kernel, wan...), lab.Options{Logger: o.Logger, OwnSignals: true, Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "braid-fed-")
	if err != nil {
		l.Close()
		return nil, err
	}
	stop, err := kit.StartServer(ctx, l.Host("s"), FedServerAddr)
	if err != nil {
		l.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	return &FedLab{L: l, Links: len(wan), bin: bin, env: env, dir: dir, stop: stop}, nil
}

// Close stops the proxies and removes the lab.
func (f *FedLab) Close() {
	f.StopProxies()
	f.stop()
	f.L.Close()
	os.RemoveAll(f.dir)
}

// Use starts the proxies of cfg (stopping those of the previous one).
func (f *FedLab) Use(ctx context.Context, cfg FedConfig) error {
	f.StopProxies()
	mptcp := "1"
	if cfg.Proxy && !cfg.MPTCP {
		mptcp = "0"
	}
	for _, h := range []string{"p1", "p2"} {
		if err := f.L.Host(h).NS.Sysctl("mptcp/enabled", mptcp); err != nil {
			return err
		}
	}
	if !cfg.Proxy {
		return nil
	}
	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		return err
	}
	pool := cfg.Pool
	s1 := FedSite{Side: 1, Links: f.Links, Uplinks: cfg.Uplinks, Key: k1, PeerKey: k2.Public(), PM: cfg.PM, PMPolicy: cfg.Policy, Pool: pool}
	s2 := FedSite{Side: 2, Links: f.Links, Uplinks: cfg.Uplinks, Key: k2, PeerKey: k1.Public(), PM: cfg.PM, PMPolicy: cfg.Policy, Pool: pool}
	if f.P1, err = roles.StartProxy(f.L.Host("p1"), f.bin, f.dir, s1.Bytes(), f.env...); err != nil {
		return err
	}
	if f.P2, err = roles.StartProxy(f.L.Host("p2"), f.bin, f.dir, s2.Bytes(), f.env...); err != nil {
		return err
	}
	return roles.WaitProxyPair(ctx, f.P1, f.P2, pool >= 0, 15*time.Second)
}

// StopProxies stops the running proxies, if any.
func (f *FedLab) StopProxies() {
	for _, p := range []**roles.ProxyProc{&f.P1, &f.P2} {
		if *p != nil {
			(*p).Stop()
			*p = nil
		}
	}
}

// Dial connects from the client host c.
func (f *FedLab) Dial() traffic.DialFunc { return f.L.Host("c").Dial }

// Bulk runs a bulk test from c to the server.
func (f *FedLab) Bulk(ctx context.Context, o traffic.BulkOptions) (traffic.BulkResult, error) {
	return traffic.Bulk(ctx, f.Dial(), FedServerAddr, o)
}

// RR runs a request/response test from c to the server.
func (f *FedLab) RR(ctx context.Context, o traffic.RROptions) (traffic.RRResult, error) {
	return traffic.RR(ctx, f.Dial(), FedServerAddr, o)
}

// CutResult is what a cut of wan0 did to a download through the proxies.
type CutResult struct {
	Samples     []traffic.Sample
	Gap         time.Duration // longest stretch with less than 1/10 of the goodput before the cut
	SubflowBack time.Duration // from the restore to a subflow over wan0 receiving data again; -1: never
	Before      float64       // goodput before the cut (its mean over the last beforeWindow), bit/s
	During      float64       // mean goodput while cut
	After       float64       // mean goodput from 2 s after the restore
	Start       time.Time     // when the first sample's interval began
	CutTime     time.Time     // when wan0 was cut
}

// beforeWindow is how much of the download before the cut its rate is taken over.
const beforeWindow = 2 * time.Second

// CutDuring runs a download of total length dur, sampled every interval, cutting wan0 (both
// directions) at cutAt and restoring it at restoreAt, and follows p1's subflows.
func (f *FedLab) CutDuring(ctx context.Context, dur, interval, cutAt, restoreAt time.Duration) (CutResult, error) {
	var res CutResult
	link := f.L.Link("wan0")
	start := time.Now()
	var restored time.Time
	done := make(chan struct{})
	watchDone := make(chan struct{})
	res.SubflowBack = -1
	go func() {
		defer close(watchDone)
		// Cut and restore on time, and watch p1's subflows after the restore.
		select {
		case <-time.After(cutAt):
		case <-done:
			return
		}
		link.Cut()
		res.CutTime = time.Now()
		select {
		case <-time.After(restoreAt - cutAt):
		case <-done:
			link.Restore()
			return
		}
		link.Restore()
		restored = time.Now()
		seen := map[string]uint64{} // subflow -> bytes received at the restore
		first := true
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			st, err := roles.ProxyStatus(ctx, f.P1.Host)
			if err != nil {
				continue
			}
			for _, c := range st.Proxy.Connections {
				for _, s := range c.Subflows {
					if s.Local.Addr().String() != "10.9.0.1" {
						continue
					}
					k := s.Local.String() + ">" + s.Remote.String()
					if first {
						seen[k] = s.BytesRecv
						continue
					}
					if s.BytesRecv > seen[k] {
						res.SubflowBack = time.Since(restored)
						return
					}
				}
			}
			first = false
		}
	}()
	var windowStart time.Time
	r, err := f.Bulk(ctx, traffic.BulkOptions{Duration: dur, Interval: interval, Reverse: true, OnSample: func(s traffic.Sample) {
		if windowStart.IsZero() {
			windowStart = time.Now().Add(-s.At)
		}
	}})
	close(done)
	<-watchDone
	if err != nil {
		return res, err
	}
	res.Samples = r.Samples
	res.Start = windowStart
	var during, after []float64
	var beforeSum float64
	beforeN := 0
	// The bulk test starts its window after its set-up; sample times are from the window's
	// start, the cut's from ours: line them up.
	setup := windowStart.Sub(start)
	for _, s := range r.Samples {
		end := s.At + setup
		switch {
		case end <= cutAt:
			// The rate before the cut is the mean of its last seconds: the median of short
			// samples from the start took in the slow start and, over unequal paths, the
			// receiver's bursts (100 ms samples at 0 and then at 160 Mbit/s), and put the
			// gap's threshold at a fraction of the real rate.
			if end > cutAt-beforeWindow {
				beforeSum += s.BitsPerSecond
				beforeN++
			}
		case end-interval >= cutAt && end <= restoreAt:
			during = append(during, s.BitsPerSecond)
		case end-interval >= restoreAt+2*time.Second:
			after = append(after, s.BitsPerSecond)
		}
	}
	// Means, not medians: over unequal paths 100 ms samples alternate between 0 and bursts.
	res.During, res.After = mean(during), mean(after)
	if beforeN > 0 {
		res.Before = beforeSum / float64(beforeN)
	}
	var run time.Duration
	for _, s := range r.Samples {
		if s.BitsPerSecond < res.Before/10 {
			run += interval
			res.Gap = max(res.Gap, run)
		} else {
			run = 0
		}
	}
	return res, nil
}

// CutFile transfers size bytes (download) through the proxies while wan0 is cut at cutAt and
// restored at restoreAt, and reports whether it arrived intact.
func (f *FedLab) CutFile(ctx context.Context, size int64, cutAt, restoreAt time.Duration) (traffic.FileResult, error) {
	link := f.L.Link("wan0")
	done := make(chan struct{})
	go func() {
		select {
		case <-time.After(cutAt):
			link.Cut()
		case <-done:
			return
		}
		select {
		case <-time.After(restoreAt - cutAt):
		case <-done:
		}
		link.Restore()
	}()
	r, err := traffic.File(ctx, f.Dial(), FedServerAddr, traffic.FileOptions{Size: size, Seed: 7, Reverse: true})
	close(done)
	if err != nil {
		return r, fmt.Errorf("file transfer across a cut: %w", err)
	}
	return r, nil
}

// Logs returns what the running proxies logged, for error reports.
func (f *FedLab) Logs() string {
	var b strings.Builder
	for _, p := range []*roles.ProxyProc{f.P1, f.P2} {
		if p != nil {
			fmt.Fprintf(&b, "--- proxy in %s:\n%s", p.Host.Name, p.Log())
		}
	}
	return b.String()
}

// Idle reports whether the proxies (if any) relay no connection.
func (f *FedLab) Idle(ctx context.Context) bool {
	for _, p := range []*roles.ProxyProc{f.P1, f.P2} {
		if p == nil {
			continue
		}
		st, err := roles.ProxyStatus(ctx, p.Host)
		if err != nil {
			return false
		}
		for _, t := range st.Proxy.Tenants {
			if t.Active > 0 {
				return false
			}
		}
	}
	return true
}

// WaitIdle waits up to 20 s for Idle: a split connection keeps delivering what it buffered
// after its sender stopped, and a measurement started meanwhile would queue behind it.
func (f *FedLab) WaitIdle(ctx context.Context) {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !f.Idle(ctx); {
		time.Sleep(100 * time.Millisecond)
	}
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
