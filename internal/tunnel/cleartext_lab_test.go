package tunnel_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
)

// With encryption off on both sides, data crosses intact, authenticated but in clear (the inner
// packet is readable in the datagram); a peer that encrypts refuses such packets and counts them.
func TestTunnelCleartext(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bClear   bool
		delivers bool
	}{{"both clear", true, true}, {"receiver encrypts", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			l := labtest.Up(t, multiPath(2, topo.Shape{Rate: 100e6, Delay: 2 * time.Millisecond}))
			var rec *recorder
			var logA bytes.Buffer
			var logMu sync.Mutex
			eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
				o.Cleartext = side == 0 || tc.bClear
				if side == 0 {
					rec = &recorder{Conn: o.Uplinks[0].Conn}
					o.Uplinks[0].Conn = rec
					o.Logger = slog.New(slog.NewTextHandler(&lockedBuffer{b: &logA, mu: &logMu}, nil))
				}
			})
			waitUp(t, eps)
			// What the operator sees: the session is not called encrypted, and the log warns.
			for side, ep := range eps {
				clear := side == 0 || tc.bClear
				c := ep.tunnel.Status().Peers[0].Cipher
				if strings.HasPrefix(c, "none (authenticated only") != clear {
					t.Errorf("%s: session cipher %q with encryption %v", ep.host.Name, c, !clear)
				}
			}
			logMu.Lock()
			logged := logA.String()
			logMu.Unlock()
			if !strings.Contains(logged, "encryption=\"off: data in clear") || !strings.Contains(logged, "level=WARN msg=\"encryption is off") {
				t.Errorf("a's log does not say that data travels in clear:\n%s", logged)
			}
			addr := serve(t, eps[1].host, eps[1].inner4)
			within := 20 * time.Second
			if !tc.delivers {
				within = 2 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			f, err := traffic.File(ctx, eps[0].host.Dial, addr, traffic.FileOptions{Size: 2 << 20, Seed: 3})
			if tc.delivers {
				if err != nil || !f.Intact {
					t.Fatalf("transfer: %v %v", err, f)
				}
			} else if err == nil && f.Intact {
				t.Fatal("clear packets reached a tunnel that encrypts")
			}
			d := rec.last()
			inner := append(eps[0].inner4.AsSlice(), eps[1].inner4.AsSlice()...)
			if d == nil || !bytes.Contains(d, inner) {
				t.Fatalf("the data packet does not carry the inner addresses in clear: % x", d)
			}
			dropped := eps[1].tunnel.Status().Counters["drop_cleartext"]
			if tc.delivers != (dropped == 0) {
				t.Fatalf("drop_cleartext %d at the receiver", dropped)
			}
		})
	}
}

// lockedBuffer is a log destination the tunnel's goroutines and the test share.
type lockedBuffer struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
