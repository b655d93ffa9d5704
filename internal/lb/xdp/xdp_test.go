package xdp

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"braid/internal/wire/mptcpopt"
)

// Frames for BPF_PROG_RUN: Ethernet, IPv4 or IPv6, TCP with options.

var (
	lbMAC     = net.HardwareAddr{0x02, 0x4c, 0x42, 0, 0, 1}
	clientMAC = net.HardwareAddr{0x02, 0xc1, 0, 0, 0, 1}
	vip4      = netip.MustParseAddrPort("10.100.0.1:80")
	vip6      = netip.MustParseAddrPort("[fd00:100::1]:80")
	lbSrc4    = netip.MustParseAddr("10.200.0.1")
	lbSrc6    = netip.MustParseAddr("fd00:200::1")
)

const (
	tcpSYN = 0x02
	tcpACK = 0x10
	tcpPSH = 0x08
)

func backendMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xbe, 0, 0, 0, byte(i)} }

func backendAddr(i int, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0x0b, 0xe, 15: byte(i + 1)})
	}
	return netip.AddrFrom4([4]byte{10, 50, 0, byte(i + 1)})
}

type packet = Packet

func ipChecksum(h []byte) uint16 { return Checksum(h) }

// rig is a loaded program with nb backends behind vip4 and vip6 (services 0 and 1).
type rig struct {
	t     *testing.T
	d     *Dataplane
	table []uint32
	cfg   Config
}

// requireBPF skips (fails under BRAID_LAB_REQUIRED=1) where programs cannot be loaded.
func requireBPF(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("BRAID_LAB_REQUIRED") != "1" && (errors.Is(err, os.ErrPermission) || os.Geteuid() != 0) {
		t.Skipf("BPF programs cannot be loaded here: %v", err)
	}
	t.Fatal(err)
}

func newRig(t *testing.T, nb int, adjust func(*Config)) *rig {
	t.Helper()
	return newRigSized(t, nb, Options{Conns: 1 << 14, Embryonic: 1 << 14, Tokens: 1 << 12, Pending: 1 << 12}, adjust)
}

func newRigSized(t *testing.T, nb int, o Options, adjust func(*Config)) *rig {
	t.Helper()
	d, err := Load(o)
	requireBPF(t, err)
	t.Cleanup(func() { d.Close() })
	cfg := Config{Aware: true, Mode: ModeMAC, HashSeed: 0x5eed, SrcMAC: lbMAC, Src4: lbSrc4, Src6: lbSrc6}
	if adjust != nil {
		adjust(&cfg)
	}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, d: d, cfg: cfg, table: make([]uint32, TableSize)}
	for i := range r.table {
		r.table[i] = uint32(i % nb)
	}
	for i := 0; i < nb; i++ {
		if err := d.SetBackend(uint32(i), Backend{MAC: backendMAC(i), Addr: backendAddr(i, i%2 == 1)}); err != nil {
			t.Fatal(err)
		}
	}
	for id, vip := range []netip.AddrPort{vip4, vip6} {
		if err := d.SetService(uint32(id), vip); err != nil {
			t.Fatal(err)
		}
		if err := d.SetTable(uint32(id), r.table); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *rig) run(p packet) Result {
	r.t.Helper()
	res, err := r.d.Run(p.Frame())
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

// backend returns the backend a forwarded frame went to (by its MAC), or -1.
func (r *rig) backend(res Result) int {
	if res.Action != ActionTX && res.Action != ActionRedirect {
		return -1
	}
	if len(res.Out) < 14 || !bytes.Equal(res.Out[0:5], backendMAC(0)[:5]) {
		r.t.Fatalf("forwarded frame to %x", res.Out[:6])
	}
	return int(res.Out[5])
}

// expect returns the backend that the hash and the table pick for a flow.
func (r *rig) expect(p packet) int {
	h := FlowHash(p.Src.Addr(), p.Dst.Addr(), p.Src.Port(), p.Dst.Port(), r.cfg.HashSeed, r.cfg.HashAddrs)
	return int(r.table[h%TableSize])
}

// cachedFlow pins the test to one CPU (the flow cache is per CPU: the packets must find the
// copy they made), places a flow by its SYN and sends three ACKs, established and then served
// from the cache, each to the same backend; it returns the ACK packet and that backend.
func (r *rig) cachedFlow() (packet, int) {
	r.t.Helper()
	pinToOneCPU(r.t)
	p := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}
	be := r.backend(r.run(p))
	p.Flags = tcpACK
	for i := 0; i < 3; i++ {
		if got := r.backend(r.run(p)); got != be {
			r.t.Fatalf("established packet %d went to %d, want %d", i, got, be)
		}
	}
	return p, be
}

func (r *rig) counters() Counters {
	r.t.Helper()
	c, err := r.d.Counters()
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// tokens returns both token tables, joined and pending.
func (r *rig) tokens() map[uint32]Token {
	r.t.Helper()
	ts, err := r.d.Tokens()
	if err != nil {
		r.t.Fatal(err)
	}
	pend, err := r.d.PendingTokens()
	if err != nil {
		r.t.Fatal(err)
	}
	m := map[uint32]Token{}
	for _, t := range append(ts, pend...) {
		m[t.Token] = t
	}
	return m
}

func client(i int, v6 bool, port uint16) netip.AddrPort {
	if v6 {
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0xd, 0xb8, 14: byte(i >> 8), 15: byte(i)}), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), port)
}

func vipOf(v6 bool) netip.AddrPort {
	if v6 {
		return vip6
	}
	return vip4
}

func mustKey(s string) [8]byte {
	var k [8]byte
	b, _ := hex.DecodeString(s)
	copy(k[:], b)
	return k
}

