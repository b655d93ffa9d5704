// Package lab builds emulated multi-site networks on one machine: every host is a network
// namespace, every link a pair of TUN devices joined by the user-space link emulator (package emu)
// with per-direction rate, delay, jitter, loss and a drop-tail queue. A host can be a NAT router
// (nat.go). Roles run for real inside the hosts, and the built-in traffic tools (package traffic)
// measure them; while they run, events change the network (events.go: interfaces down and up,
// addresses replaced; nat.go: NAT mappings flushed).
//
// Everything a lab creates carries its run ID ("braid-<id>-<host>") and is removed by Close, on
// SIGINT/SIGTERM, and, after a crash, by the next Up or by Down (`braid lab down`).
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"braid/internal/lab/emu"
	"braid/internal/lab/netns"
	"braid/internal/lab/topo"
)

// NamePrefix starts the name of every namespace a lab creates.
const NamePrefix = "braid-"

// EmulatorName says which emulator shapes the links; every printed result states it.
const EmulatorName = "braid user-space TUN delay line"

// Options tune Up.
type Options struct {
	Logger *slog.Logger
	// OwnSignals means the caller handles SIGINT and SIGTERM and closes the lab itself; otherwise
	// the lab removes itself on those signals and the signal is then delivered again.
	OwnSignals bool
	// Seed makes the links' random loss and jitter reproducible; 0 picks one at random.
	Seed uint64
}

// Lab is a running topology.
type Lab struct {
	ID   string
	Topo *topo.Topology
	log  *slog.Logger

	hosts  map[string]*Host
	order  []*Host
	links  []*Link
	byName map[string]*Link

	building sync.Mutex // held by Up while it builds
	mu       sync.Mutex
	procs    []*exec.Cmd
	closed   bool
	once     sync.Once
}

// Host is one namespace of a running lab.
type Host struct {
	Name string
	NS   *netns.NS
	lab  *Lab
	nat  *topo.NAT

	// What the host should have, for Up to restore after a down interface or a new address made
	// the kernel drop some of it: the addresses of each interface and the routes, as the
	// topology declared them and later changed by ReplaceAddr and ReplaceRoute.
	mu     sync.Mutex
	addrs  map[string][]netip.Prefix
	routes []topo.Route
}

// Link is one running emulated link.
type Link struct {
	Spec    topo.Link
	Offload bool        // TSO super-packets pass through (else MTU-sized packets)
	emu     *emu.Link   // an emulated link
	kernel  *kernelLink // or a kernel one (Spec.Kernel)
	hosts   [2]*Host    // of ends A and B
	mu      sync.Mutex
	shape   [2]topo.Shape
}

