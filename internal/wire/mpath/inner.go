package mpath

import "encoding/binary"

// InnerVersion returns 4 or 6 if pkt is one whole IPv4 or IPv6 packet, judged by its first
// header only: for IPv4, version 4, IHL at least 5, a Total Length equal to len(pkt) and not
// shorter than the header; for IPv6, version 6 and 40 + Payload Length equal to len(pkt). It
// returns ErrInnerPacket otherwise. The data path checks every decrypted inner packet with it
// before writing to the TUN device: the kernel would accept trailing bytes and trim them, but a
// peer has no reason to send any.
func InnerVersion(pkt []byte) (v int, err error) {
	if len(pkt) == 0 {
		return 0, ErrInnerPacket
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return 0, ErrInnerPacket
		}
		ihl := int(pkt[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		if ihl < 20 || total < ihl || total != len(pkt) {
			return 0, ErrInnerPacket
		}
		return 4, nil
	case 6:
		if len(pkt) < 40 || 40+int(binary.BigEndian.Uint16(pkt[4:])) != len(pkt) {
			return 0, ErrInnerPacket
		}
		return 6, nil
	}
	return 0, ErrInnerPacket
}
