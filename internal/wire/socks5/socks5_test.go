package socks5

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The reference vectors of socks5-dialect.md §3, in the compatibility profile.
func TestCompatVectors(t *testing.T) {
	for _, tc := range []struct {
		hex string
		h   Header
	}{
		{"05 0a5b0302 0a5b0002 897c 1f90 00000000", Header{Dst: netip.MustParseAddrPort("10.91.3.2:8080"), Src: netip.MustParseAddrPort("10.91.0.2:35196")}},
		{"05 0a5b0302 0a5b0002 897c 1f90 34120000", Header{Dst: netip.MustParseAddrPort("10.91.3.2:8080"), Src: netip.MustParseAddrPort("10.91.0.2:35196"), Mark: 0x1234}},
		{"06 20010db8000000000000000000000003 20010db8000000000000000000000002 c350 01bb 00000000",
			Header{Dst: netip.MustParseAddrPort("[2001:db8::3]:443"), Src: netip.MustParseAddrPort("[2001:db8::2]:50000")}},
	} {
		want := unhex(t, tc.hex)
		got, err := AppendCompat(nil, tc.h)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("AppendCompat(%+v) = %x, %v; want %x", tc.h, got, err, want)
		}
		var h Header
		// The reference client's two stray trailing bytes are not part of the header.
		n, err := DecodeCompat(&h, append(want, 0xde, 0xad))
		if err != nil || n != len(want) || h != tc.h {
			t.Errorf("DecodeCompat(%x) = %+v, %d, %v; want %+v, %d", want, h, n, err, tc.h, len(want))
		}
	}
}

func TestDialectVectors(t *testing.T) {
	for _, tc := range []struct {
		hex string
		h   Header
	}{
		{"01 13 05 0a5b0302 0a5b0002 897c 1f90 00001234", Header{Dst: netip.MustParseAddrPort("10.91.3.2:8080"), Src: netip.MustParseAddrPort("10.91.0.2:35196"), Mark: 0x1234}},
		{"01 2b 06 20010db8000000000000000000000003 20010db8000000000000000000000002 c350 01bb 00000000",
			Header{Dst: netip.MustParseAddrPort("[2001:db8::3]:443"), Src: netip.MustParseAddrPort("[2001:db8::2]:50000")}},
		{"01 09 01 0a5b0302 1f90", Header{Dst: netip.MustParseAddrPort("10.91.3.2:8080")}},
		{"01 15 04 20010db8000000000000000000000003 01bb", Header{Dst: netip.MustParseAddrPort("[2001:db8::3]:443")}},
	} {
		want := unhex(t, tc.hex)
		got, err := tc.h.Append(nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Append(%+v) = %x, %v; want %x", tc.h, got, err, want)
		}
		if n, err := HeaderLen(want[:3]); err != nil || n != len(want) {
			t.Errorf("HeaderLen(%x) = %d, %v", want[:3], n, err)
		}
		var h Header
		n, err := h.Decode(append(want, "first data"...))
		if err != nil || n != len(want) || h != tc.h {
			t.Errorf("Decode(%x) = %+v, %d, %v; want %+v", want, h, n, err, tc.h)
		}
		for i := 0; i < len(want); i++ {
			if _, err := h.Decode(want[:i]); !errors.Is(err, ErrShort) {
				t.Errorf("Decode of %d of %d bytes: %v, want ErrShort", i, len(want), err)
			}
		}
	}
}

func TestDialectErrors(t *testing.T) {
	for _, tc := range []struct {
		hex  string
		want error
	}{
		{"05 01 00 01 0a5b0302 1f90", ErrVersion}, // a SOCKS5 request sent to the dialect port
		{"01 09 07", ErrAddrType},
		{"01 09 03 04 6e616d65 0050", ErrAddrType}, // domain names are not in the dialect
		{"01 11 05 0a5b0302 0a5b0002 897c 1f90 00000000", ErrLength},
		{"01 09 01 00000000 1f90", ErrAddress},
		{"01 09 01 0a5b0302 0000", ErrAddress},
		{"01 13 05 0a5b0302 0a5b0002 0000 1f90 00000000", ErrAddress},
		// an IPv4-mapped address in an IPv6 form (found by FuzzHeader: it would not re-encode)
		{"01 15 04 00000000000000000000ffff30303030 3030", ErrAddress},
	} {
		var h Header
		h.Mark = 7
		if _, err := h.Decode(unhex(t, tc.hex)); !errors.Is(err, tc.want) || h != (Header{}) {
			t.Errorf("Decode(%s) = %v (%+v), want %v and a zero header", tc.hex, err, h, tc.want)
		}
	}
	// Mixed families cannot be written.
	if _, err := (Header{Dst: netip.MustParseAddrPort("10.0.0.1:80"), Src: netip.MustParseAddrPort("[fd00::1]:9")}).Append(nil); !errors.Is(err, ErrAddress) {
		t.Errorf("mixed families: %v", err)
	}
	// IPv4-mapped addresses are sent as IPv4.
	b, err := Header{Dst: netip.MustParseAddrPort("[::ffff:10.0.0.1]:80"), Src: netip.MustParseAddrPort("[::ffff:10.0.0.2]:9")}.Append(nil)
	if err != nil || b[2] != AtypIPv4Source {
		t.Errorf("mapped: %x %v", b, err)
	}
}

