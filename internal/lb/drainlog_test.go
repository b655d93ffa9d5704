package lb

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Draining a backend and taking it back are state changes an operator reads in the log: one
// line each, naming the backend.
func TestDrainLogged(t *testing.T) {
	var b bytes.Buffer
	clock := uint64(1e12)
	l, err := New(newFake(), Options{Services: vips, Mono: func() uint64 { return clock }, TokenIdle: time.Minute, TokenClosing: time.Second,
		Logger: slog.New(slog.NewTextHandler(&b, nil))}, []BackendSpec{spec("a", 1), spec("b", 3)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w    uint32
		want string
	}{{0, `msg="backend drained" backend=b was_weight=3`}, {2, `msg="backend undrained" backend=b weight=2`}, {5, `msg="backend weight" backend=b weight=5`}} {
		b.Reset()
		if err := l.SetWeight("b", c.w); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("weight %d: log %q lacks %q", c.w, b.String(), c.want)
		}
	}
}
