package session

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func mustKey(t testing.TB) PrivateKey {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func handshake(t testing.TB) (ki, kr Keys, ii, ir uint32) {
	t.Helper()
	a, b := mustKey(t), mustKey(t)
	in, msg, err := Initiate(a, b.Public(), 11, AllCiphers, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != InitLen {
		t.Fatalf("initiation is %d bytes, want %d", len(msg), InitLen)
	}
	got, err := Receive(b, msg)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Peer.Equal(a.Public()) || got.SenderIndex != 11 {
		t.Fatalf("responder sees peer %v index %d", got.Peer, got.SenderIndex)
	}
	resp, kr, err := got.Respond(22, AllCiphers)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp) != ResponseLen {
		t.Fatalf("response is %d bytes, want %d", len(resp), ResponseLen)
	}
	ki, idx, err := in.Finish(resp)
	if err != nil {
		t.Fatal(err)
	}
	if idx != 22 {
		t.Fatalf("initiator learned index %d, want 22", idx)
	}
	return ki, kr, 11, 22
}

func TestHandshakeAgrees(t *testing.T) {
	ki, kr, _, _ := handshake(t)
	if ki.Send != kr.Recv || ki.Recv != kr.Send {
		t.Fatal("the two sides derived different keys")
	}
	if ki.Send == ki.Recv {
		t.Fatal("both directions share one key")
	}
	ki2, _, _, _ := handshake(t)
	if ki2.Send == ki.Send {
		t.Fatal("two handshakes gave the same key: ephemeral keys are not used")
	}
}

// Any changed byte of either message makes the handshake fail.
func TestHandshakeTamper(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	in, msg, _ := Initiate(a, b.Public(), 1, AllCiphers, time.Now())
	for i := range msg {
		bad := bytes.Clone(msg)
		bad[i] ^= 0x01
		if _, err := Receive(b, bad); err == nil {
			t.Fatalf("initiation with byte %d changed was accepted", i)
		}
	}
	if _, err := Receive(b, msg[:len(msg)-1]); !errors.Is(err, ErrLength) {
		t.Errorf("short initiation: %v", err)
	}
	if _, err := Receive(mustKey(t), msg); !errors.Is(err, ErrHandshake) {
		t.Errorf("initiation for another responder: %v, want ErrHandshake", err)
	}
	rcv, _ := Receive(b, msg)
	resp, _, _ := rcv.Respond(2, AllCiphers)
	for i := range resp {
		bad := bytes.Clone(resp)
		bad[i] ^= 0x80
		if _, _, err := in.Finish(bad); err == nil {
			t.Fatalf("response with byte %d changed was accepted", i)
		}
	}
	// A forged response does not spoil the handshake for the real one.
	if _, idx, err := in.Finish(resp); err != nil || idx != 2 {
		t.Errorf("real response after forged ones: %v index %d", err, idx)
	}
}

func TestTimestampOrder(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 5)
	a, b := NewTimestamp(t0), NewTimestamp(t0.Add(time.Nanosecond))
	if !b.After(a) || a.After(b) || a.After(a) {
		t.Error("TAI64N order is wrong")
	}
}

func TestKeyText(t *testing.T) {
	k := mustKey(t)
	back, err := ParsePrivateKey(k.String())
	if err != nil || back != k {
		t.Fatalf("private key round trip: %v", err)
	}
	pub, err := ParsePublicKey(k.Public().String())
	if err != nil || pub != k.Public() {
		t.Fatalf("public key round trip: %v", err)
	}
	for _, bad := range []string{"", "abc", "AAAA", k.String() + "AA", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="} {
		if _, err := ParsePublicKey(bad); !errors.Is(err, ErrKey) {
			t.Errorf("ParsePublicKey(%q): %v, want ErrKey", bad, err)
		}
	}
}