// Up builds t (normalised in place: default names filled in): namespaces, links, addresses,
// routes. On any error it removes what it made.
func Up(ctx context.Context, t *topo.Topology, o Options) (l *Lab, err error) {
	t.Normalize()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := netns.CheckPrivilege(); err != nil {
		return nil, err
	}
	ReapStale(o.Logger)
	l = &Lab{Topo: t, log: o.Logger, hosts: map[string]*Host{}, byName: map[string]*Link{}}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.ID, err = newID(); err != nil {
		return nil, err
	}
	if err := writeState(l); err != nil {
		return nil, err
	}
	// A signal may close the lab while it is being built: Close waits for the build to end, so
	// that nothing created after its sweep is left behind.
	l.building.Lock()
	register(l, !o.OwnSignals)
	// The lab by its own name: an error return sets the result l to nil before this runs.
	built := l
	defer func() {
		built.building.Unlock()
		if err != nil {
			built.Close()
			l = nil
		}
	}()
	seed := o.Seed
	if seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		for _, c := range b {
			seed = seed<<8 | uint64(c)
		}
	}
	for _, h := range t.Hosts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ns, err := netns.Create(l.nsName(h.Name))
		if err != nil {
			return nil, err
		}
		host := &Host{Name: h.Name, NS: ns, lab: l, nat: h.NAT, addrs: map[string][]netip.Prefix{}, routes: slices.Clone(h.Routes)}
		l.hosts[h.Name] = host
		l.order = append(l.order, host)
		if h.Forward || h.NAT != nil {
			for _, k := range []string{"ipv4/ip_forward", "ipv6/conf/all/forwarding"} {
				if err := ns.Sysctl(k, "1"); err != nil {
					return nil, err
				}
			}
		}
	}
	for i, spec := range t.Links {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		lk, err := l.buildLink(spec, seed+uint64(i)*2)
		if err != nil {
			return nil, fmt.Errorf("lab: link %s: %w", spec.Name, err)
		}
		l.links = append(l.links, lk)
		l.byName[spec.Name] = lk
		lk.hosts = [2]*Host{l.hosts[spec.A.Host], l.hosts[spec.B.Host]}
		for _, ep := range []topo.Endpoint{spec.A, spec.B} {
			l.hosts[ep.Host].addrs[ep.Ifname] = slices.Clone(ep.Addrs)
		}
	}
	for _, h := range t.Hosts {
		if err := l.addRoutes(l.hosts[h.Name], h.Routes); err != nil {
			return nil, fmt.Errorf("lab: host %s: %w", h.Name, err)
		}
	}
	for _, h := range t.Hosts {
		if h.NAT == nil {
			continue
		}
		if err := l.hosts[h.Name].setupNAT(h.NAT); err != nil {
			return nil, fmt.Errorf("lab: host %s: %w", h.Name, err)
		}
	}
	l.log.Info("lab up", "id", l.ID, "topology", t.Name, "hosts", len(t.Hosts), "links", len(t.Links), "emulator", EmulatorName)
	return l, nil
}

func (l *Lab) nsName(host string) string { return NamePrefix + l.ID + "-" + host }

// Host returns the named host, or nil.
func (l *Lab) Host(name string) *Host { return l.hosts[name] }

// Hosts returns the hosts in topology order.
func (l *Lab) Hosts() []*Host { return l.order }

// Links returns the links in topology order.
func (l *Lab) Links() []*Link { return l.links }

// Link returns the named link, or nil.
func (l *Lab) Link(name string) *Link { return l.byName[name] }

// LinkBetween returns the first link between hosts a and b (in either order), and the direction
// index (0 or 1) of traffic from a to b on it.
func (l *Lab) LinkBetween(a, b string) (*Link, int, error) {
	for _, lk := range l.links {
		switch {
		case lk.Spec.A.Host == a && lk.Spec.B.Host == b:
			return lk, 0, nil
		case lk.Spec.A.Host == b && lk.Spec.B.Host == a:
			return lk, 1, nil
		}
	}
	return nil, 0, fmt.Errorf("lab: no link between %s and %s", a, b)
}

// Close stops every process the lab started, stops the links and removes the namespaces. It is
// idempotent and safe to call from a signal handler's goroutine.
func (l *Lab) Close() error {
	var errs []error
	l.once.Do(func() {
		l.building.Lock()
		defer l.building.Unlock()
		l.mu.Lock()
		l.closed = true
		procs := l.procs
		l.mu.Unlock()
		stopProcs(procs)
		for _, lk := range l.links {
			if lk.emu != nil {
				errs = append(errs, lk.emu.Close())
			} // a kernel link goes with its namespaces
		}
		for _, h := range l.order {
			h.NS.Close()
			// A process that outlived stopProcs (started by a process of ours) still holds the
			// namespace's sockets; kill what is left inside.
			killNamespace(h.NS.Name)
			errs = append(errs, netns.Delete(h.NS.Name))
		}
		removeState(l.ID)
		unregister(l)
		l.log.Info("lab down", "id", l.ID)
	})
	return errors.Join(errs...)
}

// Namespaces returns the namespace name of every host, in topology order.
func (l *Lab) Namespaces() []string {
	out := make([]string, 0, len(l.order))
	for _, h := range l.order {
		out = append(out, h.NS.Name)
	}
	return out
}

