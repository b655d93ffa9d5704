package xtr

import (
	"net/netip"
	"slices"
)

// This file holds the pure parts of locator choice: which locators may carry unicast, the
// weighted choice among them (RFC 9300 §10: lowest priority first, weights within it) and the
// deterministic placement that A-MPTCP relies on (docs/lisp.md, "Placement").

// Loc is a locator as the choice sees it.
type Loc struct {
	Addr     netip.Addr
	Priority uint8
	Weight   uint8
}

// Usable returns the locators of the best (lowest) priority below 255, sorted canonically by
// address family then address bytes, so that both sites list them in the same order whatever
// order a Map-Reply used.
func Usable(locs []Loc) []Loc {
	best := uint8(255)
	for _, l := range locs {
		best = min(best, l.Priority)
	}
	var out []Loc
	if best == 255 {
		return nil
	}
	for _, l := range locs {
		if l.Priority == best {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b Loc) int { return compareAddr(a.Addr, b.Addr) })
	return out
}

func compareAddr(a, b netip.Addr) int {
	if a.Is4() != b.Is4() {
		if a.Is4() {
			return -1
		}
		return 1
	}
	return a.Compare(b)
}

// ComparePrefix orders EID prefixes by family, address bytes, then mask length: the canonical
// site order of the placement rule.
func ComparePrefix(a, b netip.Prefix) int {
	if c := compareAddr(a.Addr(), b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Weighted picks one of locs (all of one priority) in proportion to their weights, using h
// (a flow hash) as the random source, so that one flow always gets the same locator; when all
// weights are 0 the choice is uniform. ok reports the index into locs.
func Weighted(locs []Loc, h uint32) (int, bool) {
	if len(locs) == 0 {
		return 0, false
	}
	total := 0
	for _, l := range locs {
		total += int(l.Weight)
	}
	if total == 0 {
		return int(h % uint32(len(locs))), true
	}
	x := int(h % uint32(total))
	for i, l := range locs {
		if x < int(l.Weight) {
			return i, true
		}
		x -= int(l.Weight)
	}
	return len(locs) - 1, true
}

// Placement returns the index k of the RLOC pair of a TCP flow between two sites whose usable
// locator lists have lengths nx and ny, where site X is the one whose EID prefix sorts first:
// k = (sport + dport) mod (nx·ny); the pair is (X[k mod nx], Y[k div nx]). Both directions of a
// flow give the same k, and k ↦ pair is a bijection onto the nx·ny pairs.
func Placement(sport, dport uint16, nx, ny int) (k, ix, iy int) {
	m := nx * ny
	k = (int(sport) + int(dport)) % m
	return k, k % nx, k / nx
}
