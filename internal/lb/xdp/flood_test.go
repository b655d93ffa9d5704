package xdp

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"braid/internal/wire/mptcpopt"
)

// TestForgedFloodCannotEvict floods the pending table (4096 entries) with three times its
// size of forged handshakes from addresses all over the Internet (no prefix limit helps):
// a token already joined stays in the joined table with its backend, and a legitimate token
// learned during the flood still steers its join, however full the tables are. Before the
// pending table, the same flood filled the one token table and every later join was dropped.
func TestForgedFloodCannotEvict(t *testing.T) {
	r := newRig(t, 4, nil) // pending 4096, joined 4096
	// A connection that joined before the flood.
	live := client(1, false, 1)
	liveBE := r.handshake(live, 0xd41c1a707ad28dc6)
	join := packet{Src: client(2, false, 9), Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0xbad4a582, 1)}
	if got := r.backend(r.run(join)); got != liveBE {
		t.Fatalf("join before the flood went to %d, want %d", got, liveBE)
	}
	forge := func(from, n int) {
		for i := from; i < from+n; i++ {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(1 + i%200), byte(i >> 8), byte(i), 1}), uint16(1000+i))
			r.handshake(src, uint64(i)+0x1000)
		}
	}
	const size = 1 << 12
	forge(0, 2*size)
	// A legitimate connection in the middle of the flood: its join follows at once.
	legit := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.10"), 5555)
	legitBE := r.handshake(legit, 0xa37c4b42a4d47ad3)
	forge(2*size, size/2)
	j2 := packet{Src: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.11"), 5556), Dst: vip4, Flags: tcpSYN,
		Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0x3847c420, 1)}
	if got := r.backend(r.run(j2)); got != legitBE {
		t.Fatalf("the legitimate join during the flood went to %d (counters %v), want %d", got, r.counters(), legitBE)
	}
	forge(2*size+size/2, size/2)
	c := r.counters()
	if c[CounterTokenFull] != 0 || c[CounterTokenLearned] != 3*size+2 {
		t.Fatalf("learned %d, full %d: the pending table must make room", c[CounterTokenLearned], c[CounterTokenFull])
	}
	joined, err := r.d.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	// The pending table is full (read in batches, all of it) and holds no joined token.
	pend, err := r.d.PendingTokens()
	if err != nil || len(pend) < size*9/10 || len(pend) > size {
		t.Fatalf("pending table: %d entries (%v), want about %d", len(pend), err, size)
	}
	seen := map[uint32]bool{}
	for _, tk := range pend {
		if tk.Joined || seen[tk.Token] || tk.Token == 0xbad4a582 || tk.Token == 0x3847c420 {
			t.Fatalf("pending entry %+v (duplicate %v)", tk, seen[tk.Token])
		}
		seen[tk.Token] = true
	}
	owner := map[uint32]Token{}
	for _, tk := range joined {
		owner[tk.Token] = tk
	}
	if tk, ok := owner[0xbad4a582]; !ok || tk.Backend != uint32(liveBE) || !tk.Joined {
		t.Fatalf("the joined token was evicted or moved: %+v", owner)
	}
	if tk, ok := owner[0x3847c420]; !ok || tk.Backend != uint32(legitBE) || len(joined) != 2 {
		t.Fatalf("the legitimate token was not promoted, or forged ones were: %d joined", len(joined))
	}
	// Both connections take another join after the flood.
	for _, p := range []struct {
		token uint32
		be    int
	}{{0xbad4a582, liveBE}, {0x3847c420, legitBE}} {
		j := packet{Src: netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(p.token)), Dst: vip4, Flags: tcpSYN,
			Opts: mptcpopt.AppendJoinSYN(nil, 1, false, p.token, 2)}
		if got := r.backend(r.run(j)); got != p.be {
			t.Fatalf("join for %08x after the flood went to %d, want %d", p.token, got, p.be)
		}
	}
}

