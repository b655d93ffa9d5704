package labtest

import (
	"strings"
	"testing"
	"time"
)

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

func TestCPUTimesStealSince(t *testing.T) {
	before := CPUTimes{100, 0, 200, 1000, 0, 0, 0, 10, 0, 0}
	after := CPUTimes{180, 20, 400, 1530, 20, 10, 20, 210, 50, 0}
	if got := after.StealSince(before); got < 0.185 || got > 0.186 { // 200 of 1080 ticks
		t.Errorf("StealSince = %v, want 200/1080", got)
	}
	if got := after.StealSince(nil); got != 0 {
		t.Errorf("StealSince(nil) = %v, want 0", got)
	}
	if got := before.StealSince(before); got != 0 {
		t.Errorf("StealSince(same) = %v, want 0", got)
	}
}

func TestSettleQuietHost(t *testing.T) {
	// On a quiet host settle returns after one sample; on a busy one after max. Either way it
	// says which, and never waits past max by more than a sample.
	start := time.Now()
	got := settle(50*time.Millisecond, 200*time.Millisecond)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("settle took %v, want at most max plus one sample", el)
	}
	if !strings.HasPrefix(got, "quiet again after") && !strings.HasPrefix(got, "still busy after") {
		t.Errorf("settle = %q", got)
	}
}
