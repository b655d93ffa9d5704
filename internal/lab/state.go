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
	UID        int       `json:"uid"`               // the user who started it
}

// Alive reports whether the lab's owner process is still running.
func (st State) Alive() bool { return processAlive(st.PID) }

func statePath(id string) string { return filepath.Join(StateDir, id+".json") }

// ControlPath is where `braid lab up` listens for `braid lab link` requests.
func ControlPath(id string) string { return filepath.Join(StateDir, id+".sock") }

func writeState(l *Lab) error {
	st := State{ID: l.ID, Topology: l.Topo.Name, PID: os.Getpid(), Started: time.Now(), UID: os.Getuid()}
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

// DownOptions say which labs Down removes.
type DownOptions struct {
	ID   string        // only the lab with this ID, running or not
	All  bool          // every lab on the machine, also those of running processes
	Wait time.Duration // how long a running owner may take to stop before it is killed
	UID  int           // whose last lab the default removes (os.Getuid())
	Log  *slog.Logger
}

// DownReport says what Down removed and what it left.
type DownReport struct {
	Stopped    []State  // running labs asked to stop
	Reaped     []State  // labs whose owner had died
	Namespaces []string // stray namespaces removed
	Left       []State  // running labs left alone
}

// downPlan splits the labs: those to stop (their owner runs), to reap (their owner is gone),
// and to leave. With an ID, only that lab; with All, every lab. By default: every lab whose
// owner is gone, and of the running ones only the last that uid started with `braid lab up`
// (the only labs that outlive the command that made them; they have a control socket), so that
// labs of other running programs (tests, demos, another user's) are never taken away.
func downPlan(all []State, o DownOptions, alive func(State) bool) (stop, reap, leave []State) {
	last := -1
	if o.ID == "" && !o.All {
		for i, st := range all {
			if alive(st) && st.Control != "" && st.UID == o.UID && (last < 0 || st.Started.After(all[last].Started)) {
				last = i
			}
		}
	}
	for i, st := range all {
		switch {
		case o.ID != "" && st.ID != o.ID:
		case !alive(st):
			reap = append(reap, st)
		case o.ID != "" || o.All || i == last:
			stop = append(stop, st)
		default:
			leave = append(leave, st)
		}
	}
	return stop, reap, leave
}

// labIDOf returns the lab ID in a namespace name braid-<id>-<host>, or "" when the name is not
// one a lab makes.
func labIDOf(ns string) string {
	rest, ok := strings.CutPrefix(ns, NamePrefix)
	if !ok {
		return ""
	}
	id, _, ok := strings.Cut(rest, "-")
	if !ok || len(id) != 6 || strings.Trim(id, "0123456789abcdef") != "" {
		return ""
	}
	return id
}

// Down removes labs and says what it removed and left (`braid lab down`): it asks running
// owners to stop (SIGTERM, then SIGKILL after o.Wait), removes what dead owners left, and deletes
// the namespaces of labs that no state file claims (a run killed while it started), killing the
// processes inside. Which labs: see downPlan; by default no lab of a running process is touched
// but the caller's last `braid lab up`.
func Down(o DownOptions) (DownReport, error) {
	var rep DownReport
	all, err := states()
	if err != nil {
		return rep, err
	}
	self := os.Getpid()
	alive := func(st State) bool { return st.PID != self && processAlive(st.PID) }
	stop, dead, leave := downPlan(all, o, alive)
	rep.Left = leave
	for _, st := range dead {
		rep.Reaped = append(rep.Reaped, st)
		reap(st, o.Log)
	}
	for _, st := range stop {
		syscall.Kill(st.PID, syscall.SIGTERM)
		deadline := time.Now().Add(o.Wait)
		for processAlive(st.PID) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if processAlive(st.PID) {
			syscall.Kill(st.PID, syscall.SIGKILL)
			time.Sleep(100 * time.Millisecond)
		}
		rep.Stopped = append(rep.Stopped, st)
		reap(st, o.Log) // whatever the owner did not remove itself
	}
	prefix := NamePrefix
	if o.ID != "" {
		prefix += o.ID + "-"
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
		if !o.All && o.ID == "" {
			// Only a lab's namespaces, and only when no running lab claims them: the state is
			// read again here, since a lab may have started since the list above.
			id := labIDOf(n)
			if id == "" {
				continue
			}
			if st, err := ReadState(id); err == nil && alive(st) {
				continue
			}
		}
		killNamespace(n)
		if err := netns.Delete(n); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Namespaces = append(rep.Namespaces, n)
	}
	return rep, errors.Join(errs...)
}
