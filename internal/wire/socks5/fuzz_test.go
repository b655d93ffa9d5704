package socks5

import (
	"bytes"
	"errors"
	"testing"
)

var errorsDialect = []error{ErrShort, ErrVersion, ErrAddrType, ErrLength, ErrAddress}

func oneOf(err error, set []error) bool {
	for _, e := range set {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// FuzzHeader checks the dialect decoder: errors from the documented set, the length it
// returns equals HeaderLen and the encoding's, decoding into a dirty value equals decoding into
// a zero one, and encode(decode(b)) reproduces b.
func FuzzHeader(f *testing.F) {
	for _, s := range []string{
		"01130508080808c0a80001897c1f9000001234",
		"012b0620010db800000000000000000000000320010db8000000000000000000000002c35001bb00000000",
		"0109010a5b03021f90",
		"01150420010db800000000000000000000000301bb",
		"0501000100", "01", "",
	} {
		b, _ := hexBytes(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		n, err := h.Decode(b)
		dirty := Header{Mark: 99}
		n2, err2 := dirty.Decode(b)
		if n != n2 || !errors.Is(err2, err) && err != err2 || h != dirty {
			t.Fatalf("dirty decode differs: %+v %d %v vs %+v %d %v", h, n, err, dirty, n2, err2)
		}
		if err != nil {
			if !oneOf(err, errorsDialect) {
				t.Fatalf("undocumented error %v", err)
			}
			if h != (Header{}) || n != 0 {
				t.Fatalf("error %v left %+v, %d", err, h, n)
			}
			return
		}
		if l, err := HeaderLen(b); err != nil || l != n {
			t.Fatalf("HeaderLen %d %v, Decode %d", l, err, n)
		}
		out, err := h.Append(nil)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", h, err)
		}
		// A header without a source carries no mark: Decode leaves it zero, so the bytes
		// match exactly.
		if !bytes.Equal(out, b[:n]) {
			t.Fatalf("encode(decode(%x)) = %x", b[:n], out)
		}
	})
}

// FuzzCompat is FuzzHeader for the compatibility profile (normalisation: the high nibble of
// ATYP is masked off on decode).
func FuzzCompat(f *testing.F) {
	for _, s := range []string{
		"050a5b03020a5b0002897c1f9000000000",
		"0620010db800000000000000000000000320010db8000000000000000000000002c35001bb00000000",
		"150a5b03020a5b0002897c1f9034120000", "07", "",
	} {
		b, _ := hexBytes(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		n, err := DecodeCompat(&h, b)
		if err != nil {
			if !oneOf(err, []error{ErrShort, ErrAddrType, ErrAddress}) || h != (Header{}) {
				t.Fatalf("error %v, header %+v", err, h)
			}
			return
		}
		out, err := AppendCompat(nil, h)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		want := append([]byte{b[0] & 0x0F}, b[1:n]...)
		if !bytes.Equal(out, want) {
			t.Fatalf("encode(decode(%x)) = %x", b[:n], out)
		}
	})
}

// FuzzRequest checks the RFC 1928 request decoder with the same properties.
func FuzzRequest(f *testing.F) {
	for _, s := range []string{
		"050100010a5b03021f90",
		"0501000420010db800000000000000000000000301bb",
		"050100030b6578616d706c652e636f6d0050",
		"050900010a5b03021f90", "05010003000050", "0401", "",
	} {
		b, _ := hexBytes(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		n, err := r.Decode(b)
		dirty := Request{Cmd: 9, Dst: Addr{Name: "x"}}
		n2, err2 := dirty.Decode(b)
		if n != n2 || err != err2 || r != dirty {
			t.Fatalf("dirty decode differs")
		}
		if err != nil && !errors.Is(err, ErrCommand) {
			if !oneOf(err, []error{ErrShort, ErrVersion, ErrAddrType, ErrReserved, ErrAddress}) || r != (Request{}) || n != 0 {
				t.Fatalf("error %v, %+v %d", err, r, n)
			}
			return
		}
		if l, lerr := RequestLen(b); lerr != nil || l != n {
			t.Fatalf("RequestLen %d %v, Decode %d", l, lerr, n)
		}
		if err != nil { // ErrCommand: the whole request was read
			return
		}
		out, err := r.Append(nil)
		if err != nil || !bytes.Equal(out, b[:n]) {
			t.Fatalf("encode(decode(%x)) = %x, %v", b[:n], out, err)
		}
	})
}

// FuzzGreeting checks the greeting decoder.
func FuzzGreeting(f *testing.F) {
	for _, s := range []string{"050100", "05020002", "0500", "0401", ""} {
		b, _ := hexBytes(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var g Greeting
		n, err := g.Decode(b)
		if err != nil {
			if !oneOf(err, []error{ErrShort, ErrVersion, ErrMethods}) || g.Methods != nil || n != 0 {
				t.Fatalf("error %v, %+v", err, g)
			}
			return
		}
		out, err := g.Append(nil)
		if err != nil || !bytes.Equal(out, b[:n]) {
			t.Fatalf("encode(decode(%x)) = %x %v", b[:n], out, err)
		}
	})
}

func hexBytes(s string) ([]byte, error) {
	out := make([]byte, 0, len(s)/2)
	for i := 0; i+1 < len(s); i += 2 {
		var v byte
		for _, c := range s[i : i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			case c >= 'a' && c <= 'f':
				v |= byte(c-'a') + 10
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// FuzzReply checks the RFC 1928 reply decoder (what a SOCKS5 client of an untrusted server
// reads): errors from the documented set leave a zero value and no length, the length equals
// RequestLen's (the same shape), decoding into a dirty value equals decoding into a zero one,
// and encode(decode(b)) reproduces b. Seeds: testdata/fuzz/FuzzReply.
func FuzzReply(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Reply
		n, err := r.Decode(b)
		dirty := Reply{Code: 7, Bind: Addr{Name: "x", Port: 1}}
		n2, err2 := dirty.Decode(b)
		if n != n2 || err != err2 || r != dirty {
			t.Fatalf("dirty decode differs: %+v %d %v vs %+v %d %v", r, n, err, dirty, n2, err2)
		}
		if err != nil {
			if !oneOf(err, []error{ErrShort, ErrVersion, ErrAddrType, ErrReserved, ErrAddress}) || r != (Reply{}) || n != 0 {
				t.Fatalf("error %v, %+v %d", err, r, n)
			}
			return
		}
		if n > len(b) || n > MaxRequestLen {
			t.Fatalf("length %d of %d bytes (max %d)", n, len(b), MaxRequestLen)
		}
		if l, lerr := RequestLen(b); lerr != nil || l != n {
			t.Fatalf("RequestLen %d %v, Decode %d", l, lerr, n)
		}
		out, err := r.Append(nil)
		if err != nil || !bytes.Equal(out, b[:n]) {
			t.Fatalf("encode(decode(%x)) = %x, %v", b[:n], out, err)
		}
	})
}
