package mpath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// checkDecode checks the properties of STYLE.md rule 4 for one input: decoding into a dirty
// value equals decoding into a zero value, errors come from the documented set and leave the
// value zero, the length is within the input, and encoding the value gives back the decoded
// prefix of b after normalise (nil: none). It returns the decoded value and length.
func checkDecode[T comparable, P codec[T]](t *testing.T, b []byte, dirty T, errs []error, normalise func([]byte)) (T, int, error) {
	t.Helper()
	var zero, v T
	n, err := P(&v).Decode(b)
	d := dirty
	dn, derr := P(&d).Decode(b)
	if d != v || dn != n || derr != err {
		t.Fatalf("dirty decode %d, %v, %+v != zero decode %d, %v, %+v", dn, derr, d, n, err, v)
	}
	if err != nil {
		known := false
		for _, e := range errs {
			known = known || errors.Is(err, e)
		}
		if !known || n != 0 || v != zero {
			t.Fatalf("error %v (documented: %v) with n = %d, value %+v", err, known, n, v)
		}
		return v, n, err
	}
	if n < 0 || n > len(b) {
		t.Fatalf("n = %d for %d bytes", n, len(b))
	}
	out := make([]byte, n)
	if m := P(&v).Encode(out); m != n {
		t.Fatalf("Encode(%+v) = %d, want %d", v, m, n)
	}
	want := bytes.Clone(b[:n])
	if normalise != nil {
		normalise(want)
	}
	if !bytes.Equal(out, want) {
		t.Fatalf("Encode(Decode(b)) = % x, want % x", out, want)
	}
	return v, n, nil
}

// checkRoundTrip checks Decode(Encode(v)) == v, with trailing bytes after the encoding when
// the message is not fixed-length.
func checkRoundTrip[T comparable, P codec[T]](t *testing.T, v T, size int, trailing []byte) {
	t.Helper()
	buf := make([]byte, size+len(trailing))
	n := P(&v).Encode(buf)
	if n != size {
		t.Fatalf("Encode(%+v) = %d, want %d", v, n, size)
	}
	copy(buf[n:], trailing)
	var got T
	if m, err := P(&got).Decode(buf); err != nil || m != n || got != v {
		t.Fatalf("Decode(Encode(%+v)) = %d, %v, %+v", v, m, err, got)
	}
}

func addSeeds[T any](f *testing.F, vs []vector[T], errs []errVector) {
	for _, v := range vs {
		f.Add(unhex(f, v.in), uint64(0x0102030405060708), uint32(1), uint32(2))
	}
	for _, v := range errs {
		f.Add(unhex(f, v.in), uint64(0), uint32(0), uint32(0))
	}
}

func FuzzHeader(f *testing.F) {
	addSeeds(f, headerVectors, headerErrors)
	f.Fuzz(func(t *testing.T, b []byte, counter uint64, x, _ uint32) {
		h, n, err := checkDecode(t, b, dirtyHeader, []error{ErrTruncated, ErrType, ErrUnknownFlags}, nil)
		if err == nil && (n != HeaderLen || h.Flags != 0 && (h.Flags&^(FlagClear|FlagSparse) != 0 || h.Type != TypeData)) {
			t.Fatalf("n = %d, Flags = %#x", n, h.Flags)
		}
		// Built values: only the eleven types, and no flags but FlagClear and FlagSparse on data, decode; others
		// fail as documented.
		v := Header{Type: uint8(x), Path: uint8(x >> 8), Flags: uint16(x >> 16), Counter: counter}
		buf := make([]byte, HeaderLen)
		v.Encode(buf)
		var got Header
		_, err = got.Decode(buf)
		switch v.Type {
		case TypeData, TypeProbe, TypeProbeReply, TypeFeedback, TypeMTUProbe, TypeMTUAck, TypeNack, TypeGapNack, TypeHandshakeInit, TypeHandshakeResp, TypeCookieReply:
			if v.Flags != 0 && !(v.Flags&^(FlagClear|FlagSparse) == 0 && v.Type == TypeData) {
				if err != ErrUnknownFlags {
					t.Fatalf("Decode(Encode(%+v)): %v, want ErrUnknownFlags", v, err)
				}
				v.Flags = 0
			}
			checkRoundTrip(t, v, HeaderLen, b)
		default:
			if err != ErrType {
				t.Fatalf("Decode(Encode(%+v)): %v, want ErrType", v, err)
			}
		}
	})
}

func FuzzDataPrefix(f *testing.F) {
	addSeeds(f, prefixVectors, prefixErrors)
	f.Fuzz(func(t *testing.T, b []byte, _ uint64, seq, ts uint32) {
		_, n, err := checkDecode(t, b, dirtyPrefix, []error{ErrTruncated}, nil)
		if err == nil && n != DataPrefixLen {
			t.Fatalf("n = %d", n)
		}
		checkRoundTrip(t, DataPrefix{Seq: seq, PathSeq: ts}, DataPrefixLen, b)
	})
}

func FuzzProbe(f *testing.F) {
	addSeeds(f, probeVectors, probeErrors)
	f.Fuzz(func(t *testing.T, b []byte, pad uint64, seq, ts uint32) {
		// Padding is normalised to zero bytes.
		p, n, err := checkDecode(t, b, dirtyProbe, []error{ErrTruncated}, func(w []byte) { clear(w[ProbeMinLen:]) })
		if err == nil && (n != len(b) || p.Padding != n-ProbeMinLen || p.Len() != n) {
			t.Fatalf("n = %d, Padding = %d, Len() = %d for %d bytes", n, p.Padding, p.Len(), len(b))
		}
		v := Probe{Seq: seq, Timestamp: ts, Padding: int(pad % 9000)}
		checkRoundTrip(t, v, v.Len(), nil)
	})
}

