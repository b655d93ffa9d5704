// Package experiment is the catalogue of the lab's built-in experiments (`braid lab run`,
// `braid lab demo`): each lives in its own package below this one, builds its own lab, measures
// with the traffic tools, prints a table naming the emulator, and removes the lab.
//
//	demo        two sites, each path and the tunnel and proxy over both
//	accuracy    the link emulator's checks
//	mptgre      the MPT-GRE paper
//	federation  the Multipath Cloud Federation paper
//	mplb        the MPLB paper
//	amptcp      the A-MPTCP paper, and the two LISP sites it builds on (lisp)
//	rbpm        the RBPM paper
//
// What they share is in kit (no role package) and roles (each role's starters in a lab host).
package experiment

import (
	"braid/internal/experiment/kit"

	// Each experiment registers its scenarios.
	_ "braid/internal/experiment/accuracy"
	_ "braid/internal/experiment/amptcp"
	_ "braid/internal/experiment/demo"
	_ "braid/internal/experiment/federation"
	_ "braid/internal/experiment/mplb"
	_ "braid/internal/experiment/mptgre"
	_ "braid/internal/experiment/natbranch"
	_ "braid/internal/experiment/rbpm"
)

// All returns the scenarios by name.
func All() []kit.Scenario { return kit.All() }

// Lookup returns the named scenario.
func Lookup(name string) (kit.Scenario, bool) { return kit.Lookup(name) }
