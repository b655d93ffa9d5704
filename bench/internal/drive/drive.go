// Package drive holds what the benchmark drivers share: `braid traffic` run as processes inside
// lab hosts (so that their CPU time is their own), one instrument for every CPU figure, the
// kernel's counters of a host, the commit a section ran on, and exits that remove every lab
// first.
package drive

import (
	"bytes"
	"context"
	"encoding/json"
	"log"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"braid/internal/lab"
	"braid/internal/traffic"
)

// Proc is a process started in a lab host.
type Proc struct{ Cmd *exec.Cmd }

// Pid is the process's id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop ends the process and waits for it.
func (p *Proc) Stop() { p.Cmd.Process.Signal(syscall.SIGTERM); p.Cmd.Wait() }

// Server runs `braid traffic serve` on host b, listening for TCP and UDP on addr, with the
// further arguments args (such as "--cc", "cubic").
func Server(l *lab.Lab, braid, addr string, args ...string) *Proc {
	srv := exec.Command(braid, append([]string{"traffic", "serve", "--listen", addr, "--udp", addr}, args...)...)
	if err := l.Host("b").Start(srv); err != nil {
		Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	return &Proc{Cmd: srv}
}

// Bulk runs one `braid traffic bulk` from host a to addr for dur.
func Bulk(ctx context.Context, l *lab.Lab, braid, addr string, dur time.Duration) traffic.BulkResult {
	res, _ := BulkCPU(ctx, l, braid, addr, dur)
	return res
}

// BulkCPU is Bulk that also returns the client process's CPU time (ExitedCPU).
func BulkCPU(ctx context.Context, l *lab.Lab, braid, addr string, dur time.Duration) (traffic.BulkResult, time.Duration) {
	var res traffic.BulkResult
	args := []string{"traffic", "bulk", addr, "--duration", dur.String(), "--json"}
	cmd := exec.CommandContext(ctx, braid, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := l.Host("a").Start(cmd); err != nil {
		Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		Fatalf("braid %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		Fatalf("braid %s: %v: %q", strings.Join(args, " "), err, out.String())
	}
	return res, ExitedCPU(cmd.ProcessState)
}

// RunJSON runs braid with args on host a and decodes what it prints into v.
func RunJSON(ctx context.Context, l *lab.Lab, braid string, v any, args ...string) {
	out, err := l.Host("a").Run(ctx, braid, args...)
	if err != nil {
		Fatalf("braid %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		Fatalf("braid %s: %v: %q", strings.Join(args, " "), err, out)
	}
}

// SNMP returns the named counter of a protocol line ("Udp", "Tcp") of /proc/net/snmp in host
// h's namespace.
func SNMP(ctx context.Context, l *lab.Lab, h, proto, name string) uint64 {
	out, err := l.Host(h).Run(ctx, "cat", "/proc/net/snmp")
	if err != nil {
		Fatalf("snmp: %v", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == name && i < len(f) {
				v, _ := strconv.ParseUint(f[i], 10, 64)
				return v
			}
		}
	}
	Fatalf("no %s %s in /proc/net/snmp", proto, name)
	return 0
}

// Fatal and Fatalf remove every lab of this process before exiting, so a failed run leaves
// nothing behind (log.Fatal would skip the deferred Close calls).
func Fatal(v ...any) {
	lab.CloseAll()
	log.Fatal(v...)
}

// Fatalf is Fatal with a format.
func Fatalf(format string, v ...any) {
	lab.CloseAll()
	log.Fatalf(format, v...)
}