func synCapable(version uint8) []byte {
	if version == 0 {
		return mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 12, Version: 0, Flags: 0x01, SenderKey: mustKey("1111111111111111")})
	}
	return mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 4, Version: 1, Flags: 0x01})
}

func ackCapable(version, length uint8, keyB [8]byte) []byte {
	fl := uint8(0x01)
	if length == 24 {
		fl = 0x81
	}
	return mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: length, Version: version, Flags: fl,
		SenderKey: mustKey("7576a8f2430da512"), ReceiverKey: keyB, DataLen: 3000})
}

func TestFirstSubflowHashing(t *testing.T) {
	r := newRig(t, 4, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	type flow struct {
		p  packet
		be int
	}
	var flows []flow
	hits := make([]int, 4)
	for i := 0; i < 400; i++ {
		v6 := i%2 == 1
		p := packet{Src: client(i, v6, uint16(1024+rng.IntN(60000))), Dst: vipOf(v6), Flags: tcpSYN, Opts: synCapable(1)}
		want := r.expect(p)
		got := r.backend(r.run(p))
		if got != want {
			t.Fatalf("flow %d (%v): backend %d, the hash picks %d", i, p.Src, got, want)
		}
		hits[got]++
		flows = append(flows, flow{p, got})
	}
	for i, h := range hits {
		if h < 60 {
			t.Errorf("backend %d got %d of 400 flows: the hash is poorly mixed (%v)", i, h, hits)
		}
	}
	// A new table (every new flow to backend 3) moves no established flow.
	all3 := make([]uint32, TableSize)
	for i := range all3 {
		all3[i] = 3
	}
	for id := uint32(0); id < 2; id++ {
		if err := r.d.SetTable(id, all3); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range flows {
		p := f.p
		p.Flags, p.Opts, p.Payload = tcpACK|tcpPSH, nil, []byte("hello")
		if got := r.backend(r.run(p)); got != f.be {
			t.Fatalf("established flow %v moved from %d to %d", p.Src, f.be, got)
		}
	}
	p := packet{Src: client(9999, false, 5555), Dst: vip4, Flags: tcpSYN}
	if got := r.backend(r.run(p)); got != 3 {
		t.Fatalf("new flow went to %d after the table change, want 3", got)
	}
	c := r.counters()
	if c[CounterNewConn] != 401 || c[CounterForwarded] != 801 {
		t.Errorf("counters: new_conn %d forwarded %d", c[CounterNewConn], c[CounterForwarded])
	}
}

// TestTokenLearningAndJoin covers every client-to-server MP_CAPABLE form that carries the
// server's key, in both versions and both address families, with the reference's vectors.
func TestTokenLearningAndJoin(t *testing.T) {
	vectors := []struct {
		key    string
		v1, v0 uint32
	}{
		{"0000000000000000", 0xaf5570f5, 0x05fe4057},
		{"0102030405060708", 0x66840dda, 0xdd5783bc},
		{"ffffffffffffffff", 0x12a3ae44, 0xbe673e8a},
		{"a37c4b42a4d47ad3", 0x3847c420, 0x2fdb9aca},
		{"08b7e60ea98f6592", 0xc4a47403, 0x61d955ec},
		{"d41c1a707ad28dc6", 0xbad4a582, 0},
	}
	forms := []struct {
		version, length uint8
	}{{1, 20}, {1, 22}, {1, 24}, {0, 20}}
	n := 0
	for _, v6 := range []bool{false, true} {
		for _, vec := range vectors {
			for _, f := range forms {
				want := vec.v1
				if f.version == 0 {
					if vec.v0 == 0 {
						continue
					}
					want = vec.v0
				}
				n++
				r := newRig(t, 4, nil)
				first := packet{Src: client(n, v6, 40000), Dst: vipOf(v6), Flags: tcpSYN, Opts: synCapable(f.version)}
				be := r.backend(r.run(first))
				ack := first
				ack.Flags = tcpACK
				ack.Opts = ackCapable(f.version, f.length, mustKey(vec.key))
				if f.length > 20 {
					ack.Flags |= tcpPSH
					ack.Payload = make([]byte, 100)
				}
				if got := r.backend(r.run(ack)); got != be {
					t.Fatalf("third ACK went to %d, SYN to %d", got, be)
				}
				toks := r.tokens()
				tok, ok := toks[want]
				if !ok || len(toks) != 1 {
					t.Fatalf("%s v%d len %d: token table %v, want %08x", vec.key, f.version, f.length, toks, want)
				}
				if tok.Backend != uint32(be) || tok.V0 != (f.version == 0) {
					t.Fatalf("token %+v, want backend %d", tok, be)
				}
				// A join from another address: its own hash would pick another backend;
				// the token steers it to the first subflow's.
				var join packet
				for port := uint16(50000); ; port++ {
					join = packet{Src: client(n+1000, v6, port), Dst: vipOf(v6), Flags: tcpSYN,
						Opts: mptcpopt.AppendJoinSYN(nil, 1, false, want, 0xb38d29f1)}
					if r.expect(join) != be {
						break
					}
				}
				if got := r.backend(r.run(join)); got != be {
					t.Fatalf("join went to %d, its connection is on %d", got, be)
				}
				// The join's later packets follow it.
				join.Flags, join.Opts = tcpACK, nil
				if got := r.backend(r.run(join)); got != be {
					t.Fatalf("join's ACK went to %d, want %d", got, be)
				}
				c := r.counters()
				if c[CounterTokenLearned] != 1 || c[CounterJoinSteered] != 1 || c[CounterDropJoinUnknown] != 0 {
					t.Fatalf("counters %v", c)
				}
				st, err := r.d.BackendStats(uint32(be))
				if err != nil || st.Conns != 1 || st.Joins != 1 || st.Packets != 4 {
					t.Fatalf("backend stats %+v %v", st, err)
				}
			}
		}
	}
}

func TestUnknownTokenDropped(t *testing.T) {
	r := newRig(t, 4, nil)
	rng := rand.New(rand.NewPCG(3, 4))
	// A live token that the flood must not disturb.
	first := packet{Src: client(1, false, 40000), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
	be := r.backend(r.run(first))
	first.Flags, first.Opts = tcpACK, ackCapable(1, 20, mustKey("d41c1a707ad28dc6"))
	r.run(first)
	const flood = 5000
	for i := 0; i < flood; i++ {
		tok := rng.Uint32()
		if tok == 0xbad4a582 {
			continue
		}
		p := packet{Src: client(i, i%2 == 0, uint16(1024+i)), Dst: vipOf(i%2 == 0), Flags: tcpSYN,
			Opts: mptcpopt.AppendJoinSYN(nil, 2, false, tok, rng.Uint32())}
		if res := r.run(p); res.Action != ActionDrop {
			t.Fatalf("join with unknown token %08x: action %d, want drop", tok, res.Action)
		}
	}
	c := r.counters()
	if c[CounterDropJoinUnknown] != flood || c[CounterNewConn] != 1 {
		t.Fatalf("drop_join_unknown_token %d (want %d), new_conn %d", c[CounterDropJoinUnknown], flood, c[CounterNewConn])
	}
	conns, _ := r.d.ConnsPerBackend()
	if conns[uint32(be)] != 1 || len(conns) != 1 {
		t.Fatalf("dropped joins left flows in the table: %v", conns)
	}
	if tok, ok := r.tokens()[0xbad4a582]; !ok || tok.Backend != uint32(be) {
		t.Fatalf("live token lost: %v", r.tokens())
	}
	// A join SYN of the SYN/ACK form (length 16) carries no token: dropped as unknown too.
	p := packet{Src: client(7, false, 7), Dst: vip4, Flags: tcpSYN, Opts: append([]byte{30, 16, 0x10, 1}, make([]byte, 12)...)}
	if res := r.run(p); res.Action != ActionDrop {
		t.Fatalf("join SYN of length 16: action %d", res.Action)
	}
}

func TestUnawareHashesJoins(t *testing.T) {
	r := newRig(t, 4, func(c *Config) { c.Aware = false; c.HashAddrs = true })
	first := packet{Src: client(1, false, 40000), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
	r.run(first)
	first.Flags, first.Opts = tcpACK, ackCapable(1, 20, mustKey("d41c1a707ad28dc6"))
	r.run(first)
	join := packet{Src: client(2, false, 40001), Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0xbad4a582, 1)}
	if got, want := r.backend(r.run(join)), r.expect(join); got != want {
		t.Fatalf("unaware balancer sent the join to %d, the address hash picks %d", got, want)
	}
	if len(r.tokens()) != 0 {
		t.Fatalf("unaware balancer learned tokens")
	}
}

func TestForgedAndBadInput(t *testing.T) {
	key := mustKey("d41c1a707ad28dc6")
	cases := []struct {
		name   string
		pkts   []packet
		action uint32 // of the last packet
		count  Counter
		tokens int
	}{
		{"MP_CAPABLE ACK of a flow never seen", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 20, key)},
		}, ActionTX, CounterLearnNoFlow, 0},
		{"MP_CAPABLE ACK of a flow whose SYN had no MP_CAPABLE", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 20, key)},
		}, ActionTX, CounterLearnNoFlow, 0},
		{"MP_CAPABLE of length 16", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 16, Version: 1, Flags: 1})},
		}, ActionTX, CounterMPCBad, 0},
		{"v0 MP_CAPABLE of length 22", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: synCapable(0)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(0, 22, key)},
		}, ActionTX, CounterMPCBad, 0},
		{"MP_CAPABLE version 3", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(3, 20, key)},
		}, ActionTX, CounterMPCBad, 0},
		{"option length that lies", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 20, key)[:16]},
		}, ActionTX, CounterOptMalformed, 0},
		{"option length 0", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: []byte{30, 0, 0, 0}},
		}, ActionTX, CounterOptMalformed, 0},
		{"kind without length", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: []byte{1, 1, 1, 30}},
		}, ActionTX, CounterOptMalformed, 0},
		{"data offset past the frame", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, DataOffset: 15},
		}, ActionDrop, CounterDropMalformed, 0},
		{"data offset below 5", []packet{
			{Src: client(1, true, 1), Dst: vip6, Flags: tcpSYN, DataOffset: 3},
		}, ActionDrop, CounterDropMalformed, 0},
		{"not a service", []packet{
			{Src: client(1, false, 1), Dst: netip.MustParseAddrPort("10.100.0.1:443"), Flags: tcpSYN},
		}, ActionPass, CounterPassNotVIP, 0},
		{"UDP", []packet{
			{Src: client(1, false, 1), Dst: vip4, Proto: 17},
		}, ActionPass, CounterPassOther, 0},
		{"IPv4 fragment to a VIP", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Fragment: true},
		}, ActionDrop, CounterDropFragment, 0},
		{"learned once per flow", []packet{
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 20, key)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 22, key)},
			{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 22, key)},
		}, ActionTX, CounterTokenLearned, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, 4, nil)
			var res Result
			for _, p := range c.pkts {
				res = r.run(p)
			}
			if res.Action != c.action {
				t.Errorf("action %d, want %d", res.Action, c.action)
			}
			if got := r.counters()[c.count]; got != 1 {
				t.Errorf("counter %s = %d, want 1 (%v)", c.count, got, r.counters())
			}
			if n := len(r.tokens()); n != c.tokens {
				t.Errorf("%d tokens, want %d", n, c.tokens)
			}
		})
	}
}

