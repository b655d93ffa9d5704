package lisp

import "encoding/binary"

// DataHeaderLen is the length of the data header.
const DataHeaderLen = 8

// Flags of the data header's first byte.
const (
	DataNonce      = 0x80 // N: a 24-bit nonce follows
	DataLSB        = 0x40 // L: locator-status-bits in the second word
	DataEchoNonce  = 0x20 // E: echo-nonce request
	DataMapVersion = 0x10 // V: source and destination map-versions follow
	DataIID        = 0x08 // I: instance ID in the second word
	DataReserved   = 0x04 // R
	DataKeyMask    = 0x03 // KK: LISP-crypto key ID
)

// DataHeader is the LISP data header (RFC 9300 §5.3) that follows the outer UDP header:
//
//	|N|L|E|V|I|R|K|K|            Nonce/Map-Version                  |
//	|                 Instance ID/Locator-Status-Bits               |
//
// Nonce is carried when N is set, the map-versions when V is set (N and V together are
// ErrDataFlags). With I, the second word is InstanceID and 8 bits of LSB (meaningful when L is
// set, carried as they are otherwise); without I, it is 32 bits of LSB when L is set. Fields
// whose flag is clear are encoded as zero.
type DataHeader struct {
	Flags         uint8
	Nonce         uint32 // 24 bits
	SrcMapVersion uint16 // 12 bits
	DstMapVersion uint16 // 12 bits
	InstanceID    uint32 // 24 bits
	LSB           uint32
}

// Decode overwrites h with the header at the start of b and returns DataHeaderLen.
func (h *DataHeader) Decode(b []byte) (int, error) {
	*h = DataHeader{}
	if len(b) < DataHeaderLen {
		return 0, ErrTruncated
	}
	f := b[0]
	if f&DataNonce != 0 && f&DataMapVersion != 0 {
		return 0, ErrDataFlags
	}
	d := DataHeader{Flags: f}
	w0 := binary.BigEndian.Uint32(b) & 0xffffff
	w1 := binary.BigEndian.Uint32(b[4:])
	switch {
	case f&DataNonce != 0:
		d.Nonce = w0
	case f&DataMapVersion != 0:
		d.SrcMapVersion, d.DstMapVersion = uint16(w0>>12), uint16(w0&0xfff)
	}
	if f&DataIID != 0 {
		d.InstanceID, d.LSB = w1>>8, w1&0xff
	} else if f&DataLSB != 0 {
		d.LSB = w1
	}
	*h = d
	return DataHeaderLen, nil
}

// Encode writes h into b and returns DataHeaderLen, or 0 if b is shorter.
func (h *DataHeader) Encode(b []byte) int {
	if len(b) < DataHeaderLen {
		return 0
	}
	f := h.Flags
	var w0, w1 uint32
	switch {
	case f&DataNonce != 0:
		w0 = h.Nonce & 0xffffff
	case f&DataMapVersion != 0:
		w0 = uint32(h.SrcMapVersion&0xfff)<<12 | uint32(h.DstMapVersion&0xfff)
	}
	if f&DataIID != 0 {
		w1 = (h.InstanceID&0xffffff)<<8 | h.LSB&0xff
	} else if f&DataLSB != 0 {
		w1 = h.LSB
	}
	binary.BigEndian.PutUint32(b, uint32(f)<<24|w0)
	binary.BigEndian.PutUint32(b[4:], w1)
	return DataHeaderLen
}
