package lisp

import (
	"encoding/binary"
	"net/netip"
)

// Flags of the Map-Request's first word.
const (
	ReqAuthoritative = 0x08000000 // A: ask the destination site, not the mapping system
	ReqMapData       = 0x04000000 // M: a Map-Reply record (the sender's mapping) follows
	ReqProbe         = 0x02000000 // P: RLOC-probe
	ReqSMR           = 0x01000000 // S: solicit-Map-Request
	ReqPITR          = 0x00800000 // p: sent by a proxy ITR
	ReqSMRInvoked    = 0x00400000 // s: SMR-invoked
	ReqLocal         = 0x00004000 // L
	ReqDontReply     = 0x00002000 // D
	reqFlagMask      = 0x0fffe000
)

// MapRequest is a Map-Request (RFC 9301 §5.2):
//
//	|Type=1 |A|M|P|S|p|s|R|R|  Rsvd   |L|D|   IRC   | Record Count  |
//	|                         Nonce (64 bits)                       |
//	|         Source-EID-AFI        |   Source EID Address  ...     |
//	|         ITR-RLOC-AFI 1        |    ITR-RLOC Address 1  ...    |  IRC + 1 times
//	|   Reserved    | EID mask-len  |        EID-Prefix-AFI         |  Record Count
//	|                       EID-Prefix  ...                         |  times
//	|                   Map-Reply Record  ... (only if M)           |
//
// IRC is len(ITRRLOCs) - 1, so there is at least one ITR-RLOC (1 to 32); there is at least one
// record. The M bit is derived from MapData.
type MapRequest struct {
	Flags     uint32 // Req* bits; ReqMapData is ignored by Encode and set by Decode from MapData
	Nonce     uint64
	SourceEID Addr
	ITRRLOCs  []Addr
	Records   []RequestRecord
	MapData   *Record // the sender's own mapping, when M is set
}

// RequestRecord is one EID prefix asked for.
type RequestRecord struct {
	MaskLen uint8
	EID     Addr
}

// Prefix returns the prefix asked for, or false when it is not an IP prefix.
func (r *RequestRecord) Prefix() (netip.Prefix, bool) {
	rec := Record{MaskLen: r.MaskLen, EID: r.EID}
	return rec.Prefix()
}

// Len is the encoded length of m; 0 when m cannot be encoded (no ITR-RLOC, more than 32, or no
// record or more than 255).
func (m *MapRequest) Len() int {
	if len(m.ITRRLOCs) == 0 || len(m.ITRRLOCs) > 32 || len(m.Records) == 0 || len(m.Records) > 255 {
		return 0
	}
	n := 12 + m.SourceEID.Len()
	for i := range m.ITRRLOCs {
		n += m.ITRRLOCs[i].Len()
	}
	for i := range m.Records {
		n += 2 + m.Records[i].EID.Len()
	}
	if m.MapData != nil {
		n += m.MapData.Len()
	}
	return n
}

// Decode overwrites m with the Map-Request at the start of b and returns its length.
func (m *MapRequest) Decode(b []byte) (int, error) {
	its, recs := m.ITRRLOCs[:0], m.Records[:0]
	*m = MapRequest{}
	if len(b) < 12 {
		return 0, ErrTruncated
	}
	w := binary.BigEndian.Uint32(b)
	if w>>28 != TypeMapRequest {
		return 0, ErrType
	}
	irc := int(b[2]&0x1f) + 1
	count := int(b[3])
	if count == 0 {
		return 0, ErrNoRecords
	}
	d := MapRequest{Flags: w & reqFlagMask &^ ReqMapData, Nonce: binary.BigEndian.Uint64(b[4:])}
	off := 12
	n, err := d.SourceEID.decode(b[off:])
	if err != nil {
		return 0, err
	}
	off += n
	for range irc {
		var a Addr
		n, err := a.decode(b[off:])
		if err != nil {
			return 0, err
		}
		its = append(its, a)
		off += n
	}
	for range count {
		if len(b) < off+2 {
			return 0, ErrTruncated
		}
		r := RequestRecord{MaskLen: b[off+1]}
		n, err := r.EID.decode(b[off+2:])
		if err != nil {
			return 0, err
		}
		recs = append(recs, r)
		off += 2 + n
	}
	d.ITRRLOCs, d.Records = its, recs
	if w&ReqMapData != 0 {
		var r Record
		n, err := r.decode(b[off:])
		if err != nil {
			return 0, err
		}
		d.Flags |= ReqMapData
		d.MapData = &r
		off += n
	}
	*m = d
	return off, nil
}

