package tunnel

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
	"braid/internal/tunnel/session"
	"braid/internal/wire/gre"
	"braid/internal/wire/mpath"
	"braid/internal/wire/pkt"

	"golang.org/x/sys/unix"
)

// packetBuf is one pooled packet buffer; the packet is b[off:off+n].
type packetBuf struct {
	b      []byte
	off, n int
}

func (pb *packetBuf) packet() []byte { return pb.b[pb.off : pb.off+pb.n] }

func (t *Tunnel) getBuf() *packetBuf  { return t.bufs.Get().(*packetBuf) }
func (t *Tunnel) putBuf(b *packetBuf) { t.bufs.Put(b) }

// readDevice reads inner packets from the TUN device, a batch at a time when the device has
// offloads (the segments of one TCP super-packet), and sends each on a path of its peer; each
// path's share of a batch leaves in one system call (txState). With a queue-planning
// scheduler (the default) and a device whose reads can time out, packets wait in their peer's
// send queue (txqueue.go) and the reader reads on while they do; otherwise each packet is sent
// as it is read, the reader waiting for the pacer when it must.
func (t *Tunnel) readDevice() error {
	bd, batched := t.o.Device.(BatchDevice)
	n := 1
	if batched {
		n = maxBatch
	} else {
		bd = nil
	}
	size := headroom + t.o.MTU + 1 // one byte more than the MTU shows an oversized packet
	bufs, sizes := make([][]byte, n), make([]int, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	dl, _ := t.o.Device.(deadliner)
	queue := dl != nil && t.queueing
	var (
		free     [][]byte // buffers back from the send queues
		active   []*peer  // peers with packets queued
		wake     int64    // when a queued packet may leave; 0: none is queued
		deadline bool     // a read deadline is set
	)
	tx := &txState{}
	for {
		var k int
		var err error
		now := t.now()
		switch {
		case wake == 0:
			if deadline {
				err = dl.SetReadDeadline(time.Time{})
				deadline = false
			}
			if err == nil {
				k, err = readSome(bd, t.o.Device, bufs, sizes)
			}
		case len(active) > 0 && allFull(t.peerList()):
			// The device's own queue holds the rest meanwhile, and pushes back on the
			// senders (a local one through TCP small queues; routed ones by its drops).
			sleep(wake - now)
		case wake > now:
			deadline = true
			k, err = readQueued(bd, t.o.Device, dl, bufs, sizes, wake, now)
		}
		if err != nil {
			if t.closing.Load() {
				return nil
			}
			return err
		}
		mtu := int(t.mtu.Load())
		for i := range k {
			if sizes[i] > mtu {
				// The device's MTU was raised past the tunnel's, or the packet was queued
				// before path MTU discovery lowered it.
				t.stats.DropTooBig.Add(1)
				continue
			}
			if !queue {
				t.sendData(tx, bufs[i], sizes[i])
				continue
			}
			p, wire := t.classify(bufs[i], sizes[i])
			if p == nil {
				continue
			}
			if p.q.full() {
				// The peer's queue reached its bound within this read (or is full while
				// another's is not, allFull above): the packet is dropped rather than
				// queued past the bound or the device left unread. The drop is the inner
				// flow's congestion signal, and one peer (a flood, a path that stalled)
				// cannot stall the others.
				p.queueDrops.Add(1)
				t.stats.DropQueueFull.Add(1)
				continue
			}
			if len(p.q.pkts) == 0 {
				active = append(active, p)
			}
			p.q.enqueue(p, bufs[i], sizes[i], wire, now)
			if l := len(free); l > 0 {
				bufs[i], free = free[l-1], free[:l-1]
			} else {
				bufs[i] = make([]byte, size)
			}
		}
		if queue && len(active) > 0 {
			now = t.now()
			wake = 0
			keep := active[:0]
			for _, p := range active {
				w := t.dispatch(tx, p, now, &free)
				if w == 0 {
					continue
				}
				keep = append(keep, p)
				if wake == 0 || w < wake {
					wake = w
				}
			}
			clear(active[len(keep):])
			active = keep
		}
		tx.flush(t)
		if t.closing.Load() {
			return nil
		}
	}
}

// plans reports whether the scheduler of that name plans a send queue (reloads keep it so).
func plans(name string) bool {
	sch, err := newScheduler(name)
	_, ok := sch.(planner)
	return err == nil && ok
}

// allFull reports whether every peer's send queue is full: the device reader then waits
// instead of reading. (With one peer, the branch site's case, that is whenever its queue is.)
func allFull(ps []*peer) bool {
	for _, p := range ps {
		if !p.q.full() {
			return false
		}
	}
	return len(ps) > 0
}

// classify checks the inner packet at b[headroom:headroom+n], clamps the MSS of a TCP SYN, and
// returns the peer it goes to and its size on the wire; nil (counted) when it goes nowhere.
func (t *Tunnel) classify(b []byte, n int) (*peer, int) {
	inner := b[headroom : headroom+n]
	if _, err := mpath.InnerVersion(inner); err != nil {
		t.stats.DropBadInner.Add(1)
		return nil, 0
	}
	dst, _ := innerDst(inner)
	p := t.lookup(dst)
	if p == nil {
		t.stats.DropNoRoute.Add(1)
		return nil, 0
	}
	// TCP through the tunnel must never need fragmentation: clamp the MSS of SYNs to what the
	// tunnel MTU carries (each side clamps what it sends, so both directions are covered).
	if mtu := int(t.mtu.Load()); dst.Is4() {
		pkt.ClampMSS(inner, uint16(mtu-40))
	} else {
		pkt.ClampMSS(inner, uint16(mtu-60))
	}
	if p.cur.Load() == nil {
		t.stats.DropNoSession.Add(1)
		return nil, 0
	}
	// The scheduler paces in bytes on the wire: count the outer IP and UDP headers too, so
	// that a path is never fed faster than its capacity.
	return p, n + Overhead + int(p.outer.Load())
}

// sendData sends the inner packet at b[headroom:headroom+n] (b[:headroom] is scratch for its
// headers) on the path its peer's scheduler picks, waiting for the pacer if it must.
func (t *Tunnel) sendData(tx *txState, b []byte, n int) {
	p, wire := t.classify(b, n)
	if p == nil {
		return
	}
	now := t.now()
	pp, wait := p.pick(now, wire)
	for waited := int64(0); pp == nil && wait > 0 && waited < maxSchedWait && !t.closing.Load(); {
		tx.flush(t) // what the pacer let through goes out before the wait
		// Waking for every packet would cost a system call each: wait for a few packets'
		// worth at once (the bucket holds it; the path still gets its rate).
		sleep(max(wait, minPaceWait))
		then := now
		now = t.now()
		waited += now - then
		pp, wait = p.pick(now, wire)
	}
	if pp == nil {
		t.stats.DropNoPath.Add(1)
		return
	}
	t.emit(tx, p, pp, b, n, p.txSeq.Add(1), now, 0)
}

// emit seals the inner packet at b[headroom:headroom+n], number seq of the peer's sequence,
// into pp's batch (b[:headroom] is scratch for its headers); flags are the header's
// (mpath.FlagSparse or none; emit adds FlagClear).
func (t *Tunnel) emit(tx *txState, p *peer, pp *peerPath, b []byte, n int, seq uint32, now int64, flags uint16) {
	ls := p.cur.Load()
	if ls == nil {
		t.stats.DropNoSession.Add(1)
		return
	}
	counter, err := ls.s.NextCounter()
	if err != nil {
		t.stats.DropNoSession.Add(1)
		return
	}
	g := greBraid
	g.Key = ls.s.RemoteIndex
	g.Encode(b[:greLen])
	if ls.s.Version < session.V3 {
		flags &^= mpath.FlagSparse // queued before the session changed to an older peer's
	}
	h := mpath.Header{Type: mpath.TypeData, Path: pp.id, Flags: flags, Counter: counter}
	if t.o.Cleartext {
		h.Flags |= mpath.FlagClear
	}
	h.Encode(b[greLen : greLen+mpath.HeaderLen])
	pre := mpath.DataPrefix{Seq: seq, PathSeq: p.rtx.record(pp, seq, b[headroom:headroom+n], true)}
	pre.Encode(b[greLen+mpath.HeaderLen : headroom])
	const aadLen = greLen + mpath.HeaderLen
	dg := tx.reserve(t, p, pp, headroom+n+session.Overhead)
	if t.o.Cleartext {
		copy(dg, b[:headroom+n])
		ls.s.Sign(dg[headroom+n:headroom+n], dg[greLen:aadLen], dg[:headroom+n])
		return
	}
	// Sealed straight into the path's batch: no copy of the plaintext.
	copy(dg[:aadLen], b[:aadLen])
	ls.s.Seal(dg[aadLen:aadLen], b[greLen:aadLen], b[:aadLen], b[aadLen:headroom+n])
}

// maxSchedWait bounds how long one packet waits for a path to have room: a scheduler that
// keeps declining (windows that do not drain, estimates gone wrong) costs drops, counted as
// drop_no_path, not a stalled device reader and every other peer with it.
const maxSchedWait = int64(200 * time.Millisecond)

// minPaceWait is the shortest wait for the pacer: 250 µs is 30 KB at 1 Gbit/s, well within a
// path's bucket (2 ms of its rate).
const minPaceWait = int64(250 * time.Microsecond)

// maxBatch is the most packets one device read or one path's send carries, and maxGSO the
// most bytes of datagrams one send carries (a UDP datagram's limit, less headers).
const (
	maxBatch = 64
	maxGSO   = 65000
)

// pathTx is the datagrams queued on one path during a device batch: packed back to back, all
// seg bytes long but the last, as UDP segmentation offload takes them. Only the device reader
// touches it.
type pathTx struct {
	buf    []byte
	n, cnt int
	seg    int
	closed bool // the last datagram was shorter than seg: nothing may follow it
	queued bool // on txState.pending
}

// txState is the device reader's queue of paths with datagrams to send.
type txState struct {
	pending []pathRef
}

type pathRef struct {
	p  *peer
	pp *peerPath
}

// reserve returns room for a datagram of size bytes at the end of pp's queue, sending the
// queue first when the datagram cannot join it.
func (tx *txState) reserve(t *Tunnel, p *peer, pp *peerPath, size int) []byte {
	q := &pp.tx
	if q.cnt > 0 && (size > q.seg || q.closed || q.cnt == maxBatch || q.n+size > maxGSO) {
		t.flushPath(p, pp)
	}
	if q.buf == nil {
		q.buf = make([]byte, maxGSO+t.pktSize)
	}
	if q.cnt == 0 {
		q.seg, q.closed = size, false
	} else if size < q.seg {
		q.closed = true
	}
	if !q.queued {
		q.queued = true
		tx.pending = append(tx.pending, pathRef{p, pp})
	}
	dg := q.buf[q.n : q.n+size]
	q.n += size
	q.cnt++
	return dg
}

// flush sends what every path has queued.
func (tx *txState) flush(t *Tunnel) {
	for _, r := range tx.pending {
		t.flushPath(r.p, r.pp)
		r.pp.tx.queued = false
	}
	tx.pending = tx.pending[:0]
}

// flushPath sends pp's queue in one system call when the socket can segment, and counts it.
func (t *Tunnel) flushPath(p *peer, pp *peerPath) {
	q := &pp.tx
	if q.cnt == 0 {
		return
	}
	b := q.buf[:q.n]
	var err error
	c := pp.up.conn()
	if c == nil {
		err = errNoSocket
	} else if bc, ok := c.(BatchConn); ok && q.cnt > 1 {
		err = bc.SendSegments(b, q.seg, pp.remote())
	} else {
		for off := 0; off < len(b); off += q.seg {
			if e := c.Send(b[off:min(off+q.seg, len(b))], pp.remote()); e != nil && err == nil {
				err = e
			}
		}
	}
	if err != nil {
		pp.txDrops.Add(uint64(q.cnt))
		t.stats.DropSend.Add(uint64(q.cnt))
	} else {
		pp.txPackets.Add(uint64(q.cnt))
		pp.txBytes.Add(uint64(q.n))
		pp.txDataPackets.Add(uint64(q.cnt))
		pp.txDataBytes.Add(uint64(q.n))
		t.stats.TxPackets.Add(uint64(q.cnt))
		t.stats.TxBytes.Add(uint64(q.n))
		p.mu.Lock()
		pp.est.OnSendBatch(t.now(), q.n, q.cnt)
		p.mu.Unlock()
	}
	q.n, q.cnt, q.closed = 0, 0, false
}

// send writes one datagram on a path and counts it.
func (t *Tunnel) send(p *peer, pp *peerPath, pkt []byte) {
	c := pp.up.conn()
	if c == nil {
		pp.txDrops.Add(1)
		t.stats.DropSend.Add(1)
		return
	}
	if err := c.Send(pkt, pp.remote()); err != nil {
		pp.txDrops.Add(1)
		t.stats.DropSend.Add(1)
		return
	}
	pp.txPackets.Add(1)
	pp.txBytes.Add(uint64(len(pkt)))
	t.stats.TxPackets.Add(1)
	t.stats.TxBytes.Add(uint64(len(pkt)))
	p.mu.Lock()
	pp.est.OnSend(t.now(), len(pkt))
	p.mu.Unlock()
}

// sendSealed sends a control message (probe, reply) on a path, sealed with the current session.
func (t *Tunnel) sendSealed(p *peer, pp *peerPath, typ uint8, encode func(b []byte) int) bool {
	ls := p.cur.Load()
	if ls == nil {
		return false
	}
	counter, err := ls.s.NextCounter()
	if err != nil {
		return false
	}
	pb := t.getBuf()
	defer t.putBuf(pb)
	b := pb.b
	g := greBraid
	g.Key = ls.s.RemoteIndex
	g.Encode(b[:greLen])
	h := mpath.Header{Type: typ, Path: pp.id, Counter: counter}
	const aadLen = greLen + mpath.HeaderLen
	h.Encode(b[greLen:aadLen])
	n := encode(b[aadLen : len(b)-session.Overhead])
	sealed := ls.s.Seal(b[aadLen:aadLen], b[greLen:aadLen], b[:aadLen], b[aadLen:aadLen+n])
	t.send(p, pp, b[:aadLen+len(sealed)])
	return true
}

// sendClear sends a handshake message, which authenticates itself.
func (t *Tunnel) sendClear(pp *peerPath, key uint32, typ uint8, msg []byte) {
	t.sendClearTo(pp.up, pp.remote(), pp.id, key, typ, msg)
}

// sendClearTo sends a handshake message from uplink u to dst, as our path id.
func (t *Tunnel) sendClearTo(u *uplink, dst netip.AddrPort, id uint8, key uint32, typ uint8, msg []byte) {
	b := make([]byte, greLen+mpath.HeaderLen+len(msg))
	g := greBraid
	g.Key = key
	g.Encode(b)
	h := mpath.Header{Type: typ, Path: id}
	h.Encode(b[greLen:])
	copy(b[greLen+mpath.HeaderLen:], msg)
	if c := u.conn(); c == nil || c.Send(b, dst) != nil {
		t.stats.DropSend.Add(1)
	}
}

// errNoSocket: a following uplink has no socket now (no address on its interface).
var errNoSocket = errors.New("tunnel: the uplink has no socket")

// readUplink receives the datagrams of one of an uplink's sockets, several per system call
// when the socket coalesces them (UDP GRO), and writes what they deliver to the device in one
// batch. It stops without an error when the uplink has another socket (follow.go). c is
// sk's conn, or one socket of its group (shard.go).
func (t *Tunnel) readUplink(u *uplink, sk *upSock, c Conn) error {
	bc, batched := c.(BatchConn)
	buf, oob := make([]byte, 65536), make([]byte, 128)
	ob := &outbox{}
	for {
		var n, seg int
		var src netip.AddrPort
		var err error
		if batched {
			n, seg, src, err = bc.ReadSegments(buf, oob)
		} else {
			n, src, err = c.ReadFromUDPAddrPort(buf)
			seg = n
		}
		if err != nil {
			if t.closing.Load() || u.removed.Load() || u.sock() != sk {
				return nil
			}
			return err
		}
		for off := 0; off < n; off += max(seg, 1) {
			t.receive(u, src, buf[off:min(off+seg, n)], ob)
		}
		ob.flush(t)
	}
}

// receive handles one datagram b; what it delivers goes into ob.
func (t *Tunnel) receive(u *uplink, src netip.AddrPort, b []byte, ob *outbox) {
	n := len(b)
	t.stats.RxPackets.Add(1)
	t.stats.RxBytes.Add(uint64(n))
	var g gre.Header
	gl, err := g.Decode(b)
	if err != nil || !g.KeyPresent || g.Protocol != gre.ProtoBraid || g.ChecksumPresent || g.SeqPresent {
		t.stats.DropBadGRE.Add(1)
		return
	}
	var h mpath.Header
	if _, err := h.Decode(b[gl:]); err != nil {
		t.stats.DropBadHeader.Add(1)
		return
	}
	aadLen := gl + mpath.HeaderLen
	body := b[aadLen:]
	switch h.Type {
	case mpath.TypeHandshakeInit:
		t.initiation(u, src, h.Path, body)
		return
	case mpath.TypeHandshakeResp:
		t.onResponse(g.Key, body)
		return
	case mpath.TypeCookieReply:
		t.onCookieReply(u, src, g.Key, body)
		return
	}
	ref := t.sessionFor(g.Key)
	if ref == nil {
		t.stats.DropUnknownSession.Add(1)
		return
	}
	if ref.s == nil {
		// The index of our initiation in flight: the responder sent on the new session
		// before its response (on another path, or just behind) reached us.
		t.stats.DropEarly.Add(1)
		return
	}
	if n > t.pktSize {
		t.stats.DropTooBig.Add(1) // larger than any path of ours carries
		return
	}
	// The plaintext goes into a buffer of its own, at the same offset: the datagram's buffer
	// is the next datagram's.
	pb := t.getBuf()
	var pt []byte
	switch {
	case h.Flags&mpath.FlagClear == 0:
		pt, err = ref.s.Open(pb.b[aadLen:aadLen], h.Counter, b[gl:aadLen], b[:aadLen], body)
	case !t.o.Cleartext:
		t.putBuf(pb)
		t.stats.DropCleartext.Add(1)
		return
	case len(body) < session.Overhead:
		err = session.ErrCiphertext
	default:
		end := n - session.Overhead
		if err = ref.s.Verify(h.Counter, b[gl:aadLen], b[:end], b[end:]); err == nil {
			pt = pb.b[aadLen : aadLen+copy(pb.b[aadLen:], b[aadLen:end])]
		}
	}
	if err != nil {
		t.putBuf(pb)
		t.countOpenFailure(ref.peer, u, src, err)
		return
	}
	// Authenticated and not replayed: the packet may move its path, or make one (roam.go).
	p := ref.peer
	pp := p.pathOf(u, src, h.Path)
	if pp == nil {
		t.putBuf(pb) // counted by pathOf
		return
	}
	now := t.now()
	p.mu.Lock()
	if p.pending != nil && p.pending.s == ref.s {
		p.mu.Unlock()
		p.confirm(ref.s)
		p.mu.Lock()
	}
	pp.est.OnReceive(now, n)
	pp.rxBytes += uint64(n)
	pp.rxPackets++
	if h.Type == mpath.TypeData {
		pp.rxDataBytes += uint64(n)
		pp.rxDataPackets++
	}
	p.mu.Unlock()
	if h.Type == mpath.TypeData {
		// A sparse flow's packet is delivered at once: in a session of version 3 the
		// sender says which (FlagSparse); an older peer's, this side's meter tells.
		sparse := h.Flags&mpath.FlagSparse != 0
		t.deliver(p, h.Path, now, pb, aadLen, pt, ob, sparse, !sparse && ref.s.Version < session.V3)
		return
	}
	defer t.putBuf(pb)
	switch h.Type {
	case mpath.TypeProbe:
		var pr mpath.Probe
		if _, err := pr.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return
		}
		t.reply(p, pp, pr)
	case mpath.TypeProbeReply:
		var r mpath.ProbeReply
		if _, err := r.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return
		}
		p.mu.Lock()
		pp.est.OnReply(now, r.Seq, r.Timestamp, r.Hold, path.Feedback(r.Feedback))
		pp.sampleCapacityLocked(now, int(p.outer.Load()))
		p.mu.Unlock()
	case mpath.TypeMTUProbe:
		var pr mpath.Probe
		if _, err := pr.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return
		}
		ack := mpath.MTUAck{Seq: pr.Seq, Size: uint32(n)}
		t.sendSealed(p, pp, mpath.TypeMTUAck, ack.Encode)
	case mpath.TypeMTUAck:
		var a mpath.MTUAck
		if _, err := a.Decode(pt); err != nil || a.Size > 65535 {
			t.stats.DropBadHeader.Add(1)
			return
		}
		p.mu.Lock()
		pp.pmtu.OnAck(now, a.Seq, int(a.Size)+pp.outer)
		p.mu.Unlock()
	case mpath.TypeNack:
		var k mpath.Nack
		if _, err := k.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return
		}
		t.onNack(p, k)
	case mpath.TypeGapNack:
		var k mpath.GapNack
		if _, err := k.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return
		}
		t.onGapNack(p, k)
	case mpath.TypeFeedback:
		// Feedback rides in probe replies for now; a lone one is accepted and ignored.
	}
}

