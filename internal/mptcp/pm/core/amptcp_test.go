package core

import (
	"fmt"
	"testing"
	"time"
)

func TestSubflowCount(t *testing.T) {
	for _, c := range []struct {
		r            Routing
		l1, l2, a, b int
		want         int
		what         string
	}{
		{RoutingAny, 1, 1, 2, 1, 2, "the paper's testbed: 2 DC RLOCs, 1 client RLOC"},
		{RoutingBound, 1, 1, 2, 1, 2, "same, interfaces bound"},
		{RoutingAny, 1, 1, 2, 2, 4, "2x2 RLOCs"},
		{RoutingAny, 3, 2, 1, 2, 6, "more interfaces than locator pairs: N_a takes l1·l2"},
		{RoutingBound, 3, 2, 1, 2, 2, "N_b ignores the interfaces"},
		{RoutingAny, 1, 1, 1, 1, 1, "single-homed both: one subflow"},
		{RoutingAny, 2, 2, 0, 2, 0, "no usable locator at one site"},
		{RoutingBound, 1, 1, 4, 3, 12, "4x3"},
	} {
		if got := SubflowCount(c.r, c.l1, c.l2, c.a, c.b); got != c.want {
			t.Errorf("%s: SubflowCount(%v, %d, %d, %d, %d) = %d, want %d", c.what, c.r, c.l1, c.l2, c.a, c.b, got, c.want)
		}
	}
}

func TestPortCandidate(t *testing.T) {
	for _, c := range []struct {
		r     int
		dport uint16
		m     int
		base  uint16
		span  uint16
		j     int
		want  uint16
		ok    bool
	}{
		{0, 5201, 2, 45000, 5000, 0, 45001, true}, // 45001+5201 = 50202, even
		{1, 5201, 2, 45000, 5000, 0, 45000, true},
		{1, 5201, 2, 45000, 5000, 3, 45006, true},
		{3, 80, 4, 40000, 100, 0, 40003, true}, // 40003+80 = 40083 = 3 mod 4
		{3, 80, 4, 40000, 100, 24, 40099, true},
		{3, 80, 4, 40000, 100, 25, 0, false}, // past the range
		{4, 80, 4, 40000, 100, 0, 0, false},  // residue out of range
		{0, 80, 0, 40000, 100, 0, 0, false},
		{0, 65535, 3, 65530, 6, 1, 65535, true},
		{0, 65535, 3, 65530, 6, 2, 0, false}, // would pass 65535
	} {
		got, ok := PortCandidate(c.r, c.dport, c.m, c.base, c.span, c.j)
		if got != c.want || ok != c.ok {
			t.Errorf("PortCandidate(%d, %d, %d, %d, %d, %d) = %d, %v; want %d, %v", c.r, c.dport, c.m, c.base, c.span, c.j, got, ok, c.want, c.ok)
		}
	}
	// Every candidate has its residue, and the candidates of one residue are all ports of the
	// range with that residue.
	for m := 1; m <= 8; m++ {
		for r := range m {
			n := 0
			for j := 0; ; j++ {
				p, ok := PortCandidate(r, 443, m, 45000, 100, j)
				if !ok {
					break
				}
				n++
				if Residue(p, 443, m) != r || p < 45000 || p >= 45100 {
					t.Fatalf("m %d r %d j %d: port %d has residue %d", m, r, j, p, Residue(p, 443, m))
				}
			}
			want := 0
			for p := 45000; p < 45100; p++ {
				if (p+443)%m == r {
					want++
				}
			}
			if n != want {
				t.Errorf("m %d r %d: %d candidates, want %d", m, r, n, want)
			}
		}
	}
}

// fakeMaps is a mapping source with fixed answers.
type fakeMaps map[string]struct {
	m Mapping
	s MapState
}

func (f fakeMaps) Mapping(eid string) (Mapping, MapState) {
	e, ok := f[eid]
	if !ok {
		return Mapping{}, MapPending
	}
	return e.m, e.s
}

func (f fakeMaps) set(eid string, usable int, s MapState) {
	f[eid] = struct {
		m Mapping
		s MapState
	}{Mapping{Prefix: eid + "/24", Usable: usable}, s}
}

