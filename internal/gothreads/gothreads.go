// Package gothreads sets how many threads run a process's Go code at once (GOMAXPROCS) for a
// tunnel: a number the site file gives, or, by default, one thread while the tunnel's work fits
// on one core and every CPU once it does not.
//
// Why one: a tunnel's goroutines hand packets to each other (the uplink readers, the reorder
// buffer's delivery, the device reader and writer, the timers). With a thread per CPU, a
// goroutine made runnable wakes a second thread on another core: a context switch, and the
// packet's bytes read again from the other core's cache. Over two paths at a few Gbit/s on a
// 2-core machine that cost the receiver 8-16 % more CPU per byte than one path, and one thread
// took it away (docs/tunnel-profile.md, "One thread while a core suffices"). A hub whose peers
// need more than a core gets every CPU as soon as its one thread is saturated.
package gothreads

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// The auto rule (Auto.Step): one thread until the process has used at least RaiseAt of a
// core over RaiseAfter samples in a row, then every CPU; back to one once it has used less
// than LowerAt for LowerAfter samples in a row. The gap between the two bounds keeps a load
// near either from switching back and forth.
const (
	Interval   = 500 * time.Millisecond
	RaiseAt    = 0.9
	RaiseAfter = 2 // one second
	LowerAt    = 0.6
	LowerAfter = 10 // five seconds
)

// Status is what the controller reports.
type Status struct {
	Setting string  `json:"setting"` // "auto", a fixed number, or "environment" (GOMAXPROCS set)
	Threads int     `json:"threads"` // GOMAXPROCS now
	Max     int     `json:"max"`     // what auto raises to: GOMAXPROCS at start (the CPUs, or the cgroup's quota)
	Busy    float64 `json:"busy"`    // cores the process used over the last interval
	Changes uint64  `json:"changes"` // times auto changed the count
}

// Controller applies the setting; Run samples the process's CPU time for the auto rule.
type Controller struct {
	log *slog.Logger
	max int
	env bool // GOMAXPROCS is set in the environment: auto leaves it alone

	// set changes GOMAXPROCS (runtime.GOMAXPROCS; tests replace it)
	set func(n int)

	mu      sync.Mutex
	fixed   int // 0: auto
	auto    Auto
	threads int
	busy    float64
	changes uint64
}

// New applies setting (0: auto, else a fixed count) and returns the controller.
func New(setting int, log *slog.Logger) *Controller {
	return newController(setting, runtime.GOMAXPROCS(0), os.Getenv("GOMAXPROCS") != "", func(n int) { runtime.GOMAXPROCS(n) }, log)
}

// newController is New with the runtime's count at start (max), whether the environment set
// it, and how to change it given.
func newController(setting, max int, env bool, set func(int), log *slog.Logger) *Controller {
	c := &Controller{log: log, max: max, env: env, set: set, threads: max}
	c.Set(setting)
	return c
}

// Set applies a new setting (a reload): 0 auto, which starts again from one thread, else a
// fixed count.
func (c *Controller) Set(setting int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fixed, c.auto = setting, Auto{}
	switch {
	case setting > 0:
		c.apply(setting, "threads set in the site file")
	case c.env:
		// the environment's count (a count from the file before a reload goes)
		c.apply(c.max, "threads = 0 (auto), but GOMAXPROCS is set in the environment: it stays")
	default:
		c.apply(1, "auto: one thread until the tunnel needs more than a core")
	}
}

// apply sets n threads and logs why; c.mu is held.
func (c *Controller) apply(n int, why string, attrs ...any) {
	if n == c.threads {
		return
	}
	c.set(n)
	c.log.Info("Go threads", append([]any{"threads", n, "was", c.threads, "why", why}, attrs...)...)
	c.threads = n
}

// Run samples the process's CPU time every Interval and applies the auto rule until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	lastCPU, lastWall := cpuTime(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			cpu := cpuTime()
			busy := 0.0
			if d := now.Sub(lastWall); d > 0 {
				busy = float64(cpu-lastCPU) / float64(d)
			}
			lastCPU, lastWall = cpu, now
			c.Sample(busy)
		}
	}
}

// Sample applies the auto rule to busy, the cores the process used over the last interval.
func (c *Controller) Sample(busy float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy = busy
	if c.fixed > 0 || c.env || c.max <= 1 {
		return
	}
	if n := c.auto.Step(c.threads, c.max, busy); n != c.threads {
		why := "auto: the tunnel used nearly all of its one thread"
		if n < c.threads {
			why = "auto: the tunnel's work fits on one core again"
		}
		c.apply(n, why, "busy", fmt.Sprintf("%.2f cores", busy))
		c.changes++
	}
}

// Status reports the setting and the count now.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{Setting: "auto", Threads: c.threads, Max: c.max, Busy: c.busy, Changes: c.changes}
	switch {
	case c.fixed > 0:
		s.Setting = fmt.Sprint(c.fixed)
	case c.env:
		s.Setting = "environment"
	}
	return s
}

// Auto is the auto rule's state: how many samples in a row have been above RaiseAt (at one
// thread) or below LowerAt (at more).
type Auto struct{ high, low int }

// Step returns the thread count after a sample of busy cores, at n threads of at most max.
func (a *Auto) Step(n, max int, busy float64) int {
	if n <= 1 {
		a.low = 0
		if busy >= RaiseAt {
			a.high++
		} else {
			a.high = 0
		}
		if a.high >= RaiseAfter {
			a.high = 0
			return max
		}
		return 1
	}
	a.high = 0
	if busy < LowerAt {
		a.low++
	} else {
		a.low = 0
	}
	if a.low >= LowerAfter {
		a.low = 0
		return 1
	}
	return n
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