// deliver passes an inner packet (in pb, which it takes) to ob, through the reorder buffer
// when it is on, and reports a loss on the peer's path from (its ID) that the packet reveals.
// sparse: the sender sent it as a sparse flow's (ahead of its turn, on every path): it goes
// to ob at once, and says nothing of what its path may still bring. meter: the peer does not
// mark its sparse flows (protocol version 2); this side's meter finds them, if Options.SparseFlows.
func (t *Tunnel) deliver(p *peer, from uint8, now int64, pb *packetBuf, off int, pt []byte, ob *outbox, sparse, meter bool) {
	var pre mpath.DataPrefix
	if _, err := pre.Decode(pt); err != nil {
		t.putBuf(pb)
		t.stats.DropBadHeader.Add(1)
		return
	}
	inner := pt[mpath.DataPrefixLen:]
	if _, err := mpath.InnerVersion(inner); err != nil {
		t.putBuf(pb)
		t.stats.DropBadInner.Add(1)
		return
	}
	if src, ok := innerSrc(inner); !ok || !p.accepts(src) {
		t.putBuf(pb)
		t.stats.DropSpoofed.Add(1)
		return
	}
	pb.off, pb.n = off+mpath.DataPrefixLen, len(inner)
	p.mu.Lock()
	rp := &p.rxPath[from]
	if !rp.started {
		p.rxIDs = append(p.rxIDs, from)
	}
	// A packet numbered below one its path already delivered was sent after it: a resend
	// (loss recovery), not a packet the path delays held up (reorder.Buffer.PushResent).
	resent := !sparse && rp.started && rp.lastAt != 0 && int32(pre.Seq-rp.lastSeq) < 0
	first, lost := rp.onData(pre.PathSeq, pre.Seq, now, !sparse)
	if !sparse && meter && t.o.SparseFlows && p.rb != nil && !p.rb.Seen(pre.Seq) {
		sparse = p.rxSparse.Sparse(now, inner)
	}
	switch {
	case p.rb == nil:
		ob.add(pb)
	case sparse:
		// A sparse flow's packet goes out at once, not behind other flows' gaps; its
		// number keeps its place, so that the other copies are dropped.
		out, dup := p.rb.Place(now, pre.Seq, p.released[:0])
		p.released = out[:0]
		if dup {
			t.putBuf(pb)
		} else {
			ob.add(pb)
		}
		p.rxq.add(p, out, ob)
	case resent:
		out := p.rb.PushResent(now, pre.Seq, len(inner), pb, p.released[:0])
		p.released = out[:0]
		p.rxq.add(p, out, ob)
	default:
		out := p.rb.Push(now, pre.Seq, len(inner), pb, p.released[:0])
		p.released = out[:0]
		p.rxq.add(p, out, ob)
	}
	p.mu.Unlock()
	if lost > 0 && t.o.Recovery {
		t.nack(p, from, first, lost)
	}
}

