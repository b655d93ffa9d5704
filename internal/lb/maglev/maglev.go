// Package maglev builds Maglev consistent-hashing lookup tables (Eisenbud et al., NSDI 2016)
// with weights: every backend has a preference list (a permutation of the table's slots given
// by an offset and a skip derived from its name), and backends take turns claiming their next
// free preferred slot, a backend of weight w taking w turns for every maxWeight turns. Adding
// or removing one backend changes little more than the slots it gains or loses. Pure: no I/O.
package maglev

import (
	"hash/fnv"
	"slices"
	"strings"
)

// None marks a slot without a backend (an empty table).
const None = ^uint32(0)

// Backend is one entry of the table's input.
type Backend struct {
	Name   string // identity: the preference list is derived from it, not from ID
	ID     uint32 // the value written into the table
	Weight uint32 // 0 takes no slots
}

func hashes(name string) (offset, skip uint64) {
	h := fnv.New64a()
	h.Write([]byte(name))
	a := h.Sum64()
	h.Write([]byte{0xff, 's', 'k', 'i', 'p'})
	b := h.Sum64()
	// fmix64, so that names differing in one character spread over the whole table
	mix := func(x uint64) uint64 {
		x ^= x >> 33
		x *= 0xff51afd7ed558ccd
		x ^= x >> 33
		x *= 0xc4ceb9fe1a85ec53
		x ^= x >> 33
		return x
	}
	return mix(a), mix(b)
}

// Table returns the lookup table of size m (a prime, larger than the number of backends) for
// the backends. The result does not depend on the order of backends.
func Table(backends []Backend, m int) []uint32 {
	t := make([]uint32, m)
	for i := range t {
		t[i] = None
	}
	var bs []Backend
	var maxW uint32
	for _, b := range backends {
		if b.Weight > 0 {
			bs = append(bs, b)
			maxW = max(maxW, b.Weight)
		}
	}
	if len(bs) == 0 || m < 2 {
		return t
	}
	slices.SortFunc(bs, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
	type state struct {
		offset, skip uint64
		next         uint64 // index into its preference list
		credit       uint64 // turns earned, in units of maxW
	}
	st := make([]state, len(bs))
	for i, b := range bs {
		o, s := hashes(b.Name)
		st[i] = state{offset: o % uint64(m), skip: s%uint64(m-1) + 1}
	}
	filled := 0
	for filled < m {
		for i := range bs {
			st[i].credit += uint64(bs[i].Weight)
			for st[i].credit >= uint64(maxW) && filled < m {
				st[i].credit -= uint64(maxW)
				for {
					slot := (st[i].offset + st[i].next*st[i].skip) % uint64(m)
					st[i].next++
					if t[slot] == None {
						t[slot] = bs[i].ID
						filled++
						break
					}
				}
			}
		}
	}
	return t
}
