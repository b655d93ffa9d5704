package info

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestDecodeConnInfo(t *testing.T) {
	b := make([]byte, mptcpInfoSize)
	le := binary.NativeEndian
	b[0], b[3], b[80] = 1, 8, 2
	le.PutUint32(b[8:], FlagRemoteKeyReceived)
	le.PutUint32(b[12:], 0xbad4a582)
	le.PutUint64(b[16:], 0xb54cc18ef49747bb)
	le.PutUint64(b[56:], 123456789)
	le.PutUint64(b[72:], 123456000)
	le.PutUint32(b[92:], 17)
	got := DecodeConnInfo(b)
	want := ConnInfo{Subflows: 1, SubflowsMax: 8, SubflowsTotal: 2, Flags: FlagRemoteKeyReceived, Token: 0xbad4a582,
		WriteSeq: 0xb54cc18ef49747bb, BytesSent: 123456789, BytesAcked: 123456000, LastAckRecv: 17}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// An older kernel's shorter structure leaves the newer fields zero.
	if old := DecodeConnInfo(b[:43]); old.Token != want.Token || old.BytesSent != 0 || old.SubflowsTotal != 0 {
		t.Errorf("short buffer: %+v", old)
	}
}

func TestDecodeTCPInfo(t *testing.T) {
	b := make([]byte, tcpInfoSize)
	le := binary.NativeEndian
	b[0] = 1
	le.PutUint32(b[68:], 20500) // rtt µs
	le.PutUint32(b[80:], 42)
	le.PutUint64(b[120:], 1e6)
	le.PutUint64(b[160:], 12_500_000)
	le.PutUint64(b[200:], 1_000_100)
	le.PutUint32(b[228:], 65535)
	got := DecodeTCPInfo(b)
	if got.State != 1 || got.RTT != 20500*time.Microsecond || got.SndCwnd != 42 || got.BytesAcked != 1e6 ||
		got.DeliveryRate != 12_500_000 || got.BytesSent != 1_000_100 || got.SndWnd != 65535 {
		t.Fatalf("got %+v", got)
	}
}

