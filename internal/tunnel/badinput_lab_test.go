package tunnel_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/tunnel"
	"braid/internal/wire/mpath"
)

// recorder wraps an uplink's Conn and keeps a copy of the data packets it sends; while swallow
// is set it keeps the next data packet instead of sending it.
type recorder struct {
	tunnel.Conn
	mu      sync.Mutex
	data    [][]byte
	swallow bool
	kept    []byte
}

func (r *recorder) Send(b []byte, dst netip.AddrPort) error {
	if len(b) > 20 && b[8] == mpath.TypeData {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.swallow {
			r.swallow, r.kept = false, bytes.Clone(b)
			return nil
		}
		r.data = append(r.data, bytes.Clone(b))
	}
	return r.Conn.Send(b, dst)
}

func (r *recorder) swallowNext() {
	r.mu.Lock()
	r.swallow = true
	r.mu.Unlock()
}

func (r *recorder) swallowed() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kept
}

func (r *recorder) last() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.data) == 0 {
		return nil
	}
	return r.data[len(r.data)-1]
}

// Packets from strangers, truncated, with a GRE version or flag braid does not handle, with an
// unknown session, tampered, replayed or oversized are dropped, counted by reason, and never
// reach the device.
func TestTunnelBadInput(t *testing.T) {
	l := labtest.Up(t, multiPath(1, topo.Shape{Delay: time.Millisecond}))
	var rec *recorder
	eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
		// The packet swallowed below must stay undelivered until the test sends it: loss
		// recovery would resend it when b reports the gap.
		o.Recovery = false
		if side == 0 {
			rec = &recorder{Conn: o.Uplinks[0].Conn}
			o.Uplinks[0].Conn = rec
		}
	})
	waitUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	ctx := t.Context()
	// The held-back packet: a UDP datagram to a port where b has no listener, never delivered,
	// so its counter is fresh at b. Delivered later, it makes b answer with an ICMP error, which
	// a does not answer, so it is the only delivery it causes at b. (A held-back TCP SYN made b
	// answer a SYN-ACK that a's TIME_WAIT socket acknowledged, a second delivery that came or
	// not with timing.)
	rec.swallowNext()
	u, err := eps[0].host.Dial(ctx, "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Write([]byte("held back")); err != nil {
		t.Fatal(err)
	}
	u.Close()
	for deadline := time.Now().Add(2 * time.Second); rec.swallowed() == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// Some real traffic, so that there is a data packet to replay.
	conn, err := eps[0].host.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	time.Sleep(500 * time.Millisecond) // let the connection's last packets cross
	real, fresh := rec.last(), rec.swallowed()
	if real == nil || fresh == nil {
		t.Fatal("no data packet was recorded")
	}
	before := eps[1].tunnel.Status().Counters
	// An attacker on a's network: another port on a's uplink address.
	pc, err := eps[0].host.ListenPacket("udp", "10.9.0.1:5555")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	to := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.9.0.2:4754"))
	braidGRE := func(key uint32) []byte {
		b := []byte{0x20, 0x00, 0x88, 0xb5, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[4:], key)
		return b
	}
	tampered := bytes.Clone(fresh)
	tampered[len(tampered)-20] ^= 0x55
	cases := []struct {
		name    string
		pkt     []byte
		counter string
	}{
		{"truncated", []byte{0x20, 0x00, 0x88}, "drop_bad_gre"},
		{"GRE version 1", []byte{0x20, 0x01, 0x88, 0xb5, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "drop_bad_gre"},
		{"GRE routing bit", []byte{0x60, 0x00, 0x88, 0xb5, 0, 0, 0, 1}, "drop_bad_gre"},
		{"plain GRE, no key", append([]byte{0x00, 0x00, 0x08, 0x00}, make([]byte, 40)...), "drop_bad_gre"},
		{"unknown message type", append(braidGRE(1), append([]byte{99, 0, 0, 0}, make([]byte, 40)...)...), "drop_bad_header"},
		{"unknown session", append(braidGRE(12345), append([]byte{mpath.TypeData, 0, 0, 0}, make([]byte, 60)...)...), "drop_unknown_session"},
		{"garbage handshake", append(braidGRE(0), append([]byte{mpath.TypeHandshakeInit, 0, 0, 0}, make([]byte, 8+112)...)...), "drop_handshake_mac"},
		// From an address that is no path of a: counted apart, and they move no path.
		{"tampered", tampered, "drop_auth_new_source"},
		{"replayed", real, "drop_replay_new_source"},
		// A's own packet, never delivered, from elsewhere: it authenticates and is fresh, so
		// it is delivered and moves its path there (paths follow their peer's address, as
		// through a NAT that rebinds) until a's next packet moves it back.
		{"authentic, held back, from an address that is no path", fresh, "path_moves"},
		{"oversized", append(braidGRE(12345), make([]byte, 60000)...), "drop_bad_header"},
	}
	for _, c := range cases {
		if _, err := pc.WriteTo(c.pkt, to); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	var after map[string]uint64
	for time.Now().Before(deadline) {
		after = eps[1].tunnel.Status().Counters
		all := true
		for _, c := range cases {
			if after[c.counter] <= before[c.counter] {
				all = false
			}
		}
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range cases {
		if after[c.counter] <= before[c.counter] {
			t.Errorf("%s: counter %s did not move (%d)", c.name, c.counter, after[c.counter])
		}
	}
	// Probes and their replies keep flowing, so compare deliveries, which only data makes:
	// a's held-back packet only.
	if d := after["delivered"] - before["delivered"]; d != 1 {
		t.Errorf("%d inner packets were delivered from the attacker's datagrams, want 1 (a's own, held back)", d)
	}
	if m := after["path_moves"] - before["path_moves"]; m > 2 {
		t.Errorf("path_moves grew by %d: only the held-back packet and a's next one move the path", m)
	}
	back := false
	for deadline := time.Now().Add(time.Second); !back && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ps := eps[1].tunnel.Status().Peers[0].Paths
		back = len(ps) == 1 && ps[0].Remote == "10.9.0.1:4754"
	}
	if !back {
		t.Errorf("the path did not move back to a's address: %+v", eps[1].tunnel.Status().Peers[0].Paths)
	}
}
