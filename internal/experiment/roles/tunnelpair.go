package roles

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/tunnel/session"
)

// TunnelPair is `braid tunnel` running as a process on hosts a (side 0) and b (side 1) of a
// ParallelLinks or KernelLinks topology, each from a site file written by SiteFile. Running
// them as processes keeps their CPU time apart from the lab's and the traffic's.
type TunnelPair struct {
	Procs    [2]*exec.Cmd
	dir      string
	logs     [2]*os.File
	self     string
	controls [2]string
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
	p := &TunnelPair{dir: dir, self: self}
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
		p.controls[i] = s.Control
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
	if err := kit.WaitReachable(ctx, l.Host("a"), netip.AddrPortFrom(SiteInner(1, innerVersion), 9).String()); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, p.Logs())
	}
	return p, nil
}

// CPU returns the CPU time (user and system) each tunnel process has used so far.
func (p *TunnelPair) CPU() [2]time.Duration {
	var out [2]time.Duration
	for i, c := range p.Procs {
		if c != nil && c.Process != nil {
			out[i] = kit.ProcCPU(c.Process.Pid)
		}
	}
	return out
}

// Status returns what `braid status --json` prints for side i's tunnel (0 for a, 1 for b).
func (p *TunnelPair) Status(ctx context.Context, i int) ([]byte, error) {
	out, err := exec.CommandContext(ctx, p.self, "status", "--control", p.controls[i], "--json").Output()
	if err != nil {
		return nil, fmt.Errorf("braid status of side %d: %w", i, err)
	}
	return out, nil
}

// SaveStatus writes what Status returns for both sides to prefix+"a.json" and prefix+"b.json".
func (p *TunnelPair) SaveStatus(ctx context.Context, prefix string) error {
	for i, side := range []string{"a", "b"} {
		st, err := p.Status(ctx, i)
		if err != nil {
			return err
		}
		if err := os.WriteFile(prefix+side+".json", st, 0o644); err != nil {
			return err
		}
	}
	return nil
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

// SiteSpec describes one side of a two-site tunnel between lab hosts a (Side 0) and b (Side 1)
// joined by links whose subnets are 10.9.<i>.0/24 and fd09:<i>::/64 (a is .1/::1, b .2/::2).
type SiteSpec struct {
	Side       int
	Own        session.PrivateKey
	Peer       session.PublicKey
	Paths      int      // links used, from the first
	Outer      int      // 4 or 6: the paths' address family
	Capacities []uint64 // of the uplinks, bit/s, by link (missing or 0: unknown)
	Reorder    *bool    // nil: the default
	Encryption *bool    // nil: the default (on)
	Control    string   // control socket
	Scheduler  string   // "": the default
	Weights    []int    // of the uplinks, by link (missing or 0: the default)
	// ReorderMaxBytes bounds the reorder buffer (0: the default); it is the receive buffer of
	// the buffer-aware schedulers.
	ReorderMaxBytes int
}

// SiteInner returns the tunnel address of a side: 10.255.0.<side+1> or fd00:ff::<side+1>.
func SiteInner(side, version int) netip.Addr {
	if version == 6 {
		return netip.MustParseAddr(fmt.Sprintf("fd00:ff::%d", side+1))
	}
	return netip.MustParseAddr(fmt.Sprintf("10.255.0.%d", side+1))
}

// SiteFile writes the site file of one side.
func SiteFile(s SiteSpec) []byte {
	var b strings.Builder
	other := 1 - s.Side
	fmt.Fprintf(&b, "[tunnel]\nprivate_key = %q\naddress = [\"%s/24\", \"%s/64\"]\n", s.Own.String(), SiteInner(s.Side, 4), SiteInner(s.Side, 6))
	fmt.Fprintf(&b, "control = %q\n", s.Control)
	if s.Reorder != nil {
		fmt.Fprintf(&b, "reorder = %v\n", *s.Reorder)
	}
	if s.Encryption != nil {
		fmt.Fprintf(&b, "encryption = %v\n", *s.Encryption)
	}
	if s.Scheduler != "" {
		fmt.Fprintf(&b, "scheduler = %q\n", s.Scheduler)
	}
	if s.ReorderMaxBytes > 0 {
		fmt.Fprintf(&b, "reorder_max_bytes = %d\n", s.ReorderMaxBytes)
	}
	addr := func(link, side int) string {
		if s.Outer == 6 {
			return fmt.Sprintf("fd09:%d::%d", link, side+1)
		}
		return fmt.Sprintf("10.9.%d.%d", link, side+1)
	}
	for i := range s.Paths {
		fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up%d\"\ninterface = \"eth%d\"\naddress = %q\n", i, i, addr(i, s.Side))
		if i < len(s.Capacities) && s.Capacities[i] > 0 {
			fmt.Fprintf(&b, "capacity = %d\n", s.Capacities[i])
		}
		if i < len(s.Weights) && s.Weights[i] > 0 {
			fmt.Fprintf(&b, "weight = %d\n", s.Weights[i])
		}
	}
	fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"peer\"\npublic_key = %q\nroutes = [\"%s/32\", \"%s/128\"]\n", s.Peer.String(), SiteInner(other, 4), SiteInner(other, 6))
	for i := range s.Paths {
		fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up%d\"\nremote = %q\n", i, netip.AddrPortFrom(netip.MustParseAddr(addr(i, other)), TunnelPort).String())
	}
	return []byte(b.String())
}
