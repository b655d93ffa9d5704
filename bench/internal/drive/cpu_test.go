package drive

import (
	"os"
	"syscall"
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	// utime 150, stime 25 ticks; the command name holds a space and a parenthesis.
	line := "4242 (braid (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 9 0 100 0 0"
	if got := statCPU(line); got != 1750*time.Millisecond {
		t.Errorf("statCPU = %v, want 1.75s", got)
	}
	for _, bad := range []string{"", "4242 (braid", "4242 (braid) S 1 2"} {
		if got := statCPU(bad); got != 0 {
			t.Errorf("statCPU(%q) = %v, want 0", bad, got)
		}
	}
}

// The instrument sees a process's own work: after this process has spun for 300 ms of CPU by
// getrusage's count, /proc/self/stat has grown by as much, give or take its 10 ms ticks.
func TestProcCPUCountsWork(t *testing.T) {
	rusage := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, ru0 := ProcCPU(os.Getpid()), rusage()
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for rusage()-ru0 < 300*time.Millisecond && time.Now().Before(deadline) {
		x++
	}
	spun := rusage() - ru0
	if d := ProcCPU(os.Getpid()) - before; d < spun-50*time.Millisecond {
		t.Errorf("ProcCPU grew by %v while getrusage counted %v (x=%d)", d, spun, x)
	}
}
