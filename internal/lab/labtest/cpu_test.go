package labtest

import "testing"

func TestCPUTimesSince(t *testing.T) {
	before := CPUTimes{100, 0, 200, 1000, 0, 0, 0, 10, 0, 0}
	after := CPUTimes{180, 20, 400, 1530, 20, 10, 20, 210, 50, 0}
	// 100 user+nice, 230 system+irq+softirq, 550 idle+iowait, 200 steal: 1080 ticks.
	if got, want := after.Since(before), "host CPU: user 9 %, system 21 %, idle 51 %, steal 19 %"; got != want {
		t.Errorf("Since = %q, want %q", got, want)
	}
	if got := after.Since(nil); got != "host CPU: unknown (no /proc/stat)" {
		t.Errorf("Since(nil) = %q", got)
	}
	if got := before.Since(before); got != "host CPU: no ticks counted" {
		t.Errorf("Since(same) = %q", got)
	}
	if c := ReadCPU(); len(c) < 8 {
		t.Errorf("ReadCPU() = %v: want the 8 or more counters of /proc/stat", c)
	}
}
