// Package limit is a token bucket per address for the LISP control planes, in a table of
// bounded size. When the table is full the least recently used address is forgotten, so that a
// flood from (or toward) many spoofed addresses churns only itself and never locks out an
// address in steady use.
package limit

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// MaxAddrs is the size of a Limiter's table.
const MaxAddrs = 1 << 16

// Limiter allows Rate events per second per address, in bursts of Burst. Its methods are safe
// for concurrent use.
type Limiter struct {
	rate, burst float64
	mu          sync.Mutex
	addrs       map[netip.Addr]*list.Element // of *bucket; guarded by mu
	lru         list.List                    // front: most recently used; guarded by mu
}

type bucket struct {
	addr   netip.Addr
	tokens float64
	last   time.Time
}

// New returns a limiter; a rate of 0 or less allows everything.
func New(rate, burst float64) *Limiter {
	return &Limiter{rate: rate, burst: burst, addrs: map[netip.Addr]*list.Element{}}
}

// Allow takes a token of address a at time now, and reports whether there was one.
func (l *Limiter) Allow(a netip.Addr, now time.Time) bool {
	if l.rate <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var b *bucket
	if el := l.addrs[a]; el != nil {
		l.lru.MoveToFront(el)
		b = el.Value.(*bucket)
	} else {
		if l.lru.Len() >= MaxAddrs {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.addrs, old.Value.(*bucket).addr)
		}
		b = &bucket{addr: a, tokens: l.burst, last: now}
		l.addrs[a] = l.lru.PushFront(b)
	}
	if now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Prune forgets addresses idle for 10 s (their buckets would be full again by now).
func (l *Limiter) Prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for el := l.lru.Back(); el != nil; {
		b := el.Value.(*bucket)
		if now.Sub(b.last) <= 10*time.Second {
			break
		}
		prev := el.Prev()
		l.lru.Remove(el)
		delete(l.addrs, b.addr)
		el = prev
	}
}

// Len is the number of addresses in the table.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}
