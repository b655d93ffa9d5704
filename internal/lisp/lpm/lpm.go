// Package lpm is a longest-prefix-match table over IPv4 and IPv6 prefixes, with the query a
// LISP map resolver needs for negative answers: the largest prefix around an address that
// overlaps no stored prefix. It is not safe for concurrent writes; callers lock (concurrent
// reads are safe), or publish a table that is no longer written.
//
// The table is github.com/gaissmai/bart (a multibit trie with popcount-compressed nodes and
// path compression) rather than a binary trie of our own: a map server keeps a million
// registered prefixes in it, and a binary trie costs one node per bit of each prefix that no
// other prefix shares (up to 32 nodes for an isolated IPv4 /32, 128 for IPv6), where bart
// stays within a few dozen bytes per prefix and looks up in a handful of 8-bit strides.
package lpm

import (
	"net/netip"

	"github.com/gaissmai/bart"
)

// Table maps prefixes to values. The zero value is an empty table. A Table must not be
// copied once used.
type Table[V any] struct {
	t bart.Table[V]
}

// norm returns p with its address unmapped and its host bits cleared, or false when p is not
// a valid prefix.
func norm(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return p, false
	}
	a := p.Addr()
	bits := p.Bits()
	if a.Is4In6() {
		if bits < 96 {
			return p, false
		}
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a, bits).Masked(), true
}

// Len returns the number of stored prefixes.
func (t *Table[V]) Len() int { return t.t.Size() }

// Insert stores v under p (masked), replacing what was there. Invalid prefixes are ignored.
func (t *Table[V]) Insert(p netip.Prefix, v V) {
	if p, ok := norm(p); ok {
		t.t.Insert(p, v)
	}
}

// Delete removes p and reports whether it was stored.
func (t *Table[V]) Delete(p netip.Prefix) bool {
	p, ok := norm(p)
	if !ok {
		return false
	}
	if _, found := t.t.Get(p); !found {
		return false
	}
	t.t.Delete(p)
	return true
}

// Get returns the value stored exactly under p.
func (t *Table[V]) Get(p netip.Prefix) (v V, ok bool) {
	if p, ok = norm(p); !ok {
		return v, false
	}
	return t.t.Get(p)
}

// Lookup returns the longest stored prefix that contains addr, and its value.
func (t *Table[V]) Lookup(addr netip.Addr) (p netip.Prefix, v V, ok bool) {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return p, v, false
	}
	return t.t.LookupPrefixLPM(netip.PrefixFrom(addr, addr.BitLen()))
}

// LookupPrefix returns the longest stored prefix that contains all of q.
func (t *Table[V]) LookupPrefix(q netip.Prefix) (p netip.Prefix, v V, ok bool) {
	if q, ok = norm(q); !ok {
		return p, v, false
	}
	return t.t.LookupPrefixLPM(q)
}

// Uncovered returns the largest prefix that contains addr and neither contains nor is contained
// in a stored prefix, or false when addr is inside a stored prefix or a stored prefix is addr
// itself.
func (t *Table[V]) Uncovered(addr netip.Addr) (netip.Prefix, bool) {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return netip.Prefix{}, false
	}
	if _, _, in := t.Lookup(addr); in {
		return netip.Prefix{}, false
	}
	// No stored prefix contains addr, so addr/b overlaps one exactly when it contains one:
	// true up to some length, false from there on. The first free length is searched.
	overlaps := func(b int) bool { p, _ := addr.Prefix(b); return t.t.OverlapsPrefix(p) }
	lo, hi := 0, addr.BitLen()+1 // the answer is in [lo, hi); hi: none
	for lo < hi {
		mid := (lo + hi) / 2
		if overlaps(mid) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo > addr.BitLen() {
		return netip.Prefix{}, false
	}
	p, _ := addr.Prefix(lo)
	return p, true
}

// All calls fn for every stored prefix, IPv4 first, in address order (a prefix before its
// more specific ones), until fn returns false.
func (t *Table[V]) All(fn func(netip.Prefix, V) bool) {
	for p, v := range t.t.AllSorted() {
		if !fn(p, v) {
			return
		}
	}
}
