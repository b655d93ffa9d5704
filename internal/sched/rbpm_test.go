package sched

import (
	"math"
	"testing"
	"time"
)

const msD = time.Millisecond

func TestOOWindows(t *testing.T) {
	for _, tc := range []struct {
		fast, slow time.Duration
		want       int64
	}{
		{20 * msD, 20 * msD, 0},
		{20 * msD, 39 * msD, 0}, // ratio < 2
		{20 * msD, 40 * msD, 1}, // ratio 2: floor(2) - 1
		{20 * msD, 200 * msD, 9},
		{29 * msD, 203 * msD, 6}, // the S1 snapshot of scheduling.md 2.1
		{37 * msD, 203 * msD, 4},
		{0, 200 * msD, 0}, // unknown RTT: no division
		{20 * msD, 0, 0},
	} {
		if got := ooWindows(tc.fast, tc.slow); got != tc.want {
			t.Errorf("L(%v, %v) = %d, want %d", tc.fast, tc.slow, got, tc.want)
		}
	}
}

// The worked example of scheduling.md 2.1: fast subflows at 29, 37 and 37 ms with 9, 13 and
// 10 packets out, the slow one at 203 ms; B ≈ (9·6 + 13·4 + 10·4)·1448 ≈ 211 KB exceeds a
// 96 KB free window, so the slow path (lowest bandwidth, highest RTT: score -1) goes.
func TestRBPMWorkedExample(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, MinRTT: 29 * msD, SRTT: 29 * msD, InFlight: 9 * 1448, DeliveryRate: 5e6},
		{ID: 2, Up: true, MinRTT: 37 * msD, SRTT: 37 * msD, InFlight: 13 * 1448, DeliveryRate: 5e6},
		{ID: 3, Up: true, MinRTT: 37 * msD, SRTT: 37 * msD, InFlight: 10 * 1448, DeliveryRate: 5e6},
		{ID: 4, Up: true, MinRTT: 203 * msD, SRTT: 203 * msD, InFlight: 3 * 1448, DeliveryRate: 1e6},
	}
	r := NewRBPM(RBPMConfig{})
	c := Conn{Avail: 96_000, AvailKnown: true}
	r.Decide(0, c, paths) // first sight: estimates are not judged yet
	if r.Changes != 0 {
		t.Fatalf("changed on first sight: %v", r.States(nil))
	}
	now := int64(time.Second)
	if !r.Decide(now, c, paths) {
		t.Fatal("no change")
	}
	st := r.States(nil)
	for i, s := range st {
		if s.Active != (i != 3) {
			t.Fatalf("states %v: want only path 4 demoted", st)
		}
	}
	want := (9*6 + 13*4 + 10*4) * 1448
	if st[3].Required != want || st[3].Avail != 96_000 || st[3].Reason != ReasonBlocking || st[3].Score != -1 {
		t.Fatalf("path 4: %+v, want required %d, available 96000, score -1", st[3], want)
	}
	// Without the slow path the fast ones need nothing (every ratio < 2): the paper's rule
	// would re-enable it at once. braid counts it in: 2·211 KB > 96 KB, so it stays out, and
	// it stays out with a free buffer of 400 KB too.
	c.Avail = 400_000
	for k := 1; k < 100; k++ {
		if r.Decide(now+int64(k)*int64(100*msD), c, paths) {
			t.Fatalf("changed at step %d: %v", k, r.States(nil))
		}
	}
	// Twice the requirement is free: it comes back, after the hold-down.
	c.Avail = 2*want + 1
	later := now + int64(10*time.Second)
	if !r.Decide(later, c, paths) || !r.Active(4) || r.States(nil)[3].Reason != ReasonRestored {
		t.Fatalf("not restored: %v", r.States(nil))
	}
	if i, ok := r.PickConn(later, c, paths, 1448); !ok || i == 3 {
		t.Fatalf("PickConn = %d, %v: want a fast path", i, ok)
	}
}

