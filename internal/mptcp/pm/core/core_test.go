package core

import (
	"fmt"
	"testing"
	"time"
)

var (
	t0      = time.Unix(1000, 0)
	uplinks = []Uplink{{Name: "isp1", Addr: "10.9.0.1"}, {Name: "isp2", Addr: "10.9.1.1"}}
	local0  = Endpoint{"10.9.0.1", 34000}
	remote0 = Endpoint{"10.9.0.2", 5000}
)

func newManager() *Manager {
	return New(Config{Uplinks: uplinks}, Fullmesh{})
}

func established(m *Manager, now time.Time, tok uint32) []Action {
	m.Event(now, Event{Kind: Created, Token: tok, Local: local0, Remote: remote0})
	return m.Event(now, Event{Kind: Established, Token: tok, Local: local0, Remote: remote0})
}

func actionsString(as []Action) string {
	s := ""
	for _, a := range as {
		s += a.String() + "\n"
	}
	return s
}

func TestFullmeshCreatesOnePerUplinkAndRemote(t *testing.T) {
	m := newManager()
	if got := m.Event(t0, Event{Kind: Created, Token: 1, Local: local0, Remote: remote0}); len(got) != 0 {
		t.Fatalf("actions before ESTABLISHED: %v", got)
	}
	got := m.Event(t0, Event{Kind: Established, Token: 1, Local: local0, Remote: remote0})
	want := []Action{{Kind: Create, Token: 1, LocalID: 1, Local: Endpoint{"10.9.1.1", 45000}, Remote: remote0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got\n%swant\n%s", actionsString(got), actionsString(want))
	}
	// The peer announces a second address: one subflow from each uplink to it.
	r1 := Endpoint{"10.9.1.2", 0}
	got = m.Event(t0, Event{Kind: Announced, Token: 1, RemID: 1, Remote: r1})
	if len(got) != 2 || got[0].Remote != (Endpoint{"10.9.1.2", 5000}) || got[0].Local.Addr != "10.9.0.1" || got[1].Local.Addr != "10.9.1.1" {
		t.Fatalf("after ANNOUNCED:\n%s", actionsString(got))
	}
	if got[0].LocalID == got[1].LocalID || got[0].Local.Port == got[1].Local.Port {
		t.Errorf("IDs or ports reused: %v", got)
	}
	// Nothing more to do while the joins are young.
	if got := m.Tick(t0.Add(100 * time.Millisecond)); len(got) != 0 {
		t.Errorf("tick: %v", got)
	}
}

func TestServerSideWaits(t *testing.T) {
	m := newManager()
	m.Event(t0, Event{Kind: Created, Token: 2, Local: remote0, Remote: local0, ServerSide: true})
	if got := m.Event(t0, Event{Kind: Established, Token: 2, Local: remote0, Remote: local0, ServerSide: true}); len(got) != 0 {
		t.Errorf("server side acted: %v", got)
	}
}

func TestFamiliesStaySeparate(t *testing.T) {
	m := New(Config{Uplinks: []Uplink{{Addr: "10.9.0.1"}, {Addr: "fd09:1::1", V6: true}}}, Fullmesh{})
	got := established(m, t0, 3)
	if len(got) != 0 {
		t.Errorf("IPv6 uplink used for an IPv4 connection: %v", got)
	}
}

func TestJoinTimeoutRetriesWithFreshPortAndID(t *testing.T) {
	m := newManager()
	first := established(m, t0, 1)[0]
	if got := m.Tick(t0.Add(999 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("acted before the join timeout: %v", got)
	}
	got := m.Tick(t0.Add(time.Second))
	if len(got) != 2 || got[0].Kind != Destroy || got[0].Local != first.Local || got[1].Kind != Create {
		t.Fatalf("after the timeout:\n%s", actionsString(got))
	}
	if got[1].Local.Port == first.Local.Port {
		t.Errorf("retry reused port %d", first.Local.Port)
	}
	if m.Counters.JoinTimeouts != 1 || m.Counters.Creates != 2 || m.Counters.Destroys != 1 {
		t.Errorf("counters %+v", m.Counters)
	}
}

func TestDeadSubflowReplaced(t *testing.T) {
	m := newManager()
	c := established(m, t0, 1)[0]
	m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: c.Local, Remote: c.Remote, LocID: c.LocalID})
	m.Observe([]Stats{{Token: 1, Local: c.Local, Remote: c.Remote, Unacked: 10, LastAckRecv: 500 * time.Millisecond}})
	if got := m.Tick(t0.Add(2 * time.Second)); len(got) != 0 {
		t.Fatalf("a slow subflow was replaced: %v", got)
	}
	// Idle subflows (nothing unacked) are never dead, however old their last ack.
	m.Observe([]Stats{{Token: 1, Local: c.Local, Remote: c.Remote, Unacked: 0, LastAckRecv: time.Hour}})
	if got := m.Tick(t0.Add(2 * time.Second)); len(got) != 0 {
		t.Fatalf("an idle subflow was replaced: %v", got)
	}
	m.Observe([]Stats{{Token: 1, Local: c.Local, Remote: c.Remote, Unacked: 10, LastAckRecv: 1500 * time.Millisecond}})
	got := m.Tick(t0.Add(3 * time.Second))
	if len(got) != 2 || got[0].Kind != Destroy || got[0].Local != c.Local || got[1].Kind != Create || got[1].Local.Addr != c.Local.Addr {
		t.Fatalf("dead subflow:\n%s", actionsString(got))
	}
	if m.Counters.DeadSubflows != 1 {
		t.Errorf("counters %+v", m.Counters)
	}
}

