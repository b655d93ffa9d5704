package xdp

import (
	"net/netip"
	"testing"

	"braid/internal/wire/mptcpopt"
)

// FuzzOptions runs arbitrary TCP option lists through the XDP program, on the third ACK of a
// flow whose MP_CAPABLE SYN it placed, and checks its verdict against the Go parser
// (mptcpopt, the same rules): a malformed list is counted and teaches nothing; an MP_CAPABLE
// carrying the server's key teaches exactly the Go token; a bad MP_CAPABLE is counted;
// anything else teaches nothing. The program must never fail to run.
func FuzzOptions(f *testing.F) {
	for _, s := range [][]byte{
		ackCapableSeed(1, 20), ackCapableSeed(1, 22), ackCapableSeed(1, 24), ackCapableSeed(0, 20),
		{30, 20, 0x01, 0x01}, {1, 1, 30}, {30, 0}, {2, 4, 5, 0xb4, 30, 12, 0x01, 0x01},
		mptcpopt.AppendFastclose(nil, [8]byte{1}), mptcpopt.AppendDataACK(nil, 1, true),
		mptcpopt.AppendJoinSYN(nil, 1, false, 5, 6),
	} {
		f.Add(s)
	}
	d, err := Load(Options{Conns: 1 << 16, Tokens: 1 << 16})
	requireBPF(f, err)
	f.Cleanup(func() { d.Close() })
	if err := d.SetConfig(Config{Aware: true, SrcMAC: lbMAC}); err != nil {
		f.Fatal(err)
	}
	d.SetBackend(0, Backend{MAC: backendMAC(0)})
	table := make([]uint32, TableSize)
	d.SetTable(0, table)
	d.SetService(0, vip4)
	var flow uint32
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 40 {
			b = b[:40]
		}
		opts := append([]byte(nil), b...)
		for len(opts)%4 != 0 {
			opts = append(opts, 1)
		}
		flow++
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(flow >> 16), byte(flow >> 8), byte(flow)}), uint16(flow))
		syn := Packet{Src: src, Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 4, Version: 1, Flags: 1})}
		if res, err := d.Run(syn.Frame()); err != nil || res.Action != ActionTX {
			t.Fatalf("SYN: %v %v", res.Action, err)
		}
		before, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		res, err := d.Run(Packet{Src: src, Dst: vip4, Flags: tcpACK, Opts: opts}.Frame())
		if err != nil || res.Action != ActionTX {
			t.Fatalf("ACK with options %x: action %d, %v", opts, res.Action, err)
		}
		after, _ := d.Counters()
		delta := func(c Counter) uint64 { return after[c] - before[c] }
		taught := delta(CounterTokenLearned) + delta(CounterTokenRepeat) + delta(CounterTokenCollision) + delta(CounterTokenFull)
		var in mptcpopt.Info
		switch perr := mptcpopt.Parse(opts, &in); {
		case perr != nil:
			if delta(CounterOptMalformed) != 1 || taught != 0 {
				t.Fatalf("malformed %x: opt_malformed +%d, learnings %d", opts, delta(CounterOptMalformed), taught)
			}
		case in.Flags&mptcpopt.CapableBad != 0:
			if delta(CounterMPCBad) != 1 || taught != 0 {
				t.Fatalf("bad MP_CAPABLE %x: mpc_bad +%d, learnings %d", opts, delta(CounterMPCBad), taught)
			}
		case in.Flags&mptcpopt.CapableKey != 0:
			if taught != 1 {
				t.Fatalf("MP_CAPABLE with key %x: %d learnings", opts, taught)
			}
			tok := mptcpopt.Token(in.ReceiverKey, in.Version)
			var found bool
			ts, _ := d.Tokens()
			pend, _ := d.PendingTokens()
			for _, x := range append(ts, pend...) {
				found = found || x.Token == tok
			}
			if !found {
				t.Fatalf("%x: token %08x not in the table", opts, tok)
			}
		default:
			if taught != 0 || delta(CounterOptMalformed) != 0 {
				t.Fatalf("%x (no key): learnings %d, opt_malformed +%d", opts, taught, delta(CounterOptMalformed))
			}
		}
	})
}

