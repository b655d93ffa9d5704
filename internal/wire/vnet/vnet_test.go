package vnet

import (
	"bytes"
	"encoding/binary"
	"testing"

	"braid/internal/wire/csum"
)

// tcpPacket builds an IPv4 (v4) or IPv6 TCP packet with correct checksums: ports 1000->2000,
// the given sequence number, flags, payload, and a 12-byte timestamp option.
func tcpPacket(v4 bool, seq uint32, flags byte, payload []byte) []byte {
	ipLen := 40
	if v4 {
		ipLen = 20
	}
	tcpLen := 32
	p := make([]byte, ipLen+tcpLen+len(payload))
	if v4 {
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
		binary.BigEndian.PutUint16(p[4:], 0x1234)
		binary.BigEndian.PutUint16(p[6:], 0x4000) // DF
		p[8], p[9] = 64, protoTCP
		copy(p[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
		binary.BigEndian.PutUint16(p[10:], ^csum.Sum(p[:20], 0))
	} else {
		p[0] = 0x60
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		p[6], p[7] = protoTCP, 64
		p[8], p[23] = 0xfd, 1
		p[24], p[39] = 0xfd, 2
	}
	t := p[ipLen:]
	binary.BigEndian.PutUint16(t[0:], 1000)
	binary.BigEndian.PutUint16(t[2:], 2000)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], 777)
	t[12] = byte(tcpLen/4) << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], 500)
	copy(t[20:], []byte{1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 8}) // NOP NOP TS
	copy(t[tcpLen:], payload)
	src, dst := addrs(p, v4)
	binary.BigEndian.PutUint16(t[16:], ^csum.Sum(t, csum.Pseudo(src, dst, protoTCP, len(t))))
	return p
}

func payloadOf(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func buffers(n, size int) ([][]byte, []int) {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, size)
	}
	return out, make([]int, n)
}

func checkSegment(t *testing.T, p []byte, v4 bool) {
	t.Helper()
	ipLen, _, gotV4, ok := tcpHeaders(p)
	if !ok || gotV4 != v4 {
		t.Fatalf("not a TCP packet: % x", p)
	}
	if v4 {
		if csum.Sum(p[:20], 0) != 0xffff || int(binary.BigEndian.Uint16(p[2:])) != len(p) {
			t.Fatalf("IPv4 header checksum or length wrong: % x", p[:20])
		}
	} else if int(binary.BigEndian.Uint16(p[4:]))+40 != len(p) {
		t.Fatalf("IPv6 payload length wrong")
	}
	if !tcpChecksumOK(p, ipLen, v4) {
		t.Fatalf("TCP checksum wrong")
	}
}

func TestHdrRoundTrip(t *testing.T) {
	h := Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4 | GSOECN, HdrLen: 52, GSOSize: 1448, CsumStart: 20, CsumOffset: 16}
	var b [HdrLen]byte
	if h.Encode(b[:]) != HdrLen {
		t.Fatal("Encode")
	}
	if !bytes.Equal(b[:], []byte{1, 0x81, 52, 0, 0xa8, 5, 20, 0, 16, 0}) {
		t.Fatalf("wire % x", b)
	}
	var got Hdr
	if n, err := got.Decode(b[:]); n != HdrLen || err != nil || got != h {
		t.Fatalf("Decode: %d %v %+v", n, err, got)
	}
	if _, err := got.Decode(b[:9]); err != ErrTruncated || got != (Hdr{}) {
		t.Fatalf("short: %v %+v", err, got)
	}
	if h.Encode(b[:9]) != 0 {
		t.Fatal("Encode into a short buffer")
	}
}