func TestSubClosedRecreatedAfterRetry(t *testing.T) {
	m := newManager()
	c := established(m, t0, 1)[0]
	m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: c.Local, Remote: c.Remote})
	now := t0.Add(5 * time.Second)
	if got := m.Event(now, Event{Kind: SubClosed, Token: 1, Local: c.Local, Remote: c.Remote}); len(got) != 0 {
		t.Fatalf("re-created at once: %v", got)
	}
	if got := m.Tick(now.Add(249 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("re-created before Retry: %v", got)
	}
	got := m.Tick(now.Add(250 * time.Millisecond))
	if len(got) != 1 || got[0].Kind != Create || got[0].Local.Addr != "10.9.1.1" {
		t.Fatalf("after Retry:\n%s", actionsString(got))
	}
}

func TestFailedAndClosed(t *testing.T) {
	m := newManager()
	c := established(m, t0, 1)[0]
	m.Failed(t0, c, false)
	if m.Counters.CreateFailures != 1 {
		t.Errorf("counters %+v", m.Counters)
	}
	if got := m.Tick(t0.Add(300 * time.Millisecond)); len(got) != 1 || got[0].Kind != Create {
		t.Fatalf("after a refused create: %v", got)
	}
	m.Failed(t0, c, true) // the token is gone
	if got := m.Tick(t0.Add(time.Minute)); len(got) != 0 || len(m.Status()) != 0 {
		t.Fatalf("forgotten connection still acted on: %v %v", got, m.Status())
	}
	established(m, t0, 5)
	m.Event(t0, Event{Kind: Closed, Token: 5})
	if len(m.Status()) != 0 {
		t.Errorf("closed connection kept: %v", m.Status())
	}
}

func TestIDsNeverCollide(t *testing.T) {
	// a join every second for 600 s wraps the ID space: no backoff for the pair that never works
	m := New(Config{Uplinks: uplinks, MaxJoinBackoff: time.Nanosecond}, Fullmesh{})
	established(m, t0, 1)
	now := t0
	seen := map[uint8]bool{}
	for i := range 600 {
		now = now.Add(time.Second)
		for _, a := range m.Tick(now) {
			if a.Kind == Create {
				if a.LocalID == 0 {
					t.Fatalf("id 0 at round %d", i)
				}
				seen[a.LocalID] = true
			}
		}
		st := m.Status()
		ids := map[uint8]bool{}
		for _, s := range st[0].Subflows {
			if s.ID != 0 && ids[s.ID] {
				t.Fatalf("two subflows with id %d", s.ID)
			}
			ids[s.ID] = true
		}
	}
	if len(seen) != 255 {
		t.Errorf("%d distinct ids used over 600 retries", len(seen))
	}
}

