package scenario

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/tunnel/session"
)

// TunnelPair is `braid tunnel` running as a process on hosts a (side 0) and b (side 1) of a
// ParallelLinks or KernelLinks topology, each from a site file written by SiteFile. Running
// them as processes keeps their CPU time apart from the lab's and the traffic's.
type TunnelPair struct {
	Procs [2]*exec.Cmd
	dir   string
	logs  [2]*os.File
}

// StartTunnelPair generates keys, writes both site files from spec (Side, Own and Peer are
// filled in; Control too when empty), starts `self tunnel --config` on a and b, and waits until
// a's packets reach b through the tunnel over IP version innerVersion (a TCP connection attempt
// to b's inner address is answered, accepted or refused). Close stops the tunnels. args are
// added to each command line, with "{side}" replaced by a or b.
func StartTunnelPair(ctx context.Context, l *lab.Lab, self string, spec SiteSpec, innerVersion int, args ...string) (_ *TunnelPair, err error) {
	dir, err := os.MkdirTemp("", "braid-pair-")
	if err != nil {
		return nil, err
	}
	p := &TunnelPair{dir: dir}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	var keys [2]session.PrivateKey
	for i := range keys {
		if keys[i], err = session.GenerateKey(); err != nil {
			return nil, err
		}
	}
	for i, h := range []string{"a", "b"} {
		s := spec
		s.Side, s.Own, s.Peer = i, keys[i], keys[1-i].Public()
		if s.Control == "" {
			s.Control = filepath.Join(dir, h+".sock")
		}
		file := filepath.Join(dir, h+".toml")
		if err := os.WriteFile(file, SiteFile(s), 0o600); err != nil {
			return nil, err
		}
		if p.logs[i], err = os.Create(filepath.Join(dir, h+".log")); err != nil {
			return nil, err
		}
		cmdArgs := []string{"tunnel", "--config", file}
		for _, a := range args {
			cmdArgs = append(cmdArgs, strings.ReplaceAll(a, "{side}", h))
		}
		cmd := exec.Command(self, cmdArgs...)
		cmd.Stderr = p.logs[i]
		if err := l.Host(h).Start(cmd); err != nil {
			return nil, err
		}
		p.Procs[i] = cmd
	}
	if err := WaitReachable(ctx, l.Host("a"), netip.AddrPortFrom(SiteInner(1, innerVersion), 9).String()); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, p.Logs())
	}
	return p, nil
}

// CPU returns the CPU time (user and system) each tunnel process has used so far.
func (p *TunnelPair) CPU() [2]time.Duration {
	var out [2]time.Duration
	for i, c := range p.Procs {
		if c != nil && c.Process != nil {
			out[i] = ProcCPU(c.Process.Pid)
		}
	}
	return out
}

// Logs returns what both tunnels logged so far.
func (p *TunnelPair) Logs() string {
	var b strings.Builder
	for _, h := range []string{"a", "b"} {
		out, _ := os.ReadFile(filepath.Join(p.dir, h+".log"))
		fmt.Fprintf(&b, "braid tunnel in %s:\n%s", h, out)
	}
	return b.String()
}

// Close stops both tunnels and removes their files.
func (p *TunnelPair) Close() {
	for _, c := range p.Procs {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}
	for _, f := range p.logs {
		if f != nil {
			f.Close()
		}
	}
	os.RemoveAll(p.dir)
}

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

// Median returns the median of v (the upper one of an even count), 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// KernelLinks is ParallelLinks with kernel (veth) links, each limited to its rate (0: none).
func KernelLinks(name string, rates ...uint64) *topo.Topology {
	shapes := make([]topo.Shape, len(rates))
	for i, r := range rates {
		shapes[i] = topo.Shape{Rate: r}
	}
	tp := ParallelLinks(name, shapes...)
	for i := range tp.Links {
		tp.Links[i].Kernel = true
	}
	return tp
}