// TestTruncatedFrames runs every prefix of a join SYN and of a third ACK: no prefix may be
// forwarded as something it is not, and every one is counted.
func TestTruncatedFrames(t *testing.T) {
	r := newRig(t, 2, nil)
	for _, p := range []packet{
		{Src: client(1, false, 1), Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 24, mustKey("0102030405060708"))},
		{Src: client(2, true, 2), Dst: vip6, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 5, 6)},
	} {
		f := p.Frame()
		for n := 1; n < len(f); n++ {
			before := r.counters()
			res, err := r.d.Run(f[:n])
			if err != nil {
				if n < 14 { // the kernel refuses frames shorter than an Ethernet header
					continue
				}
				t.Fatal(err)
			}
			after := r.counters()
			if after[CounterRX] != before[CounterRX]+1 {
				t.Fatalf("prefix %d not counted", n)
			}
			if res.Action == ActionTX && after[CounterForwarded] != before[CounterForwarded]+1 {
				t.Fatalf("prefix %d forwarded uncounted", n)
			}
		}
	}
	if len(r.tokens()) != 0 {
		t.Fatalf("a truncated frame taught a token: %v", r.tokens())
	}
}

func TestTokenNeverOverwritten(t *testing.T) {
	for _, drop := range []bool{false, true} {
		r := newRig(t, 4, func(c *Config) { c.CollideDrop = drop })
		key := mustKey("a37c4b42a4d47ad3")
		// Two first subflows on different backends carrying the same server key.
		var bes []int
		for i := 0; len(bes) < 2; i++ {
			p := packet{Src: client(i, false, uint16(2000+i)), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
			if len(bes) == 1 && r.expect(p) == bes[0] {
				continue
			}
			bes = append(bes, r.backend(r.run(p)))
			p.Flags, p.Opts = tcpACK, ackCapable(1, 20, key)
			r.run(p)
		}
		tok := r.tokens()[0x3847c420]
		if tok.Backend != uint32(bes[0]) || tok.Collided != drop {
			t.Fatalf("drop=%v: token %+v, first owner %d", drop, tok, bes[0])
		}
		c := r.counters()
		if c[CounterTokenCollision] != 1 {
			t.Fatalf("collisions %d", c[CounterTokenCollision])
		}
		join := packet{Src: client(500, false, 9), Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0x3847c420, 1)}
		res := r.run(join)
		if drop {
			if res.Action != ActionDrop || r.counters()[CounterDropJoinCollided] != 1 {
				t.Fatalf("collided token: join action %d", res.Action)
			}
		} else if got := r.backend(res); got != bes[0] {
			t.Fatalf("join went to %d, the first owner is %d", got, bes[0])
		}
	}
}