func TestRBPMHoldDownAndOneAtATime(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, MinRTT: 10 * msD, InFlight: 20 * 1448, DeliveryRate: 10e6},
		{ID: 2, Up: true, MinRTT: 100 * msD, InFlight: 1448, DeliveryRate: 1e6},
		{ID: 3, Up: true, MinRTT: 120 * msD, InFlight: 1448, DeliveryRate: 1e6},
	}
	r := NewRBPM(RBPMConfig{HoldDown: time.Second})
	tight := Conn{Avail: 10_000, AvailKnown: true}
	r.Decide(0, tight, paths)
	// Both slow paths go in one recalculation (the paper's "goto recalculate").
	at := int64(time.Second)
	r.Decide(at, tight, paths)
	if r.Active(2) || r.Active(3) || !r.Active(1) {
		t.Fatalf("%v", r.States(nil))
	}
	// Plenty of buffer: one path per hold-down comes back, the better first (3 has the higher
	// RTT, equal rate: 2 first).
	roomy := Conn{Avail: 10 << 20, AvailKnown: true}
	var back []int64
	for now := at; now < at+int64(5*time.Second); now += int64(10 * msD) {
		if r.Decide(now, roomy, paths) {
			back = append(back, now)
		}
	}
	if len(back) != 2 || !r.Active(2) || !r.Active(3) {
		t.Fatalf("re-enabled at %v: %v", back, r.States(nil))
	}
	if back[0] < at+int64(time.Second) || back[1]-back[0] < int64(time.Second) {
		t.Fatalf("re-enabled at %v after demotion at %v: hold-down not kept", back, at)
	}
	if r.States(nil)[1].Since != back[0] {
		t.Fatalf("path 2 should come back first: %v", r.States(nil))
	}
}

func TestRBPMNeverDemotesTheLastPath(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, MinRTT: 10 * msD, InFlight: 50 * 1448, DeliveryRate: 10e6},
		{ID: 2, Up: true, MinRTT: 300 * msD, InFlight: 50 * 1448, DeliveryRate: 1e6},
	}
	r := NewRBPM(RBPMConfig{})
	full := Conn{Avail: 0, AvailKnown: true}
	for now := int64(0); now < int64(20*time.Second); now += int64(50 * msD) {
		r.Decide(now, full, paths)
		if !r.Active(1) && !r.Active(2) {
			t.Fatalf("no active path at %v", time.Duration(now))
		}
	}
	if r.Active(2) || r.Changes != 1 {
		t.Fatalf("%d changes, %v", r.Changes, r.States(nil))
	}
	// The active path dies: the demoted one comes back at once, hold-down or not.
	paths[0].Up = false
	now := int64(20*time.Second) + 1
	if !r.Decide(now, full, paths) || !r.Active(2) || r.States(nil)[1].Reason != ReasonRescue {
		t.Fatalf("%v", r.States(nil))
	}
	paths[1].InFlight = 0 // drained while it was demoted
	if i, ok := r.PickConn(now, full, paths, 1448); !ok || i != 1 {
		t.Fatalf("PickConn = %d, %v", i, ok)
	}
}

