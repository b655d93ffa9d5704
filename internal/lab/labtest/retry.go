package labtest

import (
	"fmt"
	"testing"
)

// Tries is how many times Measure measures at most.
const Tries = 3

// Measure runs measure up to Tries times, until one returns no missed bound, each logged with
// the host's CPU shares over it; when every one misses, it reports every miss as an error. For
// lab tests that bound a rate or a delay: the lab delays packets in user space, and on a virtual
// machine the hypervisor can take a quarter of the CPU for seconds (steal), which slows one
// measurement, not every one; a fault in the code misses every time. measure gets the
// measurement's number (from 1) and returns the bounds it missed.
func Measure(t testing.TB, measure func(try int) []string) {
	t.Helper()
	var missed []string
	for try := 1; try <= Tries; try++ {
		cpu := ReadCPU()
		m := measure(try)
		host := ReadCPU().Since(cpu)
		t.Logf("measurement %d: %s", try, host)
		if len(m) == 0 {
			return
		}
		for _, s := range m {
			missed = append(missed, fmt.Sprintf("measurement %d (%s): %s", try, host, s))
		}
	}
	for _, s := range missed {
		t.Error(s)
	}
}
