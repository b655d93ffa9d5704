package kit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"braid/internal/lab"
)

// WaitReachable waits up to 15 s until a TCP connection attempt from h to addr is answered:
// accepted, or refused by the host (which proves the path there and back works).
func WaitReachable(ctx context.Context, h *lab.Host, addr string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := h.Dial(dctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("scenario: %s not reachable through the tunnel within 15 s", addr)
}

// ProcCPU returns the user and system CPU time of a process so far.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// MachineBusy is the machine's busy CPU time so far (every CPU's time but idle and iowait, from
// /proc/stat's first line). It shows whether what was measured competed with other work for the
// cores; it is no figure of braid's.
func MachineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var busy uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if i != 3 && i != 4 && i < 7 { // idle, iowait; steal and guest are not the machine's work here
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100, true // USER_HZ is 100 on Linux
}
