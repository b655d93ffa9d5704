package xdp

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Packet describes an Ethernet frame carrying TCP over IPv4 or IPv6, for tests and benchmarks
// that run the program on crafted packets.
type Packet struct {
	Src, Dst   netip.AddrPort
	SrcMAC     net.HardwareAddr // zero: 02:c1:00:00:00:01
	DstMAC     net.HardwareAddr // zero: 02:4c:42:00:00:01
	Flags      byte             // TCP flags
	Opts       []byte           // TCP options, padded with NOPs to a multiple of 4
	Payload    []byte
	DataOffset int  // TCP data offset in 32-bit words; 0: from the options
	Fragment   bool // IPv4 "more fragments"
	Proto      byte // IP protocol; 0: TCP
}

// Frame returns the frame's bytes (IPv4 header checksum computed, TCP checksum left zero).
func (p Packet) Frame() []byte {
	opts := append([]byte(nil), p.Opts...)
	for len(opts)%4 != 0 {
		opts = append(opts, 1)
	}
	tcp := make([]byte, 20, 20+len(opts)+len(p.Payload))
	binary.BigEndian.PutUint16(tcp[0:], p.Src.Port())
	binary.BigEndian.PutUint16(tcp[2:], p.Dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	doff := p.DataOffset
	if doff == 0 {
		doff = (20 + len(opts)) / 4
	}
	tcp[12] = byte(doff << 4)
	tcp[13] = p.Flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	tcp = append(tcp, opts...)
	tcp = append(tcp, p.Payload...)
	proto := p.Proto
	if proto == 0 {
		proto = 6
	}
	dmac, smac := p.DstMAC, p.SrcMAC
	if dmac == nil {
		dmac = net.HardwareAddr{0x02, 0x4c, 0x42, 0, 0, 1}
	}
	if smac == nil {
		smac = net.HardwareAddr{0x02, 0xc1, 0, 0, 0, 1}
	}
	var b []byte
	b = append(b, dmac...)
	b = append(b, smac...)
	if p.Src.Addr().Is4() {
		b = append(b, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		if p.Fragment {
			binary.BigEndian.PutUint16(ip[6:], 0x2000)
		}
		ip[8], ip[9] = 64, proto
		s, d := p.Src.Addr().As4(), p.Dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], Checksum(ip))
		b = append(b, ip...)
	} else {
		b = append(b, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
		ip[6], ip[7] = proto, 64
		s, d := p.Src.Addr().As16(), p.Dst.Addr().As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		b = append(b, ip...)
	}
	return append(b, tcp...)
}

// Checksum is the Internet checksum of h (an IPv4 header).
func Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