func TestRBPMBadEstimates(t *testing.T) {
	nan := math.NaN()
	cases := map[string][]Path{
		"no paths":       nil,
		"single":         {{ID: 1, Up: true, MinRTT: 10 * msD, InFlight: 1 << 20}},
		"unknown rtt":    {{ID: 1, Up: true}, {ID: 2, Up: true, SRTT: 50 * msD, InFlight: 1 << 20}},
		"zero rate":      {{ID: 1, Up: true, SRTT: 10 * msD}, {ID: 2, Up: true, SRTT: 100 * msD, InFlight: 1 << 20}},
		"bad rate":       {{ID: 1, Up: true, SRTT: 10 * msD, DeliveryRate: nan, Capacity: math.Inf(1)}, {ID: 2, Up: true, SRTT: 100 * msD, DeliveryRate: -5}},
		"all equal":      {{ID: 1, Up: true, SRTT: 20 * msD, DeliveryRate: 5e6, InFlight: 1 << 20}, {ID: 2, Up: true, SRTT: 20 * msD, DeliveryRate: 5e6, InFlight: 1 << 20}},
		"all down":       {{ID: 1, SRTT: 20 * msD}, {ID: 2, SRTT: 200 * msD}},
		"negative times": {{ID: 1, Up: true, SRTT: -5, MinRTT: -1, InFlight: -3}, {ID: 2, Up: true, SRTT: 30 * msD}},
		// Linux's min_rtt before the first sample: ~0U µs.
		"kernel's no-sample min rtt": {{ID: 1, Up: true, SRTT: 20 * msD, MinRTT: 20 * msD, InFlight: 1 << 20, DeliveryRate: 5e6},
			{ID: 2, Up: true, MinRTT: 4294967295 * time.Microsecond, InFlight: 1448}, {ID: 3, Up: true, SRTT: 21 * msD, MinRTT: 21 * msD, InFlight: 1 << 20, DeliveryRate: 5e6}},
	}
	for name, paths := range cases {
		r := NewRBPM(RBPMConfig{})
		for k := range 50 {
			now := int64(k) * int64(100*msD)
			i, ok := r.PickConn(now, Conn{Avail: 0, AvailKnown: true}, paths, 1448)
			if ok && (i < 0 || i >= len(paths) || !paths[i].Up) {
				t.Fatalf("%s: picked %d", name, i)
			}
			for _, s := range r.States(nil) {
				if math.IsNaN(s.Score) || math.IsInf(s.Score, 0) {
					t.Fatalf("%s: score %v", name, s.Score)
				}
			}
		}
		active := 0
		for i, s := range r.States(nil) {
			if s.Active && paths[i].Up {
				active++
			}
		}
		up := 0
		for _, p := range paths {
			if p.Up {
				up++
			}
		}
		if up > 0 && active == 0 {
			t.Errorf("%s: no active path: %v", name, r.States(nil))
		}
		if (name == "all equal" || name == "kernel's no-sample min rtt") && r.Changes != 0 {
			t.Errorf("all equal: %d changes", r.Changes)
		}
	}
}

func TestMinRTTBackupAndWindow(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, SRTT: 5 * msD, Backup: true},
		{ID: 2, Up: true, SRTT: 50 * msD, CWnd: 10 * 1448, InFlight: 9 * 1448},
		{ID: 3, Up: true, SRTT: 80 * msD, CWnd: 10 * 1448},
	}
	var m MinRTT
	if i, _ := m.Pick(0, paths, 1448); i != 1 {
		t.Fatalf("Pick = %d, want 1: backup only when nothing else can send", i)
	}
	paths[1].InFlight = 10 * 1448
	if i, _ := m.Pick(0, paths, 1448); i != 2 {
		t.Fatalf("Pick = %d, want 2: path 2's window is full", i)
	}
	paths[2].InFlight = 10 * 1448
	if i, _ := m.Pick(0, paths, 1448); i != 0 {
		t.Fatalf("Pick = %d, want the backup", i)
	}
}

func TestBLESTWaitsForTheFastPath(t *testing.T) {
	fast := Path{ID: 1, Up: true, SRTT: 20 * msD, CWnd: 20 * 1448, InFlight: 20 * 1448}
	slow := Path{ID: 2, Up: true, SRTT: 200 * msD, CWnd: 10 * 1448}
	for _, tc := range []struct {
		name  string
		c     Conn
		want  int
		wants bool
	}{
		// f sends about (20 + 5)·11 packets during s's 200 ms: 400 KB; the buffer has 100 KB.
		{"small buffer: wait", Conn{Avail: 100_000, AvailKnown: true}, 0, false},
		{"big buffer: slow path", Conn{Avail: 10 << 20, AvailKnown: true}, 1, true},
		{"unknown buffer: slow path", Conn{}, 1, true},
	} {
		b := &BLEST{}
		i, ok := b.PickConn(0, tc.c, []Path{fast, slow}, 1448)
		if ok != tc.wants || (ok && i != tc.want) {
			t.Errorf("%s: %d, %v", tc.name, i, ok)
		}
	}
	b := &BLEST{}
	paths := []Path{fast, slow}
	paths[0].InFlight = 0
	if i, ok := b.PickConn(0, Conn{Avail: 1000, AvailKnown: true}, paths, 1448); !ok || i != 0 {
		t.Fatalf("fast path with room: %d, %v", i, ok)
	}
	// λ rises while the window blocks and stays within [1, 1.3].
	for k := range 100 {
		b.PickConn(int64(k)*int64(time.Second), Conn{Avail: 0, AvailKnown: true}, []Path{fast, slow}, 1448)
	}
	if l := b.Lambda(); l != 1.3 {
		t.Fatalf("λ = %v after blocking, want 1.3", l)
	}
}

