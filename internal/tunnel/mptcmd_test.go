package tunnel_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/tunnel"
)

// mptFakeCmd is a command port fed from a channel, recording what is sent.
type mptFakeCmd struct {
	in     chan mptDatagram
	out    chan mptDatagram
	closed chan struct{}
	once   sync.Once
}

type mptDatagram struct {
	addr netip.AddrPort
	b    []byte
}

func (c *mptFakeCmd) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	select {
	case d := <-c.in:
		return copy(b, d.b), d.addr, nil
	case <-c.closed:
		return 0, netip.AddrPort{}, net.ErrClosed
	}
}
func (c *mptFakeCmd) Send(b []byte, dst netip.AddrPort) error {
	c.out <- mptDatagram{dst, bytes.Clone(b)}
	return nil
}
func (c *mptFakeCmd) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

func unhexT(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The command port refuses, counts and leaves unanswered what is not the peer's well-formed
// 0xA2 of the configured auth_type about a configured path; the peer's own (the control) is
// answered byte for byte as tunnels.md lays it out, and applied at round 3.
func TestMPTCommandRefused(t *testing.T) {
	dev := &mptFakeDev{in: make(chan []byte), closed: make(chan struct{})}
	data := &mptFakeConn{sent: make(chan int, 100), closed: make(chan struct{})}
	cmd := &mptFakeCmd{in: make(chan mptDatagram), out: make(chan mptDatagram, 10), closed: make(chan struct{})}
	tn, err := tunnel.NewMPT(tunnel.MPTOptions{Device: dev, IPVersion: 4,
		Uplinks: []tunnel.Uplink{{Name: "u", Conn: data}},
		Paths: []tunnel.MPTPath{{Uplink: "u", Remote: netip.MustParseAddrPort("198.51.100.1:23456"),
			Local: netip.MustParseAddr("192.0.2.1")}},
		Command: cmd, RemoteCmdPort: 60456})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tn.Run(ctx) }()
	defer func() { cancel(); <-done }()

	peer := netip.MustParseAddrPort("198.51.100.1:60456")
	stranger := netip.MustParseAddrPort("203.0.113.9:60456")
	const addrs = "00000000000000000000ffffc6336401 00000000000000000000ffffc0000201" // peer's, braid's
	round1 := unhexT(t, "a2 80 00 00 01 04 0000 "+addrs)
	for _, tt := range []struct {
		name    string
		from    netip.AddrPort
		b       []byte
		counter string
	}{
		{"a stranger's round 1", stranger, round1, "cmd_refused_source"},
		{"loopback CLI command", netip.MustParseAddrPort("127.0.0.1:5000"), append(unhexT(t, "a4000000"), "path down 192.0.2.1 198.51.100.1"...), "cmd_refused_source"},
		{"CONNECTION_CREATE", peer, append(unhexT(t, "a3000000"), "[connection]"...), "cmd_refused_unsupported"},
		{"CLI command from the peer", peer, append(unhexT(t, "a4000000"), "show status"...), "cmd_refused_unsupported"},
		{"truncated", peer, round1[:39], "cmd_refused_malformed"},
		{"round 5", peer, unhexT(t, "a2 80 00 00 05 04 0000 "+addrs), "cmd_refused_malformed"},
		{"auth_type 1, 0 configured", peer, unhexT(t, "a2 80 01 04 01020304 01 04 0000 "+addrs), "cmd_refused_auth"},
		{"unknown path", peer, unhexT(t, "a2 80 00 00 01 04 0000 00000000000000000000ffffc6336402 00000000000000000000ffffc0000201"), "cmd_refused_no_path"},
	} {
		before := tn.Status().Counters[tt.counter]
		cmd.in <- mptDatagram{tt.from, tt.b}
		time.Sleep(20 * time.Millisecond)
		if d := tn.Status().Counters[tt.counter] - before; d != 1 {
			t.Errorf("%s: %s grew by %d, want 1", tt.name, tt.counter, d)
		}
		select {
		case d := <-cmd.out:
			t.Errorf("%s: answered with % x", tt.name, d.b)
		default:
		}
	}
	if s := tn.Status().Paths[0].Status; s != "ok" {
		t.Fatalf("refused commands changed the path to %s", s)
	}

	// The control: the peer's rounds 1 and 3 are answered with 2 and 4, to their source, and
	// the status applied.
	for _, r := range []struct{ in, want string }{
		{"a2 80 00 00 01 04 0000 " + addrs, "a2 80 00 00 02 04 0000 00000000000000000000ffffc0000201 00000000000000000000ffffc6336401"},
		{"a2 80 00 00 03 04 0000 " + addrs, "a2 80 00 00 04 04 0000 00000000000000000000ffffc0000201 00000000000000000000ffffc6336401"},
	} {
		cmd.in <- mptDatagram{netip.MustParseAddrPort("198.51.100.1:4000"), unhexT(t, r.in)}
		select {
		case d := <-cmd.out:
			if want := unhexT(t, r.want); !bytes.Equal(d.b, want) || d.addr != netip.MustParseAddrPort("198.51.100.1:4000") {
				t.Errorf("answer % x to %v, want % x to the source", d.b, d.addr, want)
			}
		case <-time.After(time.Second):
			t.Fatalf("no answer to % s", r.in)
		}
	}
	if st := tn.Status().Paths[0]; st.Status != "peer_down" || st.State != "down" {
		t.Errorf("after the peer's PATH_DOWN the path is %s (%s)", st.State, st.Status)
	}
}