// handshake sends a forged first subflow (SYN, then the third ACK with server key key) from
// src and returns the backend it went to.
func (r *rig) handshake(src netip.AddrPort, key uint64) int {
	r.t.Helper()
	dst := vipOf(src.Addr().Is6())
	p := packet{Src: src, Dst: dst, Flags: tcpSYN, Opts: synCapable(1)}
	be := r.backend(r.run(p))
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], key)
	p.Flags, p.Opts = tcpACK, ackCapable(1, 20, k)
	r.run(p)
	return be
}

// tokenOf is the v1 token of key.
func tokenOf(key uint64) uint32 {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], key)
	return mptcpopt.Token(k, 1)
}

// TestLearningRateLimit: learning is limited per client /24 (IPv4) and /64 (IPv6), whatever
// addresses inside the prefix a forger uses; other prefixes still learn.
func TestLearningRateLimit(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		r := newRig(t, 4, func(c *Config) { c.LearnRate, c.LearnBurst = 1, 5 })
		// One attacker prefix, a new address and fresh key for every handshake.
		for i := 0; i < 50; i++ {
			src := client(1+i, v6, uint16(3000+i)) // 198.51.0.x or 2001:db8::x: one /24, one /64
			r.handshake(src, uint64(i)+1)
		}
		c := r.counters()
		if c[CounterTokenLearned] < 5 || c[CounterTokenLearned] > 6 || c[CounterLearnLimited] < 44 {
			t.Fatalf("v6 %v: learned %d, limited %d: want the burst of 5 and the rest refused", v6, c[CounterTokenLearned], c[CounterLearnLimited])
		}
		// A client in another prefix still learns.
		other := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.7"), 4000)
		if v6 {
			other = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:1:2::7"), 4000)
		}
		r.handshake(other, 0xd41c1a707ad28dc6)
		if _, ok := r.tokens()[0xbad4a582]; !ok {
			t.Fatalf("v6 %v: a client of another prefix was refused", v6)
		}
	}
}

// TestPromotionRateLimit: the global limit bounds how fast joins move tokens to the joined
// table (where nothing evicts them); a join refused promotion is still steered, from the
// pending table.
func TestPromotionRateLimit(t *testing.T) {
	// The global bucket is per CPU, so the flood is run from one CPU: a thread that migrates
	// would draw on every CPU's bucket.
	pinToOneCPU(t)
	r := newRig(t, 4, func(c *Config) { c.GlobalRate, c.GlobalBurst = uint32(cpus()), uint32(10*cpus()) })
	steered := 0
	for i := 0; i < 100; i++ {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i), 0, 1}), 3000)
		be := r.handshake(src, uint64(i)+1)
		join := packet{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{101, byte(i), 0, 1}), 3001), Dst: vip4,
			Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, tokenOf(uint64(i)+1), 1)}
		if r.backend(r.run(join)) == be {
			steered++
		}
	}
	joined, err := r.d.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	c := r.counters()
	if n := len(joined); n < 10 || n > 12 || steered != 100 || c[CounterPromoteLimited] < 88 {
		t.Fatalf("%d tokens promoted, %d of 100 joins steered, %d promotions refused: want about 10, 100, 90",
			n, steered, c[CounterPromoteLimited])
	}
}