func TestStatus(t *testing.T) {
	m := newManager()
	c := established(m, t0, 7)[0]
	st := m.Status()
	if len(st) != 1 || len(st[0].Subflows) != 2 || st[0].Remotes[0] != "10.9.0.2:5000" {
		t.Fatalf("status %+v", st)
	}
	m.Event(t0, Event{Kind: SubPriority, Token: 7, Local: c.Local, Remote: c.Remote, Backup: true})
	for _, s := range m.Status()[0].Subflows {
		if s.Local == c.Local.String() && (s.State != "joining" || s.Backup || !s.PeerBackup || !s.Ours) {
			t.Errorf("subflow %+v", s)
		}
	}
	if (Endpoint{"fd09::1", 80}).String() != "[fd09::1]:80" {
		t.Error("IPv6 endpoint format")
	}
}

// A backup uplink: joins from it carry the backup bit, and the initial subflow, when it uses
// that uplink, is switched to backup once.
func TestBackupUplink(t *testing.T) {
	ups := []Uplink{{Name: "lte", Addr: "10.9.0.1", Backup: true}, {Name: "fibre", Addr: "10.9.1.1"}}
	m := New(Config{Uplinks: ups}, Fullmesh{})
	m.Event(t0, Event{Kind: Created, Token: 1, Local: local0, Remote: remote0})
	got := m.Event(t0, Event{Kind: Established, Token: 1, Local: local0, Remote: remote0})
	if len(got) != 2 || got[0].Kind != SetBackup || !got[0].Backup || got[0].Local != local0 ||
		got[1].Kind != Create || got[1].Backup || got[1].Local.Addr != "10.9.1.1" {
		t.Fatalf("got\n%s", actionsString(got))
	}
	if got := m.Tick(t0.Add(100 * time.Millisecond)); len(got) != 0 {
		t.Errorf("backup set again: %v", got)
	}
	m2 := New(Config{Uplinks: []Uplink{{Addr: "10.9.0.1"}, {Addr: "10.9.1.1", Backup: true}}}, Fullmesh{})
	got = established(m2, t0, 2)
	if len(got) != 1 || got[0].Kind != Create || !got[0].Backup {
		t.Fatalf("join from a backup uplink:\n%s", actionsString(got))
	}
	// Established with the flag: nothing more to do.
	if more := m2.Event(t0, Event{Kind: SubEstablished, Token: 2, Local: got[0].Local, Remote: got[0].Remote}); len(more) != 0 {
		t.Errorf("after the join: %v", more)
	}
}

// A pair of an uplink and a remote that never comes up (an ISP that does not reach the other
// site's address) is joined again at once after its first failure, then after 2, 4, 8...
// JoinTimeouts, at most MaxJoinBackoff; once it has come up, a lost subflow of it is joined
// again without waiting, and so are its failed joins after that.
func TestNeverWorkedPairBacksOff(t *testing.T) {
	m := newManager()
	first := established(m, t0, 1)[0]
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var joining Action // the last join
	creates := func(got []Action) (n int) {
		for _, a := range got {
			if a.Kind == Create {
				n++
				joining = a
				if a.Local.Addr != first.Local.Addr || a.Remote != first.Remote {
					t.Fatalf("create of another pair: %v", a)
				}
			}
		}
		return n
	}
	// First timeout: retried at once, as before.
	if got := m.Tick(at(time.Second)); creates(got) != 1 {
		t.Fatalf("first timeout:\n%s", actionsString(got))
	}
	// The second timeout in a row waits 2 JoinTimeouts, the third 4, the fourth 8, then 16,
	// then MaxJoinBackoff (30 s).
	now := at(2 * time.Second)
	for i, wait := range []time.Duration{2, 4, 8, 16, 30, 30} {
		wait *= time.Second
		got := m.Tick(now)
		if creates(got) != 0 || len(got) != 1 || got[0].Kind != Destroy {
			t.Fatalf("timeout %d:\n%s", i+2, actionsString(got))
		}
		if got := m.Tick(now.Add(wait - time.Millisecond)); len(got) != 0 {
			t.Fatalf("timeout %d: joined %v early:\n%s", i+2, time.Millisecond, actionsString(got))
		}
		if got := m.Tick(now.Add(wait)); creates(got) != 1 {
			t.Fatalf("timeout %d: no join after %v:\n%s", i+2, wait, actionsString(got))
		}
		now = now.Add(wait + time.Second) // when that join times out
	}
	if m.Counters.JoinBackoffs != 6 || m.Counters.JoinTimeouts != 7 {
		t.Errorf("counters %+v", m.Counters)
	}
	// The path comes back: the join made at the end of the last wait comes up.
	up := now.Add(-500 * time.Millisecond)
	m.Event(up, Event{Kind: SubEstablished, Token: 1, Local: joining.Local, Remote: joining.Remote})
	// Lost again: joined after Retry, and its joins that time out now are retried at once.
	closed := up.Add(10 * time.Second)
	m.Event(closed, Event{Kind: SubClosed, Token: 1, Local: joining.Local, Remote: joining.Remote})
	now = closed.Add(250 * time.Millisecond)
	if got := m.Tick(now); creates(got) != 1 {
		t.Fatalf("after the pair worked, lost subflow:\n%s", actionsString(got))
	}
	for i := range 3 {
		now = now.Add(time.Second)
		if got := m.Tick(now); creates(got) != 1 {
			t.Fatalf("after the pair worked, timeout %d:\n%s", i+1, actionsString(got))
		}
	}
	if m.Counters.JoinBackoffs != 6 {
		t.Errorf("a pair that worked backed off: counters %+v", m.Counters)
	}
}

