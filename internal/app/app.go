// Package app is braid's composition root: it parses each subcommand's command line, builds the
// role's components from its configuration, and owns their lifecycle, signals and logging.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Version is set at build time with -ldflags "-X braid/internal/app.Version=...".
var Version = "dev"

// env is what a subcommand gets from the process: its streams.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	logFormat      string // the global --log-format ("" = text)
}

// command is one subcommand. run returns the process exit code.
type command struct {
	summary string
	run     func(e env, args []string) int
}

// commands is the table of top-level subcommands; each role's file adds its own entry.
var commands = map[string]command{}

// exit codes
const (
	exitOK    = 0
	exitError = 1 // the command failed at run time
	exitUsage = 2 // the command line was wrong

	exitInterrupted = 130 // stopped by SIGINT or SIGTERM, as shells report it
)

// Main runs braid with args (without the program name) and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{stdin: stdin, stdout: stdout, stderr: stderr}
	args, err := parseGlobal(&e, args)
	if err != nil {
		fmt.Fprintf(stderr, "braid: %v (see 'braid help')\n", err)
		return exitUsage
	}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.run(e, []string{"--help"})
			}
		}
		usage(stdout)
		return exitOK
	case "version", "--version":
		printVersion(stdout)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "braid: unknown command %q (see 'braid help')\n", args[0])
		return exitUsage
	}
	return c.run(e, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprint(w, `braid bonds several network paths (two ISPs, fibre plus LTE, the RLOCs of a LISP
site) into connections that are faster than any one path and survive the loss of any one.

Usage:
  braid [--log-format text|json] <command> [arguments]

Options:
  --log-format text|json
             how the daemons and the lab write their log on stderr: text (key=value, the
             default) or json (one object a line); a daemon's own --log-format overrides it

Commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `  version    print the version, the commit and the Go version

Run 'braid help <command>' or 'braid <command> --help' for a command's manual.
`)
}

// newFlags returns a FlagSet whose --help prints the manual text doc followed by the flags.
func newFlags(e env, name, doc string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintln(out, strings.TrimSpace(doc))
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(out, "\nOptions:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args; it returns done=true with the exit code when the command should stop:
// after --help (code 0, manual on stdout) or on a usage error (code 2, message on stderr).
func parseFlags(e env, fs *flag.FlagSet, args []string) (done bool, code int) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(e.stdout)
			fs.Usage()
			return true, exitOK
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, exitOK
		}
		return true, exitUsage
	}
	return false, 0
}

// dispatch runs the subcommand of a command group (braid lab ..., braid traffic ...): doc is the
// group's manual, printed on --help (stdout) or without a subcommand (stderr).
func dispatch(e env, group, doc string, sub map[string]func(env, []string) int, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, doc)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, doc)
		return exitOK
	}
	f, ok := sub[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "braid %s: unknown command %q (see 'braid %s --help')\n", group, args[0], group)
		return exitUsage
	}
	return f(e, args[1:])
}

// parseInterspersed parses flags wherever they stand among the positional arguments, and stops
// at "--", returning what follows it separately.
func parseInterspersed(e env, fs *flag.FlagSet, args []string) (pos, rest []string, done bool, code int) {
	if i := indexOf(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	if done, code := parseFlags(e, fs, args); done {
		return nil, nil, true, code
	}
	for fs.NArg() > 0 {
		pos = append(pos, fs.Arg(0))
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return nil, nil, true, exitUsage
		}
	}
	return pos, rest, false, 0
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// signalContext is cancelled on SIGINT, SIGTERM or SIGHUP: for commands that run in the
// foreground (a closed terminal stops them). Daemons use daemonContext.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
}

// daemonContext is cancelled on SIGINT or SIGTERM. SIGHUP, the daemons' "reload", never stops
// the role: it runs what the role registered with onHangup, and otherwise logs on log that
// role cannot reload yet. file is the site file the role started with.
func daemonContext(role string, log *slog.Logger, file string) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := withHangup(ctx, hup, role, log, file)
	return ctx, func() {
		signal.Stop(hup)
		cancel()
		stop()
	}
}

// withHangup runs the hangup of the returned context for each signal on hup, until cancel.
func withHangup(parent context.Context, hup <-chan os.Signal, role string, log *slog.Logger, file string) (context.Context, context.CancelFunc) {
	h := &hangup{role: role, log: log, file: file}
	ctx, stop := context.WithCancel(context.WithValue(parent, hangupKey{}, h))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-hup:
				h.fire()
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() {
		stop()
		<-done
	}
}

// hangup is what SIGHUP does in a role.
type hangup struct {
	mu     sync.Mutex
	role   string       // for the log, when the role has no reload
	log    *slog.Logger // the role's; nil: the default logger
	file   string       // the site file the role started with ("" when none)
	reload func()
}

type hangupKey struct{}

func (h *hangup) fire() {
	h.mu.Lock()
	reload, role, log := h.reload, h.role, h.log
	h.mu.Unlock()
	if reload != nil {
		reload()
		return
	}
	if log == nil {
		log = slog.Default()
	}
	log.Warn("SIGHUP: reload is not supported for " + role + " yet; still running with the configuration it started with")
}

func hangupOf(ctx context.Context) *hangup {
	h, _ := ctx.Value(hangupKey{}).(*hangup)
	return h
}

// onHangup makes SIGHUP run reload, given the site file the role started with; nothing when
// ctx is not a daemonContext.
func onHangup(ctx context.Context, reload func(file string)) {
	h := hangupOf(ctx)
	if h == nil {
		return
	}
	h.mu.Lock()
	file := h.file
	h.reload = func() { reload(file) }
	h.mu.Unlock()
}

// daemonFile is the site file of the daemon that ctx belongs to ("" when unknown).
func daemonFile(ctx context.Context) string {
	if h := hangupOf(ctx); h != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.file
	}
	return ""
}