// sleep waits d nanoseconds with the kernel's timer precision; the runtime's timers can be a
// millisecond late, which would cap a paced path far below its rate.
func sleep(d int64) {
	ts := unix.NsecToTimespec(min(d, int64(50*time.Millisecond)))
	unix.Nanosleep(&ts, nil)
}

// outbox gathers the inner packets one goroutine delivers, to write them to the device in one
// batch (joined into super-packets where the device takes them).
type outbox struct {
	bufs []*packetBuf
	pkts [][]byte
	// peers have packets in their delivery queue from this goroutine (deliverq.go)
	peers []*peer
}

func (ob *outbox) add(pb *packetBuf) {
	ob.bufs = append(ob.bufs, pb)
	ob.pkts = append(ob.pkts, pb.packet())
}

// flush writes what ob holds, then the delivery queues of the peers it noted (deliverq.go).
func (ob *outbox) flush(t *Tunnel) {
	ob.write(t)
	for i, p := range ob.peers {
		p.rxq.drain(t, p, ob)
		ob.peers[i] = nil
	}
	ob.peers = ob.peers[:0]
}

// write writes the packets ob holds and returns the buffers to the pool.
func (ob *outbox) write(t *Tunnel) {
	if len(ob.pkts) == 0 {
		return
	}
	if bd, ok := t.o.Device.(BatchDevice); ok {
		if err := bd.WriteBatch(ob.pkts); err != nil {
			t.stats.DropDevice.Add(1)
		}
	} else {
		for _, p := range ob.pkts {
			if _, err := t.o.Device.Write(p); err != nil {
				t.stats.DropDevice.Add(1)
			}
		}
	}
	t.stats.Delivered.Add(uint64(len(ob.pkts)))
	for i, pb := range ob.bufs {
		t.putBuf(pb)
		ob.bufs[i], ob.pkts[i] = nil, nil
	}
	ob.bufs, ob.pkts = ob.bufs[:0], ob.pkts[:0]
}

