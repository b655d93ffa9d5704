package mptcpopt

import (
	"errors"
	"testing"
)

// FuzzParse checks Parse's properties: errors from the documented set; decoding into a dirty
// value equals decoding into a zero one; what it found, written again with the Append
// functions, parses to the same information.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1e040101", "1e1401017576a8f2430da512d41c1a707ad28dc6",
		"1e1601017576a8f2430da512d41c1a707ad28dc60bb8", "1e0c1001bad4a582b38d29f1", "1e081001000000070101",
		"0101020405b41e040101", "1e14010100", "1e0c7000d41c1a707ad28dc6", "1e01"} {
		f.Add(hexb(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var zero, dirty Info
		err := Parse(b, &zero)
		dirty = Info{Flags: -1, Token: 5, Version: 9, Nonce: 3}
		err2 := Parse(b, &dirty)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error outside the documented set: %v", err)
		}
		if (err == nil) != (err2 == nil) || zero != dirty {
			t.Fatalf("dirty decode differs: %+v vs %+v", zero, dirty)
		}
		if err != nil {
			if zero != (Info{}) {
				t.Fatalf("malformed list left %+v", zero)
			}
			return
		}
		var re []byte
		if zero.Flags&CapableKey != 0 {
			re = AppendCapable(re, Capable{Length: 20, Version: zero.Version, Flags: 0x01, ReceiverKey: zero.ReceiverKey})
		}
		if zero.Flags&JoinSYN != 0 {
			re = AppendJoinSYN(re, zero.AddrID, zero.Backup, zero.Token, zero.Nonce)
		}
		if zero.Flags&HasFastclose != 0 {
			re = AppendFastclose(re, zero.FastcloseKey)
		}
		if zero.Flags&DataFIN != 0 {
			re = AppendDataACK(re, 0, true)
		}
		var again Info
		if err := Parse(re, &again); err != nil {
			t.Fatalf("re-encoded %x: %v", re, err)
		}
		keep := CapableKey | V0 | JoinSYN | HasFastclose | DataFIN
		want := zero
		want.Flags &= keep
		if want.Flags&CapableKey != 0 {
			want.Flags |= HasCapable
		} else {
			want.Version, want.Flags = 0, want.Flags&^V0
		}
		if want.Flags&JoinSYN != 0 {
			want.Flags |= HasJoin
		}
		if again != want {
			t.Fatalf("round trip of %x: %+v, want %+v", b, again, want)
		}
	})
}