// A reload that shortens the backoff or turns it off applies to a pair already waiting: with
// MaxJoinBackoff cut from 30 s to 3 s, a pair 8 s into its wait is joined at once; with the
// backoff then turned off, it is joined again at its next timeout.
func TestReconfigureAppliesToWaitingPairs(t *testing.T) {
	m := newManager()
	established(m, t0, 1)
	countCreates := func(got []Action) (n int) {
		for _, a := range got {
			if a.Kind == Create {
				n++
			}
		}
		return n
	}
	// Joins time out at 1 s (retried at once), 2 s (wait 2 s), 5 s (wait 4), 10 s (wait 8).
	if got := m.Tick(t0.Add(time.Second)); countCreates(got) != 1 {
		t.Fatalf("first timeout:\n%s", actionsString(got))
	}
	now := t0.Add(2 * time.Second)
	for _, wait := range []time.Duration{2 * time.Second, 4 * time.Second} {
		m.Tick(now)
		if got := m.Tick(now.Add(wait)); countCreates(got) != 1 {
			t.Fatalf("no join after %v:\n%s", wait, actionsString(got))
		}
		now = now.Add(wait + time.Second)
	}
	if got := m.Tick(now); countCreates(got) != 0 || m.Counters.JoinBackoffs != 3 {
		t.Fatalf("at %v: counters %+v:\n%s", now.Sub(t0), m.Counters, actionsString(got))
	}
	waiting := now.Add(5 * time.Second) // 5 s into the 8 s wait
	if got := m.Tick(waiting); countCreates(got) != 0 {
		t.Fatalf("joined during the 8 s wait:\n%s", actionsString(got))
	}
	cfg := m.cfg
	cfg.MaxJoinBackoff = 3 * time.Second
	if err := m.Reconfigure(cfg, Fullmesh{}); err != nil {
		t.Fatal(err)
	}
	if got := m.Tick(waiting.Add(time.Millisecond)); countCreates(got) != 1 {
		t.Fatalf("after join_backoff_max 3 s, a pair 5 s into its wait was not joined:\n%s", actionsString(got))
	}
	// That join times out at 16 s; with the backoff off it is joined again at once.
	cfg.MaxJoinBackoff = -1
	if err := m.Reconfigure(cfg, Fullmesh{}); err != nil {
		t.Fatal(err)
	}
	got := m.Tick(waiting.Add(time.Second + 2*time.Millisecond))
	if countCreates(got) != 1 {
		t.Fatalf("with the backoff off, a failed join was not retried at once:\n%s", actionsString(got))
	}
}

// With MaxJoinBackoff negative (join_backoff_max = 0) a pair that never came up is joined again
// at each JoinTimeout, as before the backoff.
func TestJoinBackoffOff(t *testing.T) {
	m := New(Config{Uplinks: uplinks, MaxJoinBackoff: -1}, Fullmesh{})
	established(m, t0, 1)
	for i := 1; i <= 8; i++ {
		got := m.Tick(t0.Add(time.Duration(i) * time.Second))
		n := 0
		for _, a := range got {
			if a.Kind == Create {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("timeout %d: %d joins, want 1:\n%s", i, n, actionsString(got))
		}
	}
	if m.Counters.JoinBackoffs != 0 {
		t.Errorf("counters %+v", m.Counters)
	}
}