func ackCapableSeed(version, length uint8) []byte {
	return ackCapable(version, length, mustKey("d41c1a707ad28dc6"))
}

// FuzzDataOptions runs arbitrary TCP option lists through the XDP program on a data packet of
// an established MPTCP subflow whose token it learned (the path where the lists that data
// packets carry are read in place, and where the flow cache may serve the packet), and checks
// its verdict against the Go parser: the packet is always forwarded; a malformed list is
// counted; a DSS with DATA_FIN marks the token closing (unless an MP_FASTCLOSE comes first
// in the program's order), and nothing else does.
func FuzzDataOptions(f *testing.F) {
	ts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	for _, s := range [][]byte{
		ts, append(append([]byte(nil), ts...), mptcpopt.AppendDataACK(nil, 1, true)...),
		append(append([]byte(nil), ts...), mptcpopt.AppendDataACK(nil, 1, false)...),
		mptcpopt.AppendDataACK(nil, 1, true), append(mptcpopt.AppendDataACK(nil, 1, true), ts...),
		{1, 1, 8, 14, 0, 0, 0, 1, 0, 0, 0, 2}, {30, 12, 0x20, 0x11}, {30, 3, 0x20, 1}, {1, 1, 8, 10},
	} {
		f.Add(s)
	}
	d, err := Load(Options{Conns: 1 << 16, Tokens: 1 << 16})
	requireBPF(f, err)
	f.Cleanup(func() { d.Close() })
	if err := d.SetConfig(Config{Aware: true, SrcMAC: lbMAC}); err != nil {
		f.Fatal(err)
	}
	d.SetBackend(0, Backend{MAC: backendMAC(0)})
	d.SetTable(0, make([]uint32, TableSize))
	d.SetService(0, vip4)
	var flow uint32
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 40 {
			b = b[:40]
		}
		opts := append([]byte(nil), b...)
		for len(opts)%4 != 0 {
			opts = append(opts, 1)
		}
		flow++
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{101, byte(flow >> 16), byte(flow >> 8), byte(flow)}), uint16(flow))
		var key [8]byte
		key[0], key[4], key[7] = byte(flow>>8), byte(flow), 0x5a
		syn := Packet{Src: src, Dst: vip4, Flags: tcpSYN, Opts: mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 4, Version: 1, Flags: 1})}
		ack := Packet{Src: src, Dst: vip4, Flags: tcpACK, Opts: ackCapable(1, 20, key)}
		for _, p := range []Packet{syn, ack} {
			if res, err := d.Run(p.Frame()); err != nil || res.Action != ActionTX {
				t.Fatalf("handshake: %v %v", res.Action, err)
			}
		}
		tok := mptcpopt.Token(key, 1)
		closing := func() (bool, bool) {
			pend, _ := d.PendingTokens()
			for _, x := range pend {
				if x.Token == tok {
					return x.Closing, true
				}
			}
			return false, false
		}
		if c, ok := closing(); !ok || c {
			t.Fatalf("token %08x after the handshake: present %v, closing %v", tok, ok, c)
		}
		before, _ := d.Counters()
		res, err := d.Run(Packet{Src: src, Dst: vip4, Flags: tcpACK, Opts: opts, Payload: make([]byte, 8)}.Frame())
		if err != nil || res.Action != ActionTX {
			t.Fatalf("data packet with options %x: action %d, %v", opts, res.Action, err)
		}
		after, _ := d.Counters()
		var in mptcpopt.Info
		perr := mptcpopt.Parse(opts, &in)
		wantMalformed := uint64(0)
		if perr != nil {
			wantMalformed = 1
		}
		if got := after[CounterOptMalformed] - before[CounterOptMalformed]; got != wantMalformed {
			t.Fatalf("%x: opt_malformed +%d, parser error %v", opts, got, perr)
		}
		wantClosing := perr == nil && in.Flags&mptcpopt.DataFIN != 0 && in.Flags&mptcpopt.HasFastclose == 0
		if c, _ := closing(); c != wantClosing {
			t.Fatalf("%x: closing %v, want %v (parser flags %#x, error %v)", opts, c, wantClosing, in.Flags, perr)
		}
	})
}