func TestSegmentTCP(t *testing.T) {
	for _, v4 := range []bool{true, false} {
		const gso = 1000
		data := payloadOf(3*gso + 500)
		super := tcpPacket(v4, 0xfffffc00, tcpACK|tcpPSH|tcpFIN|tcpCWR, data) // the sequence wraps
		typ := uint8(GSOTCPv6)
		if v4 {
			typ = GSOTCPv4
		}
		out, sizes := buffers(8, 1600)
		n, err := Segment(Hdr{Flags: FlagNeedsCsum, GSOType: typ, GSOSize: gso, CsumStart: 20, CsumOffset: 16}, super, out, 16, sizes)
		if err != nil || n != 4 {
			t.Fatalf("v4 %v: %d segments, %v", v4, n, err)
		}
		var joined []byte
		for i := range n {
			p := out[i][16 : 16+sizes[i]]
			checkSegment(t, p, v4)
			ipLen, tcpLen, _, _ := tcpHeaders(p)
			tcp := p[ipLen:]
			if seq := binary.BigEndian.Uint32(tcp[4:]); seq != 0xfffffc00+uint32(i*gso) {
				t.Errorf("segment %d: seq %#x", i, seq)
			}
			wantFlags := byte(tcpACK)
			if i == 0 {
				wantFlags |= tcpCWR
			}
			if i == n-1 {
				wantFlags |= tcpPSH | tcpFIN
			}
			if tcp[13] != wantFlags {
				t.Errorf("segment %d: flags %#x, want %#x", i, tcp[13], wantFlags)
			}
			if v4 && binary.BigEndian.Uint16(p[4:]) != 0x1234+uint16(i) {
				t.Errorf("segment %d: IPv4 id %#x", i, binary.BigEndian.Uint16(p[4:]))
			}
			joined = append(joined, p[ipLen+tcpLen:]...)
		}
		if !bytes.Equal(joined, data) {
			t.Fatalf("v4 %v: segments do not carry the payload", v4)
		}
	}
}

// A packet without GSO whose checksum the kernel left to the device gets it completed.
func TestSegmentCompletesChecksum(t *testing.T) {
	p := tcpPacket(true, 1, tcpACK, payloadOf(300))
	// As the kernel hands it: the TCP checksum field holds the pseudo-header sum only.
	src, dst := addrs(p, true)
	binary.BigEndian.PutUint16(p[36:], csum.Pseudo(src, dst, protoTCP, len(p)-20))
	out, sizes := buffers(1, 2000)
	n, err := Segment(Hdr{Flags: FlagNeedsCsum, CsumStart: 20, CsumOffset: 16}, p, out, 0, sizes)
	if err != nil || n != 1 || sizes[0] != len(p) {
		t.Fatalf("%d %v %v", n, err, sizes)
	}
	checkSegment(t, out[0][:sizes[0]], true)
}

