// Package lpm is a longest-prefix-match table over IPv4 and IPv6 prefixes (a binary trie per
// family), with the query a LISP map resolver needs for negative answers: the largest prefix
// around an address that overlaps no stored prefix. It is not safe for concurrent use; callers
// lock, or publish a table that is no longer written.
package lpm

import "net/netip"

type node[V any] struct {
	child [2]*node[V]
	set   bool
	val   V
}

// Table maps prefixes to values.
type Table[V any] struct {
	root [2]*node[V] // IPv4, IPv6
	n    int
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

func bit(a *[16]byte, i int) int { return int(a[i/8]>>(7-i%8)) & 1 }

// bytesOf returns the address bytes left-aligned in 16 bytes.
func bytesOf(a netip.Addr) [16]byte {
	var b [16]byte
	if a.Is4() {
		x := a.As4()
		copy(b[:], x[:])
		return b
	}
	return a.As16()
}

// Len returns the number of stored prefixes.
func (t *Table[V]) Len() int { return t.n }

// Insert stores v under p (masked), replacing what was there.
func (t *Table[V]) Insert(p netip.Prefix, v V) {
	p = p.Masked()
	a := p.Addr().Unmap()
	f := family(a)
	if t.root[f] == nil {
		t.root[f] = &node[V]{}
	}
	b := bytesOf(a)
	n := t.root[f]
	for i := 0; i < p.Bits(); i++ {
		c := bit(&b, i)
		if n.child[c] == nil {
			n.child[c] = &node[V]{}
		}
		n = n.child[c]
	}
	if !n.set {
		t.n++
	}
	n.set, n.val = true, v
}

// Delete removes p and reports whether it was stored.
func (t *Table[V]) Delete(p netip.Prefix) bool {
	p = p.Masked()
	a := p.Addr().Unmap()
	f := family(a)
	b := bytesOf(a)
	path := make([]*node[V], 0, p.Bits()+1)
	n := t.root[f]
	for i := 0; n != nil && i < p.Bits(); i++ {
		path = append(path, n)
		n = n.child[bit(&b, i)]
	}
	if n == nil || !n.set {
		return false
	}
	var zero V
	n.set, n.val = false, zero
	t.n--
	// Prune nodes that hold nothing and lead nowhere.
	for i := len(path) - 1; i >= 0 && n.child[0] == nil && n.child[1] == nil && !n.set; i-- {
		path[i].child[bit(&b, i)] = nil
		n = path[i]
	}
	if n == t.root[f] && n.child[0] == nil && n.child[1] == nil && !n.set {
		t.root[f] = nil
	}
	return true
}

// Get returns the value stored exactly under p.
func (t *Table[V]) Get(p netip.Prefix) (v V, ok bool) {
	p = p.Masked()
	a := p.Addr().Unmap()
	b := bytesOf(a)
	n := t.root[family(a)]
	for i := 0; n != nil && i < p.Bits(); i++ {
		n = n.child[bit(&b, i)]
	}
	if n == nil || !n.set {
		return v, false
	}
	return n.val, true
}

// Lookup returns the longest stored prefix that contains addr, and its value.
func (t *Table[V]) Lookup(addr netip.Addr) (p netip.Prefix, v V, ok bool) {
	addr = addr.Unmap()
	best := -1
	var bv V
	if _, best, bv = t.walk(addr, addr.BitLen()); best < 0 {
		return p, v, false
	}
	p, _ = addr.Prefix(best)
	return p, bv, true
}

// LookupPrefix returns the longest stored prefix that contains all of q.
func (t *Table[V]) LookupPrefix(q netip.Prefix) (p netip.Prefix, v V, ok bool) {
	a := q.Addr().Unmap()
	_, best, bv := t.walk(a, q.Bits())
	if best < 0 {
		return p, v, false
	}
	p, _ = a.Prefix(best)
	return p, bv, true
}

// walk follows addr for up to bits bits; it returns the depth of the first missing node (or
// bits + 1 when the walk reached the end), and the deepest stored prefix met.
func (t *Table[V]) walk(addr netip.Addr, bits int) (missing, best int, bv V) {
	if !addr.IsValid() {
		return 0, -1, bv
	}
	b := bytesOf(addr)
	n := t.root[family(addr)]
	best = -1
	for i := 0; ; i++ {
		if n == nil {
			return i, best, bv
		}
		if n.set {
			best, bv = i, n.val
		}
		if i == bits {
			return bits + 1, best, bv
		}
		n = n.child[bit(&b, i)]
	}
}

// Uncovered returns the largest prefix that contains addr and neither contains nor is contained
// in a stored prefix, or false when addr is inside a stored prefix or a stored prefix is addr
// itself.
func (t *Table[V]) Uncovered(addr netip.Addr) (netip.Prefix, bool) {
	addr = addr.Unmap()
	missing, best, _ := t.walk(addr, addr.BitLen())
	if best >= 0 || missing > addr.BitLen() {
		return netip.Prefix{}, false
	}
	p, _ := addr.Prefix(missing)
	return p, true
}

// All calls fn for every stored prefix, IPv4 first, in address order, until fn returns false.
func (t *Table[V]) All(fn func(netip.Prefix, V) bool) {
	for f, r := range t.root {
		var b [16]byte
		bits := 32
		if f == 1 {
			bits = 128
		}
		if !all(r, &b, 0, bits, fn) {
			return
		}
	}
}

func all[V any](n *node[V], b *[16]byte, depth, bits int, fn func(netip.Prefix, V) bool) bool {
	if n == nil {
		return true
	}
	if n.set {
		var a netip.Addr
		if bits == 32 {
			a = netip.AddrFrom4([4]byte(b[:4]))
		} else {
			a = netip.AddrFrom16(*b)
		}
		if !fn(netip.PrefixFrom(a, depth), n.val) {
			return false
		}
	}
	for c := range 2 {
		if n.child[c] == nil {
			continue
		}
		if c == 1 {
			b[depth/8] |= 1 << (7 - depth%8)
		}
		ok := all(n.child[c], b, depth+1, bits, fn)
		if c == 1 {
			b[depth/8] &^= 1 << (7 - depth%8)
		}
		if !ok {
			return false
		}
	}
	return true
}