// reply answers a probe on the path it came by.
func (t *Tunnel) reply(p *peer, pp *peerPath, pr mpath.Probe) {
	r := mpath.ProbeReply{Seq: pr.Seq, Timestamp: pr.Timestamp}
	p.mu.Lock()
	r.Feedback = mpath.Feedback{Bytes: pp.rxBytes, Packets: pp.rxPackets, Time: t.micros(t.now())}
	if p.rb != nil {
		st := p.rb.Stats()
		r.Feedback.ReorderPackets = uint32(st.Packets)
		r.Feedback.ReorderKiB = uint32(st.Bytes >> 10)
	}
	r.Feedback.ReorderFreeKiB = t.reorderFreeKiB(p)
	p.mu.Unlock()
	t.sendSealed(p, pp, mpath.TypeProbeReply, r.Encode)
}

// onInit answers a handshake initiation from a configured peer, sent on its path id: from the
// address of one of the peer's paths, or from any address for a peer whose paths are learned.
func (t *Tunnel) onInit(u *uplink, src netip.AddrPort, id uint8, msg []byte) {
	in, err := session.Receive(t.priv, msg)
	if err != nil {
		t.stats.DropHandshake.Add(1)
		return
	}
	var p *peer
	for _, q := range t.peerList() {
		if q.pub.Equal(in.Peer) {
			p = q
		}
	}
	if p == nil {
		t.stats.DropHandshake.Add(1)
		return
	}
	src = unmapPort(src)
	pp := p.pathFrom(u, src)
	if _, learnable := p.learnable(u); pp == nil && !learnable {
		t.stats.DropUnknownPath.Add(1)
		return
	}
	// The response goes back where the initiation came from, as our path's id when there is
	// one (the initiator does not read it).
	ourID := uint8(0)
	if pp != nil {
		ourID = pp.id
	}
	p.mu.Lock()
	if p.gone.Load() {
		p.mu.Unlock()
		t.stats.DropHandshake.Add(1) // a reload has just removed the peer
		return
	}
	// Copies are told apart by the initiator's path (the header's, not authenticated: a
	// forged one can make a replay count as a copy, which is not answered either).
	if !in.Timestamp.After(p.lastInit) {
		benign := p.initSeen.copyOf(msg, t.now(), id)
		p.mu.Unlock()
		if benign {
			t.stats.HandshakeCopies.Add(1) // the one answered, arriving over another path
		} else {
			t.stats.DropReplay.Add(1) // an old initiation, or a copy repeated on a path
		}
		return
	}
	p.lastInit = in.Timestamp
	p.initSeen.record(msg, t.now(), id)
	idx := t.reserveIndex(p)
	resp, keys, err := in.RespondSpeaking(idx, t.o.Ciphers, t.o.speaks())
	if err != nil {
		t.dropIndex(idx)
		p.mu.Unlock()
		switch {
		case errors.Is(err, session.ErrVersion):
			t.stats.DropVersion.Add(1)
			if !p.versionWarned.Swap(true) {
				t.log.Warn("handshake refused: no protocol version both sites speak (upgrade the older one)", "peer", p.name, "peer_speaks", in.Versions, "we_speak", t.o.speaks())
			}
		case errors.Is(err, session.ErrNoCipher):
			t.stats.DropHandshake.Add(1)
			if !p.cipherWarned.Swap(true) {
				t.log.Warn("handshake refused: no cipher both sites accept", "peer", p.name, "offered", in.Offer, "accepted", t.o.Ciphers)
			}
		default:
			t.stats.DropHandshake.Add(1)
		}
		return
	}
	s := session.New(keys, idx, in.SenderIndex)
	t.setSession(idx, s, p)
	ls := &liveSession{s: s, created: t.now()}
	// Pending until the initiator is heard on it, even with no session to send on meanwhile:
	// a valid initiation proves nothing about its sender's liveness (it may be an old one
	// replayed to a site that restarted and so forgot the last timestamp it accepted), and a
	// session made from a replay would be sent on with keys the peer no longer has. A side
	// without a session keeps initiating (handshake), so it is never left waiting on one.
	if p.pending != nil {
		t.dropIndex(p.pending.s.LocalIndex)
	}
	p.pending = ls
	p.mu.Unlock()
	t.stats.HandshakesDone.Add(1)
	t.sendClearTo(u, src, ourID, in.SenderIndex, mpath.TypeHandshakeResp, resp)
}

