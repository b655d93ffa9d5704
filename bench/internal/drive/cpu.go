package drive

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Every CPU figure of the benchmarks is measured with one instrument, on the baseline's side as
// on braid's: the user and system time the kernel accounts to each process that does the
// side's work (all its threads), summed. A live process is read from /proc/PID/stat, one that
// has exited from its rusage (os.ProcessState); both are the kernel's per-process CPU time.
// Never machine-wide busy time: it counts the other work of a shared machine, and on this
// machine /proc/stat's busy time read lower than one process's own CPU time over the same
// interval, so the two cannot be set side by side.

// ProcCPU returns the user and system time process pid has used so far, every thread counted;
// 0 if it is gone.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return statCPU(string(b))
}

// statCPU is utime + stime of a /proc/PID/stat line (fields 14 and 15 of proc(5), in clock
// ticks: USER_HZ, 100 on Linux); 0 if the line is malformed.
func statCPU(s string) time.Duration {
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces and parentheses
	if i < 0 || i+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * time.Second / 100
}

// ExitedCPU is the user and system time of a process that has exited and been waited for.
func ExitedCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// Side is the set of live processes that do one side's work in a comparison.
type Side []int

// CPU returns the sum of the processes' CPU time so far.
func (s Side) CPU() time.Duration {
	var t time.Duration
	for _, pid := range s {
		t += ProcCPU(pid)
	}
	return t
}

// Cores is CPU time spent over a wall time, in cores.
func Cores(cpu time.Duration, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return cpu.Seconds() / wall.Seconds()
}
