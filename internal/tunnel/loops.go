package tunnel

import (
	"context"
	"errors"
	"net/netip"
	"sync"
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

// bufSize holds the largest datagram a peer may send us, and our own largest packet.
const bufSize = 65536

var bufPool = sync.Pool{New: func() any { return &packetBuf{b: make([]byte, bufSize)} }}

func getBuf() *packetBuf  { return bufPool.Get().(*packetBuf) }
func putBuf(b *packetBuf) { bufPool.Put(b) }

// readDevice reads inner packets from the TUN device and sends each on a path of its peer.
func (t *Tunnel) readDevice() error {
	pb := getBuf()
	defer putBuf(pb)
	limit := headroom + t.o.MTU + 1 // one byte more than the MTU shows an oversized packet
	for {
		n, err := t.o.Device.Read(pb.b[headroom:limit])
		if err != nil {
			if t.closing.Load() {
				return nil
			}
			return err
		}
		if n > int(t.mtu.Load()) {
			// The device's MTU was raised past the tunnel's, or the packet was queued before
			// path MTU discovery lowered it.
			t.stats.DropTooBig.Add(1)
			continue
		}
		t.sendData(pb.b, n)
	}
}

// sendData seals the inner packet at b[headroom:headroom+n] in place and sends it.
func (t *Tunnel) sendData(b []byte, n int) {
	inner := b[headroom : headroom+n]
	if _, err := mpath.InnerVersion(inner); err != nil {
		t.stats.DropBadInner.Add(1)
		return
	}
	dst, _ := innerDst(inner)
	p := t.lookup(dst)
	if p == nil {
		t.stats.DropNoRoute.Add(1)
		return
	}
	// TCP through the tunnel must never need fragmentation: clamp the MSS of SYNs to what the
	// tunnel MTU carries (each side clamps what it sends, so both directions are covered).
	if mtu := int(t.mtu.Load()); dst.Is4() {
		pkt.ClampMSS(inner, uint16(mtu-40))
	} else {
		pkt.ClampMSS(inner, uint16(mtu-60))
	}
	ls := p.cur.Load()
	if ls == nil {
		t.stats.DropNoSession.Add(1)
		return
	}
	now := t.now()
	// The scheduler paces in bytes on the wire: count the outer IP and UDP headers too, so
	// that a path is never fed faster than its capacity.
	wire := n + Overhead + p.outer
	pp, wait := p.pick(now, wire)
	for pp == nil && wait > 0 && !t.closing.Load() {
		sleep(wait)
		now = t.now()
		pp, wait = p.pick(now, wire)
	}
	if pp == nil {
		t.stats.DropNoPath.Add(1)
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
	h := mpath.Header{Type: mpath.TypeData, Path: pp.id, Counter: counter}
	if t.o.Cleartext {
		h.Flags = mpath.FlagClear
	}
	h.Encode(b[greLen : greLen+mpath.HeaderLen])
	pre := mpath.DataPrefix{Seq: p.txSeq.Add(1), Timestamp: t.micros(now)}
	pre.Encode(b[greLen+mpath.HeaderLen : headroom])
	const aadLen = greLen + mpath.HeaderLen
	if t.o.Cleartext {
		tag := ls.s.Sign(b[headroom+n:headroom+n], b[greLen:aadLen], b[:headroom+n])
		t.send(p, pp, b[:headroom+n+len(tag)])
		return
	}
	sealed := ls.s.Seal(b[aadLen:aadLen], b[greLen:aadLen], b[:aadLen], b[aadLen:headroom+n])
	t.send(p, pp, b[:aadLen+len(sealed)])
}

// send writes one datagram on a path and counts it.
func (t *Tunnel) send(p *peer, pp *peerPath, pkt []byte) {
	if err := pp.up.conn.Send(pkt, pp.remote); err != nil {
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
	pb := getBuf()
	defer putBuf(pb)
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
	b := make([]byte, greLen+mpath.HeaderLen+len(msg))
	g := greBraid
	g.Key = key
	g.Encode(b)
	h := mpath.Header{Type: typ, Path: pp.id}
	h.Encode(b[greLen:])
	copy(b[greLen+mpath.HeaderLen:], msg)
	if err := pp.up.conn.Send(b, pp.remote); err != nil {
		t.stats.DropSend.Add(1)
	}
}

// readUplink receives the datagrams of one uplink.
func (t *Tunnel) readUplink(u *uplink) error {
	pb := getBuf()
	for {
		n, src, err := u.conn.ReadFromUDPAddrPort(pb.b)
		if err != nil {
			putBuf(pb)
			if t.closing.Load() {
				return nil
			}
			return err
		}
		if t.receive(u, src, pb, n) {
			pb = getBuf() // the reorder buffer kept it
		}
	}
}

// receive handles one datagram; it reports whether it kept pb.
func (t *Tunnel) receive(u *uplink, src netip.AddrPort, pb *packetBuf, n int) bool {
	b := pb.b[:n]
	t.stats.RxPackets.Add(1)
	t.stats.RxBytes.Add(uint64(n))
	var g gre.Header
	gl, err := g.Decode(b)
	if err != nil || !g.KeyPresent || g.Protocol != gre.ProtoBraid || g.ChecksumPresent || g.SeqPresent {
		t.stats.DropBadGRE.Add(1)
		return false
	}
	var h mpath.Header
	if _, err := h.Decode(b[gl:]); err != nil {
		t.stats.DropBadHeader.Add(1)
		return false
	}
	aadLen := gl + mpath.HeaderLen
	body := b[aadLen:]
	switch h.Type {
	case mpath.TypeHandshakeInit:
		t.onInit(u, src, body)
		return false
	case mpath.TypeHandshakeResp:
		t.onResponse(g.Key, body)
		return false
	}
	ref := t.sessionFor(g.Key)
	if ref == nil || ref.s == nil {
		t.stats.DropUnknownSession.Add(1)
		return false
	}
	var pt []byte
	switch {
	case h.Flags&mpath.FlagClear == 0:
		pt, err = ref.s.Open(body[:0], h.Counter, b[gl:aadLen], b[:aadLen], body)
	case !t.o.Cleartext:
		t.stats.DropCleartext.Add(1)
		return false
	case len(body) < session.Overhead:
		err = session.ErrCiphertext
	default:
		end := len(b) - session.Overhead
		err = ref.s.Verify(h.Counter, b[gl:aadLen], b[:end], b[end:])
		pt = b[aadLen:end]
	}
	switch {
	case errors.Is(err, session.ErrReplay):
		t.stats.DropReplay.Add(1)
		return false
	case err != nil:
		t.stats.DropAuth.Add(1)
		return false
	}
	p := ref.peer
	pp := p.pathFrom(u, src)
	if pp == nil {
		t.stats.DropUnknownPath.Add(1)
		return false
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
	p.mu.Unlock()
	switch h.Type {
	case mpath.TypeData:
		return t.deliver(p, now, pb, aadLen, pt)
	case mpath.TypeProbe:
		var pr mpath.Probe
		if _, err := pr.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return false
		}
		t.reply(p, pp, pr)
	case mpath.TypeProbeReply:
		var r mpath.ProbeReply
		if _, err := r.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return false
		}
		p.mu.Lock()
		pp.est.OnReply(now, r.Seq, r.Timestamp, r.Hold, path.Feedback(r.Feedback))
		pp.sampleCapacityLocked(now, p.outer)
		p.mu.Unlock()
	case mpath.TypeMTUProbe:
		var pr mpath.Probe
		if _, err := pr.Decode(pt); err != nil {
			t.stats.DropBadHeader.Add(1)
			return false
		}
		ack := mpath.MTUAck{Seq: pr.Seq, Size: uint32(n)}
		t.sendSealed(p, pp, mpath.TypeMTUAck, ack.Encode)
	case mpath.TypeMTUAck:
		var a mpath.MTUAck
		if _, err := a.Decode(pt); err != nil || a.Size > bufSize {
			t.stats.DropBadHeader.Add(1)
			return false
		}
		p.mu.Lock()
		pp.pmtu.OnAck(now, a.Seq, int(a.Size)+pp.outer)
		p.mu.Unlock()
	case mpath.TypeFeedback:
		// Feedback rides in probe replies for now; a lone one is accepted and ignored.
	}
	return false
}

// deliver writes an inner packet to the device, through the reorder buffer when it is on.
func (t *Tunnel) deliver(p *peer, now int64, pb *packetBuf, off int, pt []byte) bool {
	var pre mpath.DataPrefix
	if _, err := pre.Decode(pt); err != nil {
		t.stats.DropBadHeader.Add(1)
		return false
	}
	inner := pt[mpath.DataPrefixLen:]
	if _, err := mpath.InnerVersion(inner); err != nil {
		t.stats.DropBadInner.Add(1)
		return false
	}
	if src, ok := innerSrc(inner); !ok || !p.accepts(src) {
		t.stats.DropSpoofed.Add(1)
		return false
	}
	pb.off, pb.n = off+mpath.DataPrefixLen, len(inner)
	if p.rb == nil {
		t.write(inner)
		return false
	}
	p.mu.Lock()
	out := p.rb.Push(now, pre.Seq, len(inner), pb, p.released[:0])
	p.released = out[:0]
	p.mu.Unlock()
	kept := false
	for _, r := range out {
		t.write(r.packet())
		if r == pb {
			kept = true // written already: the caller may reuse it
			continue
		}
		putBuf(r)
	}
	if kept {
		return false
	}
	return true
}

// sleep waits d nanoseconds with the kernel's timer precision; the runtime's timers can be a
// millisecond late, which would cap a paced path far below its rate.
func sleep(d int64) {
	ts := unix.NsecToTimespec(min(d, int64(50*time.Millisecond)))
	unix.Nanosleep(&ts, nil)
}

func (t *Tunnel) write(pkt []byte) {
	if _, err := t.o.Device.Write(pkt); err != nil {
		t.stats.DropDevice.Add(1)
		return
	}
	t.stats.Delivered.Add(1)
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
	p.mu.Unlock()
	t.sendSealed(p, pp, mpath.TypeProbeReply, r.Encode)
}

// onInit answers a handshake initiation from a configured peer.
func (t *Tunnel) onInit(u *uplink, src netip.AddrPort, msg []byte) {
	in, err := session.Receive(t.priv, msg)
	if err != nil {
		t.stats.DropHandshake.Add(1)
		return
	}
	var p *peer
	for _, q := range t.peers {
		if q.pub.Equal(in.Peer) {
			p = q
		}
	}
	if p == nil {
		t.stats.DropHandshake.Add(1)
		return
	}
	pp := p.pathFrom(u, src)
	if pp == nil {
		t.stats.DropUnknownPath.Add(1)
		return
	}
	p.mu.Lock()
	if !in.Timestamp.After(p.lastInit) {
		p.mu.Unlock()
		t.stats.DropReplay.Add(1) // an old initiation, or the same one over another path
		return
	}
	p.lastInit = in.Timestamp
	idx := t.reserveIndex(p)
	resp, keys, err := in.Respond(idx)
	if err != nil {
		t.dropIndex(idx)
		p.mu.Unlock()
		return
	}
	s := session.New(keys, idx, in.SenderIndex)
	t.setSession(idx, s, p)
	ls := &liveSession{s: s, created: t.now()}
	if p.cur.Load() == nil {
		p.rotateLocked(ls) // nothing to keep using meanwhile
	} else {
		if p.pending != nil {
			t.dropIndex(p.pending.s.LocalIndex)
		}
		p.pending = ls // current until the initiator is heard on it
	}
	p.mu.Unlock()
	t.stats.HandshakesDone.Add(1)
	t.sendClear(pp, in.SenderIndex, mpath.TypeHandshakeResp, resp)
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
	rtts := make([]reorder.PathRTT, 0, 8)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := t.now()
		for _, p := range t.peers {
			p.handshake(now)
			p.expire(now)
			for _, pp := range p.paths {
				p.mu.Lock()
				before := pp.est.Snapshot().State
				changed := pp.est.Tick(now)
				seq, ts, due := pp.est.NextProbe(now)
				after := pp.est.Snapshot()
				p.mu.Unlock()
				if changed && before != after.State {
					t.log.Info("path state", "peer", p.name, "path", pp.id+1, "uplink", pp.up.name, "remote", pp.remote, "from", before, "to", after.State)
				}
				if due {
					pr := mpath.Probe{Seq: seq, Timestamp: ts}
					t.sendSealed(p, pp, mpath.TypeProbe, pr.Encode)
				}
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
			p.rb.SetHold(t.o.ReorderCfg.HoldFor(rtts))
			released = p.rb.Expire(now, released[:0])
			p.mu.Unlock()
			for _, r := range released {
				t.write(r.packet())
				putBuf(r)
			}
		}
		t.updateMTU()
	}
}

// accepts reports whether an inner source address may come from p.
func (p *peer) accepts(src netip.Addr) bool {
	for _, r := range p.routes {
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
