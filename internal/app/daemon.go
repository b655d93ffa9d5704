package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// daemonOption adds flags of one role to a daemon's command line; what it returns runs after
// the flags are parsed and before the role serves, and its cleanup when the role stops.
type daemonOption func(fs *flag.FlagSet) (before func() (cleanup func(), err error))

// runDaemon runs a long-lived role: the flags every role takes (--config, --log-format,
// --verbose) and those of opts, the site file loaded by load (a mistake is reported with the
// file, line and field), a context that ends on SIGINT or SIGTERM (SIGHUP reloads the roles
// that register a reload with onHangup, and is logged by the others), then serve until it does.
func runDaemon[C any](e env, role, doc string, args []string, load func(file string) (C, error),
	serve func(ctx context.Context, cfg C, log *slog.Logger) error, opts ...daemonOption) int {
	fs := newFlags(e, "braid "+role, doc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	format := fs.String("log-format", e.defaultLogFormat(), "log format: text or json")
	verbose := fs.Bool("verbose", false, "log debug messages too")
	var befores []func() (func(), error)
	for _, o := range opts {
		befores = append(befores, o(fs))
	}
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "braid %s: expected --config FILE (see 'braid %s --help')\n", role, role)
		return exitUsage
	}
	log, err := newLogger(e, *format, *verbose)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid %s: %v\n", role, err)
		return exitUsage
	}
	cfg, err := load(*file)
	if err != nil {
		return configFail(e, role, err)
	}
	for _, b := range befores {
		cleanup, err := b()
		if err != nil {
			fmt.Fprintf(e.stderr, "braid %s: %v\n", role, err)
			return exitUsage
		}
		if cleanup != nil {
			defer cleanup()
		}
	}
	ctx, cancel := daemonContext("braid "+role, log, *file)
	defer cancel()
	if err := serve(ctx, cfg, log); err != nil {
		fmt.Fprintf(e.stderr, "braid %s: %v\n", role, err)
		return exitError
	}
	return exitOK
}

// showStatus is a role's 'show' command: it reads the /status document of the role at
// --metrics (default addr), checks that it comes from role (roleOf reads it; what names the
// role in the error), and prints it with print, or as indented JSON with --json.
func showStatus[S any](e env, args []string, cmd, doc, addr, role, what string, roleOf func(*S) string, print func(io.Writer, *S)) int {
	fs := newFlags(e, cmd, doc)
	metricsAddr := fs.String("metrics", addr, "the role's status `ADDRESS`")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	var st S
	if err := getStatus(*metricsAddr, &st); err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", cmd, err)
		return exitError
	}
	if r := roleOf(&st); r != role {
		fmt.Fprintf(e.stderr, "%s: %s is a %q, not %s\n", cmd, *metricsAddr, r, what)
		return exitError
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
		return exitOK
	}
	print(e.stdout, &st)
	return exitOK
}

// runCheck is a role's 'check' command: it loads the site file of --config with load (a
// mistake is reported with the file, line and field) and prints "FILE: valid: " and what
// describe says of it.
func runCheck[C any](e env, args []string, role, doc string, load func(file string) (C, error), describe func(C) string) int {
	fs := newFlags(e, "braid "+role+" check", doc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if *file == "" {
		fmt.Fprintf(e.stderr, "braid %s check: expected --config FILE\n", role)
		return exitUsage
	}
	cfg, err := load(*file)
	if err != nil {
		return configFail(e, role, err)
	}
	fmt.Fprintf(e.stdout, "%s: valid: %s\n", *file, describe(cfg))
	return exitOK
}
