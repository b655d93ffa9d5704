package tunnel

import (
	"testing"
	"time"

	"braid/internal/tunnel/session"
)

// A copy of the accepted initiation is benign once per other path and within the window;
// the same copy again on a path, a late one, or another message is not.
func TestInitCopies(t *testing.T) {
	msg := make([]byte, session.InitLen)
	msg[0] = 1
	other := make([]byte, session.InitLen)
	var c initCopies
	if c.copyOf(msg, 0, 1) {
		t.Fatal("a copy before any initiation was accepted")
	}
	c.record(msg, 0, 0)
	at := int64(10 * time.Millisecond)
	for _, tc := range []struct {
		name string
		msg  []byte
		now  int64
		path uint8
		want bool
	}{
		{"again on the path it came on", msg, at, 0, false},
		{"over the second path", msg, at, 1, true},
		{"over the second path again", msg, at, 1, false},
		{"another message", other, at, 2, false},
		{"path 200", msg, at, 200, true},
		{"too late", msg, int64(initCopyWindow) + 1, 3, false},
	} {
		if got := c.copyOf(tc.msg, tc.now, tc.path); got != tc.want {
			t.Errorf("%s: copy %v, want %v", tc.name, got, tc.want)
		}
	}
	c.record(other, at, 1)
	if !c.copyOf(other, at, 0) || c.copyOf(msg, at, 2) {
		t.Error("a new initiation did not replace the old one")
	}
}
