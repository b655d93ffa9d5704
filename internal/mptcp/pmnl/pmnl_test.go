package pmnl

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
)

func newTestClient(t *testing.T, k *fakeKernel) *Client {
	t.Helper()
	c, err := NewClient(k.conn())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The exact bytes of docs' SUBFLOW_CREATE example (token 0x3f15887a, 10.91.2.1:40123 id 5 ->
// 10.91.2.2:5000), after the netlink header.
func TestSubflowCreateWireLayout(t *testing.T) {
	k := newFakeKernel()
	k.conns[0x3f15887a] = nil
	c := newTestClient(t, k)
	err := c.CreateSubflow(context.Background(), Subflow{Token: 0x3f15887a,
		Local:  Addr{ID: 5, Addr: netip.MustParseAddr("10.91.2.1"), Port: 40123},
		Remote: netip.MustParseAddrPort("10.91.2.2:5000")})
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, `0a 01 00 00  08 00 04 00 7a 88 15 3f  24 00 01 80
		06 00 01 00 02 00 00 00  08 00 03 00 0a 5b 02 01  05 00 02 00 05 00 00 00  06 00 05 00 bb 9c 00 00
		1c 00 06 80  06 00 01 00 02 00 00 00  08 00 03 00 0a 5b 02 02  06 00 05 00 88 13 00 00`)
	got := k.requests[len(k.requests)-1]
	if !bytes.Equal(got, want) {
		t.Fatalf("SUBFLOW_CREATE bytes\n got %x\nwant %x", got, want)
	}
	if f := k.flags[len(k.flags)-1]; f != netlink.Request|netlink.Acknowledge {
		t.Errorf("flags %v, want request|ack", f)
	}
	if s := k.conns[0x3f15887a]; len(s) != 1 || s[0].Local.Port != 40123 || s[0].Local.ID != 5 {
		t.Errorf("kernel recorded %+v", s)
	}
}