// TestUnjoinedTokensExpire: a token never joined steers no join once older than
// UnjoinedAfter; a joined token is not subject to it.
func TestUnjoinedTokensExpire(t *testing.T) {
	r := newRig(t, 4, func(c *Config) { c.UnjoinedAfter = 100 * time.Millisecond })
	a := r.handshake(client(1, false, 1), 1)
	b := r.handshake(client(2, false, 1), 2)
	joinOf := func(key uint64, port uint16) packet {
		return packet{Src: client(3, false, port), Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, tokenOf(key), 1)}
	}
	if got := r.backend(r.run(joinOf(1, 10))); got != a {
		t.Fatalf("join of a fresh token went to %d, want %d", got, a)
	}
	time.Sleep(200 * time.Millisecond)
	if res := r.run(joinOf(2, 11)); res.Action != ActionDrop {
		t.Fatalf("join of an expired pending token: action %d", res.Action)
	}
	if got := r.backend(r.run(joinOf(1, 12))); got != a {
		t.Fatalf("join of a joined token after UnjoinedAfter went to %d, want %d", got, a)
	}
	if c := r.counters(); c[CounterTokenExpired] != 1 || c[CounterDropJoinUnknown] != 1 {
		t.Fatalf("counters %v", c)
	}
	// Learned again (a new connection with the same key after the old one's expiry): fresh.
	_ = b
	r.handshake(client(4, false, 1), 2)
	if res := r.run(joinOf(2, 13)); res.Action == ActionDrop {
		t.Fatal("a token learned again after its expiry steers no join")
	}
}

// TestSYNFloodKeepsEstablished floods the balancer with spoofed SYNs, four times the size of
// the connection tables, after a connection and its join subflow were established and the
// Maglev table changed (so that hashing them again would send them elsewhere): the
// established flows stay in the connection table and keep their backend. Each spoofed SYN is
// sent twice, as a retransmission would be: the kernel's LRU keeps entries looked up since
// their insertion apart from those never looked up, so SYNs sent once would not have evicted
// established flows from the former single table, but SYNs sent twice did (the first subflow
// then went to backend 1, the join to backend 3, instead of 0).
func TestSYNFloodKeepsEstablished(t *testing.T) {
	const size = 1 << 12
	r := newRigSized(t, 4, Options{Conns: size, Embryonic: size, Tokens: size, Pending: size}, nil)
	first := client(1, false, 1000)
	be := r.handshake(first, 0xd41c1a707ad28dc6)
	var join packet
	for port := uint16(2000); ; port++ {
		join = packet{Src: client(2, false, port), Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0xbad4a582, 1)}
		if r.expect(join) != be {
			break
		}
	}
	if got := r.backend(r.run(join)); got != be {
		t.Fatalf("join went to %d, want %d", got, be)
	}
	join.Flags, join.Opts = tcpACK, nil
	r.run(join) // the join's third ACK: established
	// Every slot of the Maglev table moves to another backend.
	moved := make([]uint32, TableSize)
	for i := range moved {
		moved[i] = (r.table[i] + 1) % 4
	}
	if err := r.d.SetTable(0, moved); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4*size; i++ {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(1 + i%200), byte(i >> 8), byte(i), 9}), uint16(i))
		syn := packet{Src: src, Dst: vip4, Flags: tcpSYN, Opts: synCapable(1)}
		r.run(syn)
		r.run(syn)
	}
	flows, err := r.d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	est := map[netip.AddrPort]Flow{}
	embryonic := 0
	for _, f := range flows {
		if f.Embryonic {
			embryonic++
		} else {
			est[f.Src] = f
		}
	}
	if f, ok := est[first]; !ok || f.Backend != uint32(be) {
		t.Fatalf("the first subflow left the connection table: %+v", est)
	}
	if f, ok := est[join.Src]; !ok || f.Backend != uint32(be) || !f.Join {
		t.Fatalf("the join subflow left the connection table: %+v", est)
	}
	if len(est) != 2 || embryonic == 0 {
		t.Fatalf("%d established flows (want 2), %d embryonic", len(est), embryonic)
	}
	// Their packets still reach their backend.
	for _, src := range []netip.AddrPort{first, join.Src} {
		p := packet{Src: src, Dst: vip4, Flags: tcpACK, Payload: []byte("x")}
		if got := r.backend(r.run(p)); got != be {
			t.Fatalf("packet of %v after the flood went to %d, want %d", src, got, be)
		}
	}
}

