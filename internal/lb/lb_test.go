package lb

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/lb/xdp"
	"braid/internal/metrics"
)

// fakePlane is the data plane's maps in memory.
type fakePlane struct {
	mu        sync.Mutex
	cfg       xdp.Config
	services  map[uint32]netip.AddrPort
	tables    map[uint32][]uint32
	backends  map[uint32]xdp.Backend
	stateless map[netip.AddrPort]uint32
	tokens    map[[2]uint32]xdp.Token
	flows     map[uint32]int
}

func newFake() *fakePlane {
	return &fakePlane{services: map[uint32]netip.AddrPort{}, tables: map[uint32][]uint32{}, backends: map[uint32]xdp.Backend{},
		stateless: map[netip.AddrPort]uint32{}, tokens: map[[2]uint32]xdp.Token{}, flows: map[uint32]int{}}
}

func (f *fakePlane) SetConfig(c xdp.Config) error { f.cfg = c; return nil }
func (f *fakePlane) SetService(id uint32, v netip.AddrPort) error {
	f.services[id] = v
	return nil
}
func (f *fakePlane) SetTable(id uint32, t []uint32) error {
	f.tables[id] = append([]uint32(nil), t...)
	return nil
}
func (f *fakePlane) SetBackend(i uint32, b xdp.Backend) error { f.backends[i] = b; return nil }
func (f *fakePlane) RemoveBackend(i uint32) error             { delete(f.backends, i); return nil }
func (f *fakePlane) SetStateless(v netip.AddrPort, b uint32) error {
	f.stateless[v] = b
	return nil
}
func (f *fakePlane) DeleteStateless(v netip.AddrPort) error { delete(f.stateless, v); return nil }
func (f *fakePlane) Counters() (xdp.Counters, error) {
	return xdp.Counters{xdp.CounterJoinSteered: 7}, nil
}
func (f *fakePlane) BackendStats(i uint32) (xdp.BackendStats, error) {
	return xdp.BackendStats{Conns: uint64(i) + 1}, nil
}
func (f *fakePlane) Tokens() ([]xdp.Token, error) {
	var out []xdp.Token
	for _, t := range f.tokens {
		out = append(out, t)
	}
	return out, nil
}
func (f *fakePlane) PendingTokens() ([]xdp.Token, error) { return nil, nil }
func (f *fakePlane) DeleteToken(s, t uint32) error       { delete(f.tokens, [2]uint32{s, t}); return nil }
func (f *fakePlane) ConnsPerBackend() (map[uint32]int, error) {
	m := map[uint32]int{}
	for k, v := range f.flows {
		m[k] = v
	}
	return m, nil
}
func (f *fakePlane) DropFlowsOf(i uint32) error { delete(f.flows, i); return nil }

func (f *fakePlane) share(id uint32) map[uint32]int {
	s := map[uint32]int{}
	for _, v := range f.tables[0] {
		s[v]++
	}
	return s
}

var vips = []netip.AddrPort{netip.MustParseAddrPort("10.100.0.1:80"), netip.MustParseAddrPort("[fd00::1]:80")}

