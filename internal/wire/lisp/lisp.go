// Package lisp encodes and decodes the messages of the Locator/ID Separation Protocol: the data
// header of RFC 9300 and the control messages of RFC 9301 that a tunnel router (xTR) and a
// Map-Server/Map-Resolver exchange — Map-Request, Map-Reply (negative ones too), Map-Register,
// Map-Notify, Map-Notify-Ack and the Encapsulated Control Message — with their EID and locator
// records, IPv4 and IPv6 addresses and the Instance-ID LCAF of RFC 8060, and the HMAC-SHA-1 and
// HMAC-SHA-256 authentication of registrations (auth.go).
//
// Data header (UDP port 4341), DataHeader:
//
//	|N|L|E|V|I|R|K|K|            Nonce/Map-Version                  |
//	|                 Instance ID/Locator-Status-Bits               |
//
// Control messages (UDP port 4342) start with a 4-bit type. Their layouts are drawn at each
// message type: MapRequest (type 1), MapReply (2), MapRegister (3, and Map-Notify 4 and
// Map-Notify-Ack 5, which share its layout) and ECM (8). Records:
//
//	EID record (Record):
//	|                          Record TTL                           |
//	| Locator Count | EID mask-len  | ACT |A|      Reserved         |
//	| Rsvd  |  Map-Version Number   |       EID-Prefix-AFI          |
//	|                          EID-Prefix                           |
//	locator (Locator), Locator Count times:
//	|    Priority   |    Weight     |  M Priority   |   M Weight    |
//	|        Unused Flags     |L|p|R|           Loc-AFI             |
//	|                             Locator                           |
//
// Addresses are an AFI and the address (Addr): AFI 0 has no address, 1 is IPv4, 2 is IPv6,
// 16387 is an LCAF whose length is in its header. Instance-ID LCAFs (type 2) are decoded; other
// LCAF types are kept as raw bytes so that the message around them still decodes. Any other AFI
// has no known length and fails the decode (ErrAFI).
//
// Decoding is bounds-checked and overwrites the whole value. Flag bits are carried as they
// arrive in a Flags word, unknown ones included, so that receivers ignore them as the RFCs ask.
// Encode(Decode(b)) reproduces b except for reserved fields, which are encoded as zero (the
// documented normalisation), and bytes after the message, which are not part of it. Decoded
// messages may alias the input (Addr.Raw, MapRegister.AuthData).
package lisp

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// UDP ports of the data and control planes.
const (
	DataPort    = 4341
	ControlPort = 4342
)

// Message types (IANA "LISP Packet Types").
const (
	TypeMapRequest   = 1
	TypeMapReply     = 2
	TypeMapRegister  = 3
	TypeMapNotify    = 4
	TypeMapNotifyAck = 5
	TypeECM          = 8
)

// Address Family Identifiers.
const (
	AFINone = 0
	AFIIPv4 = 1
	AFIIPv6 = 2
	AFILCAF = 16387
)

// LCAF types.
const LCAFInstanceID = 2

// Actions of negative mappings (IANA "LISP ACT Values").
const (
	ActNoAction        = 0
	ActNativelyForward = 1
	ActSendMapRequest  = 2
	ActDrop            = 3
	ActPolicyDenied    = 4
	ActAuthFailure     = 5
)

// Errors of the decoders. Every decode error is one of these.
var (
	ErrTruncated = errors.New("lisp: truncated message")
	ErrType      = errors.New("lisp: wrong message type")
	ErrAFI       = errors.New("lisp: unknown address family")
	ErrLength    = errors.New("lisp: inconsistent length field")
	ErrNoRecords = errors.New("lisp: map-request without records")
	ErrDataFlags = errors.New("lisp: data header with both N and V")
	ErrInner     = errors.New("lisp: encapsulated packet is not IPv4 or IPv6 with UDP")
)

// Type returns the type of the control message in b (the high nibble of its first byte), or 0
// for an empty b.
func Type(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return int(b[0] >> 4)
}

// Addr is an address with its AFI. IP holds IPv4 and IPv6 addresses, also inside an
// Instance-ID LCAF, whose instance ID and mask length are in InstanceID and IIDMaskLen. An LCAF
// of another type is kept as it came: LCAFType, LCAFFlags and the payload in Raw.
type Addr struct {
	AFI        uint16
	IP         netip.Addr
	LCAFType   uint8
	LCAFFlags  uint8
	IIDMaskLen uint8
	InstanceID uint32
	Raw        []byte
}

