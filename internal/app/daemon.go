package app

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
)

// daemonOption adds flags of one role to a daemon's command line; what it returns runs after
// the flags are parsed and before the role serves, and its cleanup when the role stops.
type daemonOption func(fs *flag.FlagSet) (before func() (cleanup func(), err error))

// runDaemon runs a long-lived role: the flags every role takes (--config, --log-format,
// --verbose) and those of opts, the site file loaded by load (a mistake is reported with the
// file, line and field), a context that ends on SIGINT or SIGTERM, then serve until it does.
func runDaemon[C any](e env, role, doc string, args []string, load func(file string) (C, error),
	serve func(ctx context.Context, cfg C, log *slog.Logger) error, opts ...daemonOption) int {
	fs := newFlags(e, "braid "+role, doc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	format := fs.String("log-format", "text", "log format: text or json")
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
	ctx, cancel := signalContext()
	defer cancel()
	if err := serve(ctx, cfg, log); err != nil {
		fmt.Fprintf(e.stderr, "braid %s: %v\n", role, err)
		return exitError
	}
	return exitOK
}
