package labtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPUTimes is the host's CPU time counters at one moment: the fields of /proc/stat's "cpu"
// line (user, nice, system, idle, iowait, irq, softirq, steal, ...), in clock ticks. A lab test
// that measures a rate takes one before and one after, and logs what the host did meanwhile
// (CPUTimes.Since): on a virtual machine the hypervisor can take a quarter of the time away
// (steal), and a rate measured then says more about the host than about the code.
type CPUTimes []uint64

// ReadCPU returns the counters now; nil if /proc/stat cannot be read (Since then says so).
func ReadCPU() CPUTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return nil
	}
	out := make(CPUTimes, 0, len(f)-1)
	for _, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// Since describes how the host's CPUs spent the time from before to c, as shares of all of
// it: "host CPU: user 8 %, system 24 %, idle 67 %, steal 1 %".
func (c CPUTimes) Since(before CPUTimes) string {
	d, total, ok := c.delta(before)
	if !ok {
		return "host CPU: unknown (no /proc/stat)"
	}
	if total == 0 {
		return "host CPU: no ticks counted"
	}
	pct := func(v float64) float64 { return 100 * v / total }
	return fmt.Sprintf("host CPU: user %.0f %%, system %.0f %%, idle %.0f %%, steal %.0f %%",
		pct(d[0]+d[1]), pct(d[2]+d[5]+d[6]), pct(d[3]+d[4]), pct(d[7]))
}

// StealSince is the share (0 to 1) of the host's CPU time from before to c that the hypervisor
// took (steal); 0 when it cannot be told.
func (c CPUTimes) StealSince(before CPUTimes) float64 {
	d, total, ok := c.delta(before)
	if !ok || total == 0 {
		return 0
	}
	return d[7] / total
}

// delta returns the first eight counters' increase from before to c and their sum (guest time
// is already counted in user and nice); ok is false when either has fewer than eight.
func (c CPUTimes) delta(before CPUTimes) (d [8]float64, total float64, ok bool) {
	if len(c) < 8 || len(before) < 8 {
		return d, 0, false
	}
	for i := range d {
		if c[i] < before[i] {
			continue
		}
		d[i] = float64(c[i] - before[i])
		total += d[i]
	}
	return d, total, true
}