func spec(name string, w uint32) BackendSpec {
	return BackendSpec{Name: name, Weight: w, Target: xdp.Backend{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}
}

func TestWeightsDrainAddRemove(t *testing.T) {
	f := newFake()
	clock := uint64(1e12)
	l, err := New(f, Options{Services: vips, Mono: func() uint64 { return clock }, TokenIdle: time.Minute, TokenClosing: time.Second},
		[]BackendSpec{spec("a", 1), spec("b", 3)})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.services) != 2 || len(f.tables) != 2 {
		t.Fatalf("services %v tables %d", f.services, len(f.tables))
	}
	s := f.share(0)
	if s[0] < xdp.TableSize/4-2 || s[0] > xdp.TableSize/4+2 || s[1] < 3*xdp.TableSize/4-2 {
		t.Fatalf("weights 1:3 gave %v", s)
	}
	// Drain b: out of the table, still a backend, its tokens and flows kept.
	f.tokens[[2]uint32{0, 42}] = xdp.Token{Service: 0, Token: 42, Backend: 1, Active: clock}
	f.flows[1] = 10
	if err := l.SetWeight("b", 0); err != nil {
		t.Fatal(err)
	}
	if s := f.share(0); s[1] != 0 || s[0] != xdp.TableSize {
		t.Fatalf("drained b still in the table: %v", s)
	}
	if _, ok := f.backends[1]; !ok || len(f.tokens) != 1 || f.flows[1] != 10 {
		t.Fatal("draining removed the backend, its tokens or its flows")
	}
	st, _ := l.Status(true)
	if st.Backends[1].State != "drained" || st.Backends[1].Tokens != 1 || st.Backends[1].Flows != 10 || st.Counters["join_steered"] != 7 {
		t.Fatalf("status %+v", st)
	}
	// Add c: gets a free slot; removing b frees its slot, tokens and flows.
	if err := l.AddBackend(spec("c", 1)); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBackend(spec("c", 1)); !errors.Is(err, ErrExists) {
		t.Fatalf("adding twice: %v", err)
	}
	if err := l.RemoveBackend("b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.backends[1]; ok || len(f.tokens) != 0 || f.flows[1] != 0 {
		t.Fatalf("removal left backend %v tokens %v flows %v", f.backends, f.tokens, f.flows)
	}
	if err := l.RemoveBackend("b"); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("removing twice: %v", err)
	}
	if err := l.AddBackend(spec("d", 1)); err != nil {
		t.Fatal(err)
	}
	st, _ = l.Status(false)
	if st.Backends[1].Name != "d" {
		t.Fatalf("d did not reuse b's slot: %+v", st.Backends)
	}
}

