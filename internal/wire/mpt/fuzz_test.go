package mpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// FuzzDecodeData checks DecodeData on arbitrary input (documented errors, payload a sub-slice
// at the right offset, EncodeData reproducing the header up to the documented normalisation)
// and DecodeData(EncodeData(...) + payload) on values built by the fuzzer. DecodeData has no
// value to decode into, so the dirty-value property does not apply.
func FuzzDecodeData(f *testing.F) {
	for _, tt := range dataTests {
		f.Add(unhex(f, tt.in), tt.ipVer == 6, uint32(7), true, unhex(f, tt.payload))
	}
	f.Fuzz(func(t *testing.T, b []byte, v6 bool, seq uint32, withSeq bool, payload []byte) {
		p, s, hasSeq, err := DecodeData(b)
		switch {
		case errors.Is(err, ErrTruncated):
			if p != nil || s != 0 || hasSeq {
				t.Fatalf("ErrTruncated with % x, %d, %v", p, s, hasSeq)
			}
			if len(b) >= SeqHeaderLen || len(b) >= HeaderLen && b[0]&flagS == 0 {
				t.Fatalf("ErrTruncated for % x", b)
			}
		case err == nil || errors.Is(err, ErrCommand):
			hl := len(b) - len(p)
			wantHL := HeaderLen
			if b[0]&flagS != 0 {
				wantHL = SeqHeaderLen
			}
			if hl != wantHL || hasSeq != (hl == SeqHeaderLen) || len(p) > 0 && &p[0] != &b[hl] {
				t.Fatalf("payload at %d (want %d), hasSeq %v, for % x", hl, wantHL, hasSeq, b)
			}
			if hasSeq && s != binary.BigEndian.Uint32(b[4:]) || !hasSeq && s != 0 {
				t.Fatalf("seq %d for % x", s, b)
			}
			if (err != nil) != (len(p) > 0 && p[0] >= CommandMin) {
				t.Fatalf("err %v for payload % x", err, p)
			}
			// Encoding keeps S and the sequence number, and writes Protocol Type from ipVer.
			for _, ipVer := range []int{4, 6} {
				want := bytes.Clone(b[:hl])
				want[0] &= flagS
				want[1] = 0
				binary.BigEndian.PutUint16(want[2:], protoIPv4)
				if ipVer == 6 {
					binary.BigEndian.PutUint16(want[2:], protoIPv6)
				}
				out := make([]byte, hl)
				if n := EncodeData(out, ipVer, s, hasSeq); n != hl || !bytes.Equal(out, want) {
					t.Fatalf("EncodeData(%d, %d, %v) = %d, % x; want % x", ipVer, s, hasSeq, n, out, want)
				}
			}
		default:
			t.Fatalf("undocumented error %v", err)
		}

		ipVer := 4
		if v6 {
			ipVer = 6
		}
		pkt := make([]byte, SeqHeaderLen+len(payload))
		n := EncodeData(pkt, ipVer, seq, withSeq)
		pkt = append(pkt[:n], payload...)
		p, s, hasSeq, err = DecodeData(pkt)
		wantErr := error(nil)
		if len(payload) > 0 && payload[0] >= CommandMin {
			wantErr = ErrCommand
		}
		if !withSeq {
			seq = 0
		}
		if err != wantErr || !bytes.Equal(p, payload) || s != seq || hasSeq != withSeq {
			t.Fatalf("DecodeData(EncodeData(%d, %d, %v) + % x) = % x, %d, %v, %v", ipVer, seq, withSeq, payload, p, s, hasSeq, err)
		}
	})
}

// FuzzKeepalive checks the properties of STYLE.md rule 4 for Keepalive.Decode, and the round
// trip Decode(Append(k)) == k on keepalives built as Decode builds them.
func FuzzKeepalive(f *testing.F) {
	f.Add(unhex(f, golden)[4:], true, []byte{10, 0, 0, 2}, []byte{10, 0, 0, 1})
	f.Add(unhex(f, "a1 00000000 06 0000 fec00000000000000000000000000002 fec00000000000000000000000000001"), false,
		unhex(f, "fec00000000000000000000000000002"), unhex(f, "00000000000000000000ffff0a000001"))
	f.Add(unhex(f, "a1 80020401 04 abcd 00000000000000000000000000000000 00000000000000000000ffff0a000001"), true, []byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, b []byte, v4 bool, local, remote []byte) {
		var k Keepalive
		n, err := k.Decode(b)
		d := dirtyKeepalive
		dn, derr := d.Decode(b)
		if d != k || dn != n || derr != err {
			t.Fatalf("dirty decode %d, %v, %+v != zero decode %d, %v, %+v", dn, derr, d, n, err, k)
		}
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrTrailing) && !errors.Is(err, ErrNotKeepalive) && !errors.Is(err, ErrIPVersion) {
				t.Fatalf("undocumented error %v", err)
			}
			if n != 0 || k != (Keepalive{}) {
				t.Fatalf("error %v with n = %d, %+v", err, n, k)
			}
		} else {
			if n != KeepaliveLen || len(b) != KeepaliveLen || k.IPVer != 4 && k.IPVer != 6 {
				t.Fatalf("n = %d for %d bytes, IPVer %d", n, len(b), k.IPVer)
			}
			for _, a := range []netip.Addr{k.Local, k.Remote} {
				if !a.IsValid() || a.Zone() != "" || a.Is4() && k.IPVer != 4 || k.IPVer == 4 && a.Is4In6() {
					t.Fatalf("address %v with IPVer %d", a, k.IPVer)
				}
			}
			want := bytes.Clone(b)
			clear(want[1:5]) // status, auth_type, auth_len, round
			clear(want[6:8]) // padding
			if out := k.Append(nil); !bytes.Equal(out, want) {
				t.Fatalf("Append(Decode(b)) = % x, want % x", out, want)
			}
		}

		v := Keepalive{IPVer: 6, Local: addr(local, false), Remote: addr(remote, false)}
		if v4 {
			v = Keepalive{IPVer: 4, Local: addr(local, true), Remote: addr(remote, true)}
		}
		var got Keepalive
		if n, err := got.Decode(v.Append(nil)); n != KeepaliveLen || err != nil || got != v {
			t.Fatalf("Decode(Append(%+v)) = %d, %v, %+v", v, n, err, got)
		}
	})
}

// addr builds a tunnel address from fuzz bytes the way Decode would return it: 4 bytes make an
// IPv4 address in an IPv4 connection; otherwise 16 bytes (zero-padded), unmapped in an IPv4
// connection.
func addr(b []byte, v4 bool) netip.Addr {
	if v4 && len(b) == 4 {
		return netip.AddrFrom4([4]byte(b))
	}
	var a16 [16]byte
	copy(a16[:], b)
	a := netip.AddrFrom16(a16)
	if v4 {
		a = a.Unmap()
	}
	return a
}