// Every command, encoded and answered by the fake kernel, then checked by what it recorded or
// returned.
func TestCommands(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	k.userspace = false
	c := newTestClient(t, k)
	a1 := Addr{Addr: netip.MustParseAddr("10.0.1.1"), Flags: FlagSubflow, IfIndex: 3}
	a2 := Addr{ID: 9, Addr: netip.MustParseAddr("fd00::1"), Port: 5001, Flags: FlagSignal | FlagBackup}
	for _, a := range []Addr{a1, a2} {
		if err := c.AddEndpoint(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	eps, err := c.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a1.ID = 1
	if len(eps) != 2 || eps[0] != a1 || eps[1] != a2 {
		t.Fatalf("endpoints %v, want %v %v", eps, a1, a2)
	}
	if f := k.flags[len(k.flags)-1]; f != netlink.Request|netlink.Dump {
		t.Errorf("dump flags %v", f)
	}
	got, err := c.Endpoint(ctx, 9)
	if err != nil || got != a2 {
		t.Fatalf("endpoint 9: %v %v", got, err)
	}
	if err := c.SetEndpointFlags(ctx, Addr{ID: 9, Flags: 0}); err != nil {
		t.Fatal(err)
	}
	if k.endpoints[1].Flags != FlagSignal {
		t.Errorf("flags after change: %v", k.endpoints[1].Flags)
	}
	if err := c.DelEndpoint(ctx, 0, a1.Addr); err != nil || len(k.endpoints) != 2 {
		t.Fatalf("id 0: %v, endpoints %v", err, k.endpoints)
	}
	if r, _ := decodeRequest(k.requests[len(k.requests)-1][4:]); r.addr == nil || r.addr.ID != 0 || r.addr.Addr != a1.Addr {
		t.Errorf("delete by address sent %+v", r)
	}
	if err := c.DelEndpoint(ctx, 1, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if err := c.DelEndpoint(ctx, 9, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if len(k.endpoints) != 0 {
		t.Errorf("endpoints left: %v", k.endpoints)
	}
	if err := c.AddEndpoint(ctx, a1); err != nil {
		t.Fatal(err)
	}
	if err := c.FlushEndpoints(ctx); err != nil || len(k.endpoints) != 0 {
		t.Fatalf("flush: %v, %v left", err, k.endpoints)
	}
	if err := c.SetLimits(ctx, Limits{AddAddrAccepted: 4, Subflows: 8}); err != nil {
		t.Fatal(err)
	}
	l, err := c.Limits(ctx)
	if err != nil || l != (Limits{4, 8}) {
		t.Fatalf("limits %+v %v", l, err)
	}
	err = c.SetLimits(ctx, Limits{Subflows: 9})
	var ke *Error
	if !errors.As(err, &ke) || !errors.Is(err, syscall.EINVAL) || ke.Message != "limit greater than maximum" {
		t.Fatalf("limit 9: %v", err)
	}

	// The userspace PM's commands.
	k.userspace = true
	const tok = 0xa1b2c3d4
	k.conns[tok] = nil
	loc := Addr{ID: 2, Addr: netip.MustParseAddr("10.0.2.1"), Port: 40001}
	rem := netip.MustParseAddrPort("10.0.9.2:5000")
	sf := Subflow{Token: tok, Local: loc, Remote: rem}
	if err := c.Announce(ctx, tok, loc); err != nil {
		t.Fatal(err)
	}
	if r, _ := decodeRequest(k.requests[len(k.requests)-1][4:]); r.addr.Flags&FlagSignal == 0 || r.token != tok {
		t.Errorf("announce sent %+v", r)
	}
	if err := c.Remove(ctx, tok, 2); err != nil {
		t.Fatal(err)
	}
	if r, _ := decodeRequest(k.requests[len(k.requests)-1][4:]); r.locID == nil || *r.locID != 2 {
		t.Errorf("remove sent %+v", r)
	}
	if err := c.CreateSubflow(ctx, sf); err != nil {
		t.Fatal(err)
	}
	addrs, err := c.ConnAddrs(ctx, tok)
	if err != nil || len(addrs) != 1 || addrs[0] != loc {
		t.Fatalf("conn addrs %v %v", addrs, err)
	}
	sf.Local.Flags = FlagBackup
	sf.Local.Port = 0 // any local port
	if err := c.SetSubflowFlags(ctx, sf); err != nil {
		t.Fatal(err)
	}
	if k.conns[tok][0].Local.Flags != FlagBackup {
		t.Errorf("backup not set: %+v", k.conns[tok][0])
	}
	if err := c.DestroySubflow(ctx, sf); err == nil {
		t.Error("destroy without a local port accepted")
	}
	sf.Local.Port = 40001
	if err := c.DestroySubflow(ctx, sf); err != nil {
		t.Fatal(err)
	}
	if len(k.conns[tok]) != 0 {
		t.Errorf("subflow left: %v", k.conns[tok])
	}
}

// Refusals carry the errno and the kernel's message, and name the cause.
func TestErrors(t *testing.T) {
	ctx := context.Background()
	sf := Subflow{Token: 0x1234, Local: Addr{ID: 1, Addr: netip.MustParseAddr("10.0.0.1"), Port: 4000}, Remote: netip.MustParseAddrPort("10.0.0.2:80")}
	cases := []struct {
		name  string
		setup func(*fakeKernel)
		call  func(*Client) error
		errno syscall.Errno
		text  string
	}{
		{"unknown token", nil, func(c *Client) error { return c.CreateSubflow(ctx, sf) }, syscall.EINVAL, `"invalid token"`},
		{"kernel PM selected", func(k *fakeKernel) { k.userspace = false }, func(c *Client) error { return c.CreateSubflow(ctx, sf) }, syscall.EINVAL, "userspace PM not selected"},
		{"no privilege", func(k *fakeKernel) { k.deny = true }, func(c *Client) error { return c.SetLimits(ctx, Limits{}) }, syscall.EPERM, "CAP_NET_ADMIN"},
		{"families", func(k *fakeKernel) { k.conns[0x1234] = nil }, func(c *Client) error {
			s := sf
			s.Remote = netip.MustParseAddrPort("[fd00::2]:80")
			return c.CreateSubflow(ctx, s)
		}, syscall.EINVAL, "families mismatch"},
		{"destroy unknown", func(k *fakeKernel) { k.conns[0x1234] = nil }, func(c *Client) error { return c.DestroySubflow(ctx, sf) }, syscall.ESRCH, "subflow not found"},
		{"announce id 0", func(k *fakeKernel) { k.conns[0x1234] = nil }, func(c *Client) error { return c.Announce(ctx, 0x1234, Addr{Addr: sf.Local.Addr}) }, syscall.EINVAL, "invalid addr id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel()
			if tc.setup != nil {
				tc.setup(k)
			}
			err := tc.call(newTestClient(t, k))
			if !errors.Is(err, tc.errno) {
				t.Fatalf("error %v, want errno %v", err, tc.errno)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not say %q", err, tc.text)
			}
		})
	}
	k := newFakeKernel()
	k.noFamily = true
	if _, err := NewClient(k.conn()); !errors.Is(err, ErrNoMPTCP) {
		t.Errorf("kernel without MPTCP: %v", err)
	}
	c := newTestClient(t, newFakeKernel())
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.FlushEndpoints(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

var sampleEvents = []Event{
	{Type: EventCreated, Token: 0x43f10781, Local: netip.MustParseAddrPort("10.9.0.1:40532"), Remote: netip.MustParseAddrPort("10.9.0.2:5000"), Flags: 2, ServerSide: true},
	{Type: EventEstablished, Token: 0x43f10781, Local: netip.MustParseAddrPort("[fd09::1]:40532"), Remote: netip.MustParseAddrPort("[fd09::2]:5000")},
	{Type: EventClosed, Token: 7},
	{Type: EventAnnounced, Token: 7, RemID: 3, Remote: netip.MustParseAddrPort("10.9.1.2:5001")},
	{Type: EventRemoved, Token: 7, RemID: 3},
	{Type: EventSubEstablished, Token: 7, LocID: 2, RemID: 0, Local: netip.MustParseAddrPort("10.9.1.1:40001"), Remote: netip.MustParseAddrPort("10.9.0.2:5000"), Backup: true, IfIndex: 4},
	{Type: EventSubClosed, Token: 7, LocID: 2, Local: netip.MustParseAddrPort("10.9.1.1:40001"), Remote: netip.MustParseAddrPort("10.9.0.2:5000"), Error: 104, ResetReason: 1, ResetFlags: 1},
	{Type: EventSubPriority, Token: 7, LocID: 1, RemID: 1, Local: netip.MustParseAddrPort("10.9.1.1:40001"), Remote: netip.MustParseAddrPort("10.9.0.2:5000"), Backup: true},
	{Type: EventListenerCreated, Local: netip.MustParseAddrPort("0.0.0.0:5000")},
	{Type: EventListenerClosed, Local: netip.MustParseAddrPort("[::]:5000")},
	{Type: EventAnnounced, Token: 9, RemID: 1, Remote: netip.MustParseAddrPort("10.0.0.1:0"), Timeout: 120},
}

func TestEventRoundTrip(t *testing.T) {
	for _, e := range sampleEvents {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var got Event
		if err := got.Decode(uint8(e.Type), b); err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		if got != e {
			t.Errorf("round trip\n got %+v\nwant %+v", got, e)
		}
		if !strings.Contains(got.String(), strings.ToUpper(e.Type.String())) {
			t.Errorf("String %q", got.String())
		}
	}
}

// The byte orders of a captured SUB_ESTABLISHED: ports big-endian, token native.
func TestEventByteOrder(t *testing.T) {
	var b []byte
	add := func(typ uint16, data ...byte) {
		l := 4 + len(data)
		b = append(b, byte(l), byte(l>>8), byte(typ), byte(typ>>8))
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	add(evToken, 0x78, 0x56, 0x34, 0x12)
	add(evFamily, 2, 0)
	add(evSaddr4, 10, 9, 1, 1)
	add(evDaddr4, 10, 9, 0, 2)
	add(evSport, 0x9c, 0x41) // 40001
	add(evDport, 0x13, 0x88) // 5000
	add(evLocID, 2)
	add(evBackup, 1)
	var e Event
	if err := e.Decode(uint8(EventSubEstablished), b); err != nil {
		t.Fatal(err)
	}
	want := Event{Type: EventSubEstablished, Token: 0x12345678, LocID: 2, Backup: true,
		Local: netip.MustParseAddrPort("10.9.1.1:40001"), Remote: netip.MustParseAddrPort("10.9.0.2:5000")}
	if e != want {
		t.Fatalf("got %+v\nwant %+v", e, want)
	}
	enc, _ := e.Encode()
	var again Event
	if err := again.Decode(uint8(e.Type), enc); err != nil || again != e {
		t.Fatalf("re-encode: %+v %v", again, err)
	}
}

func TestEventMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"short header":   {5, 0},
		"length past":    {12, 0, 1, 0, 0, 0, 0, 0},
		"short token":    {6, 0, 1, 0, 1, 2, 0, 0},
		"bad family":     {6, 0, 2, 0, 7, 0, 0, 0},
		"family clash":   {6, 0, 2, 0, 10, 0, 0, 0, 8, 0, 5, 0, 1, 2, 3, 4},
		"long port":      {8, 0, 9, 0, 1, 2, 3, 4},
		"ipv6 too short": {8, 0, 6, 0, 1, 2, 3, 4},
	} {
		e := Event{Token: 99}
		if err := e.Decode(1, b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v, want ErrMalformed", name, err)
		}
		if e != (Event{}) {
			t.Errorf("%s: value left %+v", name, e)
		}
	}
}

func TestStream(t *testing.T) {
	k := newFakeKernel()
	s := NewStream(k.conn())
	defer s.Close()
	for _, e := range sampleEvents[:4] {
		k.events <- e
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, want := range sampleEvents[:4] {
		got, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	start := time.Now()
	if _, err := s.Next(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next after cancel: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Next took %v to see the cancellation", d)
	}
}

// Lost events are reported as ErrOverrun, and the stream goes on.
func TestStreamOverrun(t *testing.T) {
	k := newFakeKernel()
	s := NewStream(k.conn())
	defer s.Close()
	k.overrun = true
	k.events <- sampleEvents[2]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Next(ctx); !errors.Is(err, ErrOverrun) {
		t.Fatalf("first Next: %v, want ErrOverrun", err)
	}
	if e, err := s.Next(ctx); err != nil || e != sampleEvents[2] {
		t.Fatalf("after the overrun: %v %v", e, err)
	}
}

func TestFlags(t *testing.T) {
	f := FlagSignal | FlagBackup | FlagFullmesh
	if f.String() != "signal,backup,fullmesh" {
		t.Errorf("String %q", f)
	}
	g, err := ParseFlags(f.String())
	if err != nil || g != f {
		t.Errorf("ParseFlags: %v %v", g, err)
	}
	if _, err := ParseFlags("signal,bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("bad flag: %v", err)
	}
	if s := Flags(1 << 9).String(); s != "0x200" {
		t.Errorf("unknown flag %q", s)
	}
}

// FuzzEvent: decoding either fails with ErrMalformed and leaves a zero value, or succeeds and
// encode(decode(b)) decodes to the same event.
func FuzzEvent(f *testing.F) {
	for _, e := range sampleEvents {
		b, _ := e.Encode()
		f.Add(uint8(e.Type), b)
	}
	f.Add(uint8(1), []byte{6, 0, 2, 0, 7, 0})
	f.Fuzz(func(t *testing.T, cmd uint8, b []byte) {
		e := Event{Token: 1, Backup: true}
		if err := e.Decode(cmd, b); err != nil {
			if !errors.Is(err, ErrMalformed) || e != (Event{}) {
				t.Fatalf("error %v, value %+v", err, e)
			}
			return
		}
		var fresh Event
		if err := fresh.Decode(cmd, b); err != nil || fresh != e {
			t.Fatalf("dirty and zero decodes differ: %+v / %+v", e, fresh)
		}
		enc, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var again Event
		if err := again.Decode(cmd, enc); err != nil {
			t.Fatalf("re-decode: %v (%+v)", err, e)
		}
		if again != e {
			t.Fatalf("round trip\n got %+v\nwant %+v", again, e)
		}
	})
}

// FuzzAddr: an address nest decodes to an Addr whose encoding decodes to the same Addr.
func FuzzAddr(f *testing.F) {
	for _, a := range []Addr{
		{ID: 5, Addr: netip.MustParseAddr("10.91.2.1"), Port: 40123},
		{ID: 1, Addr: netip.MustParseAddr("fd00::1"), Flags: FlagSubflow | FlagBackup, IfIndex: 7},
	} {
		ae := netlink.NewAttributeEncoder()
		encodeAddr(ae, attrAddr, a)
		b, _ := ae.Encode()
		f.Add(b[4:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeAddr(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatal(err)
			}
			return
		}
		ae := netlink.NewAttributeEncoder()
		encodeAddr(ae, attrAddr, a)
		enc, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeAddrReply(enc)
		if err != nil || got != a {
			t.Fatalf("round trip %+v -> %+v (%v)", a, got, err)
		}
	})
}