func TestSegmentErrors(t *testing.T) {
	p := tcpPacket(true, 1, tcpACK, payloadOf(5000))
	out, sizes := buffers(2, 1600)
	for name, tc := range map[string]struct {
		h    Hdr
		pkt  []byte
		want error
	}{
		"UDP fragmentation":    {Hdr{GSOType: GSOUDP, GSOSize: 1000}, p, ErrGSOType},
		"UDP segmentation":     {Hdr{GSOType: GSOUDPL4, GSOSize: 1000}, p, ErrGSOType},
		"unknown type":         {Hdr{GSOType: 9, GSOSize: 1000}, p, ErrGSOType},
		"v6 type on v4":        {Hdr{GSOType: GSOTCPv6, GSOSize: 1000}, p, ErrPacket},
		"size 0":               {Hdr{GSOType: GSOTCPv4}, p, ErrPacket},
		"too many":             {Hdr{GSOType: GSOTCPv4, GSOSize: 1000}, p, ErrTooMany},
		"segment too big":      {Hdr{GSOType: GSOTCPv4, GSOSize: 3000}, p, ErrBufferSmall},
		"truncated":            {Hdr{GSOType: GSOTCPv4, GSOSize: 1000}, p[:30], ErrPacket},
		"checksum out of pkt":  {Hdr{Flags: FlagNeedsCsum, CsumStart: 100, CsumOffset: 16}, p[:110], ErrPacket},
		"whole packet too big": {Hdr{}, p, ErrBufferSmall},
	} {
		if _, err := Segment(tc.h, tc.pkt, out, 0, sizes); err != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

func segmentsOf(t *testing.T, v4 bool, seq uint32, gso int, data []byte, flags byte) [][]byte {
	t.Helper()
	typ := uint8(GSOTCPv6)
	if v4 {
		typ = GSOTCPv4
	}
	out, sizes := buffers(64, gso+100)
	n, err := Segment(Hdr{GSOType: typ, GSOSize: uint16(gso)}, tcpPacket(v4, seq, flags, data), out, 0, sizes)
	if err != nil {
		t.Fatal(err)
	}
	segs := make([][]byte, n)
	for i := range n {
		segs[i] = out[i][:sizes[i]]
	}
	return segs
}

// Segments joined by the Coalescer and split again by Segment come back as they were.
func TestCoalesceRoundTrip(t *testing.T) {
	for _, v4 := range []bool{true, false} {
		data := payloadOf(20*1200 + 700)
		segs := segmentsOf(t, v4, 5000, 1200, data, tcpACK|tcpPSH)
		c := NewCoalescer(make([]byte, CoalescerBuffer))
		for _, s := range segs {
			if out := c.Add(s); out != nil {
				t.Fatalf("v4 %v: flushed early", v4)
			}
		}
		out := c.Flush()
		var h Hdr
		h.Decode(out)
		wantType := uint8(GSOTCPv6)
		if v4 {
			wantType = GSOTCPv4
		}
		if h.GSOType != wantType || h.GSOSize != 1200 || h.Flags != FlagNeedsCsum || c.Flush() != nil {
			t.Fatalf("v4 %v: header %+v", v4, h)
		}
		again, sizes := buffers(64, 1400)
		n, err := Segment(h, out[HdrLen:], again, 0, sizes)
		if err != nil || n != len(segs) {
			t.Fatalf("v4 %v: re-segmented into %d, %v", v4, n, err)
		}
		for i := range n {
			if !bytes.Equal(again[i][:sizes[i]], segs[i]) {
				t.Fatalf("v4 %v: segment %d differs after the round trip", v4, i)
			}
		}
	}
}

func TestCoalesceRefuses(t *testing.T) {
	segs := segmentsOf(t, true, 100, 1000, payloadOf(4000), tcpACK)
	other := segmentsOf(t, true, 100, 1000, payloadOf(2000), tcpACK)
	binary.BigEndian.PutUint16(other[0][22:], 2001) // another destination port
	binary.BigEndian.PutUint16(other[0][36:], 0)    // (fix the checksum below)
	other[0][36], other[0][37] = 0, 0
	src, dst := addrs(other[0], true)
	binary.BigEndian.PutUint16(other[0][36:], ^csum.Sum(other[0][20:], csum.Pseudo(src, dst, protoTCP, len(other[0])-20)))
	bad := bytes.Clone(segs[1])
	bad[len(bad)-1] ^= 0xff // payload damaged: the checksum no longer matches
	syn := tcpPacket(true, 99, tcpSYN, nil)
	udp := []byte{0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2, 0, 8, 0, 0}
	for name, seq := range map[string][][]byte{
		"gap":          {segs[0], segs[2]},
		"other flow":   {segs[0], other[0]},
		"bad checksum": {segs[0], bad},
		"syn":          {syn, segs[0]},
		"not tcp":      {udp, segs[0]},
		"reordered":    {segs[1], segs[0]},
	} {
		c := NewCoalescer(make([]byte, CoalescerBuffer))
		var written [][]byte
		for _, p := range seq {
			if out := c.Add(p); out != nil {
				written = append(written, bytes.Clone(out))
			}
		}
		written = append(written, bytes.Clone(c.Flush()))
		if len(written) != len(seq) {
			t.Fatalf("%s: %d writes for %d packets", name, len(written), len(seq))
		}
		for i, w := range written {
			var h Hdr
			h.Decode(w)
			if h != (Hdr{}) || !bytes.Equal(w[HdrLen:], seq[i]) {
				t.Errorf("%s: packet %d not passed through unchanged (header %+v)", name, i, h)
			}
		}
	}
	// A short segment ends a run: what follows starts a new one.
	short := segmentsOf(t, true, 100, 1000, payloadOf(2500), tcpACK) // 1000, 1000, 500
	next := segmentsOf(t, true, 2600, 1000, payloadOf(1000), tcpACK)
	c := NewCoalescer(make([]byte, CoalescerBuffer))
	for _, p := range short {
		if c.Add(p) != nil {
			t.Fatal("flushed inside the run")
		}
	}
	if out := c.Add(next[0]); out == nil {
		t.Fatal("a segment after a short one joined the run")
	}
}

func TestNoAllocs(t *testing.T) {
	segs := segmentsOf(t, true, 1, 1000, payloadOf(10000), tcpACK)
	super := tcpPacket(true, 1, tcpACK, payloadOf(10000))
	out, sizes := buffers(16, 1200)
	c := NewCoalescer(make([]byte, CoalescerBuffer))
	if a := testing.AllocsPerRun(50, func() {
		Segment(Hdr{GSOType: GSOTCPv4, GSOSize: 1000}, super, out, 0, sizes)
		for _, s := range segs {
			c.Add(s)
		}
		c.Flush()
	}); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

func FuzzSegment(f *testing.F) {
	f.Add([]byte{1, 1, 0, 0, 0xe8, 3, 20, 0, 16, 0}, tcpPacket(true, 1, tcpACK, payloadOf(3000)))
	f.Add([]byte{1, 4, 0, 0, 0xe8, 3, 40, 0, 16, 0}, tcpPacket(false, 1, tcpACK, payloadOf(3000)))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 20, 0, 16, 0}, tcpPacket(true, 1, tcpACK, payloadOf(30)))
	out, sizes := buffers(8, 2048)
	f.Fuzz(func(t *testing.T, hb, pkt []byte) {
		var h Hdr
		if _, err := h.Decode(hb); err != nil {
			return
		}
		n, err := Segment(h, pkt, out, 8, sizes)
		if err != nil {
			return
		}
		if h.GSOType&^GSOECN == GSONone {
			if n != 1 || sizes[0] != len(pkt) {
				t.Fatalf("%d packets of %v for one of %d", n, sizes[:n], len(pkt))
			}
			return
		}
		v4 := h.GSOType&^GSOECN == GSOTCPv4
		ipLen, tcpLen, _, _ := tcpHeaders(pkt)
		total := 0
		for i := range n {
			checkSegment(t, out[i][8:8+sizes[i]], v4)
			total += sizes[i] - ipLen - tcpLen
		}
		if total != len(pkt)-ipLen-tcpLen {
			t.Fatalf("segments carry %d payload bytes of %d", total, len(pkt)-ipLen-tcpLen)
		}
	})
}

func FuzzCoalescer(f *testing.F) {
	var seed []byte
	for _, s := range segmentsOf(&testing.T{}, true, 1, 500, payloadOf(2000), tcpACK) {
		seed = append(seed, byte(len(s)>>8), byte(len(s)))
		seed = append(seed, s...)
	}
	f.Add(seed)
	segs, sizes := buffers(MaxSegments, 65535)
	cbuf := make([]byte, CoalescerBuffer)
	f.Fuzz(func(t *testing.T, stream []byte) {
		c := NewCoalescer(cbuf)
		in, out := 0, 0
		count := func(w []byte) {
			if w == nil {
				return
			}
			var h Hdr
			h.Decode(w)
			if h.GSOType == GSONone {
				out += len(w) - HdrLen
				return
			}
			n, err := Segment(h, w[HdrLen:], segs, 0, sizes)
			if err != nil {
				t.Fatalf("a super-packet the coalescer built does not segment: %v", err)
			}
			for i := range n {
				out += sizes[i]
			}
		}
		for len(stream) >= 2 {
			n := int(stream[0])<<8 | int(stream[1])
			stream = stream[2:]
			if n > len(stream) {
				break
			}
			in += n
			count(c.Add(stream[:n]))
			stream = stream[n:]
		}
		count(c.Flush())
		if in != out {
			t.Fatalf("%d bytes in, %d out", in, out)
		}
	})
}
