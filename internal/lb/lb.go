// Package lb is braid lb's control plane: it keeps the backends (weights, health, drain), builds
// each service's Maglev table from them, fills the XDP data plane's maps (internal/lb/xdp), keeps
// the token table clean (expiry of idle and closing tokens, removal with their backend) and
// reports status and metrics. It never touches packets; the data plane never logs.
package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"braid/internal/lb/maglev"
	"braid/internal/lb/xdp"
)

// Plane is the data plane as the control plane drives it; *xdp.Dataplane implements it.
type Plane interface {
	SetConfig(xdp.Config) error
	SetService(id uint32, vip netip.AddrPort) error
	SetTable(id uint32, table []uint32) error
	SetBackend(i uint32, b xdp.Backend) error
	RemoveBackend(i uint32) error
	SetStateless(vip netip.AddrPort, backend uint32) error
	DeleteStateless(vip netip.AddrPort) error
	Counters() (xdp.Counters, error)
	BackendStats(i uint32) (xdp.BackendStats, error)
	Tokens() ([]xdp.Token, error)
	PendingTokens() ([]xdp.Token, error)
	DeleteToken(service, token uint32) error
	ConnsPerBackend() (map[uint32]int, error)
	DropFlowsOf(i uint32) error
}

// BackendSpec describes one backend.
type BackendSpec struct {
	Name          string
	Target        xdp.Backend // where its packets go
	Weight        uint32      // 0: drained
	Health        string      // host:port of a TCP health check; "" for none
	StatelessPort uint16      // its own port on every VIP; 0 for none
}

// Options configure the control plane.
type Options struct {
	Services []netip.AddrPort
	Plane    xdp.Config

	TokenIdle    time.Duration // a token without activity for this long is removed
	TokenClosing time.Duration // a token whose client sent DATA_FIN, idle for this long, is removed
	Sweep        time.Duration // how often tokens are swept
	// TokenTable is the joined token table's size: above 3/4 of it (the headroom kept for
	// legitimate joins), the sweeper removes joined tokens idle for TokenClosing already.
	// 0: no such rule.
	TokenTable uint32

	HealthInterval time.Duration
	HealthTimeout  time.Duration
	Rise, Fall     int // consecutive successes to come up, failures to go down

	Logger *slog.Logger
	// Check runs one health check; nil dials TCP.
	Check func(ctx context.Context, addr string) error
	// Mono returns CLOCK_MONOTONIC in nanoseconds (the data plane's clock); nil reads it.
	Mono func() uint64
}

// Errors.
var (
	ErrNoBackend = errors.New("lb: no such backend")
	ErrExists    = errors.New("lb: backend exists")
	ErrFull      = errors.New("lb: no free backend slot")
)

type backend struct {
	spec    BackendSpec
	index   uint32
	up      bool // by the health check (always true without one)
	ok      int  // consecutive successes
	fail    int  // consecutive failures
	lastErr string
}

// LB is the running control plane.
type LB struct {
	plane Plane
	o     Options
	log   *slog.Logger

	mu       sync.Mutex // guards the fields below
	backends map[string]*backend
	used     [xdp.MaxBackends]bool
	swept    uint64 // tokens removed by the sweeper
	removed  uint64 // tokens removed with their backend
	pressure uint64 // sweeps that found the joined token table above 3/4
}

