package pkt

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// checksum computes the TCP checksum of tcp with the pseudo-header of src and dst.
func checksum(src, dst, tcp []byte) uint16 {
	var s uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	add(src)
	add(dst)
	s += protoTCP + uint32(len(tcp))
	add(tcp)
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func syn(v6 bool, mss uint16, flags byte, extra []byte) []byte {
	opts := append([]byte{1, 1, 4, 2, 2, 4, byte(mss >> 8), byte(mss)}, extra...) // nop nop sackok mss
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	tcp := make([]byte, 20+len(opts))
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 443)
	tcp[12] = byte((20+len(opts))/4) << 4
	tcp[13] = flags
	copy(tcp[20:], opts)
	var pkt, src, dst []byte
	if v6 {
		pkt = make([]byte, 40)
		pkt[0] = 0x60
		binary.BigEndian.PutUint16(pkt[4:], uint16(len(tcp)))
		pkt[6], pkt[7] = protoTCP, 64
		pkt[23], pkt[39] = 1, 2
		src, dst = pkt[8:24], pkt[24:40]
	} else {
		pkt = make([]byte, 20)
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(20+len(tcp)))
		pkt[8], pkt[9] = 64, protoTCP
		copy(pkt[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
		src, dst = pkt[12:16], pkt[16:20]
	}
	binary.BigEndian.PutUint16(tcp[16:], checksum(src, dst, tcp))
	return append(pkt, tcp...)
}

func mssOf(pkt []byte) uint16 {
	off := 20
	if pkt[0]>>4 == 6 {
		off = 40
	}
	return binary.BigEndian.Uint16(pkt[off+20+6:])
}

func verify(t *testing.T, pkt []byte) {
	t.Helper()
	ipLen := 20
	src, dst := pkt[12:16], pkt[16:20]
	if pkt[0]>>4 == 6 {
		ipLen, src, dst = 40, pkt[8:24], pkt[24:40]
	}
	tcp := bytes.Clone(pkt[ipLen:])
	want := binary.BigEndian.Uint16(tcp[16:])
	tcp[16], tcp[17] = 0, 0
	if got := checksum(src, dst, tcp); got != want {
		t.Fatalf("checksum %04x after clamping, a full computation gives %04x", want, got)
	}
}

func TestClampMSS(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		p := syn(v6, 1460, 0x02, nil)
		if !ClampMSS(p, 1360) || mssOf(p) != 1360 {
			t.Fatalf("v6=%v: SYN with MSS 1460 not clamped to 1360 (%d)", v6, mssOf(p))
		}
		verify(t, p)
		p = syn(v6, 1200, 0x12, nil) // SYN-ACK already small
		if ClampMSS(p, 1360) || mssOf(p) != 1200 {
			t.Fatalf("v6=%v: a smaller MSS was changed", v6)
		}
		p = syn(v6, 1460, 0x10, nil) // plain ACK
		if ClampMSS(p, 1360) {
			t.Fatalf("v6=%v: a non-SYN was changed", v6)
		}
	}
	p := syn(false, 65535, 0x02, []byte{3, 3, 7}) // window scale after MSS
	if !ClampMSS(p, 1) || mssOf(p) != 1 {
		t.Fatal("extreme values")
	}
	verify(t, p)
	frag := syn(false, 1460, 0x02, nil)
	frag[7] = 1 // fragment offset
	if ClampMSS(frag, 1000) {
		t.Error("a fragment was changed")
	}
	for _, bad := range [][]byte{nil, {0x45}, {0x60, 0}, make([]byte, 19)} {
		if ClampMSS(bad, 1000) {
			t.Errorf("malformed %x was changed", bad)
		}
	}
}

func TestClampMSSAllocs(t *testing.T) {
	p := syn(false, 1460, 0x02, nil)
	if n := testing.AllocsPerRun(100, func() { ClampMSS(p, 1460) }); n != 0 {
		t.Errorf("%.1f allocations", n)
	}
}

// Whatever the bytes, ClampMSS stays in bounds, changes at most the MSS value and the checksum,
// and keeps a valid checksum valid.
func FuzzClampMSS(f *testing.F) {
	f.Add(syn(false, 1460, 0x02, nil), uint16(1300))
	f.Add(syn(true, 9000, 0x12, []byte{3, 3, 7}), uint16(1400))
	f.Add([]byte{0x45, 0, 0, 20}, uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, max uint16) {
		orig := bytes.Clone(b)
		changed := ClampMSS(b, max)
		diff := 0
		for i := range b {
			if b[i] != orig[i] {
				diff++
			}
		}
		if !changed && diff != 0 {
			t.Fatalf("reported no change but changed %d bytes", diff)
		}
		if changed && diff > 4 {
			t.Fatalf("changed %d bytes: only the MSS and the checksum may change", diff)
		}
	})
}