// pinToOneCPU keeps the test's goroutine on its OS thread and that thread on the CPU it is
// on now, until the test ends.
func pinToOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("sched_getaffinity: %v", err)
	}
	cpu := -1
	for i := 0; i < 1024 && cpu < 0; i++ {
		if old.IsSet(i) {
			cpu = i
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("sched_setaffinity: %v", err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

func TestTokenRemoval(t *testing.T) {
	r := newRig(t, 4, nil)
	key := mustKey("08b7e60ea98f6592")
	p := packet{Src: client(1, false, 1000), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
	r.run(p)
	p.Flags, p.Opts = tcpACK, ackCapable(1, 20, key)
	r.run(p)
	if _, ok := r.tokens()[0xc4a47403]; !ok {
		t.Fatal("not learned")
	}
	// DATA_FIN marks it closing.
	p.Opts = mptcpopt.AppendDataACK(nil, 1, true)
	r.run(p)
	if tok := r.tokens()[0xc4a47403]; !tok.Closing {
		t.Fatalf("DATA_FIN: %+v", tok)
	}
	// A FASTCLOSE with another key removes nothing; with the server's key, the token.
	p.Opts = mptcpopt.AppendFastclose(nil, mustKey("0102030405060708"))
	r.run(p)
	if len(r.tokens()) != 1 {
		t.Fatal("a FASTCLOSE with a foreign key removed the token")
	}
	p.Flags = tcpACK | 0x04
	p.Opts = mptcpopt.AppendFastclose(nil, key)
	r.run(p)
	if len(r.tokens()) != 0 || r.counters()[CounterTokenFastclose] != 1 {
		t.Fatalf("FASTCLOSE left %v", r.tokens())
	}
	// Control-plane removal.
	q := packet{Src: client(2, false, 1000), Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
	r.run(q)
	q.Flags, q.Opts = tcpACK, ackCapable(1, 20, key)
	r.run(q)
	if err := r.d.DeleteToken(0, 0xc4a47403); err != nil || len(r.tokens()) != 0 {
		t.Fatalf("DeleteToken: %v %v", err, r.tokens())
	}
}

func TestMACRewriteBytes(t *testing.T) {
	for _, ifindex := range []int{0, 7} {
		r := newRig(t, 2, nil)
		if ifindex != 0 {
			for i := 0; i < 2; i++ {
				r.d.SetBackend(uint32(i), Backend{MAC: backendMAC(i), IfIndex: ifindex})
			}
		}
		for _, v6 := range []bool{false, true} {
			p := packet{Src: client(3, v6, 3333), Dst: vipOf(v6), Flags: tcpSYN, Opts: synCapable(1)}
			in := p.Frame()
			res, err := r.d.Run(in)
			if err != nil {
				t.Fatal(err)
			}
			wantAction := uint32(ActionTX)
			if ifindex != 0 {
				wantAction = ActionRedirect
			}
			if res.Action != wantAction {
				t.Fatalf("action %d, want %d", res.Action, wantAction)
			}
			want := append([]byte(nil), in...)
			copy(want[0:], backendMAC(r.expect(p)))
			copy(want[6:], lbMAC)
			if !bytes.Equal(res.Out, want) {
				t.Fatalf("v6=%v frame\n got %x\nwant %x", v6, res.Out, want)
			}
		}
	}
}

func TestIPIPBytes(t *testing.T) {
	r := newRig(t, 2, func(c *Config) { c.Mode = ModeIPIP })
	// Backend 0 has an IPv4 address, backend 1 an IPv6 one (newRig).
	for _, v6 := range []bool{false, true} {
		for want := 0; want < 2; want++ {
			var p packet
			for port := uint16(1); ; port++ {
				p = packet{Src: client(4, v6, port), Dst: vipOf(v6), Flags: tcpSYN, Opts: synCapable(1)}
				if r.expect(p) == want {
					break
				}
			}
			in := p.Frame()
			res, err := r.d.Run(in)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != ActionTX {
				t.Fatalf("action %d", res.Action)
			}
			inner := in[14:]
			var outer []byte
			if want == 0 {
				outer = make([]byte, 20)
				outer[0] = 0x45
				binary.BigEndian.PutUint16(outer[2:], uint16(20+len(inner)))
				outer[8] = 64
				outer[9] = 4
				if v6 {
					outer[9] = 41
				}
				s, d := lbSrc4.As4(), backendAddr(0, false).As4()
				copy(outer[12:], s[:])
				copy(outer[16:], d[:])
				binary.BigEndian.PutUint16(outer[10:], ipChecksum(outer))
			} else {
				outer = make([]byte, 40)
				outer[0] = 0x60
				binary.BigEndian.PutUint16(outer[4:], uint16(len(inner)))
				outer[6] = 4
				if v6 {
					outer[6] = 41
				}
				outer[7] = 64
				s, d := lbSrc6.As16(), backendAddr(1, true).As16()
				copy(outer[8:], s[:])
				copy(outer[24:], d[:])
			}
			var wantFrame []byte
			wantFrame = append(wantFrame, backendMAC(want)...)
			wantFrame = append(wantFrame, lbMAC...)
			if want == 0 {
				wantFrame = append(wantFrame, 0x08, 0x00)
			} else {
				wantFrame = append(wantFrame, 0x86, 0xdd)
			}
			wantFrame = append(wantFrame, outer...)
			wantFrame = append(wantFrame, inner...)
			if !bytes.Equal(res.Out, wantFrame) {
				t.Fatalf("inner v6=%v backend %d:\n got %x\nwant %x", v6, want, res.Out, wantFrame)
			}
			if want == 0 && ipChecksum(res.Out[14:34]) != 0 {
				t.Fatal("outer IPv4 checksum does not verify")
			}
		}
	}
}

func TestStateless(t *testing.T) {
	r := newRig(t, 4, nil)
	port := netip.AddrPortFrom(vip4.Addr(), 5002)
	if err := r.d.SetStateless(port, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		p := packet{Src: client(i, false, uint16(7000+i)), Dst: port, Flags: tcpSYN,
			Opts: mptcpopt.AppendJoinSYN(nil, 1, false, uint32(i), 0)}
		if got := r.backend(r.run(p)); got != 2 {
			t.Fatalf("stateless port sent a join to %d", got)
		}
	}
	conns, _ := r.d.ConnsPerBackend()
	if len(conns) != 0 {
		t.Fatalf("stateless forwarding kept state: %v", conns)
	}
	if c := r.counters(); c[CounterStateless] != 50 || c[CounterDropJoinUnknown] != 0 {
		t.Fatalf("counters %v", c)
	}
	if err := r.d.DeleteStateless(port); err != nil {
		t.Fatal(err)
	}
	if res := r.run(packet{Src: client(1, false, 1), Dst: port, Flags: tcpSYN}); res.Action != ActionPass {
		t.Fatalf("removed stateless port: action %d", res.Action)
	}
}

func TestRemovedBackendFlowsPlacedAgain(t *testing.T) {
	r := newRig(t, 2, nil)
	p := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}
	be := r.backend(r.run(p))
	other := 1 - be
	table := make([]uint32, TableSize)
	for i := range table {
		table[i] = uint32(other)
	}
	r.d.SetTable(0, table)
	if err := r.d.RemoveBackend(uint32(be)); err != nil {
		t.Fatal(err)
	}
	p.Flags = tcpACK
	if got := r.backend(r.run(p)); got != other {
		t.Fatalf("flow of a removed backend went to %d, want %d", got, other)
	}
}

func TestFlowHashMatchesProgram(t *testing.T) {
	r := newRig(t, 16, func(c *Config) { c.HashSeed = 12345 })
	for i := 0; i < 16; i++ {
		r.table = make([]uint32, TableSize)
	}
	// Make the table the identity modulo 16 to read the hash back from the backend.
	for i := range r.table {
		r.table[i] = uint32(i % 16)
	}
	r.d.SetTable(0, r.table)
	r.d.SetTable(1, r.table)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 300; i++ {
		v6 := rng.IntN(2) == 0
		p := packet{Src: client(rng.IntN(65536), v6, uint16(rng.Uint32())), Dst: vipOf(v6), Flags: tcpSYN}
		if got, want := r.backend(r.run(p)), r.expect(p); got != want {
			t.Fatalf("%v: program picked %d, FlowHash says %d", p.Src, got, want)
		}
	}
}

func TestBaselineAndSink(t *testing.T) {
	r := newRig(t, 1, nil)
	in := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}.Frame()
	_, ret, err := Time(r.d.Baseline(), in, 1)
	if err != nil || ret != ActionTX {
		t.Fatalf("baseline: %d %v", ret, err)
	}
	out := make([]byte, len(in))
	opts := ebpf.RunOptions{Data: in, DataOut: out}
	if _, err := r.d.Baseline().Run(&opts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || !bytes.Equal(out[12:], in[12:]) {
		t.Fatalf("baseline did not swap the MACs: %x", out[:14])
	}
	per, ret, err := Time(r.d.objs.BraidSink, in, 1000)
	if err != nil || ret != ActionDrop || per <= 0 {
		t.Fatalf("sink: %v %d %v", per, ret, err)
	}
	if n, err := r.d.SinkCount(); err != nil || n != 1000 {
		t.Fatalf("sink count %d %v", n, err)
	}
}

func TestNoBackendDropped(t *testing.T) {
	r := newRig(t, 2, nil)
	empty := make([]uint32, TableSize)
	for i := range empty {
		empty[i] = NoBackend
	}
	r.d.SetTable(0, empty)
	if res := r.run(packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}); res.Action != ActionDrop {
		t.Fatalf("SYN with no backend: action %d", res.Action)
	}
	// A stateless entry naming a removed backend.
	port := netip.AddrPortFrom(vip4.Addr(), 5001)
	r.d.SetStateless(port, 1)
	r.d.RemoveBackend(1)
	if res := r.run(packet{Src: client(1, false, 1), Dst: port, Flags: tcpSYN}); res.Action != ActionDrop {
		t.Fatalf("stateless to a removed backend: action %d", res.Action)
	}
	if c := r.counters(); c[CounterDropNoBackend] != 2 {
		t.Fatalf("drop_no_backend %d, want 2", c[CounterDropNoBackend])
	}
}

// TestDecapRestoresFrame encapsulates with the balancer and decapsulates with braid_decap: the
// backend's stack gets the client's packet unchanged behind the balancer's Ethernet header.
func TestDecapRestoresFrame(t *testing.T) {
	r := newRig(t, 2, func(c *Config) { c.Mode = ModeIPIP })
	for _, v6 := range []bool{false, true} {
		for port := uint16(1); port < 20; port++ {
			p := packet{Src: client(9, v6, port), Dst: vipOf(v6), Flags: tcpSYN, Opts: synCapable(1), Payload: []byte("x")}
			in := p.Frame()
			res := r.run(p)
			out := make([]byte, len(res.Out))
			opts := ebpf.RunOptions{Data: res.Out, DataOut: out}
			ret, err := r.d.Decap().Run(&opts)
			if err != nil || ret != ActionPass {
				t.Fatalf("decap: %d %v", ret, err)
			}
			want := append([]byte(nil), in...)
			copy(want[0:6], res.Out[0:6])
			copy(want[6:12], res.Out[6:12])
			if !bytes.Equal(opts.DataOut, want) {
				t.Fatalf("decapsulated\n got %x\nwant %x", opts.DataOut, want)
			}
		}
	}
	if n, err := r.d.DecapCount(); err != nil || n != 38 {
		t.Fatalf("decap count %d %v, want 38", n, err)
	}
	// Anything else passes untouched.
	plain := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}.Frame()
	out := make([]byte, len(plain))
	opts := ebpf.RunOptions{Data: plain, DataOut: out}
	if ret, err := r.d.Decap().Run(&opts); err != nil || ret != ActionPass || !bytes.Equal(opts.DataOut, plain) {
		t.Fatalf("plain TCP through decap: %d %v", ret, err)
	}
}

// TestDeletedServiceFlowsPassed: the program finds an established flow by its 5-tuple without
// reading the service table, so deleting a service must remove its flows: their next packet is
// passed to the stack (not for a service), while another service's flows keep their backend.
func TestDeletedServiceFlowsPassed(t *testing.T) {
	r := newRig(t, 4, nil)
	gone := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}
	kept := packet{Src: client(1, true, 1), Dst: vip6, Flags: tcpSYN}
	keptBE := r.backend(r.run(kept))
	r.run(gone)
	gone.Flags, kept.Flags = tcpACK, tcpACK
	r.run(gone) // both flows established: in the connection table
	r.run(kept)
	if err := r.d.DeleteService(vip4); err != nil {
		t.Fatal(err)
	}
	before := r.counters()
	if res := r.run(gone); res.Action != ActionPass {
		t.Fatalf("a deleted service's established flow: action %d, want pass", res.Action)
	}
	if d := r.counters()[CounterPassNotVIP] - before[CounterPassNotVIP]; d != 1 {
		t.Fatalf("pass_not_vip +%d, want +1", d)
	}
	if got := r.backend(r.run(kept)); got != keptBE {
		t.Fatalf("the other service's flow went to %d, want %d", got, keptBE)
	}
}

// TestServiceFilterMatchesProgram: the bitmap that lets the program pass traffic for no service
// without a lookup is written by the control plane (svcBit) and read by the program (svc_bit):
// every service set at random addresses and ports is balanced, and deleting it passes its
// traffic again.
func TestServiceFilterMatchesProgram(t *testing.T) {
	r := newRig(t, 4, nil)
	rnd := rand.New(rand.NewPCG(7, 19))
	for i := 0; i < 64; i++ {
		var vip netip.AddrPort
		port := uint16(1 + rnd.IntN(65535))
		if i%2 == 0 {
			vip = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(rnd.IntN(256)), byte(rnd.IntN(256)), byte(1 + rnd.IntN(254))}), port)
		} else {
			var a [16]byte
			for j := range a {
				a[j] = byte(rnd.IntN(256))
			}
			a[0] = 0xfd
			vip = netip.AddrPortFrom(netip.AddrFrom16(a), port)
		}
		if err := r.d.SetService(2, vip); err != nil {
			t.Fatal(err)
		}
		r.d.SetTable(2, r.table)
		p := packet{Src: client(i, vip.Addr().Is6(), 1000), Dst: vip, Flags: tcpSYN}
		if res := r.run(p); res.Action != ActionTX {
			t.Fatalf("service %v: action %d, want TX", vip, res.Action)
		}
		if err := r.d.DeleteService(vip); err != nil {
			t.Fatal(err)
		}
		if res := r.run(p); res.Action != ActionPass {
			t.Fatalf("deleted service %v: action %d, want pass", vip, res.Action)
		}
	}
}