var (
	client    = Endpoint{"192.168.1.1", 40000}
	server    = Endpoint{"192.168.2.1", 5201}
	clientUps = []Uplink{{Name: "eth0", Addr: "192.168.1.1"}}
)

func amptcpManager(p *AMPTCP) *Manager {
	return New(Config{Uplinks: clientUps}, p)
}

func establish(m *Manager, tok uint32, local, remote Endpoint) []Action {
	m.Event(t0, Event{Kind: Created, Token: tok, Local: local, Remote: remote})
	return m.Event(t0, Event{Kind: Established, Token: tok, Local: local, Remote: remote})
}

// residues returns the residues mod m of the initial subflow and the creates.
func residues(initial Endpoint, remote Endpoint, acts []Action, m int) map[int]int {
	out := map[int]int{Residue(initial.Port, remote.Port, m): 1}
	for _, a := range acts {
		if a.Kind == Create {
			out[Residue(a.Local.Port, a.Remote.Port, m)]++
		}
	}
	return out
}

func TestAMPTCPOpensOnePerPair(t *testing.T) {
	for _, c := range []struct{ a, b, n int }{{1, 2, 2}, {2, 2, 4}, {2, 3, 6}, {1, 1, 1}, {2, 4, 8}} {
		t.Run(fmt.Sprintf("%dx%d", c.a, c.b), func(t *testing.T) {
			maps := fakeMaps{}
			maps.set(client.Addr, c.a, MapFound)
			maps.set(server.Addr, c.b, MapFound)
			m := amptcpManager(&AMPTCP{Maps: maps})
			acts := establish(m, 1, client, server)
			if len(acts) != c.n-1 {
				t.Fatalf("%d actions, want %d creates:\n%s", len(acts), c.n-1, actionsString(acts))
			}
			res := residues(client, server, acts, c.a*c.b)
			if len(res) != c.n {
				t.Errorf("residues %v: not %d distinct RLOC pairs", res, c.n)
			}
			for _, a := range acts {
				if a.Kind != Create || a.Local.Addr != client.Addr || a.Remote != server || a.Local.Port < 45000 || a.Local.Port >= 50000 {
					t.Errorf("action %v", a)
				}
			}
			// Once up, nothing more is asked.
			for _, a := range acts {
				m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: a.Local, Remote: a.Remote, LocID: a.LocalID})
			}
			if got := m.Tick(t0.Add(2 * time.Second)); len(got) != 0 {
				t.Errorf("tick after all up: %v", got)
			}
		})
	}
}

func TestAMPTCPFollowsMapping(t *testing.T) {
	maps := fakeMaps{}
	maps.set(client.Addr, 2, MapFound)
	maps.set(server.Addr, 2, MapFound)
	p := &AMPTCP{Maps: maps}
	m := amptcpManager(p)
	acts := establish(m, 1, client, server)
	if len(acts) != 3 {
		t.Fatalf("2x2: %d creates", len(acts))
	}
	for _, a := range acts {
		m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: a.Local, Remote: a.Remote, LocID: a.LocalID})
	}
	// The client site loses an RLOC: two subflows go, the two left are on distinct pairs, the
	// initial subflow among them.
	maps.set(client.Addr, 1, MapFound)
	got := m.Tick(t0.Add(time.Second))
	if len(got) != 2 || got[0].Kind != Destroy || got[1].Kind != Destroy {
		t.Fatalf("after losing an RLOC:\n%s", actionsString(got))
	}
	left := map[int]bool{Residue(client.Port, server.Port, 2): true}
	for _, a := range acts {
		if a.Local != got[0].Local && a.Local != got[1].Local {
			left[Residue(a.Local.Port, a.Remote.Port, 2)] = true
		}
	}
	if len(left) != 2 {
		t.Errorf("subflows left on residues %v, want 2 distinct", left)
	}
	if p.Counters.MappingChanges != 1 || m.Counters.Unwanted != 2 {
		t.Errorf("counters %+v %+v", p.Counters, m.Counters)
	}
	for _, a := range got {
		m.Event(t0, Event{Kind: SubClosed, Token: 1, Local: a.Local, Remote: a.Remote})
	}
	// It comes back: two more.
	maps.set(client.Addr, 2, MapFound)
	got = m.Tick(t0.Add(2 * time.Second))
	if len(got) != 2 || got[0].Kind != Create {
		t.Fatalf("after the RLOC's return:\n%s", actionsString(got))
	}
	st := m.Status()[0]
	res := map[int]bool{}
	for _, s := range st.Subflows {
		var port uint16
		fmt.Sscanf(s.Local[len("192.168.1.1:"):], "%d", &port)
		res[Residue(port, server.Port, 4)] = true
	}
	if len(st.Subflows) != 4 || len(res) != 4 {
		t.Errorf("subflows after the return: %+v", st.Subflows)
	}
}

