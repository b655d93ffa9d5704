package netns_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"braid/internal/lab/labtest"
	"braid/internal/lab/netns"
)

func tempName(t *testing.T) string {
	var b [4]byte
	rand.Read(b[:])
	return "braid-nstest-" + hex.EncodeToString(b[:])
}

func TestNamespaceLife(t *testing.T) {
	labtest.Require(t)
	name := tempName(t)
	ns, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); netns.Delete(name) })
	if _, err := netns.Create(name); err == nil {
		t.Error("a second namespace with the same name was created")
	}
	if names, _ := netns.List("braid-nstest-"); !slices.Contains(names, name) {
		t.Errorf("List does not show %s: %v", name, names)
	}

	// A socket opened inside listens in the namespace only: the host cannot reach it, the
	// namespace's own loopback can.
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("the namespace's listener was reached from the host's namespace")
	}
	if err := ns.Spawn(func() error {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Errorf("dial inside the namespace: %v", err)
	}

	// A process started on the namespace's thread is inside it.
	cmd := exec.Command("sleep", "30")
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	pids, err := netns.PIDs(name)
	cmd.Process.Kill()
	cmd.Wait()
	if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("PIDs(%s) = %v, %v; want it to contain %d", name, pids, err, cmd.Process.Pid)
	}

	hostBefore, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err := ns.Sysctl("ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	other, err := netns.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	var fwd []byte
	other.Do(func() (err error) { fwd, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward"); return })
	other.Close()
	if strings.TrimSpace(string(fwd)) != "1" {
		t.Errorf("ip_forward read through Open is %q, want 1", fwd)
	}
	if hostAfter, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(hostAfter) != string(hostBefore) {
		t.Errorf("the namespace's sysctl changed the host's ip_forward: %q -> %q", hostBefore, hostAfter)
	}

	ns.Close()
	ns.Close() // idempotent
	if err := ns.Do(func() error { return nil }); !errors.Is(err, netns.ErrClosed) {
		t.Errorf("Do after Close: %v, want ErrClosed", err)
	}
	if err := netns.Delete(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(netns.Dir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace file left after Delete: %v", err)
	}
	if err := netns.Delete(name); err != nil {
		t.Errorf("deleting a missing namespace: %v", err)
	}
	if _, err := netns.Open(name); err == nil {
		t.Error("Open of a deleted namespace succeeded")
	}
}