func TestECF(t *testing.T) {
	fast := Path{ID: 1, Up: true, SRTT: 20 * msD, CWnd: 20 * 1448, InFlight: 20 * 1448}
	slow := Path{ID: 2, Up: true, SRTT: 200 * msD, CWnd: 10 * 1448}
	e := &ECF{}
	// Little queued: the fast path alone finishes first, the slow one would finish later.
	if _, ok := e.PickConn(0, Conn{Queued: 10_000}, []Path{fast, slow}, 1448); ok {
		t.Fatal("little data queued: want to wait for the fast path")
	}
	// Much queued: both paths are needed.
	if i, ok := e.PickConn(0, Conn{Queued: 10 << 20}, []Path{fast, slow}, 1448); !ok || i != 1 {
		t.Fatalf("much data queued: %d, %v", i, ok)
	}
	// Similar paths: no waiting.
	slow.SRTT = 25 * msD
	if i, ok := (&ECF{}).PickConn(0, Conn{Queued: 10_000}, []Path{fast, slow}, 1448); !ok || i != 1 {
		t.Fatalf("similar paths: %d, %v", i, ok)
	}
}

func TestConnSchedulersNoAllocs(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, SRTT: 20 * msD, MinRTT: 20 * msD, CWnd: 20 * 1448, InFlight: 20 * 1448, DeliveryRate: 5e6},
		{ID: 2, Up: true, SRTT: 200 * msD, MinRTT: 200 * msD, CWnd: 10 * 1448, DeliveryRate: 1e6},
		{ID: 3, Up: true, SRTT: 25 * msD, MinRTT: 22 * msD, CWnd: 20 * 1448, DeliveryRate: 5e6},
	}
	c := Conn{Avail: 100_000, AvailKnown: true, Queued: 1 << 20}
	b, e, r := &BLEST{}, &ECF{}, NewRBPM(RBPMConfig{})
	var now int64
	b.PickConn(now, c, paths, 1448)
	r.PickConn(now, c, paths, 1448)
	for name, f := range map[string]func(){
		"BLEST": func() { now += 1e6; b.PickConn(now, c, paths, 1448) },
		"ECF":   func() { e.PickConn(now, c, paths, 1448) },
		"RBPM":  func() { now += 1e6; r.PickConn(now, c, paths, 1448) },
	} {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocs, want 0", name, a)
		}
	}
}

// Linux reports min_rtt as ~0U µs until the first sample; taken at face value it would make a
// hold-down of hours. It falls back to SRTT, and the slow path goes after the usual second.
func TestRBPMIgnoresUnbelievableRTT(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, SRTT: 20 * msD, MinRTT: 20 * msD, InFlight: 30 * 1448, DeliveryRate: 5e6},
		{ID: 2, Up: true, SRTT: 300 * msD, MinRTT: 4294967295 * time.Microsecond, InFlight: 1448, DeliveryRate: 1e6},
	}
	r := NewRBPM(RBPMConfig{})
	for now := int64(0); now <= int64(1500*msD); now += int64(100 * msD) {
		r.Decide(now, Conn{Avail: 10_000, AvailKnown: true}, paths)
	}
	if r.Active(2) {
		t.Fatalf("slow path not demoted: %v", r.States(nil))
	}
}
