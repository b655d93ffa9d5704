package session

import (
	"bytes"
	"testing"
	"time"
)

// An initiation closed by the MAC of its responder's key passes; one for another responder,
// one with a byte changed anywhere, a truncated one and random bytes do not.
func TestMAC1(t *testing.T) {
	a, _ := GenerateKey()
	b, _ := GenerateKey()
	c, _ := GenerateKey()
	_, msg, err := Initiate(a, b.Public(), 7, AllCiphers, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	kb, kc := MAC1Key(b.Public()), MAC1Key(c.Public())
	wire := AppendMAC1(bytes.Clone(msg), &kb)
	if len(wire) != len(msg)+MAC1Len {
		t.Fatalf("length %d, want %d", len(wire), len(msg)+MAC1Len)
	}
	got, ok := CheckMAC1(wire, &kb)
	if !ok || !bytes.Equal(got, msg) {
		t.Fatalf("CheckMAC1 of a good initiation: %v", ok)
	}
	if _, err := Receive(b, got); err != nil {
		t.Fatalf("the initiation after the MAC is checked: %v", err)
	}
	if _, ok := CheckMAC1(wire, &kc); ok {
		t.Error("the MAC for b passed for c")
	}
	for i := range wire {
		w := bytes.Clone(wire)
		w[i] ^= 0x40
		if _, ok := CheckMAC1(w, &kb); ok {
			t.Fatalf("byte %d changed: the MAC still passed", i)
		}
	}
	for _, n := range []int{0, MAC1Len - 1, MAC1Len, len(wire) - 1} {
		if _, ok := CheckMAC1(wire[:n], &kb); ok {
			t.Errorf("%d bytes passed", n)
		}
	}
}

func FuzzCheckMAC1(f *testing.F) {
	a, _ := GenerateKey()
	b, _ := GenerateKey()
	_, msg, _ := Initiate(a, b.Public(), 7, AllCiphers, time.Now())
	kb := MAC1Key(b.Public())
	f.Add(AppendMAC1(msg, &kb))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, wire []byte) {
		msg, ok := CheckMAC1(wire, &kb)
		if ok && !bytes.Equal(AppendMAC1(bytes.Clone(msg), &kb), wire) {
			t.Fatal("a MAC passed that AppendMAC1 does not make")
		}
	})
}