func TestSweep(t *testing.T) {
	f := newFake()
	clock := uint64(1e12)
	l, err := New(f, Options{Services: vips[:1], Mono: func() uint64 { return clock }, TokenIdle: time.Minute, TokenClosing: 5 * time.Second},
		[]BackendSpec{spec("a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	f.tokens[[2]uint32{0, 1}] = xdp.Token{Token: 1, Backend: 0, Active: clock - uint64(2*time.Minute)}                 // idle
	f.tokens[[2]uint32{0, 2}] = xdp.Token{Token: 2, Backend: 0, Active: clock - uint64(10*time.Second)}                // fresh
	f.tokens[[2]uint32{0, 3}] = xdp.Token{Token: 3, Backend: 0, Active: clock - uint64(10*time.Second), Closing: true} // closed
	f.tokens[[2]uint32{0, 4}] = xdp.Token{Token: 4, Backend: 9, Active: clock}                                         // backend gone
	f.tokens[[2]uint32{0, 5}] = xdp.Token{Token: 5, Backend: 0, Active: clock - uint64(time.Second), Closing: true}    // closing
	n, err := l.Sweep()
	if err != nil || n != 3 {
		t.Fatalf("swept %d (%v), want 3", n, err)
	}
	if _, ok := f.tokens[[2]uint32{0, 2}]; !ok {
		t.Fatal("fresh token swept")
	}
	if _, ok := f.tokens[[2]uint32{0, 5}]; !ok {
		t.Fatal("recently closing token swept")
	}
}

// TestSweepKeepsHeadroom: with the joined token table above 3/4 of its size, the sweeper
// removes tokens idle for TokenClosing already, so that a table filled by forged joins makes
// room again while tokens in use stay.
func TestSweepKeepsHeadroom(t *testing.T) {
	f := newFake()
	clock := uint64(1e12)
	l, err := New(f, Options{Services: vips[:1], Mono: func() uint64 { return clock }, TokenIdle: time.Minute,
		TokenClosing: 5 * time.Second, TokenTable: 8}, []BackendSpec{spec("a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint32(0); i < 6; i++ { // 6 of 8: at 3/4, no pressure yet
		f.tokens[[2]uint32{0, i}] = xdp.Token{Token: i, Active: clock - uint64(10*time.Second)}
	}
	if n, _ := l.Sweep(); n != 0 {
		t.Fatalf("swept %d below the pressure mark", n)
	}
	f.tokens[[2]uint32{0, 6}] = xdp.Token{Token: 6, Active: clock - uint64(time.Second)} // in use
	if n, _ := l.Sweep(); n != 6 {
		t.Fatalf("swept %d above 3/4, want the 6 idle ones", n)
	}
	if _, ok := f.tokens[[2]uint32{0, 6}]; !ok {
		t.Fatal("a token in use was swept")
	}
	if st, _ := l.Status(false); st.TokenPressure != 1 {
		t.Fatalf("pressure sweeps %d", st.TokenPressure)
	}
}

func TestHealth(t *testing.T) {
	f := newFake()
	var mu sync.Mutex
	failing := map[string]bool{}
	check := func(ctx context.Context, addr string) error {
		mu.Lock()
		defer mu.Unlock()
		if failing[addr] {
			return errors.New("connection refused")
		}
		return nil
	}
	a, b := spec("a", 1), spec("b", 1)
	a.Health, b.Health = "10.0.0.1:80", "10.0.0.2:80"
	l, err := New(f, Options{Services: vips[:1], Check: check, Rise: 2, Fall: 2, HealthTimeout: time.Second}, []BackendSpec{a, b})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s := f.share(0); s[xdp.NoBackend] != xdp.TableSize {
		t.Fatalf("backends with checks start down until they pass: %v", s)
	}
	l.CheckHealth(ctx)
	if s := f.share(0); s[xdp.NoBackend] != xdp.TableSize {
		t.Fatal("up after one success, rise is 2")
	}
	l.CheckHealth(ctx)
	if s := f.share(0); len(s) != 2 || s[0] == 0 || s[1] == 0 {
		t.Fatalf("both up: %v", s)
	}
	mu.Lock()
	failing["10.0.0.2:80"] = true
	mu.Unlock()
	l.CheckHealth(ctx)
	l.CheckHealth(ctx)
	if s := f.share(0); s[1] != 0 || s[0] != xdp.TableSize {
		t.Fatalf("b down after 2 failures: %v", s)
	}
	st, _ := l.Status(false)
	if st.Backends[1].State != "down" || !strings.Contains(st.Backends[1].HealthError, "refused") {
		t.Fatalf("status %+v", st.Backends[1])
	}
	var sb strings.Builder
	w := metrics.NewWriter(&sb)
	l.WriteMetrics(w)
	w.Flush()
	for _, want := range []string{`braid_lb_backend_up{backend="b",index="1"} 0`, "braid_lb_join_steered_total 7", "# TYPE braid_lb_drop_join_unknown_token_total counter"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, sb.String())
		}
	}
}

func TestStateless(t *testing.T) {
	f := newFake()
	b := spec("a", 1)
	b.StatelessPort = 5001
	l, err := New(f, Options{Services: vips}, []BackendSpec{b})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.stateless) != 2 || f.stateless[netip.MustParseAddrPort("10.100.0.1:5001")] != 0 {
		t.Fatalf("stateless %v", f.stateless)
	}
	l.RemoveBackend("a")
	if len(f.stateless) != 0 {
		t.Fatalf("stateless entries left: %v", f.stateless)
	}
}

// TestRunStops checks that Run's goroutines (health checks, sweeper) end with its context.
func TestRunStops(t *testing.T) {
	f := newFake()
	b := spec("a", 1)
	b.Health = "10.0.0.1:80"
	checks := make(chan struct{}, 100)
	l, err := New(f, Options{Services: vips[:1], Sweep: 5 * time.Millisecond, HealthInterval: 5 * time.Millisecond, HealthTimeout: time.Second,
		Check: func(ctx context.Context, addr string) error {
			select {
			case checks <- struct{}{}:
			default:
			}
			return nil
		}}, []BackendSpec{b})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	<-checks
	<-checks
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not stop")
	}
}
