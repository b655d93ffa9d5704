package lab_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/netns"
)

// `braid lab down` without --lab or --all removes what a killed run left behind and leaves the
// lab of a running process alone, saying so; --lab then removes that one.
func TestDownLeavesRunningLabs(t *testing.T) {
	live := startHeldLab(t)
	dead := startHeldLab(t)
	dead.cmd.Process.Kill()
	dead.wait(t)
	// UID -1: no user's `braid lab up` lab is the caller's, so that this test never stops a lab
	// someone else runs on the machine; which lab the default picks is TestDownPlan's.
	rep, err := lab.Down(lab.DownOptions{Wait: 5 * time.Second, UID: -1})
	if err != nil {
		// Down reaps every dead lab on the machine; what it could not remove of a lab other
		// than this test's (a namespace still mounted elsewhere) is not this test's failure.
		if strings.Contains(err.Error(), dead.id) || strings.Contains(err.Error(), live.id) {
			t.Errorf("lab down: %v", err)
		} else {
			t.Logf("lab down, about other labs on this machine: %v", err)
		}
	}
	has := func(sts []lab.State, id string) bool {
		return slices.ContainsFunc(sts, func(st lab.State) bool { return st.ID == id })
	}
	if !has(rep.Reaped, dead.id) {
		t.Errorf("the killed run's lab %s was not reaped: %+v", dead.id, rep)
	}
	dead.assertGone(t)
	if has(rep.Stopped, live.id) || !has(rep.Left, live.id) {
		t.Errorf("the running lab %s was not left alone and listed: %+v", live.id, rep)
	}
	for _, n := range live.ns {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); err != nil {
			t.Errorf("namespace %s of the running lab was removed: %v", n, err)
		}
		if slices.Contains(rep.Namespaces, n) {
			t.Errorf("namespace %s of the running lab reported removed", n)
		}
	}
	if _, err := lab.ReadState(live.id); err != nil {
		t.Errorf("state of the running lab: %v", err)
	}
	if live.cmd.ProcessState != nil || syscall.Kill(live.cmd.Process.Pid, 0) != nil {
		t.Errorf("the running lab's process was stopped")
	}

	rep, err = lab.Down(lab.DownOptions{ID: live.id, Wait: 5 * time.Second})
	if err != nil || !has(rep.Stopped, live.id) {
		t.Errorf("lab down --lab %s: %+v, %v", live.id, rep, err)
	}
	live.wait(t)
	live.assertGone(t)
}