func TestAMPTCPNeverDropsTheLastWorkingSubflow(t *testing.T) {
	maps := fakeMaps{}
	maps.set(client.Addr, 1, MapFound)
	maps.set(server.Addr, 2, MapFound)
	m := amptcpManager(&AMPTCP{Maps: maps})
	acts := establish(m, 1, client, server)
	if len(acts) != 1 {
		t.Fatalf("%v", acts)
	}
	m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: acts[0].Local, Remote: server, LocID: acts[0].LocalID})
	// The initial subflow dies; the mapping shrinks to one pair: the working join stays even
	// though its residue no longer matches... it has the only residue, so it is claimed.
	m.Observe([]Stats{{Token: 1, Local: client, Remote: server, Unacked: 10, LastAckRecv: 5 * time.Second}})
	maps.set(server.Addr, 1, MapFound)
	for _, a := range m.Tick(t0.Add(time.Second)) {
		if a.Kind == Destroy && a.Local == acts[0].Local {
			t.Errorf("the only working subflow was destroyed: %v", a)
		}
	}
}

func TestAMPTCPFallbacks(t *testing.T) {
	for _, c := range []struct {
		name   string
		state  MapState
		usable int
		count  func(AMPTCPCounters) uint64
	}{
		{"no mapping", MapNone, 0, func(c AMPTCPCounters) uint64 { return c.NoMapping }},
		{"resolver silent", MapNoAnswer, 0, func(c AMPTCPCounters) uint64 { return c.NoAnswer }},
		{"zero usable locators", MapNoLocator, 0, func(c AMPTCPCounters) uint64 { return c.NoLocator }},
	} {
		t.Run(c.name, func(t *testing.T) {
			maps := fakeMaps{}
			maps.set(client.Addr, 2, MapFound)
			maps.set(server.Addr, c.usable, c.state)
			var notes []string
			p := &AMPTCP{Maps: maps, Note: func(r, d string) { notes = append(notes, r+": "+d) }}
			// Two uplinks: the kernel-like fallback is the full mesh, one subflow per uplink.
			m := New(Config{Uplinks: []Uplink{clientUps[0], {Name: "eth1", Addr: "192.168.1.2"}}}, p)
			for tok := uint32(1); tok <= 2; tok++ {
				acts := establish(m, tok, Endpoint{client.Addr, client.Port + uint16(tok)}, server)
				if len(acts) != 1 || acts[0].Local.Addr != "192.168.1.2" {
					t.Errorf("connection %d: %v", tok, acts)
				}
			}
			if n := c.count(p.Counters); n != 2 || p.Counters.FallbackToKernel != 2 || p.Counters.Placed != 0 {
				t.Errorf("counters %+v", p.Counters)
			}
			if len(notes) != 1 {
				t.Errorf("notes %q, want one", notes)
			}
		})
	}
}