// Shape returns the current shape of direction dir (0: A to B, 1: B to A).
func (lk *Link) Shape(dir int) topo.Shape {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.shape[dir]
}

// SetShape changes direction dir while traffic flows. A kernel link takes only the rate: it
// has no delay, jitter, loss or queue size to change (ChangeLinks refuses those).
func (lk *Link) SetShape(dir int, s topo.Shape) {
	lk.mu.Lock()
	lk.shape[dir] = s
	lk.mu.Unlock()
	if lk.kernel != nil {
		if err := lk.kernel.setRate(dir, s.Rate); err != nil {
			lk.kernel.log.Error("link rate", "link", lk.Spec.Name, "err", err)
		}
		return
	}
	lk.emu.SetShape(dir, s)
}

// Cut stops all traffic on the link (on an emulated link, packets in flight too).
func (lk *Link) Cut() {
	if lk.kernel != nil {
		lk.kernel.setCut(true)
		return
	}
	lk.emu.SetDown(true)
}

// Restore lets traffic flow again after Cut.
func (lk *Link) Restore() {
	if lk.kernel != nil {
		lk.kernel.setCut(false)
		return
	}
	lk.emu.SetDown(false)
}

// IsCut reports whether the link is cut.
func (lk *Link) IsCut() bool {
	if lk.kernel != nil {
		return lk.kernel.isCut()
	}
	return lk.emu.Down()
}

// Stats returns the counters of direction dir: the emulator's, or for a kernel link the
// sending interface's transmit counters and its qdisc's drops.
func (lk *Link) Stats(dir int) emu.Stats {
	if lk.kernel != nil {
		return lk.kernel.stats(dir)
	}
	return lk.emu.Stats(dir)
}

// Listen opens a listening socket inside the host.
func (h *Host) Listen(network, address string) (ln net.Listener, err error) {
	err = h.NS.Do(func() error {
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet socket inside the host.
func (h *Host) ListenPacket(network, address string) (pc net.PacketConn, err error) {
	err = h.NS.Do(func() error {
		pc, err = net.ListenPacket(network, address)
		return err
	})
	return pc, err
}

// Dial connects from inside the host. Dials run in parallel with each other.
func (h *Host) Dial(ctx context.Context, network, address string) (c net.Conn, err error) {
	err = h.NS.Spawn(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Start starts cmd inside the host. The lab stops it on Close; it is killed if this process dies.
func (h *Host) Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL // tied to the namespace's thread, which lives until Close
	cmd.SysProcAttr.Setpgid = true
	h.lab.mu.Lock()
	defer h.lab.mu.Unlock()
	if h.lab.closed {
		return errors.New("lab: closed")
	}
	if err := h.NS.Do(cmd.Start); err != nil {
		return fmt.Errorf("lab: start %s in %s: %w", cmd.Path, h.Name, err)
	}
	h.lab.procs = append(h.lab.procs, cmd)
	return nil
}

// Run runs a command inside the host and returns its combined output.
func (h *Host) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out safeBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := h.Start(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return out.Bytes(), err
}

// stopProcs sends SIGTERM to each process group, waits up to 3 s, then kills what is left.
func stopProcs(procs []*exec.Cmd) {
	for _, c := range procs {
		if c.Process != nil && c.ProcessState == nil {
			syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for _, c := range procs {
		if c.Process == nil {
			continue
		}
		for time.Now().Before(deadline) && processAlive(c.Process.Pid) {
			time.Sleep(20 * time.Millisecond)
		}
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the parenthesised command name
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z'
		}
	}
	return true
}

// killNamespace kills every process left inside a namespace.
func killNamespace(name string) {
	pids, _ := netns.PIDs(name)
	self := os.Getpid()
	for _, pid := range pids {
		if pid != self {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func newID() (string, error) {
	for range 16 {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("lab: %w", err)
		}
		id := hex.EncodeToString(b[:])
		if names, _ := netns.List(NamePrefix + id + "-"); len(names) == 0 {
			return id, nil
		}
	}
	return "", errors.New("lab: no free run ID")
}
