package core

import (
	"testing"
	"time"
)

func rbpmSub(local string, port uint16, rtt time.Duration, unacked uint32, rate uint64, wnd uint32) SubflowStats {
	return SubflowStats{Local: Endpoint{local, port}, Remote: Endpoint{"10.9.9.2", 5201}, RTT: rtt, MinRTT: rtt, Cwnd: 20, MSS: 1448,
		Unacked: unacked, DeliveryRate: rate, SndWnd: wnd}
}

func TestRBPMPolicyDemotesAndRestores(t *testing.T) {
	p := NewRBPM(time.Second)
	ups := []Uplink{{Name: "fast", Addr: "10.9.0.1"}, {Name: "slow", Addr: "10.9.1.1"}}
	t0 := time.Unix(1000, 0)
	slowBackup := false // the kernel's BKUP_LOC flag on the slow subflow
	conn := func(wnd uint32) []ConnStats {
		slow := rbpmSub("10.9.1.1", 45000, 200*time.Millisecond, 10, 125_000, wnd)
		slow.Backup = slowBackup
		return []ConnStats{{Token: 7, Subflows: []SubflowStats{
			rbpmSub("10.9.0.1", 40000, 20*time.Millisecond, 40, 1_250_000, wnd), slow,
		}}}
	}
	if acts := p.Decide(t0, conn(60_000), ups); len(acts) != 0 {
		t.Fatalf("first sight: %v", acts)
	}
	// After the hold-down: 40·1448·9 bytes needed, 60 KB free: the slow subflow goes to backup.
	acts := p.Decide(t0.Add(1100*time.Millisecond), conn(60_000), ups)
	if len(acts) != 1 || acts[0].Kind != SetBackup || !acts[0].Backup || acts[0].Local != (Endpoint{"10.9.1.1", 45000}) || acts[0].Token != 7 {
		t.Fatalf("demotion: %v", acts)
	}
	// The kernel did not take it: asked again a second later, not before.
	if acts := p.Decide(t0.Add(1500*time.Millisecond), conn(60_000), ups); len(acts) != 0 {
		t.Fatalf("resent too early: %v", acts)
	}
	if acts := p.Decide(t0.Add(2200*time.Millisecond), conn(60_000), ups); len(acts) != 1 || !acts[0].Backup || p.Counters.Resent != 1 {
		t.Fatalf("not resent: %v, %+v", acts, p.Counters)
	}
	slowBackup = true
	st := p.Status()
	if len(st) != 1 || len(st[0].Subflows) != 2 || st[0].Subflows[1].Active || st[0].Subflows[1].Reason == "" || !st[0].Subflows[0].Active {
		t.Fatalf("status: %+v", st)
	}
	// Nothing more while nothing changes; the flag is not sent again.
	for k := 3; k < 20; k++ {
		if acts := p.Decide(t0.Add(time.Duration(k)*time.Second), conn(60_000), ups); len(acts) != 0 {
			t.Fatalf("step %d: %v", k, acts)
		}
	}
	// A window twice what the fast subflow's out-of-order data needs with it: restored.
	acts = p.Decide(t0.Add(30*time.Second), conn(2_000_000), ups)
	if len(acts) != 1 || acts[0].Backup || acts[0].Local.Addr != "10.9.1.1" {
		t.Fatalf("restore: %v", acts)
	}
	if p.Counters.Demotions != 1 || p.Counters.Restores != 1 {
		t.Fatalf("counters %+v", p.Counters)
	}
	p.Forget(7)
	if len(p.Status()) != 0 {
		t.Fatal("forgotten connection still listed")
	}
}

func TestRBPMPolicyLeavesAlone(t *testing.T) {
	t0 := time.Unix(1000, 0)
	slowUp := []Uplink{{Name: "fast", Addr: "10.9.0.1"}, {Name: "slow", Addr: "10.9.1.1", Backup: true}}
	two := []SubflowStats{
		rbpmSub("10.9.0.1", 40000, 20*time.Millisecond, 40, 1_250_000, 1000),
		rbpmSub("10.9.1.1", 45000, 200*time.Millisecond, 10, 125_000, 1000),
	}
	for _, tc := range []struct {
		name  string
		conns []ConnStats
		ups   []Uplink
	}{
		{"fallback", []ConnStats{{Token: 1, Fallback: true, Subflows: two}}, nil},
		{"configured backup uplink", []ConnStats{{Token: 2, Subflows: two}}, slowUp},
		{"single subflow", []ConnStats{{Token: 3, Subflows: two[1:]}}, nil},
		{"no statistics", []ConnStats{{Token: 4, Subflows: []SubflowStats{{Local: Endpoint{"10.9.0.1", 1}, Remote: Endpoint{"10.9.9.2", 2}}, {Local: Endpoint{"10.9.1.1", 1}, Remote: Endpoint{"10.9.9.2", 2}}}}}, nil},
	} {
		p := NewRBPM(time.Second)
		for k := range 30 {
			if acts := p.Decide(t0.Add(time.Duration(k)*time.Second), tc.conns, tc.ups); len(acts) != 0 {
				t.Fatalf("%s: %v", tc.name, acts)
			}
		}
	}
}