// Encode writes m into b and returns m.Len(), or 0 (writing nothing) if b is too short or m
// cannot be encoded.
func (m *MapRequest) Encode(b []byte) int {
	n := m.Len()
	if n == 0 || len(b) < n {
		return 0
	}
	w := uint32(TypeMapRequest)<<28 | m.Flags&reqFlagMask&^ReqMapData | uint32(len(m.ITRRLOCs)-1)<<8 | uint32(len(m.Records))
	if m.MapData != nil {
		w |= ReqMapData
	}
	binary.BigEndian.PutUint32(b, w)
	binary.BigEndian.PutUint64(b[4:], m.Nonce)
	off := 12 + m.SourceEID.encode(b[12:])
	for i := range m.ITRRLOCs {
		off += m.ITRRLOCs[i].encode(b[off:])
	}
	for i := range m.Records {
		b[off], b[off+1] = 0, m.Records[i].MaskLen
		off += 2 + m.Records[i].EID.encode(b[off+2:])
	}
	if m.MapData != nil {
		off += m.MapData.encode(b[off:])
	}
	return off
}

// Flags of the Map-Reply's first word.
const (
	ReplyProbe      = 0x08000000 // P: RLOC-probe reply
	ReplyEchoNonce  = 0x04000000 // E: echo-nonce capable
	ReplySecurity   = 0x02000000 // S: LISP-SEC data follows the records
	replyFlagMask   = 0x0fffff00
	registerFlagMsk = 0x0fffff00
)

// MapReply is a Map-Reply (RFC 9301 §5.4); a negative Map-Reply is one whose record has no
// locators:
//
//	|Type=2 |P|E|S|          Reserved               | Record Count  |
//	|                         Nonce (64 bits)                       |
//	|                       Records ...                             |
//
// Bytes after the records (LISP-SEC data when S is set) are not decoded.
type MapReply struct {
	Flags   uint32 // Reply* bits, and reserved bits as they came
	Nonce   uint64
	Records []Record
}

// Len is the encoded length of m; 0 with more than 255 records.
func (m *MapReply) Len() int {
	if len(m.Records) > 255 {
		return 0
	}
	return 12 + recordsLen(m.Records)
}

// Decode overwrites m with the Map-Reply at the start of b and returns its length.
func (m *MapReply) Decode(b []byte) (int, error) {
	rs := m.Records
	*m = MapReply{}
	if len(b) < 12 {
		return 0, ErrTruncated
	}
	w := binary.BigEndian.Uint32(b)
	if w>>28 != TypeMapReply {
		return 0, ErrType
	}
	rs, n, err := decodeRecords(b[12:], int(b[3]), rs)
	if err != nil {
		return 0, err
	}
	*m = MapReply{Flags: w & replyFlagMask, Nonce: binary.BigEndian.Uint64(b[4:]), Records: rs}
	return 12 + n, nil
}

// Encode writes m into b and returns m.Len(), or 0 (writing nothing) if b is too short.
func (m *MapReply) Encode(b []byte) int {
	n := m.Len()
	if n == 0 || len(b) < n {
		return 0
	}
	binary.BigEndian.PutUint32(b, uint32(TypeMapReply)<<28|m.Flags&replyFlagMask|uint32(len(m.Records)))
	binary.BigEndian.PutUint64(b[4:], m.Nonce)
	encodeRecords(b[12:], m.Records)
	return n
}

// Flags of the Map-Register's first word (reserved in Map-Notify and Map-Notify-Ack).
const (
	RegProxyReply = 0x08000000 // P: the Map-Server answers Map-Requests for the site itself
	RegSecurity   = 0x04000000 // S: LISP-SEC capable
	RegXTRID      = 0x02000000 // I: xTR-ID and site-ID follow the records
	RegEIDNotify  = 0x00001000 // E
	RegTTLTimeout = 0x00000800 // T: time the registration out by the record TTL
	RegMerge      = 0x00000400 // a
	RegWantNotify = 0x00000100 // M: answer with a Map-Notify
)

// Authentication algorithms (IANA "LISP Algorithm ID Numbers").
const (
	AlgNone       = 0
	AlgHMACSHA1   = 1 // HMAC-SHA-1-96; the full 20-byte digest is sent by deployed peers
	AlgHMACSHA256 = 2 // HMAC-SHA-256-128; the full 32-byte digest is sent by deployed peers
)

