package gothreads

import (
	"io"
	"log/slog"
	"testing"
)

// fake is a controller over a recorded GOMAXPROCS.
func fake(t *testing.T, setting, max int, env bool) (*Controller, *[]int) {
	t.Helper()
	var calls []int
	c := newController(setting, max, env, func(n int) { calls = append(calls, n) }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return c, &calls
}

func feed(c *Controller, busy ...float64) {
	for _, b := range busy {
		c.Sample(b)
	}
}

func TestThreadsAutoStartsAtOne(t *testing.T) {
	c, calls := fake(t, 0, 4, false)
	if st := c.Status(); st.Threads != 1 || st.Setting != "auto" || st.Max != 4 {
		t.Fatalf("status %+v, want 1 thread of at most 4, auto", st)
	}
	if len(*calls) != 1 || (*calls)[0] != 1 {
		t.Fatalf("GOMAXPROCS set to %v, want [1]", *calls)
	}
}

func TestThreadsAutoRaisesWhenOneThreadIsSaturated(t *testing.T) {
	c, calls := fake(t, 0, 4, false)
	// one sample at a core is a burst, not a saturated thread
	feed(c, 0.95, 0.5, 0.95, 0.89)
	if n := c.Status().Threads; n != 1 {
		t.Fatalf("after single samples above %.2f: %d threads, want 1", RaiseAt, n)
	}
	feed(c, 0.92, 1.01)
	st := c.Status()
	if st.Threads != 4 || st.Changes != 1 {
		t.Fatalf("after %d samples in a row at a core: %+v, want 4 threads and one change", RaiseAfter, st)
	}
	if got := (*calls)[len(*calls)-1]; got != 4 {
		t.Fatalf("GOMAXPROCS last set to %d, want 4", got)
	}
}

func TestThreadsAutoLowersOnlyAfterAQuietWhile(t *testing.T) {
	c, _ := fake(t, 0, 2, false)
	feed(c, 1, 1)
	if n := c.Status().Threads; n != 2 {
		t.Fatalf("%d threads, want 2", n)
	}
	// between the bounds: stays
	for range 3 * LowerAfter {
		c.Sample(0.75)
	}
	if n := c.Status().Threads; n != 2 {
		t.Fatalf("at 0.75 of a core: %d threads, want it to stay at 2", n)
	}
	// quiet, but interrupted once before LowerAfter samples
	for range LowerAfter - 1 {
		c.Sample(0.1)
	}
	c.Sample(0.7)
	for range LowerAfter - 1 {
		c.Sample(0.1)
	}
	if n := c.Status().Threads; n != 2 {
		t.Fatalf("quiet for %d samples, interrupted: %d threads, want 2", LowerAfter-1, n)
	}
	c.Sample(0.1)
	if st := c.Status(); st.Threads != 1 || st.Changes != 2 {
		t.Fatalf("quiet for %d samples in a row: %+v, want 1 thread, two changes", LowerAfter, st)
	}
}

func TestThreadsFixedSettingIsKept(t *testing.T) {
	c, calls := fake(t, 3, 2, false)
	feed(c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2)
	if st := c.Status(); st.Threads != 3 || st.Setting != "3" || st.Changes != 0 {
		t.Fatalf("threads = 3: %+v", st)
	}
	if len(*calls) != 1 || (*calls)[0] != 3 {
		t.Fatalf("GOMAXPROCS set to %v, want [3]", *calls)
	}
	// a reload back to auto starts from one thread
	c.Set(0)
	if n := c.Status().Threads; n != 1 {
		t.Fatalf("reloaded to auto: %d threads, want 1", n)
	}
}

func TestThreadsAutoLeavesTheEnvironmentsCount(t *testing.T) {
	c, calls := fake(t, 0, 3, true)
	feed(c, 2, 2, 2, 0, 0)
	if st := c.Status(); st.Threads != 3 || st.Setting != "environment" {
		t.Fatalf("GOMAXPROCS=3 in the environment: %+v", st)
	}
	if len(*calls) != 0 {
		t.Fatalf("GOMAXPROCS changed to %v, want untouched", *calls)
	}
	// a count from the file wins; a reload without it goes back to the environment's
	c.Set(1)
	c.Set(0)
	if st := c.Status(); st.Threads != 3 || st.Setting != "environment" || (*calls)[len(*calls)-1] != 3 {
		t.Fatalf("threads = 1, then 0, with GOMAXPROCS=3 in the environment: %+v, GOMAXPROCS set to %v", st, *calls)
	}
}

func TestThreadsAutoOnOneCPU(t *testing.T) {
	c, _ := fake(t, 0, 1, false)
	feed(c, 1, 1, 1, 1)
	if n := c.Status().Threads; n != 1 {
		t.Fatalf("one CPU: %d threads", n)
	}
}