func TestRBPMPolicyRestoresALeftoverBackup(t *testing.T) {
	p := NewRBPM(time.Second)
	s := rbpmSub("10.9.1.1", 45000, 20*time.Millisecond, 1, 1_250_000, 1_000_000)
	s.Backup = true
	acts := p.Decide(time.Unix(1, 0), []ConnStats{{Token: 9, Subflows: []SubflowStats{rbpmSub("10.9.0.1", 40000, 20*time.Millisecond, 1, 1_250_000, 1_000_000), s}}}, nil)
	if len(acts) != 1 || acts[0].Backup || acts[0].Local.Port != 45000 {
		t.Fatalf("%v", acts)
	}
}

// A zero window is the most blocked state there is, not an unknown one.
func TestRBPMPolicyZeroWindow(t *testing.T) {
	p := NewRBPM(time.Second)
	conn := []ConnStats{{Token: 5, Subflows: []SubflowStats{
		rbpmSub("10.9.0.1", 40000, 20*time.Millisecond, 40, 1_250_000, 0),
		rbpmSub("10.9.1.1", 45000, 200*time.Millisecond, 10, 125_000, 0),
	}}}
	p.Decide(time.Unix(1, 0), conn, nil)
	acts := p.Decide(time.Unix(3, 0), conn, nil)
	if len(acts) != 1 || !acts[0].Backup || acts[0].Local.Port != 45000 {
		t.Fatalf("%v", acts)
	}
}

// A large peer window does not hide a send buffer the fast subflow's data would fill while
// the slow subflow's chunk is unacknowledged: the smaller of the two is the available buffer.
func TestRBPMPolicySendBufferBinds(t *testing.T) {
	ups := []Uplink{{Name: "fast", Addr: "10.9.0.1"}, {Name: "slow", Addr: "10.9.1.1"}}
	t0 := time.Unix(1000, 0)
	conn := func(sndbuf uint32) []ConnStats {
		return []ConnStats{{Token: 9, SendBuffer: sndbuf, Subflows: []SubflowStats{
			rbpmSub("10.9.0.1", 40000, 20*time.Millisecond, 40, 1_250_000, 2_000_000),
			rbpmSub("10.9.1.1", 45000, 200*time.Millisecond, 10, 125_000, 2_000_000),
		}}}
	}
	// 40·1448·9 = 521 KB needed: a 2 MB window alone holds it; with a 300 KB send buffer the
	// slow subflow goes to backup; with the send buffer unknown, the window decides.
	for _, tc := range []struct {
		sndbuf uint32
		demote bool
	}{{0, false}, {4_000_000, false}, {300_000, true}} {
		p := NewRBPM(time.Second)
		p.Decide(t0, conn(tc.sndbuf), ups)
		acts := p.Decide(t0.Add(1100*time.Millisecond), conn(tc.sndbuf), ups)
		if got := len(acts) == 1 && acts[0].Backup && acts[0].Local.Addr == "10.9.1.1"; got != tc.demote || (!tc.demote && len(acts) != 0) {
			t.Fatalf("send buffer %d: actions %v, want demotion %v", tc.sndbuf, acts, tc.demote)
		}
		st := p.Status()
		if len(st) != 1 || st[0].Window != 2_000_000 || st[0].SendBuffer != int(tc.sndbuf) {
			t.Fatalf("status %+v", st)
		}
		if tc.demote && (st[0].Subflows[1].Avail != int(tc.sndbuf) || st[0].Subflows[1].Reason != "would block the send buffer") {
			t.Fatalf("demoted against %d B (%s), want the send buffer %d", st[0].Subflows[1].Avail, st[0].Subflows[1].Reason, tc.sndbuf)
		}
	}
}