// MapRegister is a Map-Register (RFC 9301 §5.6), and with Type 4 or 5 a Map-Notify or a
// Map-Notify-Ack (§5.7), which share its layout:
//
//	|Type=3 |P|S|I|        Reserved         |E|T|a|R|M| Record Count  |
//	|                         Nonce (64 bits)                       |
//	|    Key ID     | Algorithm ID  |  Authentication Data Length   |
//	~                     Authentication Data                       ~
//	|                       Records ...                             |
//	|  xTR-ID (128 bits) ‖ site-ID (64 bits)     -- only if I = 1   |
//
// The I bit is derived from HasXTRID. Sign and Verify (auth.go) compute the authentication
// data over the encoded message.
type MapRegister struct {
	Type     int    // TypeMapRegister, TypeMapNotify or TypeMapNotifyAck; 0 means Map-Register
	Flags    uint32 // Reg* bits and reserved bits as they came; RegXTRID follows HasXTRID
	Nonce    uint64
	KeyID    uint8
	AlgID    uint8
	AuthData []byte
	Records  []Record
	HasXTRID bool
	XTRID    [16]byte
	SiteID   uint64
}

func (m *MapRegister) msgType() int {
	if m.Type == 0 {
		return TypeMapRegister
	}
	return m.Type
}

// Len is the encoded length of m; 0 with more than 255 records, authentication data longer
// than 65535 bytes or a Type that is not 3, 4 or 5.
func (m *MapRegister) Len() int {
	t := m.msgType()
	if len(m.Records) > 255 || len(m.AuthData) > 0xffff || t < TypeMapRegister || t > TypeMapNotifyAck {
		return 0
	}
	n := 16 + len(m.AuthData) + recordsLen(m.Records)
	if m.HasXTRID {
		n += 24
	}
	return n
}

// Decode overwrites m with the message of type 3, 4 or 5 at the start of b and returns its
// length.
func (m *MapRegister) Decode(b []byte) (int, error) {
	rs := m.Records
	*m = MapRegister{}
	if len(b) < 16 {
		return 0, ErrTruncated
	}
	w := binary.BigEndian.Uint32(b)
	t := int(w >> 28)
	if t < TypeMapRegister || t > TypeMapNotifyAck {
		return 0, ErrType
	}
	d := MapRegister{Type: t, Flags: w & registerFlagMsk, Nonce: binary.BigEndian.Uint64(b[4:]), KeyID: b[12], AlgID: b[13]}
	al := int(binary.BigEndian.Uint16(b[14:]))
	if len(b) < 16+al {
		return 0, ErrTruncated
	}
	if al > 0 {
		d.AuthData = b[16 : 16+al]
	}
	rs, n, err := decodeRecords(b[16+al:], int(b[3]), rs)
	if err != nil {
		return 0, err
	}
	d.Records = rs
	off := 16 + al + n
	if w&RegXTRID != 0 {
		if len(b) < off+24 {
			return 0, ErrTruncated
		}
		d.HasXTRID = true
		d.XTRID = [16]byte(b[off : off+16])
		d.SiteID = binary.BigEndian.Uint64(b[off+16:])
		off += 24
	}
	*m = d
	return off, nil
}

// Encode writes m into b and returns m.Len(), or 0 (writing nothing) if b is too short or m
// cannot be encoded.
func (m *MapRegister) Encode(b []byte) int {
	n := m.Len()
	if n == 0 || len(b) < n {
		return 0
	}
	w := uint32(m.msgType())<<28 | m.Flags&registerFlagMsk&^RegXTRID | uint32(len(m.Records))
	if m.HasXTRID {
		w |= RegXTRID
	}
	binary.BigEndian.PutUint32(b, w)
	binary.BigEndian.PutUint64(b[4:], m.Nonce)
	b[12], b[13] = m.KeyID, m.AlgID
	binary.BigEndian.PutUint16(b[14:], uint16(len(m.AuthData)))
	copy(b[16:], m.AuthData)
	off := 16 + len(m.AuthData)
	off += encodeRecords(b[off:], m.Records)
	if m.HasXTRID {
		copy(b[off:], m.XTRID[:])
		binary.BigEndian.PutUint64(b[off+16:], m.SiteID)
	}
	return n
}