func FuzzFeedback(f *testing.F) {
	addSeeds(f, feedbackVectors, feedbackErrors)
	f.Fuzz(func(t *testing.T, b []byte, nbytes uint64, x, y uint32) {
		_, n, err := checkDecode(t, b, dirtyFeedback, []error{ErrTruncated, ErrTrailing}, nil)
		if (err == nil) != (len(b) == FeedbackLen) || err == nil && n != FeedbackLen {
			t.Fatalf("len(b) = %d: n = %d, %v", len(b), n, err)
		}
		checkRoundTrip(t, Feedback{Bytes: nbytes, Packets: x, Lost: y, ReorderPackets: x ^ y, ReorderKiB: x + y, Time: x * 3, ReorderFreeKiB: y * 5}, FeedbackLen, nil)
	})
}

func FuzzProbeReply(f *testing.F) {
	addSeeds(f, replyVectors, replyErrors)
	f.Fuzz(func(t *testing.T, b []byte, nbytes uint64, x, y uint32) {
		_, n, err := checkDecode(t, b, dirtyReply, []error{ErrTruncated, ErrTrailing}, nil)
		if (err == nil) != (len(b) == ProbeReplyLen) || err == nil && n != ProbeReplyLen {
			t.Fatalf("len(b) = %d: n = %d, %v", len(b), n, err)
		}
		v := ProbeReply{Seq: x, Timestamp: y, Hold: x * y, Feedback: Feedback{Bytes: nbytes, Packets: y, Lost: x, ReorderPackets: x - y, ReorderKiB: x | y, Time: x + 7, ReorderFreeKiB: x & y}}
		checkRoundTrip(t, v, ProbeReplyLen, nil)
	})
}

func FuzzMTUAck(f *testing.F) {
	addSeeds(f, mtuAckVectors, mtuAckErrors)
	f.Fuzz(func(t *testing.T, b []byte, _ uint64, x, y uint32) {
		_, n, err := checkDecode(t, b, dirtyMTUAck, []error{ErrTruncated, ErrTrailing}, nil)
		if (err == nil) != (len(b) == MTUAckLen) || err == nil && n != MTUAckLen {
			t.Fatalf("len(b) = %d: n = %d, %v", len(b), n, err)
		}
		checkRoundTrip(t, MTUAck{Seq: x, Size: y}, MTUAckLen, nil)
	})
}

func FuzzNack(f *testing.F) {
	addSeeds(f, nackVectors, nackErrors)
	f.Fuzz(func(t *testing.T, b []byte, _ uint64, x, y uint32) {
		_, n, err := checkDecode(t, b, dirtyNack, []error{ErrTruncated, ErrTrailing}, nil)
		if (err == nil) != (len(b) == NackLen) || err == nil && n != NackLen {
			t.Fatalf("len(b) = %d: n = %d, %v", len(b), n, err)
		}
		checkRoundTrip(t, Nack{First: x, Count: uint16(y), Path: uint8(y >> 16)}, NackLen, nil)
	})
}

func FuzzGapNack(f *testing.F) {
	addSeeds(f, gapNackVectors, gapNackErrors)
	f.Fuzz(func(t *testing.T, b []byte, z uint64, x, _ uint32) {
		_, n, err := checkDecode(t, b, dirtyGapNack, []error{ErrTruncated, ErrTrailing}, nil)
		if (err == nil) != (len(b) == GapNackLen) || err == nil && n != GapNackLen {
			t.Fatalf("len(b) = %d: n = %d, %v", len(b), n, err)
		}
		checkRoundTrip(t, GapNack{First: x, Missing: z}, GapNackLen, nil)
	})
}

func FuzzInnerVersion(f *testing.F) {
	for _, tt := range innerTests {
		f.Add(unhex(f, tt.in))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := InnerVersion(b)
		switch {
		case err != nil:
			if !errors.Is(err, ErrInnerPacket) || v != 0 {
				t.Fatalf("InnerVersion = %d, %v", v, err)
			}
		case v == 4:
			ihl := int(b[0]&0xf) * 4
			if b[0]>>4 != 4 || ihl < 20 || ihl > len(b) || int(binary.BigEndian.Uint16(b[2:])) != len(b) {
				t.Fatalf("accepted as IPv4: % x", b)
			}
		case v == 6:
			if b[0]>>4 != 6 || len(b) < 40 || 40+int(binary.BigEndian.Uint16(b[4:])) != len(b) {
				t.Fatalf("accepted as IPv6: % x", b)
			}
		default:
			t.Fatalf("InnerVersion = %d, nil", v)
		}
		// Made consistent, any long enough input is accepted.
		if len(b) >= 60 && len(b) <= 0xffff {
			p := bytes.Clone(b)
			p[0] = 0x40 | p[0]&0x0f | 0x05
			binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
			if v, err := InnerVersion(p); v != 4 || err != nil {
				t.Fatalf("consistent IPv4 % x: %d, %v", p, v, err)
			}
			p[0] = 0x60 | p[0]&0x0f
			binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
			if v, err := InnerVersion(p); v != 6 || err != nil {
				t.Fatalf("consistent IPv6 % x: %d, %v", p, v, err)
			}
		}
	})
}
