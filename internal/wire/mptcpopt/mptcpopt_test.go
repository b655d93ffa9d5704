package mptcpopt

import (
	"encoding/hex"
	"errors"
	"testing"
)

func key(s string) [8]byte {
	var k [8]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 8 {
		panic(s)
	}
	copy(k[:], b)
	return k
}

// The vectors of the reference (RFC 8684 / RFC 6824 derivations; the last two keys were
// captured and their v1 tokens equal the kernel's mptcpi_token).
var tokenVectors = []struct {
	key        string
	v1, v0     uint32
	idsn1, id0 uint64
}{
	{"0000000000000000", 0xaf5570f5, 0x05fe4057, 0xe5b2328de0e83dfc, 0xac558654f107c7e9},
	{"0102030405060708", 0x66840dda, 0xdd5783bc, 0xf5a101d3d29d6f72, 0x3a95ed6e4ebb4ad5},
	{"ffffffffffffffff", 0x12a3ae44, 0xbe673e8a, 0x57fb595bbbacf0ca, 0x866701c11ef8e089},
	{"a37c4b42a4d47ad3", 0x3847c420, 0x2fdb9aca, 0xf8b8a752a32fa8ae, 0x9705692424804b01},
	{"08b7e60ea98f6592", 0xc4a47403, 0x61d955ec, 0xe1c55835c2cd50df, 0x1c9b1aa507b14b69},
	{"d41c1a707ad28dc6", 0xbad4a582, 0, 0xb54cc18ef49747ba, 0},
	{"7576a8f2430da512", 0x43f10781, 0, 0x6c41af277e898fbf, 0},
}

func TestToken(t *testing.T) {
	for _, v := range tokenVectors {
		k := key(v.key)
		if got := Token(k, 1); got != v.v1 {
			t.Errorf("v1 token of %s = %08x, want %08x", v.key, got, v.v1)
		}
		if got := IDSN(k, 1); got != v.idsn1 {
			t.Errorf("v1 IDSN of %s = %016x, want %016x", v.key, got, v.idsn1)
		}
		if v.v0 != 0 {
			if got := Token(k, 0); got != v.v0 {
				t.Errorf("v0 token of %s = %08x, want %08x", v.key, got, v.v0)
			}
			if got := IDSN(k, 0); got != v.id0 {
				t.Errorf("v0 IDSN of %s = %016x, want %016x", v.key, got, v.id0)
			}
		}
	}
}

func hexb(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestParse(t *testing.T) {
	kb := key("d41c1a707ad28dc6")
	for _, c := range []struct {
		name  string
		opts  []byte
		flags int
		err   error
	}{
		{"captured SYN", hexb("1e040101"), HasCapable, nil},
		{"captured SYN/ACK", hexb("1e0c0101d41c1a707ad28dc6"), HasCapable, nil},
		{"captured ACK", hexb("1e1401017576a8f2430da512d41c1a707ad28dc6"), HasCapable | CapableKey, nil},
		{"captured data", hexb("1e1601017576a8f2430da512d41c1a707ad28dc60bb8"), HasCapable | CapableKey, nil},
		{"with checksum", AppendCapable(nil, Capable{Length: 24, Version: 1, Flags: 0x81, ReceiverKey: kb}), HasCapable | CapableKey, nil},
		{"v0 ACK", AppendCapable(nil, Capable{Length: 20, Version: 0, Flags: 0x01, ReceiverKey: kb}), HasCapable | CapableKey | V0, nil},
		{"v0 length 22", AppendCapable(nil, Capable{Length: 22, Version: 0, Flags: 0x01}), HasCapable | CapableBad | V0, nil},
		{"version 2", AppendCapable(nil, Capable{Length: 20, Version: 2, Flags: 0x01}), HasCapable | CapableBad, nil},
		{"no H flag", AppendCapable(nil, Capable{Length: 20, Version: 1, Flags: 0x00}), HasCapable | CapableBad, nil},
		{"B flag", AppendCapable(nil, Capable{Length: 20, Version: 1, Flags: 0x41}), HasCapable | CapableBad, nil},
		{"length 16", AppendCapable(nil, Capable{Length: 16, Version: 1, Flags: 0x01}), HasCapable | CapableBad, nil},
		{"length 3", []byte{30, 3, 0x01}, HasCapable | CapableBad, nil},
		{"captured join SYN", hexb("1e0c1001bad4a582b38d29f1"), HasJoin | JoinSYN, nil},
		{"join SYN/ACK form", append(hexb("1e101001"), make([]byte, 12)...), HasJoin, nil},
		{"fastclose", AppendFastclose(nil, kb), HasFastclose, nil},
		{"data fin", AppendDataACK(nil, 7, true), DataFIN, nil},
		{"data ack", AppendDataACK(nil, 7, false), 0, nil},
		{"nops and mss first", append(hexb("0101020405b4"), hexb("1e040101")...), HasCapable, nil},
		{"end of list hides the rest", append([]byte{0}, hexb("1e040101")...), 0, nil},
		{"length runs past the end", hexb("1e140101"), 0, ErrMalformed},
		{"length 1", hexb("1e01"), 0, ErrMalformed},
		{"kind without length", hexb("01011e"), 0, ErrMalformed},
	} {
		var in Info
		in.Token = 99 // Parse overwrites everything
		err := Parse(c.opts, &in)
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		if in.Flags != c.flags {
			t.Errorf("%s: flags %b, want %b", c.name, in.Flags, c.flags)
		}
		if in.Flags&CapableKey != 0 && in.ReceiverKey != kb {
			t.Errorf("%s: receiver key %x", c.name, in.ReceiverKey)
		}
		if in.Flags&JoinSYN != 0 && (in.Token != 0xbad4a582 || in.Nonce != 0xb38d29f1 || in.AddrID != 1) {
			t.Errorf("%s: join %+v", c.name, in)
		}
		if in.Flags&HasFastclose != 0 && in.FastcloseKey != kb {
			t.Errorf("%s: fastclose key %x", c.name, in.FastcloseKey)
		}
		if in.Flags&JoinSYN == 0 && in.Token != 0 {
			t.Errorf("%s: token %x left from before", c.name, in.Token)
		}
	}
}

func TestCapturedTokenFromThirdACK(t *testing.T) {
	var in Info
	if err := Parse(hexb("1e1401017576a8f2430da512d41c1a707ad28dc6"), &in); err != nil {
		t.Fatal(err)
	}
	if got := Token(in.ReceiverKey, in.Version); got != 0xbad4a582 {
		t.Fatalf("server token from the third ACK = %08x, want bad4a582 (the join's token)", got)
	}
}

func TestParseAllocs(t *testing.T) {
	opts := hexb("0101020405b41e1601017576a8f2430da512d41c1a707ad28dc60bb8")
	var in Info
	if n := testing.AllocsPerRun(100, func() { Parse(opts, &in) }); n != 0 {
		t.Fatalf("Parse allocates %v times", n)
	}
}
