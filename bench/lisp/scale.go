package main

import (
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"text/tabwriter"
	"time"

	"braid/internal/lisp/mapserver"
	"braid/internal/wire/lisp"
)

// The scale table: a map server holding many registered EID prefixes. Each site owns a /14
// and registers 1000 of its 1024 /24s, picked in a scattered order, with two locators (what
// an xTR with two RLOCs registers); sites are at 32.0.0.0 upward, 1000 prefixes a site.
const prefixesPerSite = 1000

type scaleResult struct {
	perPrefix   float64 // bytes of heap after GC per registered prefix
	heap        uint64  // bytes of heap the registrations hold
	registerDur time.Duration
	resolve     resolverResult
}

// scaleSites returns the map server's configuration for n prefixes and, per site, the
// prefixes it registers.
func scaleSites(n int) (cfg mapserver.Config, regs [][]netip.Prefix) {
	cfg = mapserver.Defaults()
	cfg.RatePerSource = 0
	cfg.RatePerDestination = 0
	for s := 0; s*prefixesPerSite < n; s++ {
		base := uint32(32<<24) + uint32(s)<<18
		own := netip.PrefixFrom(netip.AddrFrom4(be4(base)), 14)
		key := fmt.Sprintf("scale-site-%d", s)
		cfg.Sites = append(cfg.Sites, mapserver.Site{Name: key, Keys: map[uint8][]byte{0: []byte(key)}, Prefixes: []netip.Prefix{own}, ProxyReply: true})
		var ps []netip.Prefix
		for i := range min(prefixesPerSite, n-s*prefixesPerSite) {
			k := uint32(i*397) % 1024 // 397 is odd: a permutation of the /14's /24s
			ps = append(ps, netip.PrefixFrom(netip.AddrFrom4(be4(base+k<<8)), 24))
		}
		regs = append(regs, ps)
	}
	return cfg, regs
}

func be4(v uint32) [4]byte { return [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

// heapAfterGC returns the bytes of live heap.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// scaleRun registers n prefixes in a fresh map server, measures the heap they hold, then the
// resolver's rate and latency with clients closed-loop clients for dur.
func scaleRun(n, clients int, dur time.Duration) scaleResult {
	cfg, sites := scaleSites(n)
	srv, err := mapserver.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	before := heapAfterGC()
	from := netip.MustParseAddrPort("172.16.0.1:4342")
	start := time.Now()
	for s, ps := range sites {
		key := []byte(cfg.Sites[s].Name)
		locs := []lisp.Locator{
			{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.AddrFrom4([4]byte{172, 16, byte(s >> 8), byte(s)}))},
			{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.AddrFrom4([4]byte{172, 17, byte(s >> 8), byte(s)}))}}
		for len(ps) > 0 {
			k := min(len(ps), 100)
			m := lisp.MapRegister{Nonce: 0, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32)}
			for _, p := range ps[:k] {
				m.Records = append(m.Records, lisp.Record{TTL: 10, MaskLen: 24, Authoritative: true, EID: lisp.AddrFrom(p.Addr()), Locators: locs})
			}
			b := make([]byte, m.Len())
			m.Encode(b)
			lisp.Sign(b, key)
			srv.Handle(start, from, b, nil)
			ps = ps[k:]
		}
	}
	registerDur := time.Since(start)
	after := heapAfterGC()
	if got := srv.RegisteredPrefixes(); got != n {
		log.Fatalf("%d prefixes registered, want %d", got, n)
	}
	// Queries for the host .1 of registered prefixes, drawn at random.
	targets := make([]netip.Addr, 0, 65536)
	for range cap(targets) {
		ps := sites[rand.IntN(len(sites))]
		targets = append(targets, ps[rand.IntN(len(ps))].Addr().Next())
	}
	r := scaleResult{heap: after - before, perPrefix: float64(after-before) / float64(n), registerDur: registerDur,
		resolve: resolverRun(srv, targets, clients, dur)}
	runtime.KeepAlive(srv)
	return r
}

// scale writes the scale table: one row per size, medians of runs.
func scale(w io.Writer, sizes []int, clients int, dur time.Duration, runs int) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| registered prefixes\t| heap\t| bytes per prefix\t| registration\t| requests/s\t| p50\t| p99\t| requests/s vs the first row\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	var first float64
	for _, n := range sizes {
		var rs []scaleResult
		for range runs {
			rs = append(rs, scaleRun(n, clients, dur))
		}
		med := func(f func(scaleResult) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return median(v)
		}
		rps := med(func(r scaleResult) float64 { return r.resolve.rps })
		if first == 0 {
			first = rps
		}
		per := med(func(r scaleResult) float64 { return r.perPrefix })
		heap := med(func(r scaleResult) float64 { return float64(r.heap) })
		reg := med(func(r scaleResult) float64 { return float64(n) / r.registerDur.Seconds() })
		p50 := time.Duration(med(func(r scaleResult) float64 { return float64(r.resolve.p50) }))
		p99 := time.Duration(med(func(r scaleResult) float64 { return float64(r.resolve.p99) }))
		fmt.Fprintf(tw, "| %d\t| %.1f MiB\t| %.0f\t| %.0f prefixes/s\t| %.0f\t| %v\t| %v\t| %.2f\t|\n", n, heap/(1<<20), per, reg, rps,
			p50.Round(time.Microsecond), p99.Round(time.Microsecond), rps/first)
	}
	tw.Flush()
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}