func TestAMPTCPTriggers(t *testing.T) {
	maps := fakeMaps{}
	maps.set(client.Addr, 1, MapFound)
	maps.set(server.Addr, 2, MapFound)
	p := &AMPTCP{Maps: maps, MinBytes: 1 << 20, InScope: func(a string) bool { return a == server.Addr }}
	m := amptcpManager(p)
	if acts := establish(m, 1, client, server); len(acts) != 0 {
		t.Fatalf("a young flow got subflows: %v", acts)
	}
	m.ObserveBytes(1, 1<<19)
	if acts := m.Tick(t0.Add(time.Second)); len(acts) != 0 {
		t.Fatalf("a short flow got subflows: %v", acts)
	}
	m.ObserveBytes(1, 2<<20)
	if acts := m.Tick(t0.Add(2 * time.Second)); len(acts) != 1 {
		t.Fatalf("a long flow: %v", acts)
	}
	// Out of scope: left alone whatever it carries.
	other := Endpoint{"203.0.113.9", 443}
	establish(m, 2, Endpoint{client.Addr, 40001}, other)
	m.ObserveBytes(2, 1<<30)
	for _, a := range m.Tick(t0.Add(3 * time.Second)) {
		if a.Token == 2 {
			t.Errorf("out-of-scope connection got %v", a)
		}
	}
	if p.Counters.OutOfScope != 1 || p.Counters.Placed != 1 {
		t.Errorf("counters %+v", p.Counters)
	}
	// A short flow closes: counted as such.
	establish(m, 3, Endpoint{client.Addr, 40002}, server)
	m.Event(t0, Event{Kind: Closed, Token: 3})
	if p.Counters.ShortFlows != 1 {
		t.Errorf("short flows %d", p.Counters.ShortFlows)
	}
}

func TestAMPTCPClosedDuringLookup(t *testing.T) {
	maps := fakeMaps{}
	p := &AMPTCP{Maps: maps}
	m := amptcpManager(p)
	if acts := establish(m, 1, client, server); len(acts) != 0 {
		t.Fatalf("%v", acts)
	}
	m.Event(t0, Event{Kind: Closed, Token: 1})
	if p.Counters.ClosedInLookup != 1 || len(p.Tokens()) != 0 {
		t.Errorf("counters %+v tokens %v", p.Counters, p.Tokens())
	}
	// The answer arriving later changes nothing.
	maps.set(client.Addr, 1, MapFound)
	maps.set(server.Addr, 2, MapFound)
	if acts := m.Tick(t0.Add(time.Second)); len(acts) != 0 {
		t.Errorf("%v", acts)
	}
}

func TestAMPTCPClampAndForce(t *testing.T) {
	maps := fakeMaps{}
	maps.set(client.Addr, 2, MapFound)
	maps.set(server.Addr, 4, MapFound)
	var notes []string
	p := &AMPTCP{Maps: maps, MaxSubflows: 3, Note: func(r, d string) { notes = append(notes, r) }}
	m := amptcpManager(p)
	if acts := establish(m, 1, client, server); len(acts) != 2 {
		t.Errorf("clamped to 3: %v", acts)
	}
	establish(m, 2, Endpoint{client.Addr, 40001}, server)
	if p.Counters.Clamped != 2 || len(notes) != 1 {
		t.Errorf("counters %+v notes %v", p.Counters, notes)
	}
	// Forced 3 over 2 pairs: two subflows share a residue.
	maps.set(client.Addr, 1, MapFound)
	maps.set(server.Addr, 2, MapFound)
	m = amptcpManager(&AMPTCP{Maps: maps, Force: 3})
	acts := establish(m, 1, client, server)
	if len(acts) != 2 {
		t.Fatalf("forced 3: %v", acts)
	}
	if res := residues(client, server, acts, 2); len(res) != 2 {
		t.Errorf("forced 3 over 2 pairs uses residues %v", res)
	}
}

func TestAMPTCPPortInUse(t *testing.T) {
	maps := fakeMaps{}
	maps.set(client.Addr, 1, MapFound)
	maps.set(server.Addr, 2, MapFound)
	m := amptcpManager(&AMPTCP{Maps: maps})
	acts := establish(m, 1, client, server)
	if len(acts) != 1 {
		t.Fatal(acts)
	}
	m.PortInUse(t0, acts[0])
	again := m.Tick(t0.Add(time.Millisecond))
	if len(again) != 1 || again[0].Local.Port == acts[0].Local.Port ||
		Residue(again[0].Local.Port, server.Port, 2) != Residue(acts[0].Local.Port, server.Port, 2) {
		t.Errorf("after EADDRINUSE on %v: %v", acts[0], again)
	}
	// A second connection to the same server skips the ports of the first.
	m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: again[0].Local, Remote: server, LocID: again[0].LocalID})
	acts2 := establish(m, 2, Endpoint{client.Addr, 40002}, server)
	for _, a := range acts2 {
		if a.Local == again[0].Local || a.Local == acts[0].Local {
			t.Errorf("port reused: %v", a)
		}
	}
}