// TestDataOptionsReadInPlace: the option lists of MPTCP data packets that the program reads in
// place (timestamps alone, a DSS last after timestamps or alone) mean what the option parser
// makes of them, and lists it does not recognise still go through the parser: a DATA_FIN marks
// the connection's token closing wherever its DSS sits, and nothing else does.
func TestDataOptionsReadInPlace(t *testing.T) {
	ts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	dss := func(fin bool) []byte {
		f := byte(0x01)
		if fin {
			f |= 0x10
		}
		return []byte{30, 8, 0x20, f, 0, 0, 0, 9}
	}
	cat := func(bs ...[]byte) []byte {
		var o []byte
		for _, b := range bs {
			o = append(o, b...)
		}
		return o
	}
	cases := []struct {
		name      string
		opts      []byte
		closing   bool
		malformed bool
	}{
		{"timestamps alone", ts, false, false},
		{"timestamps then DSS with DATA_FIN", cat(ts, dss(true)), true, false},
		{"timestamps then DSS", cat(ts, dss(false)), false, false},
		{"DSS with DATA_FIN alone", dss(true), true, false},
		{"DSS with DATA_FIN then timestamps (parser)", cat(dss(true), ts), true, false},
		{"DSS with DATA_FIN then end of list (parser)", cat(ts, dss(true), []byte{0, 0, 0, 0}), true, false},
		{"DSS claiming more than the list (parser, malformed)", cat(ts, []byte{30, 12, 0x20, 0x11, 0, 0, 0, 9}), false, true},
		{"timestamps of a wrong length (parser, malformed)", []byte{1, 1, 8, 14, 0, 0, 0, 1, 0, 0, 0, 2}, false, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, 4, nil)
			r.handshake(client(100+i, false, 2000), 0x1234+uint64(i))
			tok := tokenOf(0x1234 + uint64(i))
			if _, ok := r.tokens()[tok]; !ok {
				t.Fatal("not learned")
			}
			before := r.counters()
			p := packet{Src: client(100+i, false, 2000), Dst: vip4, Flags: tcpACK, Opts: c.opts, Payload: make([]byte, 10)}
			if res := r.run(p); res.Action != ActionTX {
				t.Fatalf("action %d, want TX", res.Action)
			}
			if got := r.tokens()[tok].Closing; got != c.closing {
				t.Fatalf("closing %v, want %v", got, c.closing)
			}
			if got := r.counters()[CounterOptMalformed] - before[CounterOptMalformed]; got != map[bool]uint64{false: 0, true: 1}[c.malformed] {
				t.Fatalf("opt_malformed +%d, want malformed %v", got, c.malformed)
			}
		})
	}
}

