// Package netns creates, enters and removes named network namespaces without ever moving a shared
// OS thread: each NS owns one locked OS thread that lives inside the namespace, and work that must
// run there (opening sockets and TUN devices, starting processes) runs on that thread. The thread
// is destroyed, never returned to the scheduler, when the NS is closed. Sockets and file
// descriptors opened that way stay in their namespace for their whole life, whichever thread
// later uses them, and child processes started there get SIGKILL if this process dies.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where named namespaces are bound, as with `ip netns`.
const Dir = "/run/netns"

// ErrPrivilege reports that the process may not create network namespaces.
var ErrPrivilege = errors.New("netns: creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)")

// ErrClosed reports work handed to a closed NS.
var ErrClosed = errors.New("netns: namespace handle closed")

// NS is a named network namespace.
type NS struct {
	Name   string
	handle vns.NsHandle
	nl     *netlink.Handle
	work   chan func()
	done   chan struct{}
	once   sync.Once
}

// CheckPrivilege returns ErrPrivilege when this process cannot create namespaces.
func CheckPrivilege() error {
	if os.Geteuid() != 0 {
		return ErrPrivilege
	}
	var caps unix.CapUserHeader
	caps.Version = unix.LINUX_CAPABILITY_VERSION_3
	var data [2]unix.CapUserData
	if err := unix.Capget(&caps, &data[0]); err != nil {
		return nil // cannot tell; let the real operation report
	}
	const need = 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_NET_ADMIN
	if data[0].Effective&need != need {
		return ErrPrivilege
	}
	return nil
}

// Create makes a new named namespace with its loopback up. It fails if the name exists.
func Create(name string) (*NS, error) {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); err == nil {
		return nil, fmt.Errorf("netns: namespace %q already exists", name)
	}
	ns := &NS{Name: name, work: make(chan func()), done: make(chan struct{})}
	if err := ns.start(func() (vns.NsHandle, error) { return vns.NewNamed(name) }); err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, ErrPrivilege
		}
		return nil, fmt.Errorf("netns: create %s: %w", name, err)
	}
	var err error
	if ns.nl, err = netlink.NewHandleAt(ns.handle); err != nil {
		ns.Close()
		Delete(name)
		return nil, fmt.Errorf("netns: netlink in %s: %w", name, err)
	}
	lo, err := ns.nl.LinkByName("lo")
	if err == nil {
		err = ns.nl.LinkSetUp(lo)
	}
	if err != nil {
		ns.Close()
		Delete(name)
		return nil, fmt.Errorf("netns: loopback in %s: %w", name, err)
	}
	return ns, nil
}

// Open returns the existing named namespace.
func Open(name string) (*NS, error) {
	ns := &NS{Name: name, work: make(chan func()), done: make(chan struct{})}
	err := ns.start(func() (vns.NsHandle, error) {
		h, err := vns.GetFromName(name)
		if err != nil {
			return h, err
		}
		if err := vns.Set(h); err != nil {
			h.Close()
			return vns.None(), err
		}
		return h, nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns: open %s: %w", name, err)
	}
	if ns.nl, err = netlink.NewHandleAt(ns.handle); err != nil {
		ns.Close()
		return nil, fmt.Errorf("netns: netlink in %s: %w", name, err)
	}
	return ns, nil
}

// start runs the namespace's thread: enter moves the locked thread into the namespace and returns
// its handle; the thread then serves Do until Close.
func (ns *NS) start(enter func() (vns.NsHandle, error)) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		h, err := enter()
		if err != nil {
			errc <- err
			return
		}
		ns.handle = h
		errc <- nil
		for {
			select {
			case fn := <-ns.work:
				fn()
			case <-ns.done:
				return
			}
		}
	}()
	return <-errc
}

// Netlink returns a netlink handle bound to the namespace.
func (ns *NS) Netlink() *netlink.Handle { return ns.nl }

// Do runs fn on the namespace's own thread. Sockets, TUN devices and child processes created by
// fn belong to the namespace. Calls are serialised; fn must not call Do.
func (ns *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	select {
	case ns.work <- func() { errc <- fn() }:
		return <-errc
	case <-ns.done:
		return ErrClosed
	}
}

// Spawn runs fn on a new OS thread that enters the namespace and is destroyed when fn returns.
// Unlike Do, calls run in parallel: use it for work that waits, such as dialling a connection.
func (ns *NS) Spawn(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := vns.Set(ns.handle); err != nil {
			errc <- fmt.Errorf("netns: enter %s: %w", ns.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Sysctl writes a value under /proc/sys/net (e.g. "ipv4/ip_forward") inside the namespace.
func (ns *NS) Sysctl(key, value string) error {
	return ns.Do(func() error {
		// /proc/sys/net resolves to the namespace of the thread that opens the file.
		p := "/proc/sys/net/" + key
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("netns: sysctl net/%s in %s: %w", key, ns.Name, err)
		}
		return nil
	})
}

// Close releases the handles and ends the namespace's thread (processes started with
// Pdeathsig from it then get their signal); the namespace itself stays until Delete.
// Idempotent.
func (ns *NS) Close() {
	ns.once.Do(func() {
		close(ns.done)
		if ns.nl != nil {
			ns.nl.Close()
		}
		if ns.handle.IsOpen() {
			ns.handle.Close()
		}
	})
}

// Delete unmounts and removes a named namespace; a missing one is not an error.
func Delete(name string) error {
	if _, err := os.Stat(filepath.Join(Dir, name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := vns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns: delete %s: %w", name, err)
	}
	return nil
}

// List returns the names of the named namespaces that start with prefix.
func List(prefix string) ([]string, error) {
	ents, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// PIDs returns the processes whose network namespace is the named one (as `ip netns pids`).
func PIDs(name string) ([]int, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(Dir, name), &st); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	var out []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		var ps unix.Stat_t
		if unix.Stat("/proc/"+p.Name()+"/ns/net", &ps) != nil {
			continue
		}
		if ps.Dev == st.Dev && ps.Ino == st.Ino {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Handle is the namespace's file descriptor, for moving interfaces into it. It stays valid
// until Close.
func (ns *NS) Handle() int { return int(ns.handle) }
