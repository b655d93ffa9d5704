package xtr

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"braid/internal/wire/lisp"
)

// headroom is the room kept in front of packets read from the device for the outer headers.
const headroom = lisp.IPv6UDPLen + lisp.DataHeaderLen

// flow is what the ITR reads from an inner packet.
type flow struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
	ttl          uint8
}

// parseFlow reads the addresses, protocol and (for TCP and UDP) ports of an IP packet.
func parseFlow(p []byte) (f flow, ok bool) {
	if len(p) < 1 {
		return f, false
	}
	var l4 []byte
	switch p[0] >> 4 {
	case 4:
		if len(p) < 20 {
			return f, false
		}
		ihl := int(p[0]&0x0f) * 4
		f.src, f.dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		f.proto, f.ttl = p[9], p[8]
		if ihl >= 20 && len(p) >= ihl+4 && binary.BigEndian.Uint16(p[6:])&0x1fff == 0 {
			l4 = p[ihl:]
		}
	case 6:
		if len(p) < 40 {
			return f, false
		}
		f.src, f.dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		f.proto, f.ttl = p[6], p[7]
		if len(p) >= 44 {
			l4 = p[40:]
		}
	default:
		return f, false
	}
	if l4 != nil && (f.proto == 6 || f.proto == 17) {
		f.sport, f.dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	}
	return f, true
}

// hash is a hash of the flow's 5-tuple (FNV-1a over the fields, then mixed).
func (f *flow) hash() uint32 {
	h := uint32(2166136261)
	mix := func(b []byte) {
		for _, c := range b {
			h = (h ^ uint32(c)) * 16777619
		}
	}
	s, d := f.src.As16(), f.dst.As16()
	mix(s[:])
	mix(d[:])
	mix([]byte{f.proto, byte(f.sport >> 8), byte(f.sport), byte(f.dport >> 8), byte(f.dport)})
	h ^= h >> 16
	h *= 0x7feb352d
	h ^= h >> 15
	return h
}