// TestFragmentsAndExtensionHeaders: IPv4 fragments (first or later) and IPv6 packets whose
// first next header is an extension header are dropped when addressed to a VIP (any port:
// a later fragment has none), and passed to the stack otherwise. Plain TCP with IPv4 options
// is still balanced.
func TestFragmentsAndExtensionHeaders(t *testing.T) {
	r := newRig(t, 4, nil)
	other4 := netip.MustParseAddrPort("10.9.9.9:80")
	other6 := netip.MustParseAddrPort("[fd00:9::9]:80")
	laterFragment := func(p packet) []byte {
		b := p.Frame()
		binary.BigEndian.PutUint16(b[14+6:], 0x0010) // offset 128 bytes, MF clear
		binary.BigEndian.PutUint16(b[14+10:], 0)
		binary.BigEndian.PutUint16(b[14+10:], Checksum(b[14:34]))
		return b
	}
	cases := []struct {
		name   string
		frame  []byte
		action uint32
		count  Counter
	}{
		{"IPv4 first fragment to a VIP", packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN, Fragment: true}.Frame(), ActionDrop, CounterDropFragment},
		{"IPv4 later fragment to a VIP", laterFragment(packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}), ActionDrop, CounterDropFragment},
		{"IPv4 fragment to a VIP, another port", packet{Src: client(1, false, 1), Dst: netip.AddrPortFrom(vip4.Addr(), 443), Flags: tcpSYN, Fragment: true}.Frame(), ActionDrop, CounterDropFragment},
		{"IPv4 UDP fragment to a VIP", packet{Src: client(1, false, 1), Dst: vip4, Proto: 17, Fragment: true}.Frame(), ActionDrop, CounterDropFragment},
		{"IPv4 fragment elsewhere", packet{Src: client(1, false, 1), Dst: other4, Flags: tcpSYN, Fragment: true}.Frame(), ActionPass, CounterPassOther},
		{"IPv6 fragment header to a VIP", packet{Src: client(1, true, 1), Dst: vip6, Proto: 44}.Frame(), ActionDrop, CounterDropExtHeader},
		{"IPv6 routing header to a VIP", packet{Src: client(1, true, 1), Dst: vip6, Proto: 43}.Frame(), ActionDrop, CounterDropExtHeader},
		{"IPv6 destination options to a VIP", packet{Src: client(1, true, 1), Dst: vip6, Proto: 60}.Frame(), ActionDrop, CounterDropExtHeader},
		{"IPv6 hop-by-hop to a VIP", hopByHop(packet{Src: client(1, true, 1), Dst: vip6}), ActionDrop, CounterDropExtHeader},
		{"IPv6 extension header elsewhere", packet{Src: client(1, true, 1), Dst: other6, Proto: 60}.Frame(), ActionPass, CounterPassOther},
		{"IPv6 UDP to a VIP", packet{Src: client(1, true, 1), Dst: vip6, Proto: 17}.Frame(), ActionPass, CounterPassOther},
	}
	for _, c := range cases {
		before := r.counters()
		res, err := r.d.Run(c.frame)
		if err != nil {
			t.Fatal(err)
		}
		after := r.counters()
		if res.Action != c.action || after[c.count]-before[c.count] != 1 || after[CounterForwarded] != before[CounterForwarded] {
			t.Errorf("%s: action %d (want %d), %s +%d", c.name, res.Action, c.action, c.count, after[c.count]-before[c.count])
		}
	}
	// A stateless VIP's address counts too, and removing the last use of an address stops it.
	vip := netip.MustParseAddrPort("10.77.0.1:5001")
	frag := packet{Src: client(1, false, 1), Dst: vip, Flags: tcpSYN, Fragment: true}.Frame()
	if err := r.d.SetStateless(vip, 1); err != nil {
		t.Fatal(err)
	}
	if res, _ := r.d.Run(frag); res.Action != ActionDrop {
		t.Errorf("fragment to a stateless VIP: action %d", res.Action)
	}
	if err := r.d.DeleteStateless(vip); err != nil {
		t.Fatal(err)
	}
	if res, _ := r.d.Run(frag); res.Action != ActionPass {
		t.Errorf("fragment to a former VIP: action %d", res.Action)
	}
	// IPv4 options before TCP are not fragments: balanced.
	b := packet{Src: client(1, false, 1), Dst: vip4, Flags: tcpSYN}.Frame()
	withOpts := append(append(append([]byte(nil), b[:34]...), 1, 1, 1, 0), b[34:]...) // NOP NOP NOP EOL
	withOpts[14] = 0x46
	binary.BigEndian.PutUint16(withOpts[16:], uint16(len(withOpts)-14))
	binary.BigEndian.PutUint16(withOpts[24:], 0)
	binary.BigEndian.PutUint16(withOpts[24:], Checksum(withOpts[14:38]))
	if res, _ := r.d.Run(withOpts); res.Action != ActionTX {
		t.Errorf("TCP with IPv4 options: action %d", res.Action)
	}
}

// hopByHop returns p's IPv6 frame with an 8-byte hop-by-hop header (PadN) before TCP.
func hopByHop(p packet) []byte {
	b := p.Frame()
	ext := []byte{6, 0, 1, 4, 0, 0, 0, 0} // next header TCP, length 0, PadN of 4
	out := append(append(append([]byte(nil), b[:54]...), ext...), b[54:]...)
	out[14+6] = 0
	binary.BigEndian.PutUint16(out[14+4:], uint16(len(out)-54))
	return out
}