func TestSealOpen(t *testing.T) {
	ki, kr, ii, ir := handshake(t)
	a, b := New(ki, ii, ir), New(kr, ir, ii)
	hdr := []byte("header")
	n := make([]byte, NonceSize)
	for i := range 3 {
		c, _ := a.NextCounter()
		if c != uint64(i) {
			t.Fatalf("counter %d, want %d", c, i)
		}
		Nonce(n, c)
		pkt := a.Seal(nil, n, hdr, []byte("payload"))
		out, err := b.Open(nil, c, n, hdr, pkt)
		if err != nil || string(out) != "payload" {
			t.Fatalf("open: %v %q", err, out)
		}
		if _, err := b.Open(nil, c, n, hdr, pkt); !errors.Is(err, ErrReplay) {
			t.Fatalf("replayed packet: %v", err)
		}
	}
	c, _ := a.NextCounter()
	Nonce(n, c)
	pkt := a.Seal(nil, n, hdr, []byte("payload"))
	if _, err := b.Open(nil, c, n, []byte("HEADER"), pkt); !errors.Is(err, ErrAuth) {
		t.Errorf("changed header: %v", err)
	}
	n2 := make([]byte, NonceSize)
	Nonce(n2, c+1)
	if _, err := b.Open(nil, c+1, n2, hdr, pkt); !errors.Is(err, ErrAuth) {
		t.Errorf("changed counter: %v", err)
	}
	if _, err := b.Open(nil, c, n, hdr, pkt); err != nil {
		t.Errorf("forged copies must not burn the counter: %v", err)
	}
	if _, err := b.Open(nil, 99, n, hdr, []byte("short")); !errors.Is(err, ErrCiphertext) {
		t.Errorf("short ciphertext: %v", err)
	}
	// The reverse direction uses the other key.
	c, _ = b.NextCounter()
	Nonce(n, c)
	if _, err := b.Open(nil, c, n, hdr, b.Seal(nil, n, hdr, []byte("x"))); err == nil {
		t.Error("a packet sealed by b opened with b's receive key")
	}
}

func TestSealOpenAllocs(t *testing.T) {
	ki, kr, ii, ir := handshake(t)
	a, b := New(ki, ii, ir), New(kr, ir, ii)
	hdr := make([]byte, 20)
	buf := make([]byte, 1500+Overhead)
	plain := make([]byte, 1400)
	allocs := testing.AllocsPerRun(200, func() {
		c, _ := a.NextCounter()
		Nonce(hdr[8:], c) // as the tunnel does: the nonce lives in the header
		pkt := a.Seal(buf[:0], hdr[8:], hdr, plain)
		if _, err := b.Open(pkt[:0], c, hdr[8:], hdr, pkt); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Seal+Open allocate %.1f times per packet", allocs)
	}
}

// The window agrees with a model that remembers every counter.
func TestWindowModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var w Window
	seen := map[uint64]bool{}
	var last uint64
	var any bool
	next := uint64(0)
	for range 200_000 {
		var c uint64
		switch r := rng.IntN(10); {
		case r < 6: // mostly forward, with reordering
			c = next + uint64(rng.IntN(64))
			next += uint64(rng.IntN(3))
		case r < 8: // old, around the window's edge
			c = next - min(next, uint64(rng.IntN(2*WindowSize)))
		case r < 9: // duplicate
			c = next - min(next, uint64(rng.IntN(16)))
		default: // jump
			c = next + uint64(rng.IntN(3*WindowSize))
			next = c
		}
		want := !seen[c] && (!any || c > last || last-c < WindowSize)
		if got := w.Accept(c); got != want {
			t.Fatalf("counter %d (last %d): accepted %v, want %v", c, last, got, want)
		}
		if want {
			seen[c] = true
			if !any || c > last {
				last, any = c, true
			}
		}
	}
}

func TestWindowLimits(t *testing.T) {
	var w Window
	if !w.Accept(0) || w.Accept(0) {
		t.Error("first counter 0")
	}
	if !w.Accept(WindowSize) || w.Accept(0) {
		t.Error("a counter WindowSize behind must be refused")
	}
	if !w.Accept(1) {
		t.Error("a counter WindowSize-1 behind must be accepted")
	}
	if w.Accept(RejectAfterMessages) {
		t.Error("a counter past the limit was accepted")
	}
}

