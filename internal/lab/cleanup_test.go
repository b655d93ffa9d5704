package lab_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/netns"
	"braid/internal/lab/topo"
)

// TestMain lets a test re-run this binary as a process that holds a lab, to be interrupted.
func TestMain(m *testing.M) {
	if os.Getenv("BRAID_LAB_HOLD") == "1" {
		holdLab()
		return
	}
	os.Exit(m.Run())
}

// holdLab brings a lab up, starts a process inside it, reports the namespaces and waits to be
// signalled. It exits by itself after a minute so that nothing can hang.
func holdLab() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, labtest.Pair(topo.Shape{Delay: time.Millisecond}), lab.Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	cmd := exec.Command("sleep", "60")
	if err := l.Host("a").Start(cmd); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Printf("ready %s %d %s\n", l.ID, cmd.Process.Pid, strings.Join(l.Namespaces(), ","))
	<-ctx.Done()
	l.Close()
	os.Exit(3)
}

type heldLab struct {
	cmd     *exec.Cmd
	id      string
	sleeper int
	ns      []string
}

func startHeldLab(t *testing.T) *heldLab {
	t.Helper()
	labtest.Require(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "BRAID_LAB_HOLD=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &heldLab{cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if h.id != "" {
			lab.ReapStale(nil)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	var ns string
	if _, err2 := fmt.Sscanf(line, "ready %s %d %s", &h.id, &h.sleeper, &ns); err != nil || err2 != nil {
		t.Fatalf("lab holder said %q (%v, %v)", line, err, err2)
	}
	h.ns = strings.Split(ns, ",")
	for _, n := range h.ns {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); err != nil {
			t.Fatalf("namespace %s of the held lab is missing: %v", n, err)
		}
	}
	return h
}

func (h *heldLab) wait(t *testing.T) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		h.cmd.Process.Kill()
		t.Fatal("the lab holder did not exit within 20 s of its signal")
		return nil
	}
}

func (h *heldLab) assertGone(t *testing.T) {
	t.Helper()
	for _, n := range h.ns {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still exists (%v)", n, err)
		}
	}
	if _, err := lab.ReadState(h.id); err == nil {
		t.Errorf("state of lab %s still exists", h.id)
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(h.sleeper, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.sleeper)); err == nil && !strings.Contains(string(b), ") Z") {
		t.Errorf("process %d started in the lab is still running", h.sleeper)
	}
}

func TestSIGINTRemovesLab(t *testing.T) {
	h := startHeldLab(t)
	h.cmd.Process.Signal(syscall.SIGINT)
	err := h.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Errorf("the interrupted process should end by SIGINT, got %v", err)
	}
	h.assertGone(t)
}

func TestSIGTERMRemovesLab(t *testing.T) {
	h := startHeldLab(t)
	h.cmd.Process.Signal(syscall.SIGTERM)
	h.wait(t)
	h.assertGone(t)
}

// A run killed outright cannot clean up: its namespaces stay until the next lab (or `braid lab
// down`) finds that their owner is dead.
func TestKilledRunIsReaped(t *testing.T) {
	h := startHeldLab(t)
	h.cmd.Process.Kill()
	h.wait(t)
	for _, n := range h.ns {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); err != nil {
			t.Fatalf("after SIGKILL the namespace %s should still be there to reap: %v", n, err)
		}
	}
	if n := lab.ReapStale(nil); n < 1 {
		t.Errorf("ReapStale removed %d labs, want at least 1", n)
	}
	h.assertGone(t)
}

// A failing test still removes its lab: Cleanup runs on t.Fatal too.
func TestFailedTestRemovesLab(t *testing.T) {
	labtest.Require(t)
	var names []string
	t.Run("fails", func(t *testing.T) {
		ft := &fakeFatal{T: t}
		func() {
			defer func() { recover() }()
			l := labtest.Up(ft, labtest.Pair(topo.Shape{}))
			names = l.Namespaces()
			ft.Fatal("deliberate failure")
		}()
		ft.runCleanups()
	})
	if len(names) == 0 {
		t.Fatal("no lab was built")
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s survived a failed test (%v)", n, err)
		}
	}
}

// fakeFatal records Fatal instead of failing the real test, and runs cleanups on demand.
type fakeFatal struct {
	*testing.T
	cleanups []func()
}

func (f *fakeFatal) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (f *fakeFatal) Fatalf(s string, args ...any) { panic(fmt.Sprintf(s, args...)) }
func (f *fakeFatal) Cleanup(fn func())            { f.cleanups = append(f.cleanups, fn) }
func (f *fakeFatal) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