// AddrFrom returns the plain AFI address of ip (AFI 0 for the zero Addr).
func AddrFrom(ip netip.Addr) Addr {
	switch {
	case ip.Is4():
		return Addr{AFI: AFIIPv4, IP: ip}
	case ip.Is6():
		return Addr{AFI: AFIIPv6, IP: ip}
	}
	return Addr{}
}

// AddrWithIID returns ip inside an Instance-ID LCAF.
func AddrWithIID(ip netip.Addr, iid uint32, maskLen uint8) Addr {
	return Addr{AFI: AFILCAF, LCAFType: LCAFInstanceID, IP: ip.Unmap(), InstanceID: iid & 0xffffff, IIDMaskLen: maskLen}
}

func ipLen(ip netip.Addr) int {
	if ip.Is4() {
		return 4
	}
	if ip.Is6() {
		return 16
	}
	return 0
}

// Len is the encoded length of a.
func (a *Addr) Len() int {
	switch a.AFI {
	case AFIIPv4, AFIIPv6:
		return 2 + ipLen(a.IP)
	case AFILCAF:
		if a.LCAFType == LCAFInstanceID {
			return 2 + 6 + 4 + 2 + ipLen(a.IP)
		}
		return 2 + 6 + len(a.Raw)
	}
	return 2
}

// decode overwrites a with the address at the start of b and returns its length.
func (a *Addr) decode(b []byte) (int, error) {
	*a = Addr{}
	if len(b) < 2 {
		return 0, ErrTruncated
	}
	afi := binary.BigEndian.Uint16(b)
	switch afi {
	case AFINone:
		return 2, nil
	case AFIIPv4:
		if len(b) < 6 {
			return 0, ErrTruncated
		}
		*a = Addr{AFI: afi, IP: netip.AddrFrom4([4]byte(b[2:6]))}
		return 6, nil
	case AFIIPv6:
		if len(b) < 18 {
			return 0, ErrTruncated
		}
		*a = Addr{AFI: afi, IP: netip.AddrFrom16([16]byte(b[2:18]))}
		return 18, nil
	case AFILCAF:
		if len(b) < 8 {
			return 0, ErrTruncated
		}
		l := int(binary.BigEndian.Uint16(b[6:]))
		if len(b) < 8+l {
			return 0, ErrTruncated
		}
		d := Addr{AFI: afi, LCAFFlags: b[3], LCAFType: b[4]}
		p := b[8 : 8+l]
		if d.LCAFType != LCAFInstanceID {
			d.IIDMaskLen = b[5]
			d.Raw = p
			*a = d
			return 8 + l, nil
		}
		d.IIDMaskLen = b[5]
		if len(p) < 6 {
			return 0, ErrLength
		}
		d.InstanceID = binary.BigEndian.Uint32(p) & 0xffffff
		var in Addr
		n, err := in.decode(p[4:])
		if err != nil {
			if err == ErrTruncated {
				err = ErrLength
			}
			return 0, err
		}
		if (in.AFI != AFIIPv4 && in.AFI != AFIIPv6) || 4+n != l || p[0] != 0 {
			return 0, ErrLength
		}
		d.IP = in.IP
		*a = d
		return 8 + l, nil
	}
	return 0, ErrAFI
}

// encode writes a into b, which has room for a.Len() bytes, and returns a.Len(). A plain AFI
// address whose IP is not of that family is written as zeros of the AFI's length.
func (a *Addr) encode(b []byte) int {
	binary.BigEndian.PutUint16(b, a.AFI)
	switch a.AFI {
	case AFIIPv4, AFIIPv6:
		putIP(b[2:], a.IP)
	case AFILCAF:
		b[2], b[3], b[4] = 0, a.LCAFFlags, a.LCAFType
		if a.LCAFType == LCAFInstanceID {
			n := 4 + 2 + ipLen(a.IP)
			b[5] = a.IIDMaskLen
			binary.BigEndian.PutUint16(b[6:], uint16(n))
			binary.BigEndian.PutUint32(b[8:], a.InstanceID&0xffffff)
			in := AddrFrom(a.IP)
			in.encode(b[12:])
		} else {
			b[5] = a.IIDMaskLen
			binary.BigEndian.PutUint16(b[6:], uint16(len(a.Raw)))
			copy(b[8:], a.Raw)
		}
	}
	return a.Len()
}

func putIP(b []byte, ip netip.Addr) {
	switch {
	case ip.Is4():
		a := ip.As4()
		copy(b, a[:])
	case ip.Is6():
		a := ip.As16()
		copy(b, a[:])
	}
}