// onResponse completes a handshake this side initiated.
func (t *Tunnel) onResponse(key uint32, msg []byte) {
	ref := t.sessionFor(key)
	if ref == nil {
		t.stats.DropUnknownSession.Add(1)
		return
	}
	p := ref.peer
	p.mu.Lock()
	hs := p.hs
	ok := hs != nil && p.hsIndex == key
	p.mu.Unlock()
	if !ok {
		t.stats.DropHandshake.Add(1)
		return
	}
	keys, remote, err := hs.Finish(msg)
	if errors.Is(err, session.ErrVersion) {
		t.stats.DropVersion.Add(1)
		return
	}
	if err != nil {
		t.stats.DropHandshake.Add(1)
		return
	}
	t.stats.HandshakesDone.Add(1)
	p.installInitiated(t.now(), keys, remote)
}

// timers probes every path, runs the path state machines, releases what waited too long in the
// reorder buffers and keeps the sessions fresh.
func (t *Tunnel) timers(ctx context.Context) {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var released []*packetBuf
	var gaps []uint32
	var gapNacks []mpath.GapNack
	rtts := make([]reorder.PathRTT, 0, 8)
	ob := &outbox{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := t.now()
		for _, p := range t.peerList() {
			p.handshake(now)
			p.expire(now)
			for _, pp := range p.pathList() {
				p.mu.Lock()
				before := pp.est.Snapshot().State
				changed := pp.est.Tick(now)
				seq, ts, due := pp.est.NextProbe(now)
				after := pp.est.Snapshot()
				p.mu.Unlock()
				if changed && before != after.State {
					t.log.Info("path state", "peer", p.name, "path", pp.id+1, "uplink", pp.up.name, "remote", pp.remote(), "from", before, "to", after.State)
				}
				if due {
					pr := mpath.Probe{Seq: seq, Timestamp: ts}
					t.sendSealed(p, pp, mpath.TypeProbe, pr.Encode)
				}
				t.keepalive(p, pp, now)
				t.probeMTU(now, p, pp, before, after)
			}
			if p.rb == nil {
				continue
			}
			p.mu.Lock()
			rtts = rtts[:0]
			for _, pp := range p.paths {
				s := pp.est.Snapshot()
				if s.State == path.Up {
					rtts = append(rtts, reorder.PathRTT{SRTT: s.SRTT, RTTVar: s.RTTVar})
				}
			}
			hold := t.o.ReorderCfg.HoldFor(rtts)
			rtx := fastestRTT(rtts) + recoveryMargin
			if t.o.Recovery && rtx <= t.o.ReorderCfg.Defaults().MaxHold {
				// A lost packet, resent on the fastest path, comes about that path's round
				// trip after the packets behind it: hold gaps at least that long, and as
				// long again as the paths' spread where the loss was on the slowest.
				hold += rtx
				p.rb.SetFloor(rtx)
			} else {
				// The resend cannot come within the longest hold (an LTE path's round
				// trip under load): holding a gap for it stalls the flows inside and
				// still shows them the loss. Hold only for the paths' reordering; the
				// resend, when it comes, is delivered late (docs/scheduling.md, "One
				// path: a gap is a loss").
				p.rb.SetFloor(0)
			}
			p.rb.SetHold(hold)
			p.rb.SetInFlight(p.inFlightLocked(now, int64(t.o.ReorderCfg.MaxHold)))
			gapNacks = gapNacks[:0]
			if t.o.Recovery && len(p.paths) > 1 && p.gapNacks() {
				// The nack and the resend each cross the fastest path: hold the gap
				// half as long again, for the jitter of both.
				gaps, gapNacks = p.overdueLocked(now, int64(rtx+rtx/2), gaps, gapNacks)
			}
			released = p.rb.Expire(now, released[:0])
			p.rxq.add(p, released, ob)
			p.mu.Unlock()
			ob.flush(t)
			t.sendGapNacks(p, gapNacks)
		}
		t.updateMTU()
	}
}

// accepts reports whether an inner source address may come from p.
func (p *peer) accepts(src netip.Addr) bool {
	for _, r := range *p.routes.Load() {
		if r.Contains(src) {
			return true
		}
	}
	return false
}

func innerDst(pkt []byte) (netip.Addr, bool) {
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		return netip.AddrFrom4([4]byte(pkt[16:20])), true
	case len(pkt) >= 40 && pkt[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return netip.Addr{}, false
}

func innerSrc(pkt []byte) (netip.Addr, bool) {
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		return netip.AddrFrom4([4]byte(pkt[12:16])), true
	case len(pkt) >= 40 && pkt[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(pkt[8:24])), true
	}
	return netip.Addr{}, false
}
