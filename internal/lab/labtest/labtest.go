// Package labtest brings labs up from tests: it skips with a one-line reason where the machine
// cannot run them, except when BRAID_LAB_REQUIRED=1 (set by CI), where a skip is a failure.
package labtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/netns"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

// Require skips (or fails, under BRAID_LAB_REQUIRED=1) when lab tests cannot run here.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		skip(t, "lab test not run with -short")
	}
	if err := netns.CheckPrivilege(); err != nil {
		skip(t, err.Error())
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		skip(t, "lab needs /dev/net/tun: "+err.Error())
	}
}

// Tool returns the path of the program name when it is installed and runs (name --version).
// Without it the test fails at once under BRAID_LAB_REQUIRED=1; otherwise ok is false and the
// test may run what does not need the program, then call Skip.
func Tool(t testing.TB, name string) (path string, ok bool) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		if out, rerr := exec.Command(path, "--version").CombinedOutput(); rerr != nil {
			err = fmt.Errorf("%s --version: %v: %s", path, rerr, bytes.TrimSpace(out))
		}
	}
	if err != nil {
		if os.Getenv("BRAID_LAB_REQUIRED") == "1" {
			t.Fatalf("BRAID_LAB_REQUIRED=1 but %s cannot run (scripts/deps.sh installs it): %v", name, err)
		}
		return "", false
	}
	return path, true
}

// Skip skips with reason, or fails under BRAID_LAB_REQUIRED=1.
func Skip(t testing.TB, reason string) {
	t.Helper()
	skip(t, reason)
}

func skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("BRAID_LAB_REQUIRED") == "1" {
		t.Fatalf("BRAID_LAB_REQUIRED=1 but the lab cannot run: %s", reason)
	}
	t.Skip(reason)
}

// Up brings up tp for the test and removes it when the test ends, whatever the outcome.
func Up(t testing.TB, tp *topo.Topology) *lab.Lab {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := lab.Up(ctx, tp, lab.Options{})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	return l
}

// Pair is topo.Pair: hosts "a" (10.99.0.1, fd99::1) and "b" (10.99.0.2, fd99::2) joined by one
// link shaped s in both directions.
func Pair(s topo.Shape) *topo.Topology { return topo.Pair(s) }

// Serve runs a traffic server (TCP and UDP) inside host h on addr until stop is called.
func Serve(h *lab.Host, addr string) (stop func(), err error) {
	ln, err := h.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	pc, err := h.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		return nil, err
	}
	srv := traffic.NewServer(ln, pc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx) }()
	return func() { cancel(); srv.Close(); <-done }, nil
}