// Record is an EID record: an EID prefix and its locators, or, with no locators, a negative
// mapping whose Action says what to do with packets to the prefix.
type Record struct {
	TTL           uint32 // minutes; 0 = remove now, 0xffffffff = the receiver decides
	MaskLen       uint8
	Action        uint8 // ACT, 3 bits
	Authoritative bool  // A
	MapVersion    uint16
	EID           Addr
	Locators      []Locator
}

// Prefix returns the record's EID prefix (IPv4 or IPv6, with or without an instance ID), or
// false when the EID is of another kind or the mask is longer than the address.
func (r *Record) Prefix() (netip.Prefix, bool) {
	if !r.EID.IP.IsValid() || int(r.MaskLen) > r.EID.IP.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(r.EID.IP, int(r.MaskLen)).Masked(), true
}

// Locator flags.
const (
	LocLocal     = 0x0004 // L: the sender's own locator
	LocProbed    = 0x0002 // p: this reply is the RLOC-probe reply from this locator
	LocReachable = 0x0001 // R
)

// Locator is one RLOC of a record.
type Locator struct {
	Priority  uint8 // lower is preferred; 255 = not for unicast
	Weight    uint8
	MPriority uint8
	MWeight   uint8
	Flags     uint16
	Addr      Addr
}

// Len is the encoded length of r.
func (r *Record) Len() int {
	n := 10 + r.EID.Len()
	for i := range r.Locators {
		n += 6 + r.Locators[i].Addr.Len()
	}
	return n
}

func (r *Record) decode(b []byte) (int, error) {
	*r = Record{}
	if len(b) < 12 {
		return 0, ErrTruncated
	}
	d := Record{
		TTL:           binary.BigEndian.Uint32(b),
		MaskLen:       b[5],
		Action:        b[6] >> 5,
		Authoritative: b[6]&0x10 != 0,
		MapVersion:    binary.BigEndian.Uint16(b[8:]) & 0x0fff,
	}
	count := int(b[4])
	n, err := d.EID.decode(b[10:])
	if err != nil {
		return 0, err
	}
	off := 10 + n
	// A locator takes at least 8 bytes (6 and an AFI): check before allocating, so that a
	// short message cannot make the decoder allocate 255 locators.
	if len(b)-off < 8*count {
		return 0, ErrTruncated
	}
	if count > 0 {
		d.Locators = make([]Locator, count)
	}
	for i := range d.Locators {
		if len(b) < off+6 {
			return 0, ErrTruncated
		}
		l := &d.Locators[i]
		l.Priority, l.Weight, l.MPriority, l.MWeight = b[off], b[off+1], b[off+2], b[off+3]
		l.Flags = binary.BigEndian.Uint16(b[off+4:])
		n, err := l.Addr.decode(b[off+6:])
		if err != nil {
			return 0, err
		}
		off += 6 + n
	}
	*r = d
	return off, nil
}

func (r *Record) encode(b []byte) int {
	binary.BigEndian.PutUint32(b, r.TTL)
	b[4] = uint8(len(r.Locators))
	b[5] = r.MaskLen
	b[6] = r.Action << 5
	if r.Authoritative {
		b[6] |= 0x10
	}
	b[7] = 0
	binary.BigEndian.PutUint16(b[8:], r.MapVersion&0x0fff)
	off := 10 + r.EID.encode(b[10:])
	for i := range r.Locators {
		l := &r.Locators[i]
		b[off], b[off+1], b[off+2], b[off+3] = l.Priority, l.Weight, l.MPriority, l.MWeight
		binary.BigEndian.PutUint16(b[off+4:], l.Flags)
		off += 6 + l.Addr.encode(b[off+6:])
	}
	return off
}

func decodeRecords(b []byte, count int, rs []Record) ([]Record, int, error) {
	rs = rs[:0]
	off := 0
	for range count {
		var r Record
		n, err := r.decode(b[off:])
		if err != nil {
			return nil, 0, err
		}
		rs = append(rs, r)
		off += n
	}
	if len(rs) == 0 {
		rs = nil
	}
	return rs, off, nil
}

func recordsLen(rs []Record) int {
	n := 0
	for i := range rs {
		n += rs[i].Len()
	}
	return n
}

func encodeRecords(b []byte, rs []Record) int {
	off := 0
	for i := range rs {
		off += rs[i].encode(b[off:])
	}
	return off
}
