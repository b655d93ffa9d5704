package session

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// fixedKey is a deterministic key for the fuzz targets: the same messages in every run.
func fixedKey(b byte) PrivateKey {
	var k PrivateKey
	for i := range k {
		k[i] = b + byte(i)
	}
	k.clamp()
	return k
}

var fuzzNow = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// The responder chooses the highest version both speak; the keys and sessions of both sides
// name it; with none in common the handshake is refused with ErrVersion.
func TestVersionNegotiation(t *testing.T) {
	v5 := Versions(1 << 5)
	for _, tc := range []struct {
		name         string
		offer, speak Versions
		want         Version
		err          error
	}{
		{"this release on both sides", Supported, Supported, V4, nil},
		{"a release of 2 alone to this one", V2.bit(), Supported, V2, nil},
		{"this release to a release of 2 alone", Supported, V2.bit(), V2, nil},
		{"the release before (2, 3) to this one", V2.bit() | V3.bit(), Supported, V3, nil},
		{"this release to the release before", Supported, V2.bit() | V3.bit(), V3, nil},
		{"a next release (2 to 5) to this one", Supported | v5, Supported, V4, nil},
		{"this release to a next one", Supported, Supported | v5, V4, nil},
		{"two next releases", Supported | v5, Supported | v5, 5, nil},
		{"a release that dropped 2 to 4", v5, Supported, 0, ErrVersion},
	} {
		a, b := mustKey(t), mustKey(t)
		eph := mustKey(t)
		in, msg, err := initiate(a, b.Public(), eph, 1, AllCiphers, tc.offer, time.Now(), 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Receive(b, msg)
		if err != nil || got.Versions != tc.offer {
			t.Fatalf("%s: Receive: %v, versions %v want %v", tc.name, err, got.Versions, tc.offer)
		}
		resp, kr, err := got.respond(mustKey(t), 2, AllCiphers, tc.speak, 0)
		if !errors.Is(err, tc.err) {
			t.Fatalf("%s: Respond: %v, want %v", tc.name, err, tc.err)
		}
		if err != nil {
			continue
		}
		ki, _, err := in.Finish(resp)
		if err != nil || ki.Version != tc.want || kr.Version != tc.want {
			t.Fatalf("%s: Finish %v, versions %v %v want %v", tc.name, err, ki.Version, kr.Version, tc.want)
		}
		if s := New(ki, 1, 2); s.Version != tc.want {
			t.Fatalf("%s: session version %v", tc.name, s.Version)
		}
	}
}

// An initiation of version 1 (a release before versions: 113 bytes, no versions field) is
// verified, so that the responder can say who runs the old release, and refused.
func TestVersion1Refused(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	_, msg, err := initiate(a, b.Public(), mustKey(t), 7, AllCiphers, Supported, time.Now(), -2)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != V1InitLen || V1InitLen != 113 {
		t.Fatalf("version 1 initiation is %d bytes, want %d (113)", len(msg), V1InitLen)
	}
	got, err := Receive(b, msg)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Peer.Equal(a.Public()) || got.Versions != V1.bit() || got.SenderIndex != 7 {
		t.Fatalf("peer %v versions %v index %d", got.Peer, got.Versions, got.SenderIndex)
	}
	if _, _, err := got.Respond(2, AllCiphers); !errors.Is(err, ErrVersion) {
		t.Fatalf("Respond to version 1: %v, want ErrVersion", err)
	}
}

// Later versions may append sealed fields; this one reads what it knows and ignores the rest.
func TestHandshakeExtensionsIgnored(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	in, msg, err := initiate(a, b.Public(), mustKey(t), 3, AllCiphers, Supported|1<<5, time.Now(), 20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Receive(b, msg)
	if err != nil || got.SenderIndex != 3 {
		t.Fatalf("extended initiation (%d bytes): %v", len(msg), err)
	}
	resp, kr, err := got.respond(mustKey(t), 4, AllCiphers, Supported, 30)
	if err != nil {
		t.Fatal(err)
	}
	ki, idx, err := in.Finish(resp)
	if err != nil || idx != 4 || ki.Send != kr.Recv || ki.Version != Current {
		t.Fatalf("extended response (%d bytes): %v, index %d, version %v", len(resp), err, idx, ki.Version)
	}
	long := make([]byte, MaxInitLen+1)
	if _, err := Receive(b, long); !errors.Is(err, ErrLength) {
		t.Fatalf("initiation of %d bytes: %v", len(long), err)
	}
}

// An initiator refuses a response that chose a version it did not offer.
func TestFinishRefusesUnofferedVersion(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	in, msg, _ := initiate(a, b.Public(), mustKey(t), 1, AllCiphers, Supported, time.Now(), 0)
	got, _ := Receive(b, msg)
	got.Versions = 1 << 5 // a responder that does not read the offer
	resp, _, err := got.respond(mustKey(t), 2, AllCiphers, 1<<5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.Finish(resp); !errors.Is(err, ErrVersion) {
		t.Fatalf("Finish: %v, want ErrVersion", err)
	}
}

func TestVersionsBest(t *testing.T) {
	for _, tc := range []struct {
		vs   Versions
		want Version
		ok   bool
	}{{0, 0, false}, {1, 0, false}, {1 << 2, 2, true}, {1<<2 | 1<<5, 5, true}, {0xffff, 15, true}} {
		if v, ok := tc.vs.Best(); v != tc.want || ok != tc.ok {
			t.Errorf("%#x: %v %v, want %v %v", uint16(tc.vs), v, ok, tc.want, tc.ok)
		}
	}
	if s := (Versions(1<<1 | 1<<2)).String(); s != "1,2" {
		t.Errorf("String %q", s)
	}
}

// fuzzInitiations are the initiations the fuzz targets start from, from fixed keys: this
// version's, version 1's and a later version's with appended fields.
func fuzzInitiations(t testing.TB) (initiator, responder PrivateKey, msgs [][]byte) {
	initiator, responder = fixedKey(1), fixedKey(100)
	for i, extra := range []int{0, -2, 16} {
		_, msg, err := initiate(initiator, responder.Public(), fixedKey(byte(50+i)), uint32(10+i), AllCiphers, Supported|1<<5, fuzzNow, extra)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, msg)
	}
	return initiator, responder, msgs
}

// FuzzHandshakeInitiation: Receive fails only with ErrLength or ErrHandshake; what verifies is
// one of the genuine initiations byte for byte (nothing else can, without the keys), decodes
// to the same fields every time, and can be answered (or is refused with ErrVersion or
// ErrNoCipher only).
func FuzzHandshakeInitiation(f *testing.F) {
	initiator, responder, msgs := fuzzInitiations(f)
	for _, m := range msgs {
		f.Add(m)
		f.Add(m[:len(m)-1])
	}
	f.Add([]byte{})
	f.Add(make([]byte, InitLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := Receive(responder, b)
		if err != nil {
			if !errors.Is(err, ErrLength) && !errors.Is(err, ErrHandshake) {
				t.Fatalf("undocumented error %v", err)
			}
			if in != nil {
				t.Fatal("an error with an initiation")
			}
			return
		}
		genuine := false
		for _, m := range msgs {
			genuine = genuine || bytes.Equal(m, b)
		}
		if !genuine {
			t.Fatalf("a message that is no genuine initiation verified: %x", b)
		}
		if !in.Peer.Equal(initiator.Public()) || in.Timestamp != NewTimestamp(fuzzNow) {
			t.Fatalf("peer %v timestamp %x", in.Peer, in.Timestamp)
		}
		again, err := Receive(responder, b)
		if err != nil || again.SenderIndex != in.SenderIndex || again.Offer != in.Offer || again.Versions != in.Versions {
			t.Fatalf("decoding twice differs: %v %+v %+v", err, again, in)
		}
		if len(b) == V1InitLen && in.Versions != V1.bit() {
			t.Fatalf("version 1 initiation read as versions %v", in.Versions)
		}
		if _, _, err := in.Respond(1, AllCiphers); err != nil && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrNoCipher) {
			t.Fatalf("Respond: %v", err)
		}
	})
}

// FuzzHandshakeResponse: Finish fails only with the documented errors, and a failure leaves
// the initiator able to finish with the genuine response; what finishes is a genuine response
// byte for byte, with the responder's keys.
func FuzzHandshakeResponse(f *testing.F) {
	initiator, responder := fixedKey(1), fixedKey(100)
	var resps [][]byte
	var keys []Keys
	for i, extra := range []int{0, 24} {
		_, msg, err := initiate(initiator, responder.Public(), fixedKey(50), 10, AllCiphers, Supported|1<<5, fuzzNow, 0)
		if err != nil {
			f.Fatal(err)
		}
		in, err := Receive(responder, msg)
		if err != nil {
			f.Fatal(err)
		}
		resp, k, err := in.respond(fixedKey(byte(60+i)), 20, AllCiphers, Supported, extra)
		if err != nil {
			f.Fatal(err)
		}
		resps, keys = append(resps, resp), append(keys, k)
		f.Add(resp)
		f.Add(resp[:len(resp)-1])
	}
	f.Add([]byte{})
	f.Add(make([]byte, ResponseLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, _, err := initiate(initiator, responder.Public(), fixedKey(50), 10, AllCiphers, Supported|1<<5, fuzzNow, 0)
		if err != nil {
			t.Fatal(err)
		}
		k, idx, err := in.Finish(b)
		if err != nil {
			for _, e := range []error{ErrLength, ErrHandshake, ErrNoCipher, ErrVersion} {
				if errors.Is(err, e) {
					if _, _, err := in.Finish(resps[0]); err != nil {
						t.Fatalf("after a refused response the genuine one fails: %v", err)
					}
					return
				}
			}
			t.Fatalf("undocumented error %v", err)
		}
		for i, r := range resps {
			if bytes.Equal(r, b) {
				if idx != 20 || k.Send != keys[i].Recv || k.Recv != keys[i].Send || k.Version != Current {
					t.Fatalf("genuine response %d: index %d version %v, keys differ", i, idx, k.Version)
				}
				return
			}
		}
		t.Fatalf("a message that is no genuine response finished: %x", b)
	})
}
