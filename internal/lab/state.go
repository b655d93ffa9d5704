package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"braid/internal/lab/netns"
)

// StateDir holds one file per running lab, so that a later run (or `braid lab down`) can find and
// remove what a killed run left behind.
const StateDir = "/run/braid/lab"

// State is what a running lab records about itself.
type State struct {
	ID         string    `json:"id"`
	Topology   string    `json:"topology"`
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"`
	Namespaces []string  `json:"namespaces"`
	Hosts      []string  `json:"hosts"`
	Control    string    `json:"control,omitempty"` // unix socket of `braid lab up`, if any
}

// Alive reports whether the lab's owner process is still running.
func (st State) Alive() bool { return processAlive(st.PID) }

func statePath(id string) string { return filepath.Join(StateDir, id+".json") }

// ControlPath is where `braid lab up` listens for `braid lab link` requests.
func ControlPath(id string) string { return filepath.Join(StateDir, id+".sock") }

func writeState(l *Lab) error {
	st := State{ID: l.ID, Topology: l.Topo.Name, PID: os.Getpid(), Started: time.Now()}
	for _, h := range l.Topo.Hosts {
		st.Hosts = append(st.Hosts, h.Name)
		st.Namespaces = append(st.Namespaces, l.nsName(h.Name))
	}
	return saveState(st)
}

func saveState(st State) error {
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return fmt.Errorf("lab: state: %w", err)
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	tmp := statePath(st.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("lab: state: %w", err)
	}
	return os.Rename(tmp, statePath(st.ID))
}

// SetControl records the control socket of a running lab.
func (l *Lab) SetControl(path string) error {
	st, err := ReadState(l.ID)
	if err != nil {
		return err
	}
	st.Control = path
	return saveState(st)
}

func removeState(id string) {
	os.Remove(statePath(id))
	os.Remove(ControlPath(id))
}

// ReadState returns the state of the lab with the given ID.
func ReadState(id string) (State, error) {
	var st State
	b, err := os.ReadFile(statePath(id))
	if err != nil {
		return st, fmt.Errorf("lab: no running lab %q: %w", id, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("lab: state of %s: %w", id, err)
	}
	return st, nil
}

// Running returns the state of every lab whose owner process is alive.
func Running() ([]State, error) {
	all, err := states()
	var out []State
	for _, st := range all {
		if processAlive(st.PID) {
			out = append(out, st)
		}
	}
	return out, err
}

func states() ([]State, error) {
	ents, err := os.ReadDir(StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	var out []State
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		st, err := ReadState(id)
		if err != nil {
			os.Remove(statePath(id)) // unreadable: a write cut short
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// ReapStale removes the labs whose owner process has died (killed, or crashed): their processes,
// namespaces and state. Labs of live processes are left alone, so concurrent runs are safe.
func ReapStale(log *slog.Logger) int {
	all, _ := states()
	n := 0
	for _, st := range all {
		if processAlive(st.PID) {
			continue
		}
		reap(st, log)
		n++
	}
	return n
}

func reap(st State, log *slog.Logger) {
	for _, ns := range st.Namespaces {
		killNamespace(ns)
		netns.Delete(ns)
	}
	removeState(st.ID)
	if log != nil {
		log.Info("removed a lab left behind", "id", st.ID, "topology", st.Topology, "pid", st.PID)
	}
}

// DownReport says what Down removed.
type DownReport struct {
	Stopped    []State  // running labs asked to stop
	Reaped     []State  // labs whose owner had died
	Namespaces []string // stray namespaces removed
}

// Down removes every lab on this machine, or only the lab id when id is not empty: it asks running
// owners to stop (SIGTERM, then SIGKILL after wait), removes what dead owners left, and deletes
// any namespace named braid-* (braid-<id>-*) that no lab claims, killing the processes inside.
// This is `braid lab down`.
func Down(id string, wait time.Duration, log *slog.Logger) (DownReport, error) {
	var rep DownReport
	all, err := states()
	if err != nil {
		return rep, err
	}
	self := os.Getpid()
	for _, st := range all {
		if id != "" && st.ID != id {
			continue
		}
		if st.PID == self || !processAlive(st.PID) {
			rep.Reaped = append(rep.Reaped, st)
			reap(st, log)
			continue
		}
		syscall.Kill(st.PID, syscall.SIGTERM)
		deadline := time.Now().Add(wait)
		for processAlive(st.PID) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if processAlive(st.PID) {
			syscall.Kill(st.PID, syscall.SIGKILL)
			time.Sleep(100 * time.Millisecond)
		}
		rep.Stopped = append(rep.Stopped, st)
		reap(st, log) // whatever the owner did not remove itself
	}
	prefix := NamePrefix
	if id != "" {
		prefix += id + "-"
	}
	names, err := netns.List(prefix)
	if err != nil {
		return rep, err
	}
	if running, _ := Running(); len(running) == 0 {
		logs, _ := filepath.Glob(filepath.Join(StateDir, "up-*.log")) // of `braid lab up --detach`
		for _, f := range logs {
			os.Remove(f)
		}
	}
	var errs []error
	for _, n := range names {
		killNamespace(n)
		if err := netns.Delete(n); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Namespaces = append(rep.Namespaces, n)
	}
	return rep, errors.Join(errs...)
}
