package mpt

import (
	"net/netip"
)

// CommandMin is the least first byte of a command: a GRE payload starting with it or more is a
// command, not an IP packet.
const CommandMin = 0xA0

// Command codes, the first byte of a command (spyff/mpt src/include/mp_local.h).
const (
	CmdKeepalive        = 0xA1 // on the data socket, per path
	CmdPathStatusChange = 0xA2 // command port: a path's status, with its two IPs
	CmdConnectionCreate = 0xA3 // command port: a connection's INI text
	CmdLocalReply       = 0xA4 // command port: the local CLI's command, and the replies to it
	CmdLocalReplyEnd    = 0xA5 // command port: end of the replies
)

// Status codes, the second byte of a command.
const (
	StatusOK             = 0x00
	StatusPathDown       = 0x80
	StatusIfDown         = 0x81
	StatusAddressDown    = 0x82
	StatusPathDownManual = 0x83 // set locally by "path down"; the peer is told StatusPathDown
	StatusDisabled       = 0xFF
)

// KeepaliveLen is the length of a keepalive after its GRE header (44 bytes of UDP payload in
// all).
const KeepaliveLen = 40

// Keepalive is MPT's per-path keepalive (CmdKeepalive). MPT sends it every keepalive_time
// seconds; a path with none for dead_time is down.
type Keepalive struct {
	IPVer  uint8      // the connection's ip_ver: 4 or 6
	Local  netip.Addr // the sender's tunnel address
	Remote netip.Addr // the receiver's tunnel address, as the sender knows it
}

// Decode overwrites k with the keepalive b, the GRE payload that DecodeData returned with
// ErrCommand, exactly KeepaliveLen bytes, and returns KeepaliveLen. The status, auth_type,
// auth_len and round bytes and the padding are unused in keepalives and ignored (Append writes
// zeros). With IPVer 4, an IPv4-mapped address (::ffff:a.b.c.d) decodes as the IPv4 address;
// any other address, and every address with IPVer 6, decodes as the 16-byte IPv6 address it is.
// Errors, in the order checked: ErrTruncated, ErrTrailing, ErrNotKeepalive, ErrIPVersion; on
// error k is zero.
func (k *Keepalive) Decode(b []byte) (n int, err error) {
	*k = Keepalive{}
	switch {
	case len(b) < KeepaliveLen:
		return 0, ErrTruncated
	case len(b) > KeepaliveLen:
		return 0, ErrTrailing
	case b[0] != CmdKeepalive:
		return 0, ErrNotKeepalive
	case b[5] != 4 && b[5] != 6:
		return 0, ErrIPVersion
	}
	*k = Keepalive{IPVer: b[5], Local: tunnelAddr(b[5], b[8:24]), Remote: tunnelAddr(b[5], b[24:40])}
	return KeepaliveLen, nil
}

func tunnelAddr(ipVer uint8, b []byte) netip.Addr {
	a := netip.AddrFrom16([16]byte(b))
	if ipVer == 4 && a.Is4In6() {
		return a.Unmap()
	}
	return a
}

// Append appends the keepalive k, KeepaliveLen bytes, to b and returns the extended buffer; put
// a GRE header in front with EncodeData(b, ipVer, 0, false). IPv4 addresses are written as
// ::ffff:a.b.c.d, an invalid Addr as ::, and zones are dropped. IPVer is written as it is, even a
// value Decode rejects. With IPVer 6, an IPv4 address decodes back as IPv4-mapped IPv6.
func (k *Keepalive) Append(b []byte) []byte {
	b = append(b, CmdKeepalive, 0, 0, 0, 0, k.IPVer, 0, 0)
	l, r := k.Local.As16(), k.Remote.As16()
	b = append(b, l[:]...)
	return append(b, r[:]...)
}