// New configures plane with the services and backends.
func New(plane Plane, o Options, backends []BackendSpec) (*LB, error) {
	if len(o.Services) == 0 || len(o.Services) > xdp.MaxServices {
		return nil, fmt.Errorf("lb: %d services (want 1..%d)", len(o.Services), xdp.MaxServices)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Check == nil {
		o.Check = dialCheck
	}
	if o.Mono == nil {
		o.Mono = monotonic
	}
	if o.Rise <= 0 {
		o.Rise = 1
	}
	if o.Fall <= 0 {
		o.Fall = 1
	}
	l := &LB{plane: plane, o: o, log: o.Logger, backends: map[string]*backend{}}
	if err := plane.SetConfig(o.Plane); err != nil {
		return nil, err
	}
	for i, s := range o.Services {
		if err := plane.SetService(uint32(i), s); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range backends {
		if err := l.addLocked(b); err != nil {
			return nil, err
		}
	}
	return l, l.rebuildLocked()
}

func dialCheck(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func (l *LB) addLocked(s BackendSpec) error {
	if _, ok := l.backends[s.Name]; ok {
		return fmt.Errorf("%w: %s", ErrExists, s.Name)
	}
	idx := -1
	for i, u := range l.used {
		if !u {
			idx = i
			break
		}
	}
	if idx < 0 {
		return ErrFull
	}
	if err := l.plane.SetBackend(uint32(idx), s.Target); err != nil {
		return err
	}
	l.used[idx] = true
	b := &backend{spec: s, index: uint32(idx), up: s.Health == ""}
	l.backends[s.Name] = b
	if s.StatelessPort != 0 {
		return l.statelessLocked(s.StatelessPort, b.index, false)
	}
	return nil
}

// rebuildLocked writes every service's Maglev table from the backends that take new
// connections: weight above 0 and healthy.
func (l *LB) rebuildLocked() error {
	var in []maglev.Backend
	for name, b := range l.backends {
		if b.up && b.spec.Weight > 0 {
			in = append(in, maglev.Backend{Name: name, ID: b.index, Weight: b.spec.Weight})
		}
	}
	table := maglev.Table(in, xdp.TableSize)
	for i := range l.o.Services {
		if err := l.plane.SetTable(uint32(i), table); err != nil {
			return err
		}
	}
	return nil
}

// AddBackend adds a backend. Established connections stay where they are: the connection
// table pins them; only new connections see the new table.
func (l *LB) AddBackend(s BackendSpec) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.addLocked(s); err != nil {
		return err
	}
	l.log.Info("backend added", "backend", s.Name, "weight", s.Weight)
	return l.rebuildLocked()
}

// RemoveBackend removes a backend: new connections go elsewhere at once, and its flows and
// tokens are forgotten (its connections are gone with it).
func (l *LB) RemoveBackend(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.backends[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoBackend, name)
	}
	delete(l.backends, name)
	if err := l.rebuildLocked(); err != nil {
		return err
	}
	if err := l.forgetLocked(b); err != nil {
		return err
	}
	l.log.Info("backend removed", "backend", name)
	return nil
}

// forgetLocked frees the slot of b, which the Maglev tables no longer name, with its
// stateless entries, tokens and flows.
func (l *LB) forgetLocked(b *backend) error {
	if b.spec.StatelessPort != 0 {
		l.statelessLocked(b.spec.StatelessPort, b.index, true)
	}
	if err := l.plane.RemoveBackend(b.index); err != nil {
		return err
	}
	l.used[b.index] = false
	if err := l.dropTokensLocked(func(t xdp.Token) bool { return t.Backend == b.index }); err != nil {
		return err
	}
	return l.plane.DropFlowsOf(b.index)
}

// SetWeight changes a backend's weight; 0 drains it: its connections and all their subflows
// stay (flows are pinned and its tokens still steer joins), new connections go elsewhere.
func (l *LB) SetWeight(name string, w uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.backends[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoBackend, name)
	}
	old := b.spec.Weight
	b.spec.Weight = w
	switch {
	case w == 0 && old != 0:
		l.log.Info("backend drained", "backend", name, "was_weight", old)
	case w != 0 && old == 0:
		l.log.Info("backend undrained", "backend", name, "weight", w)
	default:
		l.log.Info("backend weight", "backend", name, "weight", w)
	}
	return l.rebuildLocked()
}

// Run runs the health checks and the token sweeper until ctx ends.
func (l *LB) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { l.healthLoop(ctx) })
	wg.Go(func() {
		t := time.NewTicker(l.o.Sweep)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := l.Sweep(); err != nil {
					l.log.Warn("token sweep", "err", err)
				}
			}
		}
	})
	wg.Wait()
	return nil
}