// Run runs the xTR until ctx ends; it closes the device and the uplinks when it returns.
func (x *XTR) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2+2*len(x.o.Uplinks))
	fail := func(err error) {
		if !x.closing.Load() {
			errc <- err
			cancel()
		}
	}
	wg.Go(func() {
		<-ctx.Done()
		x.closing.Store(true)
		// The loops end on these errors; the raw sockets they send on close after them.
		x.o.Device.Close()
		for _, u := range x.o.Uplinks {
			u.Control.Close()
			u.Data.Close()
		}
	})
	wg.Go(func() { fail(x.itrLoop()) })
	for i, u := range x.o.Uplinks {
		wg.Go(func() { fail(x.etrLoop(i, u)) })
		wg.Go(func() { fail(x.controlLoop(i, u)) })
	}
	wg.Go(func() { x.timerLoop(ctx) })
	wg.Wait()
	for _, u := range x.o.Uplinks {
		u.Close()
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (x *XTR) itrLoop() error {
	buf := make([]byte, headroom+65536)
	for {
		n, err := x.o.Device.Read(buf[headroom:])
		if err != nil {
			return err
		}
		x.encap(buf, n)
	}
}

// encap sends the packet at buf[headroom:headroom+n] to its destination's RLOCs, or holds it
// while the mapping is resolved.
func (x *XTR) encap(buf []byte, n int) {
	pkt := buf[headroom : headroom+n]
	f, ok := parseFlow(pkt)
	if !ok {
		x.count(DropNotIP)
		return
	}
	if !f.dst.IsGlobalUnicast() {
		x.count(DropNotUnicast) // link-local and multicast traffic of the device itself
		return
	}
	if _, _, own := x.db.Load().eids.Lookup(f.dst); own {
		x.count(DropOwnEID)
		return
	}
	now := time.Now()
	x.mu.RLock()
	_, e, found := x.cache.Lookup(f.dst)
	if !found || e.pending || !now.Before(e.expires) {
		x.mu.RUnlock()
		x.miss(now, &f, pkt)
		return
	}
	if e.negative {
		x.mu.RUnlock()
		x.count(DropNegative)
		return
	}
	e.used.Store(true)
	li, pr := x.choose(e, &f)
	x.mu.RUnlock()
	if pr == nil {
		x.count(DropNoPath)
		return
	}
	x.send(buf, n, li, pr, &f)
}

// send writes the outer headers in front of the packet and sends it on uplink li.
func (x *XTR) send(buf []byte, n, li int, pr *pair, f *flow) {
	start := x.encapsulate(buf, n, x.locals[li].Addr, pr.remote, f)
	if start < 0 {
		x.count(DropTooBig)
		return
	}
	if err := x.o.Uplinks[li].send(buf[start:headroom+n], pr.remote); err != nil {
		x.count(DropSend)
		return
	}
	pr.txPackets.Add(1)
	pr.txBytes.Add(uint64(n))
	x.count(CountTxPackets)
}

// encapsulate writes the outer IP, UDP and LISP headers from local to remote in front of the
// packet at buf[headroom:headroom+n] and returns where the outer packet starts, or -1 when it
// would be too big. The outer source port comes from the flow hash, for the underlay's ECMP.
func (x *XTR) encapsulate(buf []byte, n int, local, remote netip.Addr, f *flow) int {
	h := lisp.DataHeader{Flags: lisp.DataNonce | lisp.DataIID, Nonce: rand.Uint32() & 0xffffff}
	h.Encode(buf[headroom-lisp.DataHeaderLen:])
	ipu := lisp.IPUDP{
		Src:        netip.AddrPortFrom(local, 49152+uint16(f.hash()%16384)),
		Dst:        netip.AddrPortFrom(remote, lisp.DataPort),
		TTL:        max(f.ttl, 1),
		NoChecksum: local.Is4(),
		PayloadLen: uint16(lisp.DataHeaderLen + n),
	}
	start := headroom - lisp.DataHeaderLen - ipu.Len()
	if ipu.Encode(buf[start:headroom+n]) == 0 {
		return -1
	}
	return start
}

// choose returns the uplink and pair for flow f to entry e, or a nil pair when no pair is up.
// Called with mu read-locked.
func (x *XTR) choose(e *entry, f *flow) (int, *pair) {
	nr := len(e.all)
	if x.o.Placement && f.proto == 6 {
		if li, pr := x.place(e, f); pr != nil {
			return li, pr
		}
	}
	alive := func(r int) bool {
		for i := range x.locals {
			if e.pairs[i*nr+r].up.Load() {
				return true
			}
		}
		return false
	}
	best := 256
	for r, l := range e.all {
		if int(l.Priority) < best && alive(r) {
			best = int(l.Priority)
		}
	}
	if best == 256 {
		return 0, nil
	}
	var cand [16]Loc
	var idx [16]int
	c := 0
	for r, l := range e.all {
		if int(l.Priority) == best && c < len(cand) && alive(r) {
			cand[c], idx[c] = l, r
			c++
		}
	}
	h := f.hash()
	i, _ := Weighted(cand[:c], h)
	r := idx[i]
	// The local RLOC: best priority among those whose pair to r is up, by weight, from other
	// bits of the hash so that the two choices are not correlated.
	best, c = 256, 0
	for li, l := range x.locals {
		if e.pairs[li*nr+r].up.Load() && int(l.Priority) < best {
			best = int(l.Priority)
		}
	}
	for li, l := range x.locals {
		if int(l.Priority) == best && c < len(cand) && e.pairs[li*nr+r].up.Load() {
			cand[c], idx[c] = l, li
			c++
		}
	}
	i, _ = Weighted(cand[:c], h>>16|h<<16)
	li := idx[i]
	return li, e.pairs[li*nr+r]
}

// place applies the A-MPTCP rule; when the pair of the flow's residue is down it takes the
// next residue's, so that the choice stays deterministic.
func (x *XTR) place(e *entry, f *flow) (int, *pair) {
	lp, _, ok := x.db.Load().eids.Lookup(f.src)
	if !ok || len(e.remote) == 0 {
		return 0, nil
	}
	localFirst := ComparePrefix(lp, e.prefix) < 0
	nx, ny := len(e.remote), len(x.usableL)
	if localFirst {
		nx, ny = ny, nx
	}
	m := nx * ny
	for step := range m {
		_, ix, iy := Placement(f.sport, f.dport+uint16(step), nx, ny)
		// X is the site whose prefix sorts first; with sites of different sizes only the
		// right one of the two readings is in range.
		var la, ra netip.Addr
		if localFirst {
			la, ra = x.usableL[ix].Addr, e.remote[iy].Addr
		} else {
			la, ra = x.usableL[iy].Addr, e.remote[ix].Addr
		}
		li, ri := x.localIndex(la), -1
		for r, l := range e.all {
			if l.Addr == ra {
				ri = r
			}
		}
		if li < 0 || ri < 0 {
			continue
		}
		if pr := e.pairs[li*len(e.all)+ri]; pr.up.Load() {
			return li, pr
		}
	}
	return 0, nil
}

// miss holds the packet of an unresolved destination and starts its resolution.
func (x *XTR) miss(now time.Time, f *flow, pkt []byte) {
	x.mu.Lock()
	_, e, found := x.cache.Lookup(f.dst)
	if found && !e.pending && now.Before(e.expires) {
		// Resolved meanwhile.
		x.mu.Unlock()
		buf := make([]byte, headroom+len(pkt))
		copy(buf[headroom:], pkt)
		x.encap(buf, len(pkt))
		return
	}
	start := false
	if !found || !e.pending {
		if e = x.startResolutionLocked(now, f.dst, f.src); e == nil {
			x.mu.Unlock()
			x.count(DropPendingFull)
			return
		}
		start = true
	}
	if len(e.queue) < x.o.QueuePerEID && x.heldBytes+len(pkt) <= x.o.MaxHeldBytes {
		e.queue = append(e.queue, append([]byte(nil), pkt...))
		e.bytes += len(pkt)
		x.heldBytes += len(pkt)
	} else {
		x.count(DropQueueFull)
	}
	nonce, tries, res := e.nonce, e.tries, e.resolver
	x.mu.Unlock()
	if start {
		x.sendRequest(f.dst, f.src, nonce, tries, res)
	}
}

func (x *XTR) etrLoop(i int, u *Uplink) error {
	buf := make([]byte, 65536)
	for {
		n, from, err := u.Data.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		var h lisp.DataHeader
		if _, err := h.Decode(buf[:n]); err != nil {
			x.count(DropDecap)
			continue
		}
		x.decap(time.Now(), i, from.Addr().Unmap(), buf[lisp.DataHeaderLen:n])
	}
}

// decap delivers the inner packet of an encapsulated packet that came from outer source from
// on uplink i, after the ETR's source checks: the inner source is not one of the site's own
// EIDs, and (unless AnyOuterSource) from is a locator of the mapping of the inner source. A
// packet whose inner source has no mapping yet is held while the mapping is resolved and
// delivered if from turns out to be one of its locators.
func (x *XTR) decap(now time.Time, i int, from netip.Addr, inner []byte) {
	f, ok := parseFlow(inner)
	if !ok {
		x.count(DropNotIP)
		return
	}
	if _, _, own := x.db.Load().eids.Lookup(f.dst); !own {
		x.count(DropNotOurEID)
		return
	}
	if _, _, own := x.db.Load().eids.Lookup(f.src); own {
		x.count(DropSpoofedSource)
		return
	}
	x.mu.RLock()
	pr := x.pairs[pairKey{i, from}]
	verified := x.o.AnyOuterSource
	known := false
	if !verified {
		var e *entry
		_, e, known = x.cache.Lookup(f.src)
		known = known && !e.pending
		verified = known && e.hasLocator(from)
	}
	x.mu.RUnlock()
	if !verified {
		if known {
			x.count(DropOuterSource)
			return
		}
		x.holdForVerification(now, from, &f, inner)
		return
	}
	x.deliver(inner, pr)
}

// deliver writes a decapsulated packet to the device.
func (x *XTR) deliver(inner []byte, pr *pair) {
	if _, err := x.o.Device.Write(inner); err != nil {
		x.count(DropSend)
		return
	}
	x.count(CountRxPackets)
	if pr != nil {
		pr.rxPackets.Add(1)
	}
}

// hasLocator reports whether a is one of the entry's locators (any priority).
func (e *entry) hasLocator(a netip.Addr) bool {
	for _, l := range e.locs {
		if l.Addr.IP.Unmap() == a {
			return true
		}
	}
	return false
}

// heldPacket is a decapsulated packet waiting for the mapping of its inner source.
type heldPacket struct {
	from netip.Addr
	pkt  []byte
}

// holdForVerification keeps a copy of a decapsulated packet from an inner source without a
// mapping and starts resolving that source (a remote site usually talks first, before our
// ITR has its mapping). Bounded like the ITR's queue.
// startResolutionLocked makes the pending map-cache entry of a resolution of query (asked
// for srcEID), in place of an expired entry of the same host prefix; nil when as many
// resolutions are pending as allowed.
func (x *XTR) startResolutionLocked(now time.Time, query, srcEID netip.Addr) *entry {
	if !x.roomForPendingLocked() {
		return nil
	}
	e := &entry{prefix: netip.PrefixFrom(query, query.BitLen()), pending: true, query: query, srcEID: srcEID,
		nonce: randomNonce(), sent: now}
	x.cacheDeleteLocked(e.prefix) // an expired entry of the same prefix
	x.cache.Insert(e.prefix, e)
	x.byNonce[e.nonce] = e
	x.pending++
	x.askResolverLocked(now, e)
	return e
}

func (x *XTR) holdForVerification(now time.Time, from netip.Addr, f *flow, inner []byte) {
	x.mu.Lock()
	_, e, found := x.cache.Lookup(f.src)
	start := false
	if !found || !e.pending {
		if e = x.startResolutionLocked(now, f.src, f.dst); e == nil {
			x.mu.Unlock()
			x.count(DropPendingFull)
			return
		}
		start = true
	}
	if len(e.held) < x.o.QueuePerEID && x.heldBytes+len(inner) <= x.o.MaxHeldBytes {
		e.held = append(e.held, heldPacket{from, append([]byte(nil), inner...)})
		e.bytes += len(inner)
		x.heldBytes += len(inner)
	} else {
		x.count(DropQueueFull)
	}
	nonce, tries, res := e.nonce, e.tries, e.resolver
	x.mu.Unlock()
	if start {
		x.sendRequest(f.src, f.dst, nonce, tries, res)
	}
}
