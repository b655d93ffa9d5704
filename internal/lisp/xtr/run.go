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
		// The loops end on these errors; the sending sockets close after them.
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

// maxBatch is how many packets the ITR loop reads at once (the segments of one super-packet),
// each behind headroom for the LISP header, and the most datagrams of one train.
const maxBatch = 64

// itrReader is the ITR loop's state. A train may outlive the read its datagrams came from:
// a TCP super-packet of 64 KiB is more than one train carries (a datagram of at most 65 507
// bytes, headers of each segment included), and sent alone its last few segments would take a
// system call, a trip through the underlay and a read at the ETR of their own. So the loop reads
// into two sets of buffers in turn and the train gathers across reads: it leaves when it is
// full, when the device has nothing more to read, or before a read into the set its oldest
// datagram is in.
type itrReader struct {
	bufs  [2][][]byte
	sizes []int
	cur   int   // the set the next read goes into
	held  uint8 // bit s: the train holds datagrams of set s
	tr    train
	route route  // of the last packet of the current read
	idle  func() // flushes the train; made once
}

func (x *XTR) newITRReader() *itrReader {
	// Segments are at most the device's MTU; room for jumbo frames keeps a later, larger MTU
	// working without new buffers.
	size := headroom + max(x.o.MTU, 9000) + 128
	r := &itrReader{sizes: make([]int, maxBatch)}
	for s := range r.bufs {
		mem := make([]byte, maxBatch*size)
		r.bufs[s] = make([][]byte, maxBatch)
		for i := range r.bufs[s] {
			r.bufs[s][i] = mem[i*size : (i+1)*size : (i+1)*size]
		}
	}
	r.idle = func() { r.flush(x) }
	return r
}

// flush sends the train.
func (r *itrReader) flush(x *XTR) {
	r.tr.flush(x)
	r.held = 0
}

// next reads from the device once and encapsulates what it read.
func (r *itrReader) next(x *XTR) error {
	s := r.cur
	if r.held&(1<<s) != 0 {
		r.flush(x) // the read would overwrite datagrams the train holds
	}
	k, err := x.o.Device.ReadBatchIdle(r.bufs[s], headroom, r.sizes, r.idle)
	if err != nil {
		return err
	}
	now, sent := time.Now(), r.tr.sent
	r.route.ok = false // a read sees the map-cache afresh
	for i := range k {
		x.encapTo(&r.tr, &r.route, now, r.bufs[s][i], r.sizes[i])
	}
	if r.tr.sent != sent {
		r.held = 0 // what it held of earlier reads is gone
	}
	if r.tr.n > 0 {
		r.held |= 1 << s
	}
	r.cur ^= 1
	return nil
}

func (x *XTR) itrLoop() error {
	r := x.newITRReader()
	for {
		if err := r.next(x); err != nil {
			return err
		}
	}
}

// encap sends the packet at buf[headroom:headroom+n] to its destination's RLOCs, or holds it
// while the mapping is resolved.
func (x *XTR) encap(buf []byte, n int) {
	var tr train
	x.encapTo(&tr, nil, time.Now(), buf, n)
	tr.flush(x)
}

// route is where the ITR sends the packets of one flow: what encapTo's lookups (map-cache,
// locator choice, sending socket) decide. The segments of a super-packet are one flow, so the
// ITR loop keeps the last route for the rest of a read and looks up once a flow and read, not
// once a segment.
type route struct {
	ok  bool
	f   flow // the flow (outer TTL included) it is for
	t   *txSocket
	dst netip.AddrPort
	pr  *pair
}

// encapTo is encap adding the packet to the train tr, which the caller flushes. With rt, the
// packet takes rt's route when it is of rt's flow, and rt becomes its route otherwise.
func (x *XTR) encapTo(tr *train, rt *route, now time.Time, buf []byte, n int) {
	pkt := buf[headroom : headroom+n]
	f, ok := parseFlow(pkt)
	if !ok {
		x.count(DropNotIP)
		return
	}
	if rt == nil || !rt.ok || rt.f != f {
		var r route
		if !x.lookup(now, &f, pkt, &r) {
			return
		}
		if rt == nil {
			rt = &r
		} else {
			*rt = r
		}
	}
	if lisp.DataHeaderLen+n > maxUDPPayload {
		x.count(DropTooBig)
		return
	}
	tr.add(x, rt.t, rt.dst, max(f.ttl, 1), rt.pr, encapsulate(buf, n))
}