// TestFlowCacheDroppedFlowsPlacedAgain: an established flow's packets are served from the
// per-CPU flow cache; when the control plane drops the flows of a backend and gives its index
// to another server, the cached copy must not keep sending the flow there: the next packet is
// placed again by the (new) table, as for a flow the connection table no longer has.
func TestFlowCacheDroppedFlowsPlacedAgain(t *testing.T) {
	r := newRig(t, 2, nil)
	p, be := r.cachedFlow()
	other := 1 - be
	table := make([]uint32, TableSize)
	for i := range table {
		table[i] = uint32(other)
	}
	if err := r.d.SetTable(0, table); err != nil {
		t.Fatal(err)
	}
	if err := r.d.DropFlowsOf(uint32(be)); err != nil {
		t.Fatal(err)
	}
	// the index stays present, now another server's (a reused slot)
	if err := r.d.SetBackend(uint32(be), Backend{MAC: net.HardwareAddr{0x02, 0xbe, 0, 0, 0, 0x77}}); err != nil {
		t.Fatal(err)
	}
	if got := r.backend(r.run(p)); got != other {
		t.Fatalf("a dropped flow went to %d, want %d (placed again)", got, other)
	}
}

// TestFlowCacheStatelessTakesOver: the program looks in its flow cache before the stateless
// table, so a stateless entry added for a service's address and port must end the cached
// copies of its flows: the flow's next packet goes to the stateless backend. Another stateless
// entry exists already, so the configuration (and its flag) does not change with this one.
func TestFlowCacheStatelessTakesOver(t *testing.T) {
	r := newRig(t, 3, nil)
	if err := r.d.SetStateless(netip.AddrPortFrom(vip4.Addr(), 5002), 2); err != nil {
		t.Fatal(err)
	}
	p, be := r.cachedFlow()
	other := (be + 1) % 3
	if err := r.d.SetStateless(vip4, uint32(other)); err != nil {
		t.Fatal(err)
	}
	before := r.counters()[CounterStateless]
	if got := r.backend(r.run(p)); got != other {
		t.Fatalf("after a stateless entry for the service, its cached flow went to %d, want %d", got, other)
	}
	if n := r.counters()[CounterStateless] - before; n != 1 {
		t.Fatalf("stateless forwards counted %d, want 1", n)
	}
}

