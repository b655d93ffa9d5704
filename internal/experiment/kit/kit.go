// Package kit is what the lab's experiments share: the scenario registry and its options,
// claims checked against bounds, medians and confidence intervals, tables and figures, traffic
// servers and probes in lab hosts, link traces and common topologies. It imports no role
// package; the roles' starters in lab hosts are in package roles.
package kit

import (
	"context"
	"io"
	"log/slog"
	"sort"
)

// Options tune a scenario run.
type Options struct {
	Quick  bool   // short measurements: a smoke run
	File   string // a topology file replacing the embedded one, where the scenario has one
	Logger *slog.Logger
	Seed   uint64 // links' random seed; 0 for a random one
	Out    string // directory for the figures a scenario writes; "" for the current one
	Reps   int    // repetitions, where a scenario repeats its measurements; 0 for its default
}

// Scenario is one built-in experiment.
type Scenario struct {
	Name    string
	Summary string
	Run     func(ctx context.Context, w io.Writer, o Options) error
}

var registry = map[string]Scenario{}

// Register adds s to the scenarios; each experiment's package registers its own in init.
func Register(s Scenario) { registry[s.Name] = s }

// All returns the scenarios by name.
func All() []Scenario {
	out := make([]Scenario, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup returns the named scenario.
func Lookup(name string) (Scenario, bool) {
	s, ok := registry[name]
	return s, ok
}
