package gre

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzDecode checks the properties of STYLE.md rule 4 on arbitrary input, and the round trip
// Decode(Encode(h)) == h on headers built from the other arguments.
func FuzzDecode(f *testing.F) {
	for _, tt := range decodeTests {
		f.Add(unhex(f, tt.in), uint8(0), uint16(0), uint16(0), uint32(0), uint32(0), []byte(nil))
	}
	f.Add([]byte{0x40, 0, 8, 0}, uint8(7), uint16(ProtoBraid), uint16(0xffff), uint32(1), uint32(2), []byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte, flags uint8, proto, csum uint16, key, seq uint32, payload []byte) {
		var zero Header
		n, err := zero.Decode(b)
		d := dirty()
		dn, derr := d.Decode(b)
		if d != zero || dn != n || derr != err {
			t.Fatalf("dirty decode %d, %v, %+v != zero decode %d, %v, %+v", dn, derr, d, n, err, zero)
		}
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrReserved) {
				t.Fatalf("undocumented error %v", err)
			}
			if n != 0 || zero != (Header{}) {
				t.Fatalf("error %v with n = %d, header %+v", err, n, zero)
			}
		} else {
			if n != zero.Len() || n < MinLen || n > MaxLen || n > len(b) {
				t.Fatalf("n = %d, Len() = %d, len(b) = %d", n, zero.Len(), len(b))
			}
			out := make([]byte, n)
			if m := zero.Encode(out); m != n {
				t.Fatalf("Encode = %d, want %d", m, n)
			}
			want := bytes.Clone(b[:n])
			if zero.ChecksumPresent {
				want[6], want[7] = 0, 0 // Reserved1 is normalised to zero
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("Encode(Decode(b)) = % x, want % x", out, want)
			}
		}

		// Round trip of a header built by the fuzzer, with the optional fields of absent flags
		// left zero as Decode leaves them.
		h := Header{ChecksumPresent: flags&1 != 0, KeyPresent: flags&2 != 0, SeqPresent: flags&4 != 0, Protocol: proto}
		if h.ChecksumPresent {
			h.CSum = csum
		}
		if h.KeyPresent {
			h.Key = key
		}
		if h.SeqPresent {
			h.Seq = seq
		}
		pkt := make([]byte, h.Len()+len(payload))
		hn := h.Encode(pkt)
		copy(pkt[hn:], payload)
		var g Header
		if gn, err := g.Decode(pkt); err != nil || gn != hn || g != h {
			t.Fatalf("Decode(Encode(%+v)) = %d, %v, %+v", h, gn, err, g)
		}
		if h.ChecksumPresent {
			if !PutChecksum(pkt) || !VerifyChecksum(pkt) {
				t.Fatalf("checksum put into % x does not verify", pkt)
			}
			if refChecksum(pkt) != 0 || Checksum(payload) != refChecksum(payload) {
				t.Fatalf("Checksum disagrees with the reference on % x", pkt)
			}
			// A ones' complement sum detects any single-bit error.
			bit := int(seq % uint32(8*len(pkt)))
			pkt[bit/8] ^= 1 << (bit % 8)
			if binary.BigEndian.Uint16(pkt)&flagC != 0 && VerifyChecksum(pkt) {
				t.Fatalf("bit %d flipped, checksum still verifies: % x", bit, pkt)
			}
		} else if VerifyChecksum(pkt) || PutChecksum(pkt) {
			t.Fatalf("checksum without C verifies or is put: % x", pkt)
		}
	})
}