func (l *LB) healthLoop(ctx context.Context) {
	if l.o.HealthInterval <= 0 {
		return
	}
	t := time.NewTicker(l.o.HealthInterval)
	defer t.Stop()
	for {
		l.CheckHealth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CheckHealth runs one round of health checks, concurrently, and rebuilds the tables if a
// backend went up or down.
func (l *LB) CheckHealth(ctx context.Context) {
	l.mu.Lock()
	type job struct {
		name, addr string
	}
	var jobs []job
	for name, b := range l.backends {
		if b.spec.Health != "" {
			jobs = append(jobs, job{name, b.spec.Health})
		}
	}
	timeout := l.o.HealthTimeout
	l.mu.Unlock()
	results := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			results[i] = l.o.Check(cctx, j.addr)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	changed := false
	for i, j := range jobs {
		b, ok := l.backends[j.name]
		if !ok {
			continue
		}
		if results[i] == nil {
			b.ok++
			b.fail = 0
			b.lastErr = ""
			if !b.up && b.ok >= l.o.Rise {
				b.up, changed = true, true
				l.log.Info("backend up", "backend", j.name)
			}
		} else {
			b.fail++
			b.ok = 0
			b.lastErr = results[i].Error()
			if b.up && b.fail >= l.o.Fall {
				b.up, changed = false, true
				l.log.Warn("backend down", "backend", j.name, "err", results[i])
			}
		}
	}
	if changed {
		if err := l.rebuildLocked(); err != nil {
			l.log.Warn("maglev table", "err", err)
		}
	}
}

// Sweep removes expired joined tokens and those of backends that are gone; it returns how
// many. Pending tokens need no sweeping: the data plane ignores them once older than
// Plane.UnjoinedAfter, and its LRU reuses their slots.
func (l *LB) Sweep() (int, error) {
	toks, err := l.plane.Tokens()
	if err != nil {
		return 0, err
	}
	now := l.o.Mono()
	l.mu.Lock()
	defer l.mu.Unlock()
	idleLimit := l.o.TokenIdle
	if l.o.TokenTable > 0 && uint64(len(toks)) > uint64(l.o.TokenTable)*3/4 {
		// Under pressure, keep the headroom: idle tokens go first.
		idleLimit = min(idleLimit, l.o.TokenClosing)
		l.pressure++
	}
	n := 0
	for _, t := range toks {
		idle := time.Duration(0)
		if now > t.Active {
			idle = time.Duration(now - t.Active)
		}
		gone := int(t.Backend) >= len(l.used) || !l.used[t.Backend]
		if gone || idle > idleLimit || t.Closing && idle > l.o.TokenClosing {
			if err := l.plane.DeleteToken(t.Service, t.Token); err != nil {
				return n, err
			}
			n++
		}
	}
	l.swept += uint64(n)
	return n, nil
}

// BackendStatus is one backend in Status.
type BackendStatus struct {
	Name          string `json:"name"`
	Index         uint32 `json:"index"`
	Weight        uint32 `json:"weight"`
	State         string `json:"state"` // active, drained, down
	Health        string `json:"health,omitempty"`
	HealthError   string `json:"health_error,omitempty"`
	StatelessPort uint16 `json:"stateless_port,omitempty"`
	Flows         int    `json:"flows"` // entries of the connection table
	Conns         uint64 `json:"conns_total"`
	Joins         uint64 `json:"joins_total"`
	Packets       uint64 `json:"packets_total"`
	Bytes         uint64 `json:"bytes_total"`
	Tokens        int    `json:"tokens"`
}

// TokenStatus is one token in Status.
type TokenStatus struct {
	Service  netip.AddrPort `json:"service"`
	Token    string         `json:"token"`
	Backend  string         `json:"backend"`
	Version  int            `json:"version"`
	Closing  bool           `json:"closing,omitempty"`
	Collided bool           `json:"collided,omitempty"`
	Joined   bool           `json:"joined,omitempty"` // in the joined table (else pending)
	AgeMS    int64          `json:"age_ms"`
	IdleMS   int64          `json:"idle_ms"`
}

// Status is the control plane's report (`braid lb status`).
type Status struct {
	Role          string            `json:"role"` // "lb", as every role's status names it
	Services      []netip.AddrPort  `json:"services"`
	Mode          string            `json:"mode"`
	Aware         bool              `json:"aware"`
	Backends      []BackendStatus   `json:"backends"`
	Counters      map[string]uint64 `json:"counters"`
	TokensSwept   uint64            `json:"tokens_swept"`
	TokensRemoved uint64            `json:"tokens_removed_with_backend"`
	TokensJoined  int               `json:"tokens_joined"`  // entries of the joined table
	TokensPending int               `json:"tokens_pending"` // pending tokens not yet expired
	TokenPressure uint64            `json:"token_pressure_sweeps"`
	Tokens        []TokenStatus     `json:"tokens,omitempty"`
}

// Status reads the data plane's counters and tables; withTokens lists every token.
func (l *LB) Status(withTokens bool) (Status, error) {
	l.mu.Lock()
	st := Status{Role: "lb", Aware: l.o.Plane.Aware, Counters: map[string]uint64{}}
	for _, v := range l.o.Services {
		if v.IsValid() {
			st.Services = append(st.Services, v)
		}
	}
	services := slices.Clone(l.o.Services)
	unjoinedAfter := l.o.Plane.UnjoinedAfter
	st.Mode = "mac"
	if l.o.Plane.Mode == xdp.ModeIPIP {
		st.Mode = "ipip"
	}
	l.mu.Unlock()
	c, err := l.plane.Counters()
	if err != nil {
		return st, err
	}
	for i := xdp.Counter(0); i < xdp.NumCounters; i++ {
		st.Counters[i.String()] = c[i]
	}
	flows, err := l.plane.ConnsPerBackend()
	if err != nil {
		return st, err
	}
	toks, err := l.plane.Tokens()
	if err != nil {
		return st, err
	}
	pend, err := l.plane.PendingTokens()
	if err != nil {
		return st, err
	}
	st.TokensJoined = len(toks)
	now := l.o.Mono()
	for _, t := range pend {
		if unjoinedAfter == 0 || now-t.Created <= uint64(unjoinedAfter) {
			toks = append(toks, t)
			st.TokensPending++
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st.TokensSwept, st.TokensRemoved, st.TokenPressure = l.swept, l.removed, l.pressure
	perBackend := map[uint32]int{}
	names := map[uint32]string{}
	for name, b := range l.backends {
		names[b.index] = name
	}
	for _, t := range toks {
		perBackend[t.Backend]++
		if withTokens {
			v := 1
			if t.V0 {
				v = 0
			}
			ts := TokenStatus{Token: fmt.Sprintf("%08x", t.Token), Backend: names[t.Backend], Version: v,
				Closing: t.Closing, Collided: t.Collided, Joined: t.Joined, AgeMS: msSince(now, t.Created), IdleMS: msSince(now, t.Active)}
			if int(t.Service) < len(services) {
				ts.Service = services[t.Service]
			}
			st.Tokens = append(st.Tokens, ts)
		}
	}
	slices.SortFunc(st.Tokens, func(a, b TokenStatus) int { return int(a.AgeMS - b.AgeMS) })
	for name, b := range l.backends {
		bs, err := l.plane.BackendStats(b.index)
		if err != nil {
			return st, err
		}
		state := "active"
		switch {
		case !b.up:
			state = "down"
		case b.spec.Weight == 0:
			state = "drained"
		}
		st.Backends = append(st.Backends, BackendStatus{Name: name, Index: b.index, Weight: b.spec.Weight, State: state,
			Health: b.spec.Health, HealthError: b.lastErr, StatelessPort: b.spec.StatelessPort, Flows: flows[b.index],
			Conns: bs.Conns, Joins: bs.Joins, Packets: bs.Packets, Bytes: bs.Bytes, Tokens: perBackend[b.index]})
	}
	slices.SortFunc(st.Backends, func(a, b BackendStatus) int { return int(a.Index) - int(b.Index) })
	return st, nil
}

func msSince(now, t uint64) int64 {
	if now < t {
		return 0
	}
	return int64((now - t) / 1e6)
}
