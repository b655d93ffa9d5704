package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"braid/internal/lb/xdp"
)

func (f *fakePlane) DeleteService(v netip.AddrPort) error {
	for id, s := range f.services {
		if s == v {
			delete(f.services, id)
			return nil
		}
	}
	return errors.New("no such service")
}

func changeNames(cs []Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.What+" "+c.Name)
	}
	slices.Sort(out)
	return out
}

// TestApply: a reload keeps what stays (slots, flows, tokens, service IDs), adds before it
// removes (a new backend never takes a removed one's slot in the same reload), and refuses
// what it cannot do with nothing changed.
func TestApply(t *testing.T) {
	f := newFake()
	clock := uint64(1e12)
	b := spec("b", 3)
	b.StatelessPort = 5000
	l, err := New(f, Options{Services: vips, Mono: func() uint64 { return clock }, TokenIdle: time.Minute, TokenClosing: time.Second},
		[]BackendSpec{spec("a", 1), b})
	if err != nil {
		t.Fatal(err)
	}
	f.tokens[[2]uint32{0, 1}] = xdpToken(0, 1, 0, clock) // a, on the service to be removed
	f.tokens[[2]uint32{1, 2}] = xdpToken(1, 2, 0, clock) // a, on the service that stays
	f.tokens[[2]uint32{1, 3}] = xdpToken(1, 3, 1, clock) // b
	f.flows[0], f.flows[1] = 10, 20
	if f.stateless[netip.MustParseAddrPort("10.100.0.1:5000")] != 1 {
		t.Fatalf("stateless %v", f.stateless)
	}

	v3 := netip.MustParseAddrPort("10.100.0.3:443")
	changes, err := l.Apply([]netip.AddrPort{vips[1], v3}, []BackendSpec{spec("a", 2), spec("c", 1)}, Settings{TokenIdle: time.Minute, TokenClosing: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"backend added c", "backend removed b", "backend weight changed a", "service added 10.100.0.3:443", "service removed 10.100.0.1:80"}
	if got := changeNames(changes); !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	if f.services[1] != vips[1] || f.services[0] != v3 {
		t.Errorf("services %v: the one that stays keeps ID 1, the new one takes the free ID 0", f.services)
	}
	if _, ok := f.tokens[[2]uint32{0, 1}]; ok {
		t.Errorf("the removed service's token stayed")
	}
	if _, ok := f.tokens[[2]uint32{1, 2}]; !ok || f.flows[0] != 10 {
		t.Errorf("a lost a token or flows: tokens %v flows %v", f.tokens, f.flows)
	}
	if _, ok := f.tokens[[2]uint32{1, 3}]; ok || f.flows[1] != 0 || len(f.stateless) != 0 {
		t.Errorf("b's tokens, flows or stateless entries stayed: tokens %v flows %v stateless %v", f.tokens, f.flows, f.stateless)
	}
	st, _ := l.Status(false)
	idx := map[string]uint32{}
	for _, bs := range st.Backends {
		idx[bs.Name] = bs.Index
	}
	if len(idx) != 2 || idx["a"] != 0 || idx["c"] != 2 {
		t.Errorf("slots %v: a keeps 0, c takes 2 (not b's 1, freed in the same reload)", idx)
	}
	if s := f.share(0); s[0] < 2*s[2]-200 || s[1] != 0 {
		t.Errorf("table of the new service %v: a twice c, nothing for b's freed slot", s)
	}
	if len(st.Services) != 2 {
		t.Errorf("status services %v", st.Services)
	}

	// Again: nothing to do.
	if changes, err := l.Apply([]netip.AddrPort{vips[1], v3}, []BackendSpec{spec("a", 2), spec("c", 1)}, Settings{TokenIdle: time.Minute, TokenClosing: time.Second}); err != nil || len(changes) != 0 {
		t.Errorf("the same file again: %v %v", changes, err)
	}
	// More new backends than free slots: refused, nothing changed.
	var many []BackendSpec
	for i := range 300 {
		many = append(many, spec(fmt.Sprintf("n%d", i), 1))
	}
	if _, err := l.Apply([]netip.AddrPort{vips[1]}, many, Settings{}); !errors.Is(err, ErrFull) {
		t.Errorf("300 backends: %v", err)
	}
	if st, _ := l.Status(false); len(st.Backends) != 2 || len(st.Services) != 2 {
		t.Errorf("a refused reload changed %+v", st)
	}
	if _, err := l.Apply(nil, []BackendSpec{spec("a", 1)}, Settings{}); err == nil || !strings.Contains(err.Error(), "0 services") {
		t.Errorf("no services: %v", err)
	}
}

func xdpToken(service, token, backend uint32, active uint64) xdp.Token {
	return xdp.Token{Service: service, Token: token, Backend: backend, Active: active, Created: active}
}