func TestSockaddr(t *testing.T) {
	for _, a := range []netip.AddrPort{
		netip.MustParseAddrPort("10.9.0.1:40001"),
		netip.MustParseAddrPort("[fd09::1]:5000"),
		{},
	} {
		b := make([]byte, 128)
		encodeSockaddr(b, a)
		got, err := decodeSockaddr(b)
		if err != nil || got != a {
			t.Errorf("%v: got %v %v", a, got, err)
		}
	}
	if _, err := decodeSockaddr([]byte{7, 0, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Errorf("family 7: %v", err)
	}
	if _, err := decodeSockaddr([]byte{10, 0, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Errorf("short sockaddr_in6: %v", err)
	}
}

// diagMsg builds an inet_diag_msg as the kernel sends it.
func diagMsg(family uint8, local, remote netip.AddrPort, inode uint32, attrs ...[]byte) []byte {
	b := make([]byte, diagMsgSize)
	b[0], b[1] = family, 1
	binary.BigEndian.PutUint16(b[4:], local.Port())
	binary.BigEndian.PutUint16(b[6:], remote.Port())
	if family == 2 {
		l, r := local.Addr().As4(), remote.Addr().As4()
		copy(b[8:], l[:])
		copy(b[24:], r[:])
	} else {
		l, r := local.Addr().As16(), remote.Addr().As16()
		copy(b[8:], l[:])
		copy(b[24:], r[:])
	}
	binary.NativeEndian.PutUint32(b[68:], inode)
	for _, a := range attrs {
		b = append(b, a...)
	}
	return b
}

func nla(typ uint16, data ...[]byte) []byte {
	var d []byte
	for _, x := range data {
		d = append(d, x...)
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(d)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, d...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func TestDiagGroup(t *testing.T) {
	mi := make([]byte, mptcpInfoSize)
	binary.NativeEndian.PutUint32(mi[12:], 0xabcd)
	ti := make([]byte, tcpInfoSize)
	binary.NativeEndian.PutUint64(ti[200:], 5000)
	// sk_meminfo: rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, and more.
	var mem []byte
	for _, v := range []uint32{1, 131072, 3, 967168, 5, 769320, 168, 0, 0} {
		mem = append(mem, u32(v)...)
	}
	msk := diagMsg(2, netip.MustParseAddrPort("10.9.0.1:40000"), netip.MustParseAddrPort("10.9.0.2:5000"), 77, nla(diagInfo, mi), nla(diagMemInfo, mem))
	sub := func(local string, flags uint32, token uint32) []byte {
		ulp := nla(diagULPInfo|0x8000, nla(ulpInfoName, []byte("mptcp\x00")),
			nla(ulpInfoMPTCP|0x8000, nla(sfAttrTokenLoc, u32(token)), nla(sfAttrFlags, u32(flags)), nla(sfAttrIDLoc, []byte{2}), nla(sfAttrIDRem, []byte{1})))
		return diagMsg(10, netip.MustParseAddrPort(local), netip.MustParseAddrPort("[::ffff:10.9.0.2]:5000"), 0, nla(diagInfo, ti), ulp)
	}
	plain := diagMsg(2, netip.MustParseAddrPort("10.9.0.1:22"), netip.MustParseAddrPort("10.9.0.2:999"), 0, nla(diagInfo, ti))
	var msks, tcps []diagSock
	for _, b := range [][]byte{msk} {
		s, err := parseDiag(b)
		if err != nil {
			t.Fatal(err)
		}
		msks = append(msks, s)
	}
	for _, b := range [][]byte{sub("[::ffff:10.9.1.1]:40001", uint32(SubflowBackupLocal|SubflowJoinLocal), 0xabcd), sub("[::ffff:10.9.0.1]:40000", 0, 0xabcd), sub("[::ffff:10.9.0.1]:41000", 0, 0x9999), plain} {
		s, err := parseDiag(b)
		if err != nil {
			t.Fatal(err)
		}
		tcps = append(tcps, s)
	}
	conns := group(msks, tcps)
	if len(conns) != 1 {
		t.Fatalf("%d connections", len(conns))
	}
	c := conns[0]
	if c.Info.Token != 0xabcd || c.Inode != 77 || len(c.Subflows) != 2 {
		t.Fatalf("connection %+v", c)
	}
	if want := (MemInfo{Known: true, ReceiveAlloc: 1, ReceiveBuffer: 131072, SendBuffer: 967168, WriteQueued: 769320}); c.Mem != want {
		t.Errorf("memory %+v, want %+v", c.Mem, want)
	}
	if _, err := parseDiag(diagMsg(2, netip.MustParseAddrPort("10.9.0.1:40000"), netip.MustParseAddrPort("10.9.0.2:5000"), 77, nla(diagMemInfo, mem[:20]))); !errors.Is(err, ErrMalformed) {
		t.Errorf("a short sk_meminfo: %v", err)
	}
	s := c.Subflows[0]
	if s.Local != netip.MustParseAddrPort("10.9.1.1:40001") || !s.Flags.Backup() || s.LocID != 2 || s.RemID != 1 || s.TCP.BytesSent != 5000 {
		t.Errorf("subflow %+v", s)
	}
	if sent, _, _ := c.SubflowBytes(); sent != 10000 {
		t.Errorf("subflow bytes %d", sent)
	}
}

func TestDiagRequest(t *testing.T) {
	if b := diagRequest(2, 6, allButListenState, false); b[2] != 2 {
		t.Fatalf("extensions without memory: %#x", b[2])
	}
	b := diagRequest(2, 262, allButListenState, true)
	if len(b) != diagReqSize+8 || b[0] != 2 || b[2] != 2|64 || binary.NativeEndian.Uint32(b[4:]) != ^uint32(1<<10) || binary.NativeEndian.Uint32(b[diagReqSize+4:]) != 262 ||
		binary.NativeEndian.Uint16(b[diagReqSize+2:]) != diagReqProtocol {
		t.Fatalf("request %x", b)
	}
}

// FuzzDiag: parseDiag fails only with ErrMalformed; a success keeps the addresses of the
// fixed header.
func FuzzDiag(f *testing.F) {
	ti := make([]byte, 16)
	f.Add(diagMsg(2, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2"), 1, nla(diagInfo, ti)))
	f.Add(diagMsg(2, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2"), 1, nla(diagMemInfo, make([]byte, 36))))
	f.Add(diagMsg(10, netip.MustParseAddrPort("[fd::1]:1"), netip.MustParseAddrPort("[fd::2]:2"), 1,
		nla(diagULPInfo, nla(ulpInfoName, []byte("mptcp\x00")), nla(ulpInfoMPTCP, nla(sfAttrTokenLoc, u32(5)), nla(sfAttrIDLoc, []byte{1})))))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseDiag(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatal(err)
			}
			return
		}
		if s.local.Port() != binary.BigEndian.Uint16(b[4:]) || s.remote.Port() != binary.BigEndian.Uint16(b[6:]) {
			t.Fatalf("ports %v %v from %x", s.local, s.remote, b[:8])
		}
		again, err := parseDiag(b)
		if err != nil || again.token != s.token || again.local != s.local || again.flags != s.flags || again.mem != s.mem {
			t.Fatal("parse is not deterministic")
		}
	})
}

// FuzzSubflowAddrs: decoding either fails with ErrMalformed or re-encodes to an equal pair.
func FuzzSubflowAddrs(f *testing.F) {
	b := make([]byte, addrsSize)
	encodeSockaddr(b[:128], netip.MustParseAddrPort("10.9.1.1:40001"))
	encodeSockaddr(b[128:], netip.MustParseAddrPort("10.9.0.2:5000"))
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeAddrPair(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatal(err)
			}
			return
		}
		enc := make([]byte, addrsSize)
		encodeSockaddr(enc[:128], p.Local)
		encodeSockaddr(enc[128:], p.Remote)
		again, err := decodeAddrPair(enc)
		if err != nil || again != p {
			t.Fatalf("round trip %+v -> %+v (%v)", p, again, err)
		}
	})
}

// MPTCP_FULL_INFO: the header's mptcp_info and the two arrays, laid out with the user's sizes.
func TestDecodeFull(t *testing.T) {
	le := binary.NativeEndian
	buf := make([]byte, fullInfoSize)
	le.PutUint32(buf[0:], tcpInfoSize)
	le.PutUint32(buf[8:], sfInfoSize)
	le.PutUint32(buf[16:], 2)
	le.PutUint32(buf[40+12:], 0x3f15887a) // mptcp_info.token
	sf := make([]byte, 4*sfInfoSize)
	tcp := make([]byte, 4*tcpInfoSize)
	pairs := []AddrPair{
		{netip.MustParseAddrPort("10.9.0.1:40000"), netip.MustParseAddrPort("10.9.0.2:5000")},
		{netip.MustParseAddrPort("10.9.1.1:40001"), netip.MustParseAddrPort("10.9.1.2:5000")},
	}
	for i, p := range pairs {
		s := sf[i*sfInfoSize:]
		le.PutUint32(s, uint32(i+1))
		encodeSockaddr(s[8:136], p.Local)
		encodeSockaddr(s[136:264], p.Remote)
		le.PutUint64(tcp[i*tcpInfoSize+120:], uint64(1000*(i+1)))
	}
	c, err := decodeFull(buf, sf, tcp, 2)
	if err != nil {
		t.Fatal(err)
	}
	if c.Info.Token != 0x3f15887a || len(c.Subflows) != 2 || c.Local != pairs[0].Local || c.Remote != pairs[0].Remote {
		t.Fatalf("conn %+v", c)
	}
	for i, s := range c.Subflows {
		if s.ID != uint32(i+1) || s.Local != pairs[i].Local || s.Remote != pairs[i].Remote || s.TCP.BytesAcked != uint64(1000*(i+1)) {
			t.Errorf("subflow %d: %+v", i, s)
		}
	}
	if _, err := decodeFull(buf, sf, tcp, 5); !errors.Is(err, ErrMalformed) {
		t.Errorf("more subflows than room: %v", err)
	}
}

func TestDestroyRequest(t *testing.T) {
	b := destroyRequest(netip.MustParseAddrPort("10.9.0.2:7101"), netip.MustParseAddrPort("10.9.1.1:45009"), 3)
	want := []byte{
		unix.AF_INET, unix.IPPROTO_TCP, 0, 0, 0, 0, 0, 0, // family, protocol, ext, pad, states (below)
		0x1b, 0xbd, 0xaf, 0xd1, // sport 7101, dport 45009
		10, 9, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // src
		10, 9, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // dst
		0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // if (below), cookie
	}
	binary.NativeEndian.PutUint32(want[4:], allButListenState)
	binary.NativeEndian.PutUint32(want[44:], 3)
	if !bytes.Equal(b, want) {
		t.Errorf("destroyRequest:\n got %x\nwant %x", b, want)
	}
	b6 := destroyRequest(netip.MustParseAddrPort("[fd09::2]:7101"), netip.MustParseAddrPort("[fd09:1::1]:5"), 0)
	if b6[0] != unix.AF_INET6 || !bytes.Equal(b6[12:28], netip.MustParseAddr("fd09::2").AsSlice()) || !bytes.Equal(b6[28:44], netip.MustParseAddr("fd09:1::1").AsSlice()) {
		t.Errorf("destroyRequest (IPv6): %x", b6)
	}
}
