package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
)

// roleReloader is the reload of the lb, mapserver, xtr and pm roles ('braid ROLE reload',
// SIGHUP): apply re-reads the site file and applies the difference to the running role, or
// refuses it with nothing changed (a file with a mistake, with its file:line, or a change
// only a restart applies). Each applied change is logged by apply, one line each.
type roleReloader struct {
	role string
	log  *slog.Logger
	file string // the site file the role started with
	// apply loads file and applies it; it returns a line per change.
	apply func(file string) ([]string, error)

	mu sync.Mutex // one reload at a time
}

// reload applies the site file; the error says why nothing changed.
func (r *roleReloader) reload() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.file == "" {
		return "", fmt.Errorf("%w: the %s was not started from a site file", errReloadRefused, r.role)
	}
	changes, err := r.apply(r.file)
	if errors.Is(err, errPartlyApplied) {
		r.log.Error("reload partly applied", "file", r.file, "applied", len(changes), "err", err)
		return "", fmt.Errorf("%s: %d changes applied (%s), then: %w", r.file, len(changes), strings.Join(changes, "; "), err)
	}
	if err != nil {
		r.log.Error("reload refused: nothing changed", "file", r.file, "err", err)
		return "", fmt.Errorf("%w: %s", errReloadRefused, err)
	}
	summary := "no change"
	if len(changes) > 0 {
		summary = fmt.Sprintf("%d changes: %s", len(changes), strings.Join(changes, "; "))
	}
	r.log.Info("reloaded", "file", r.file, "changes", len(changes))
	return r.file + ": " + summary, nil
}

// newRoleReloader makes SIGHUP on ctx's daemon run the reload and returns it, for the
// role's control socket.
func newRoleReloader(ctx context.Context, role string, log *slog.Logger, apply func(string) ([]string, error)) *roleReloader {
	r := &roleReloader{role: role, log: log, file: daemonFile(ctx), apply: apply}
	onHangup(ctx, func(file string) {
		log.Info("SIGHUP: reloading", "file", file)
		r.reload() // logged either way
	})
	return r
}

// controlReload answers a reload request on a control socket.
func (r *roleReloader) controlReload() error {
	msg, err := r.reload()
	if err != nil {
		return err
	}
	return controlDone(msg)
}

// sameOrRestart lists the fields whose change only a restart applies.
type restartCheck struct{ what []string }

func (c *restartCheck) check(name string, a, b any) {
	if !reflect.DeepEqual(a, b) {
		c.what = append(c.what, name)
	}
}

func (c *restartCheck) err() error {
	if len(c.what) == 0 {
		return nil
	}
	return fmt.Errorf("%s changed: %w", strings.Join(c.what, ", "), errNeedsRestart)
}

// errPartlyApplied: the kernel refused a step of a reload that had begun (a map update of the
// LB's data plane): the changes before it are in force, the rest not.
var errPartlyApplied = errors.New("the data plane refused a step; the rest of the reload was not applied")

// errNeedsRestart: the change is not applied by a reload.
var errNeedsRestart = errors.New("only a restart applies that (restart the role, or put it back)")

// runReloadCommand is 'braid ROLE reload': the running role re-reads its site file; the
// reply says what changed, or why nothing did (exit 1).
func runReloadCommand(e env, role, doc, defaultControl string, args []string) int {
	fs := newFlags(e, "braid "+role+" reload", doc)
	control := fs.String("control", defaultControl, "the "+role+"'s control `SOCKET`")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "braid %s reload: no arguments expected (the %s re-reads the site file it started with)\n", role, role)
		return exitUsage
	}
	rep, err := callControl(*control, controlAction{Action: "reload"})
	if err != nil {
		if errors.Is(err, errNotRunning) {
			fmt.Fprintf(e.stderr, "braid %s reload: is the %s running? %v\n", role, role, err)
		} else {
			fmt.Fprintf(e.stderr, "braid %s reload: %v\n", role, err)
		}
		return exitError
	}
	fmt.Fprintf(e.stdout, "reloaded %s\n", rep.Message)
	return exitOK
}

// serveReloadControl serves a control socket that takes reload and status requests.
func serveReloadControl(ctx context.Context, sock string, r *roleReloader, status func() any) (func(), error) {
	return serveControl(ctx, sock, func(a controlAction) error {
		if a.Action != "reload" {
			return fmt.Errorf("action %q is not reload or status", a.Action)
		}
		return r.controlReload()
	}, status)
}