// lookup finds the route of flow f into r, or counts why there is none (false); a packet pkt
// to a destination being resolved is held.
func (x *XTR) lookup(now time.Time, f *flow, pkt []byte, r *route) bool {
	if !f.dst.IsGlobalUnicast() {
		x.count(DropNotUnicast) // link-local and multicast traffic of the device itself
		return false
	}
	if _, _, own := x.db.Load().eids.Lookup(f.dst); own {
		x.count(DropOwnEID)
		return false
	}
	x.mu.RLock()
	_, e, found := x.cache.Lookup(f.dst)
	if !found || e.pending || !now.Before(e.expires) {
		x.mu.RUnlock()
		x.miss(now, f, pkt)
		return false
	}
	if e.negative {
		x.mu.RUnlock()
		x.count(DropNegative)
		return false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	li, pr := x.choose(e, f)
	x.mu.RUnlock()
	if pr == nil {
		x.count(DropNoPath)
		return false
	}
	*r = route{ok: true, f: *f, pr: pr, dst: netip.AddrPortFrom(pr.remote, lisp.DataPort)}
	if tx := x.o.Uplinks[li].tx; len(tx) > 0 {
		r.t = tx[f.hash()%uint32(len(tx))]
	}
	return true
}

// maxUDPPayload is the most a datagram carries over IPv4.
const maxUDPPayload = 0xffff - 20 - 8

// encapsulate writes the LISP header in front of the packet at buf[headroom:headroom+n] and
// returns the datagram (header and packet); the sending socket adds the outer UDP and IP
// headers, its source port (one of the uplink's sockets, by flow hash) for the underlay's ECMP.
func encapsulate(buf []byte, n int) []byte {
	h := lisp.DataHeader{Flags: lisp.DataNonce | lisp.DataIID, Nonce: rand.Uint32() & 0xffffff}
	h.Encode(buf[headroom-lisp.DataHeaderLen:])
	return buf[headroom-lisp.DataHeaderLen : headroom+n]
}

// train gathers datagrams to one remote RLOC through one socket with one outer TTL, all of the
// size of the first but the last, which may be shorter: the segments of one super-packet,
// sent in one system call (UDP GSO, the datagrams as the message's iovecs, not copied).
type train struct {
	t     *txSocket
	dst   netip.AddrPort
	ttl   uint8
	pr    *pair
	seg   int
	bytes int // of inner packets
	total int
	n     int
	short bool   // the last datagram is shorter than seg: the train is complete
	sent  uint32 // trains sent (wrapping): a caller sees whether an add sent the train
	dgs   [maxBatch][]byte
}

// add appends datagram d, sending what the train holds first when d cannot join it.
func (tr *train) add(x *XTR, t *txSocket, dst netip.AddrPort, ttl uint8, pr *pair, d []byte) {
	if tr.n > 0 && (t != tr.t || dst != tr.dst || ttl != tr.ttl || tr.short || len(d) > tr.seg ||
		tr.n == maxBatch || tr.total+len(d) > maxUDPPayload) {
		tr.flush(x)
	}
	if tr.n == 0 {
		tr.t, tr.dst, tr.ttl, tr.pr, tr.seg = t, dst, ttl, pr, len(d)
	} else if len(d) < tr.seg {
		tr.short = true
	}
	tr.dgs[tr.n] = d
	tr.n++
	tr.total += len(d)
	tr.bytes += len(d) - lisp.DataHeaderLen
}

// flush sends the train and counts it.
func (tr *train) flush(x *XTR) {
	if tr.n == 0 {
		return
	}
	err := errNoSocket
	if tr.t != nil {
		err = tr.t.sendSegments(tr.dgs[:tr.n], tr.seg, tr.dst, tr.ttl)
	}
	if err != nil {
		x.counts[DropSend].Add(uint64(tr.n))
	} else {
		tr.pr.txPackets.Add(uint64(tr.n))
		tr.pr.txBytes.Add(uint64(tr.bytes))
		x.counts[CountTxPackets].Add(uint64(tr.n))
	}
	clear(tr.dgs[:tr.n])
	tr.sent++
	tr.t, tr.pr, tr.n, tr.total, tr.bytes, tr.short = nil, nil, 0, 0, 0, false
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
	r, err := newRxSocket(u.Data)
	if err != nil {
		return err
	}
	out := make([][]byte, 0, rxBatch*maxBatch)
	for {
		m, err := r.read()
		if err != nil {
			return err
		}
		out = x.decapBatch(time.Now(), i, r, m, out)
	}
}

// decapBatch checks the m messages of the last read of r on uplink i and writes what passes to
// the device in one batch; out is the batch's room, returned for the next call.
func (x *XTR) decapBatch(now time.Time, i int, r *rxSocket, m int, out [][]byte) [][]byte {
	out = out[:0]
	for j := range m {
		b, seg, from := r.message(j)
		var v verdict // the datagrams of one message are mostly of one flow
		for len(b) > 0 {
			d := b[:min(seg, len(b))]
			b = b[len(d):]
			var h lisp.DataHeader
			if _, err := h.Decode(d); err != nil {
				x.count(DropDecap)
				continue
			}
			inner := d[lisp.DataHeaderLen:]
			if x.decapCheck(now, i, from, inner, &v) {
				out = append(out, inner)
			}
			if len(out) == cap(out) {
				x.deliverBatch(out)
				out = out[:0]
			}
		}
	}
	x.deliverBatch(out)
	return out[:0]
}

// decap delivers the inner packet of an encapsulated packet that came from outer source from
// on uplink i, if it passes decapCheck.
func (x *XTR) decap(now time.Time, i int, from netip.Addr, inner []byte) {
	if x.decapCheck(now, i, from, inner, nil) {
		one := onePool.Get().(*[1][]byte)
		one[0] = inner
		x.deliverBatch(one[:])
		one[0] = nil
		onePool.Put(one)
	}
}

// onePool holds the one-packet batches of decap and deliver.
var onePool = sync.Pool{New: func() any { return new([1][]byte) }}

// verdict is a packet that passed decapCheck: its outer source, inner source and destination,
// and its pair. Packets of the same three addresses pass as well while it is kept (the rest of
// one message: the segments of a train).
type verdict struct {
	ok             bool
	from, src, dst netip.Addr
	pr             *pair
}

// decapCheck applies the ETR's source checks to the inner packet of an encapsulated packet
// that came from outer source from on uplink i, and reports whether to deliver it (counted on
// its pair): the inner source is not one of the site's own EIDs, and (unless AnyOuterSource)
// from is a locator of the mapping of the inner source. A packet whose inner source has no
// mapping yet is held while the mapping is resolved and delivered if from turns out to be one
// of its locators. With v, a packet of v's addresses passes as v did, and v becomes the
// verdict of a packet that passes otherwise.
func (x *XTR) decapCheck(now time.Time, i int, from netip.Addr, inner []byte, v *verdict) bool {
	f, ok := parseFlow(inner)
	if !ok {
		x.count(DropNotIP)
		return false
	}
	if v != nil && v.ok && v.src == f.src && v.dst == f.dst && v.from == from {
		if v.pr != nil {
			v.pr.rxPackets.Add(1)
		}
		return true
	}
	if _, _, own := x.db.Load().eids.Lookup(f.dst); !own {
		x.count(DropNotOurEID)
		return false
	}
	if _, _, own := x.db.Load().eids.Lookup(f.src); own {
		x.count(DropSpoofedSource)
		return false
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
			return false
		}
		x.holdForVerification(now, from, &f, inner)
		return false
	}
	if pr != nil {
		pr.rxPackets.Add(1)
	}
	if v != nil {
		*v = verdict{ok: true, from: from, src: f.src, dst: f.dst, pr: pr}
	}
	return true
}

// deliver writes a decapsulated packet that was held for verification to the device.
func (x *XTR) deliver(inner []byte, pr *pair) {
	if pr != nil {
		pr.rxPackets.Add(1)
	}
	one := onePool.Get().(*[1][]byte)
	one[0] = inner
	x.deliverBatch(one[:])
	one[0] = nil
	onePool.Put(one)
}

// deliverBatch writes decapsulated packets to the device, which joins the segments of a TCP
// flow into super-packets. A failed write counts as one drop (the device reports the first
// error of a batch only).
func (x *XTR) deliverBatch(pkts [][]byte) {
	if len(pkts) == 0 {
		return
	}
	if err := x.o.Device.WriteBatch(pkts); err != nil {
		x.count(DropSend)
		x.counts[CountRxPackets].Add(uint64(len(pkts) - 1))
		return
	}
	x.counts[CountRxPackets].Add(uint64(len(pkts)))
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
