package lab

import (
	"slices"
	"testing"
	"time"
)

func ids(sts []State) []string {
	var out []string
	for _, st := range sts {
		out = append(out, st.ID)
	}
	return out
}

// By default lab down takes what dead runs left and the caller's last `braid lab up` lab,
// never a lab of another running process.
func TestDownPlan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	all := []State{
		{ID: "dead01", PID: 1, UID: 0, Started: t0},
		{ID: "up0old", PID: 2, UID: 0, Control: "/run/braid/lab/up0old.sock", Started: t0.Add(time.Minute)},
		{ID: "up0new", PID: 3, UID: 0, Control: "/run/braid/lab/up0new.sock", Started: t0.Add(2 * time.Minute)},
		{ID: "test00", PID: 4, UID: 0, Started: t0.Add(3 * time.Minute)}, // a test's or a demo's lab: no control socket
		{ID: "up1000", PID: 5, UID: 1000, Control: "/run/braid/lab/up1000.sock", Started: t0.Add(4 * time.Minute)},
	}
	alive := func(st State) bool { return st.PID != 1 }
	for _, c := range []struct {
		name              string
		o                 DownOptions
		stop, reap, leave []string
	}{
		{"default", DownOptions{UID: 0}, []string{"up0new"}, []string{"dead01"}, []string{"up0old", "test00", "up1000"}},
		{"default, other user", DownOptions{UID: 1000}, []string{"up1000"}, []string{"dead01"}, []string{"up0old", "up0new", "test00"}},
		{"default, no lab up of this user", DownOptions{UID: 7}, nil, []string{"dead01"}, []string{"up0old", "up0new", "test00", "up1000"}},
		{"--lab of a running test", DownOptions{ID: "test00"}, []string{"test00"}, nil, nil},
		{"--lab of a dead run", DownOptions{ID: "dead01"}, nil, []string{"dead01"}, nil},
		{"--all", DownOptions{All: true}, []string{"up0old", "up0new", "test00", "up1000"}, []string{"dead01"}, nil},
	} {
		stop, reap, leave := downPlan(all, c.o, alive)
		if !slices.Equal(ids(stop), c.stop) || !slices.Equal(ids(reap), c.reap) || !slices.Equal(ids(leave), c.leave) {
			t.Errorf("%s: stop %v reap %v leave %v; want %v %v %v", c.name, ids(stop), ids(reap), ids(leave), c.stop, c.reap, c.leave)
		}
	}
}

func TestLabIDOf(t *testing.T) {
	for ns, want := range map[string]string{
		"braid-3fa9c1-h1":      "3fa9c1",
		"braid-3fa9c1-core-2":  "3fa9c1",
		"braid-nstest-0a1b2c3": "",
		"braid-3FA9C1-h1":      "",
		"other-3fa9c1-h1":      "",
		"braid-3fa9c1":         "",
	} {
		if got := labIDOf(ns); got != want {
			t.Errorf("labIDOf(%q) = %q, want %q", ns, got, want)
		}
	}
}
