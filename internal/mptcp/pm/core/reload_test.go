package core

import (
	"errors"
	"testing"
	"time"
)

// TestReconfigure: a reload keeps the connections and their subflows; the next tick signals a
// changed backup flag on the subflow that exists (no destroy, no create); other uplinks are
// refused.
func TestReconfigure(t *testing.T) {
	m := newManager()
	got := established(m, t0, 1)
	if len(got) != 1 || got[0].Kind != Create {
		t.Fatalf("got\n%s", actionsString(got))
	}
	join := got[0]
	m.Event(t0, Event{Kind: SubEstablished, Token: 1, Local: join.Local, Remote: join.Remote})
	if got := m.Tick(t0.Add(100 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("before the reload:\n%s", actionsString(got))
	}
	backup := []Uplink{uplinks[0], {Name: "isp2", Addr: "10.9.1.1", Backup: true}}
	if err := m.Reconfigure(Config{Uplinks: backup, JoinTimeout: 2 * time.Second, PortSpan: 10}, Fullmesh{}); err != nil {
		t.Fatal(err)
	}
	got = m.Tick(t0.Add(200 * time.Millisecond))
	if len(got) != 1 || got[0].Kind != SetBackup || !got[0].Backup || got[0].Local != join.Local {
		t.Fatalf("after making isp2 backup:\n%s", actionsString(got))
	}
	if st := m.Status(); len(st) != 1 || len(st[0].Subflows) != 2 || m.Counters.Destroys != 0 || m.Counters.Creates != 1 {
		t.Errorf("the connection changed: %+v, counters %+v", st, m.Counters)
	}
	if c := m.Config(); c.JoinTimeout != 2*time.Second || c.DeadAfter != time.Second || m.nextPort >= c.PortSpan {
		t.Errorf("config %+v, next port %d", c, m.nextPort)
	}
	other := []Uplink{uplinks[0], {Name: "isp3", Addr: "10.9.2.1"}}
	if err := m.Reconfigure(Config{Uplinks: other}, Fullmesh{}); !errors.Is(err, ErrUplinks) {
		t.Errorf("other uplinks: %v", err)
	}
	if err := m.Reconfigure(Config{Uplinks: uplinks[:1]}, Fullmesh{}); !errors.Is(err, ErrUplinks) {
		t.Errorf("fewer uplinks: %v", err)
	}
}