func BenchmarkSeal1400(b *testing.B) {
	ki, _, ii, ir := handshake(b)
	a := New(ki, ii, ir)
	hdr, buf, plain := make([]byte, 20), make([]byte, 1500+Overhead), make([]byte, 1400)
	b.SetBytes(1400)
	for b.Loop() {
		c, _ := a.NextCounter()
		Nonce(hdr[8:], c)
		a.Seal(buf[:0], hdr[8:], hdr, plain)
	}
}

// Nonce writes a nonce for counter into n: 4 zero bytes, then counter big-endian. (The tunnel
// uses its 12-byte packet header, which holds the counter, instead.)
func Nonce(n []byte, counter uint64) {
	clear(n[:4])
	binary.BigEndian.PutUint64(n[4:NonceSize], counter)
}

// The responder chooses the best cipher both accept; the keys name it and a session of either
// kind carries packets.
func TestCipherNegotiation(t *testing.T) {
	for _, tc := range []struct {
		offer, accept Ciphers
		want          Cipher
		err           error
	}{
		{AllCiphers, AllCiphers, AES256GCM, nil},
		{Only(ChaCha20Poly1305), AllCiphers, ChaCha20Poly1305, nil},
		{AllCiphers, Only(ChaCha20Poly1305), ChaCha20Poly1305, nil},
		{Only(AES256GCM), Only(AES256GCM), AES256GCM, nil},
		{Only(AES256GCM), Only(ChaCha20Poly1305), 0, ErrNoCipher},
	} {
		a, b := mustKey(t), mustKey(t)
		in, msg, err := Initiate(a, b.Public(), 1, tc.offer, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		got, err := Receive(b, msg)
		if err != nil || got.Offer != tc.offer {
			t.Fatalf("Receive: %v, offer %b want %b", err, got.Offer, tc.offer)
		}
		resp, kr, err := got.Respond(2, tc.accept)
		if !errors.Is(err, tc.err) {
			t.Fatalf("offer %b accept %b: %v, want %v", tc.offer, tc.accept, err, tc.err)
		}
		if err != nil {
			continue
		}
		ki, _, err := in.Finish(resp)
		if err != nil || ki.Cipher != tc.want || kr.Cipher != tc.want {
			t.Fatalf("offer %b accept %b: %v, ciphers %v %v want %v", tc.offer, tc.accept, err, ki.Cipher, kr.Cipher, tc.want)
		}
		si, sr := New(ki, 1, 2), New(kr, 2, 1)
		if si.Cipher != tc.want {
			t.Fatalf("session cipher %v", si.Cipher)
		}
		var nonce [NonceSize]byte
		sealed := si.Seal(nil, nonce[:], []byte("hdr"), []byte("payload"))
		if pt, err := sr.Open(nil, 0, nonce[:], []byte("hdr"), sealed); err != nil || string(pt) != "payload" {
			t.Fatalf("%v session: %v %q", tc.want, err, pt)
		}
	}
	if _, _, err := Initiate(mustKey(t), mustKey(t).Public(), 1, 0, time.Now()); !errors.Is(err, ErrNoCipher) {
		t.Fatalf("empty offer: %v", err)
	}
}

// An initiator refuses a response that chose a cipher it did not offer.
func TestFinishRefusesUnofferedCipher(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	in, msg, _ := Initiate(a, b.Public(), 1, Only(ChaCha20Poly1305), time.Now())
	got, _ := Receive(b, msg)
	got.Offer = AllCiphers // a responder that does not read the offer
	resp, _, err := got.Respond(2, AllCiphers)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.Finish(resp); !errors.Is(err, ErrNoCipher) {
		t.Fatalf("Finish: %v, want ErrNoCipher", err)
	}
}

func TestParseCipher(t *testing.T) {
	for _, c := range []Cipher{ChaCha20Poly1305, AES256GCM} {
		if got, err := ParseCipher(c.String()); err != nil || got != c {
			t.Fatalf("%v: %v %v", c, got, err)
		}
	}
	if _, err := ParseCipher("rot13"); err == nil {
		t.Fatal("rot13 parsed")
	}
	if !Fast().Has(ChaCha20Poly1305) {
		t.Fatal("ChaCha20-Poly1305 is always fast")
	}
}
