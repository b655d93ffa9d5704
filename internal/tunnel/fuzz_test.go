package tunnel

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// fuzzConn is an uplink socket that receives nothing and swallows what is sent.
type fuzzConn struct {
	closed chan struct{}
	once   sync.Once
}

func (c *fuzzConn) ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error) {
	<-c.closed
	return 0, netip.AddrPort{}, net.ErrClosed
}
func (c *fuzzConn) Send([]byte, netip.AddrPort) error { return nil }
func (c *fuzzConn) Close() error                      { c.once.Do(func() { close(c.closed) }); return nil }

// fuzzDev is a device that reads nothing and takes every write.
type fuzzDev struct{}

func (fuzzDev) Read([]byte) (int, error)    { select {} }
func (fuzzDev) Write(b []byte) (int, error) { return len(b), nil }
func (fuzzDev) Close() error                { return nil }

// fuzzSite is a tunnel with one peer (inner network 10.2.0.0/16) on one uplink and a session
// with it already up (index fuzzIndex), and the peer's side of that session, to seal what
// the fuzzer sends as the peer would.
type fuzzSite struct {
	t    *Tunnel
	peer *session.Session
	src  netip.AddrPort
	u    *uplink
}

const fuzzIndex = 7

func newFuzzSite(tb testing.TB) *fuzzSite {
	tb.Helper()
	priv, _ := session.GenerateKey()
	peerKey, _ := session.GenerateKey()
	src := netip.MustParseAddrPort("192.0.2.2:4754")
	t, err := New(Options{PrivateKey: priv, Device: fuzzDev{}, Reorder: true, Recovery: true,
		Uplinks: []Uplink{{Name: "u", Conn: &fuzzConn{closed: make(chan struct{})}, Local: netip.MustParseAddrPort("192.0.2.1:4754")}},
		Peers: []PeerConfig{{Name: "p", PublicKey: peerKey.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")},
			Paths: []PathConfig{{Uplink: "u", Remote: src}}}}})
	if err != nil {
		tb.Fatal(err)
	}
	var k session.Keys
	copy(k.Send[:], strings.Repeat("s", 32))
	copy(k.Recv[:], strings.Repeat("r", 32))
	k.Cipher, k.Version = session.ChaCha20Poly1305, session.Current
	p := t.peerList()[0]
	p.mu.Lock()
	p.hsIndex = fuzzIndex
	p.mu.Unlock()
	p.installInitiated(t.now(), k, 9)
	k.Send, k.Recv = k.Recv, k.Send
	return &fuzzSite{t: t, peer: session.New(k, 9, fuzzIndex), src: src, u: t.uplinks["u"]}
}

// sealed returns a datagram of type typ carrying plaintext, sealed as the peer sends it.
func (s *fuzzSite) sealed(typ uint8, pathID uint8, plaintext []byte) []byte {
	b := make([]byte, greLen+mpath.HeaderLen, greLen+mpath.HeaderLen+len(plaintext)+session.Overhead)
	g := greBraid
	g.Key = fuzzIndex
	g.Encode(b)
	ctr, _ := s.peer.NextCounter()
	h := mpath.Header{Type: typ, Path: pathID, Counter: ctr}
	h.Encode(b[greLen:])
	return s.peer.Seal(b, b[greLen:greLen+mpath.HeaderLen], b[:greLen+mpath.HeaderLen], plaintext)
}

// receive feeds one datagram to the tunnel and returns how much the drop counters and the
// other outcomes of an unauthenticated datagram moved.
func (s *fuzzSite) receive(b []byte) (rx, outcomes uint64) {
	before := s.t.Status().Counters
	ob := &outbox{}
	s.t.receive(s.u, s.src, b, ob)
	ob.flush(s.t)
	after := s.t.Status().Counters
	for k, v := range after {
		if strings.HasPrefix(k, "drop_") || k == "cookies_sent" || k == "handshake_copies" {
			outcomes += v - before[k]
		}
	}
	return after["rx_packets"] - before["rx_packets"], outcomes
}

func fuzzInner(src, dst string, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[28:], payload)
	return b
}

// FuzzTunnelReceive feeds the tunnel's receive path whole datagrams (issue 18 item 16): raw
// bytes as anyone on the Internet may send (kind even), and messages sealed by the peer's
// session whose plaintext is the fuzzer's (kind odd: the type is kind>>1 among the eight of
// the wire), which reach the decoders behind the AEAD. Nothing panics; every datagram is
// counted received; a raw datagram, which never authenticates, always ends in a counted drop
// (or a cookie reply); a sealed one may be accepted.
func FuzzTunnelReceive(f *testing.F) {
	s := newFuzzSite(f)
	f.Add([]byte{}, uint8(0))
	f.Add([]byte{0x20, 0x00, 0x88, 0xb5, 0, 0, 0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint8(0))
	f.Add(make([]byte, 8+12+session.InitLen+session.MAC1Len), uint8(0))
	pre := make([]byte, mpath.DataPrefixLen)
	binary.BigEndian.PutUint32(pre, 1)
	f.Add(append(pre, fuzzInner("10.2.0.1", "10.1.0.1", []byte("hello"))...), uint8(mpath.TypeData<<1|1))
	f.Add(append(pre, fuzzInner("10.9.0.1", "10.1.0.1", []byte("spoofed"))...), uint8(mpath.TypeData<<1|1))
	f.Add(make([]byte, 8), uint8(mpath.TypeProbe<<1|1))
	f.Add(make([]byte, 12+32), uint8(mpath.TypeProbeReply<<1|1))
	f.Add([]byte{0, 0, 0, 1, 0, 200, 0}, uint8(mpath.TypeNack<<1|1))
	f.Add(make([]byte, 8), uint8(mpath.TypeMTUAck<<1|1))
	types := []uint8{mpath.TypeData, mpath.TypeProbe, mpath.TypeProbeReply, mpath.TypeFeedback, mpath.TypeMTUProbe, mpath.TypeMTUAck, mpath.TypeNack, mpath.TypeCookieReply}
	f.Fuzz(func(t *testing.T, in []byte, kind uint8) {
		if len(in) > 1<<16 {
			return
		}
		if kind&1 == 0 {
			rx, outcomes := s.receive(in)
			if rx != 1 || outcomes == 0 {
				t.Fatalf("a raw datagram of %d bytes: rx %d, counted outcomes %d (want 1 and at least 1)", len(in), rx, outcomes)
			}
			return
		}
		typ := types[int(kind>>1)%len(types)]
		auth := s.t.stats.DropAuth.Load()
		if rx, _ := s.receive(s.sealed(typ, kind>>4, in)); rx != 1 {
			t.Fatalf("a sealed datagram: rx %d", rx)
		}
		if typ != mpath.TypeCookieReply && s.t.stats.DropAuth.Load() != auth {
			t.Fatal("a datagram sealed by the peer's session did not open: the harness seals wrongly")
		}
	})
}
