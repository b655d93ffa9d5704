package tunnel

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"braid/internal/tunnel/session"
)

// A session that reaches its end without a rekey leaves the peer without one: a state change
// the log says, once, naming the peer; a session still in its time says nothing.
func TestSessionExpiredLogged(t *testing.T) {
	var b bytes.Buffer
	tn := &Tunnel{log: slog.New(slog.NewTextHandler(&b, nil)), sessions: map[uint32]*sessionRef{}}
	p := &peer{t: tn, name: "site-b"}
	p.cur.Store(&liveSession{s: &session.Session{LocalIndex: 7}, created: 0})
	p.expire(int64(rejectAfter) / 2)
	if b.Len() != 0 || p.cur.Load() == nil {
		t.Fatalf("a session in its time: log %q, session dropped %v", b.String(), p.cur.Load() == nil)
	}
	p.expire(int64(rejectAfter) + 1)
	p.expire(int64(rejectAfter) + 2)
	if p.cur.Load() != nil {
		t.Fatal("an expired session is still current")
	}
	if n := strings.Count(b.String(), `msg="session expired" peer=site-b age=3m0s`); n != 1 {
		t.Errorf("%d session expired lines, want 1: %q", n, b.String())
	}
}