// The RFC 1928 example of socks5-dialect.md §1, and the other address types.
func TestRFC1928(t *testing.T) {
	var g Greeting
	if n, err := g.Decode(unhex(t, "050100")); err != nil || n != 3 || !g.Offers(MethodNoAuth) || g.Offers(MethodUserPass) {
		t.Errorf("greeting: %v %d %v", g, n, err)
	}
	if _, err := g.Decode(unhex(t, "0500")); !errors.Is(err, ErrMethods) {
		t.Errorf("empty greeting: %v", err)
	}
	if _, err := g.Decode(unhex(t, "040100")); !errors.Is(err, ErrVersion) {
		t.Errorf("SOCKS4 greeting: %v", err)
	}
	if b, _ := (Greeting{Methods: []byte{0, 2}}).Append(nil); !bytes.Equal(b, unhex(t, "05020002")) {
		t.Errorf("greeting append %x", b)
	}
	if b := AppendSelection(nil, MethodNoAuth); !bytes.Equal(b, unhex(t, "0500")) {
		t.Errorf("selection %x", b)
	}
	for _, tc := range []struct {
		hex string
		r   Request
	}{
		{"05 01 00 01 0a5b0302 1f90", Request{Cmd: CmdConnect, Dst: Addr{IP: netip.MustParseAddr("10.91.3.2"), Port: 8080}}},
		{"05 01 00 04 20010db8000000000000000000000003 01bb", Request{Cmd: CmdConnect, Dst: Addr{IP: netip.MustParseAddr("2001:db8::3"), Port: 443}}},
		{"05 01 00 03 0b 6578616d706c652e636f6d 0050", Request{Cmd: CmdConnect, Dst: Addr{Name: "example.com", Port: 80}}},
	} {
		want := unhex(t, tc.hex)
		var r Request
		n, err := r.Decode(want)
		if err != nil || n != len(want) || r != tc.r {
			t.Errorf("Decode(%s) = %+v %d %v", tc.hex, r, n, err)
		}
		if b, err := tc.r.Append(nil); err != nil || !bytes.Equal(b, want) {
			t.Errorf("Append(%+v) = %x %v", tc.r, b, err)
		}
		for i := 0; i < len(want); i++ {
			if _, err := r.Decode(want[:i]); !errors.Is(err, ErrShort) {
				t.Errorf("%s cut to %d: %v", tc.hex, i, err)
			}
		}
	}
	var r Request
	if n, err := r.Decode(unhex(t, "05 02 00 01 0a5b0302 1f90")); err != nil || n != 10 || r.Cmd != CmdBind {
		t.Errorf("bind: %v %d", err, n)
	}
	if n, err := r.Decode(unhex(t, "05 09 00 01 0a5b0302 1f90")); !errors.Is(err, ErrCommand) || n != 10 {
		t.Errorf("command 9: %v %d (the whole request must be consumed to answer it)", err, n)
	}
	if _, err := r.Decode(unhex(t, "05 01 00 05 0a5b0302 1f90")); !errors.Is(err, ErrAddrType) {
		t.Errorf("atyp 5 from a client: %v", err)
	}
	if _, err := r.Decode(unhex(t, "05 01 01 01 0a5b0302 1f90")); !errors.Is(err, ErrReserved) {
		t.Errorf("reserved: %v", err)
	}
	if _, err := r.Decode(unhex(t, "05 01 00 03 00 0050")); !errors.Is(err, ErrAddress) {
		t.Errorf("empty name: %v", err)
	}
	b, _ := Reply{Code: RepSucceeded, Bind: Addr{IP: netip.MustParseAddr("10.0.0.1"), Port: 1080}}.Append(nil)
	if !bytes.Equal(b, unhex(t, "05 00 00 01 0a000001 0438")) {
		t.Errorf("reply %x", b)
	}
	var rp Reply
	if n, err := rp.Decode(b); err != nil || n != len(b) || rp.Bind.Port != 1080 {
		t.Errorf("reply decode %+v %v", rp, err)
	}
	b, _ = Reply{Code: RepNotAllowed}.Append(nil)
	if !bytes.Equal(b, unhex(t, "05 02 00 01 00000000 0000")) {
		t.Errorf("refusal %x", b)
	}
}