// TestFlowCacheBackendChanges: a flow cache slot carries its backend's MAC and interface, so a
// cached flow reads no backend element. A backend given a new MAC must be reached at the new
// one from the flow's next packet, a removed backend must not be reached at all, and the
// backend's packet and byte counts must count every cached packet.
func TestFlowCacheBackendChanges(t *testing.T) {
	r := newRig(t, 2, nil)
	p, be := r.cachedFlow()
	other := 1 - be
	before, err := r.d.BackendStats(uint32(be))
	if err != nil {
		t.Fatal(err)
	}
	var sent uint64
	const n = 5
	for i := 0; i < n; i++ { // served from the cache
		res := r.run(p)
		if got := r.backend(res); got != be {
			t.Fatalf("established packet %d went to %d, want %d", i, got, be)
		}
		sent += uint64(len(res.Out))
	}
	after, err := r.d.BackendStats(uint32(be))
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Packets - before.Packets; d != n {
		t.Fatalf("backend %d counted %d packets of %d forwarded", be, d, n)
	}
	if d := after.Bytes - before.Bytes; d != sent {
		t.Fatalf("backend %d counted %d bytes, %d forwarded", be, d, sent)
	}

	// the same backend at a new MAC (its server replaced)
	moved := net.HardwareAddr{0x02, 0xbe, 0, 0, 0, 0x40 + byte(be)}
	if err := r.d.SetBackend(uint32(be), Backend{MAC: moved}); err != nil {
		t.Fatal(err)
	}
	res := r.run(p)
	if res.Action != ActionTX || !bytes.Equal(res.Out[0:6], moved) {
		t.Fatalf("after the backend's MAC changed, its cached flow went to %x (action %d), want %s", res.Out[:6], res.Action, moved)
	}

	// the backend removed: its flow is placed again, by the table, on the other
	table := make([]uint32, TableSize)
	for i := range table {
		table[i] = uint32(other)
	}
	if err := r.d.SetTable(0, table); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // served from the cache again, at the new MAC
		if res := r.run(p); !bytes.Equal(res.Out[0:6], moved) {
			t.Fatalf("packet %d went to %x, want %s", i, res.Out[:6], moved)
		}
	}
	if err := r.d.RemoveBackend(uint32(be)); err != nil {
		t.Fatal(err)
	}
	if got := r.backend(r.run(p)); got != other {
		t.Fatalf("a cached flow of a removed backend went to %d, want %d", got, other)
	}
}
