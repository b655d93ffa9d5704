package xtr

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"braid/internal/lisp/mapserver"
	"braid/internal/wire/lisp"
)

// requireTshark skips without tshark, unless BRAID_LAB_REQUIRED=1 (CI), where it fails.
func requireTshark(t *testing.T) string {
	p, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("BRAID_LAB_REQUIRED") == "1" {
			t.Fatal("BRAID_LAB_REQUIRED=1 but tshark is missing (scripts/deps.sh installs it)")
		}
		t.Skip("tshark is not installed (scripts/deps.sh installs it)")
	}
	return p
}

type nullDevice struct{}

func (nullDevice) ReadBatchIdle([][]byte, int, []int, func()) (int, error) { select {} }
func (nullDevice) WriteBatch([][]byte) error                               { return nil }
func (nullDevice) Close() error                                            { return nil }

// capture is a pcap file of raw IP packets (LINKTYPE_RAW).
type capture struct {
	b     []byte
	types []string // what each frame must dissect as: "lisp:<type>" or "lisp-data"
}

func (c *capture) add(pkt []byte, want string) {
	if c.b == nil {
		c.b = make([]byte, 24)
		binary.LittleEndian.PutUint32(c.b, 0xa1b2c3d4)
		binary.LittleEndian.PutUint16(c.b[4:], 2)
		binary.LittleEndian.PutUint16(c.b[6:], 4)
		binary.LittleEndian.PutUint32(c.b[16:], 65535)
		binary.LittleEndian.PutUint32(c.b[20:], 101)
	}
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, uint32(len(c.types)))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(pkt)))
	binary.LittleEndian.PutUint32(h[12:], uint32(len(pkt)))
	c.b = append(append(c.b, h...), pkt...)
	c.types = append(c.types, want)
}

// control wraps a control message in IPv4 and UDP (4342 on the side that receives requests).
func (c *capture) control(msg []byte, from, to netip.AddrPort) {
	u := lisp.IPUDP{Src: from, Dst: to, TTL: 64, PayloadLen: uint16(len(msg))}
	b := make([]byte, u.Len()+len(msg))
	copy(b[u.Len():], msg)
	u.Encode(b)
	c.add(b, "lisp:"+strconv.Itoa(lisp.Type(msg)))
}

// TestTsharkDecodes writes every kind of message braid's xTR and map server send into a
// capture, with the code that sends them, and has tshark dissect it: each frame must be LISP of
// the intended type, and no frame malformed or with an expert warning.
func TestXtrTsharkDecodes(t *testing.T) {
	tshark := requireTshark(t)
	eids := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	rlocs := []netip.Addr{netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")}
	ms := netip.MustParseAddrPort("10.0.9.1:4342")
	o := Options{Device: nullDevice{}, EIDs: eids, Resolvers: []netip.AddrPort{ms},
		MapServers: []MapServer{{Addr: ms, Key: []byte("k1"), AlgID: lisp.AlgHMACSHA1}, {Addr: ms, Key: []byte("k1"), AlgID: lisp.AlgHMACSHA256, ProxyReply: true}}}
	for _, a := range rlocs {
		o.Uplinks = append(o.Uplinks, &Uplink{Addr: a})
		o.Locators = append(o.Locators, Locator{Priority: 1, Weight: 50})
	}
	x, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mapserver.Defaults()
	cfg.Sites = []mapserver.Site{{Name: "s1", Keys: map[uint8][]byte{0: []byte("k1")}, Prefixes: eids},
		{Name: "s2", Keys: map[uint8][]byte{0: []byte("k2")}, Prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.2.0/24")}}}
	srv, err := mapserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var c capture
	etr := netip.AddrPortFrom(rlocs[0], lisp.ControlPort)
	now := time.Now()
	serve := func(msg []byte, from netip.AddrPort, want int) {
		c.control(msg, from, ms)
		out := srv.Handle(now, from, msg, nil)
		if len(out) != want {
			t.Fatalf("map server sent %d packets, want %d (%v)", len(out), want, srv.Counters())
		}
		for _, p := range out {
			c.control(p.Data, ms, p.To)
		}
	}
	// Registrations (HMAC-SHA-1 20 bytes; HMAC-SHA-256 32 bytes with proxy reply) and the
	// map server's Map-Notify for each.
	for k := range o.MapServers {
		b, err := x.registerMessage(k, uint64(100+k))
		if err != nil {
			t.Fatal(err)
		}
		serve(b, etr, 1)
	}
	// ECM Map-Requests for IPv4 and IPv6 EIDs: a proxy reply, negative replies for an
	// unregistered site and for space no site holds.
	for i, q := range []string{"192.168.1.7", "fd00:1::7", "192.168.2.7", "192.0.2.1", "2001:db8::1"} {
		eid := netip.MustParseAddr(q)
		ui, res, b := x.requestMessage(eid, netip.Addr{}, uint64(200+i), i, i%len(x.o.Resolvers))
		if b == nil || res != ms {
			t.Fatalf("no request for %v", eid)
		}
		serve(b, netip.AddrPortFrom(rlocs[ui], lisp.ControlPort), 1)
	}
	// Without proxy reply, the map server forwards the ECM to the ETR.
	cfg.Sites[0].ProxyReply = false
	srv2, _ := mapserver.New(cfg)
	b, _ := x.registerMessage(0, 300)
	srv2.Handle(now, etr, b, nil)
	_, _, req := x.requestMessage(netip.MustParseAddr("192.168.1.9"), netip.MustParseAddr("192.168.2.1"), 301, 0, 0)
	fwd := srv2.Handle(now, etr, req, nil)
	if len(fwd) != 1 || fwd[0].To != etr {
		t.Fatalf("not forwarded: %+v", fwd)
	}
	c.control(fwd[0].Data, ms, fwd[0].To)
	// The ETR's answer to it, an RLOC-probe and the probe reply.
	var m lisp.MapRequest
	var e lisp.ECM
	n, _ := e.Decode(fwd[0].Data)
	m.Decode(fwd[0].Data[n:])
	c.control(x.answerMessage(0, &m, false), etr, netip.MustParseAddrPort("10.0.3.1:4342"))
	probe := probeMessage(400, rlocs[1], netip.MustParsePrefix("192.168.1.0/24"))
	c.control(probe, netip.AddrPortFrom(rlocs[1], lisp.ControlPort), netip.MustParseAddrPort("10.0.4.1:4342"))
	m.Decode(probe)
	c.control(x.answerMessage(1, &m, true), netip.MustParseAddrPort("10.0.4.1:4342"), netip.AddrPortFrom(rlocs[1], lisp.ControlPort))
	// Data packets with IPv4 and IPv6 inner packets, over IPv4 and IPv6 RLOCs.
	for _, d := range []struct{ inner, local, remote string }{
		{"192.168.1.1:5000 192.168.2.1:7", "10.0.1.1", "10.0.3.1"},
		{"[fd00:1::1]:5000 [fd00:2::1]:7", "10.0.1.1", "10.0.3.1"},
		{"192.168.1.1:5000 192.168.2.1:7", "2001:db8:1::1", "2001:db8:3::1"},
		{"[fd00:1::1]:5000 [fd00:2::1]:7", "2001:db8:1::1", "2001:db8:3::1"},
	} {
		ends := strings.Fields(d.inner)
		inner := ipUDP(t, ends[0], ends[1])
		buf := make([]byte, headroom+len(inner))
		copy(buf[headroom:], inner)
		dg := encapsulate(buf, len(inner))
		// The outer headers, as the sending socket writes them.
		ipu := lisp.IPUDP{Src: netip.AddrPortFrom(netip.MustParseAddr(d.local), 50000), Dst: netip.AddrPortFrom(netip.MustParseAddr(d.remote), lisp.DataPort),
			TTL: 64, PayloadLen: uint16(len(dg))}
		out := make([]byte, ipu.Len()+len(dg))
		copy(out[ipu.Len():], dg)
		ipu.Encode(out)
		c.add(out, "lisp-data")
	}
	// A registration over IPv6.
	b, _ = x.registerMessage(1, 500)
	c.control(b, netip.MustParseAddrPort("[2001:db8:1::1]:4342"), netip.MustParseAddrPort("[2001:db8:9::1]:4342"))

	problems, seen, err := tsharkProblems(tshark, t.TempDir(), &c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("tshark dissected %d frames: %v", len(c.types), seen)
	for _, want := range []string{"lisp:1", "lisp:2", "lisp:3", "lisp:4", "lisp:8", "lisp-data"} {
		if seen[want] == 0 {
			t.Errorf("no %s frame", want)
		}
	}
}

// TestTsharkCheckSeesMalformed: the check above reports what tshark flags.
func TestXtrTsharkCheckSeesMalformed(t *testing.T) {
	tshark := requireTshark(t)
	var c capture
	reply := lisp.MapReply{Nonce: 1, Records: []lisp.Record{{TTL: 1, MaskLen: 24, EID: lisp.AddrFrom(netip.MustParseAddr("192.168.1.0")),
		Locators: []lisp.Locator{{Priority: 1, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.1.1"))}}}}}
	b := make([]byte, reply.Len())
	reply.Encode(b)
	from, to := netip.MustParseAddrPort("10.0.1.1:4342"), netip.MustParseAddrPort("10.0.3.1:4342")
	c.control(b, from, to)
	c.control(b[:30], from, to) // truncated in the locator
	problems, _, err := tsharkProblems(tshark, t.TempDir(), &c)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 { // the frame, and the expert summary
		t.Fatalf("problems %q, want the truncated frame and the summary", problems)
	}
}

// tsharkProblems has tshark dissect the capture and returns what is wrong with it.
func tsharkProblems(tshark, dir string, c *capture) (problems []string, seen map[string]int, err error) {
	file := filepath.Join(dir, "braid-lisp.pcap")
	if err := os.WriteFile(file, c.b, 0o644); err != nil {
		return nil, nil, err
	}
	out, err := exec.Command(tshark, "-r", file, "-T", "fields", "-E", "separator=|", "-e", "frame.number",
		"-e", "frame.protocols", "-e", "lisp.type", "-e", "_ws.malformed", "-e", "_ws.expert.severity").Output()
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(c.types) {
		return nil, nil, fmt.Errorf("tshark read %d frames, %d written", len(lines), len(c.types))
	}
	seen = map[string]int{}
	for i, l := range lines {
		f := strings.Split(l, "|")
		protos, types, malformed, severity := f[1], f[2], f[3], f[4]
		want := c.types[i]
		var ok bool
		if want == "lisp-data" {
			ok = strings.Contains(protos, ":lisp-data:ip")
		} else {
			// An ECM dissects as two LISP layers (8, then the inner Map-Request).
			ok = strings.Contains(protos, ":lisp") && strings.HasPrefix(types, strings.TrimPrefix(want, "lisp:"))
		}
		if !ok || malformed != "" || severity != "" {
			problems = append(problems, fmt.Sprintf("frame %d (%s): protocols %s, type %q, malformed %q, expert %q", i+1, want, protos, types, malformed, severity))
		}
		seen[want]++
	}
	// The summary of expert information has no warning or error.
	sum, err := exec.Command(tshark, "-r", file, "-q", "-z", "expert,warn").Output()
	if err != nil {
		return nil, nil, err
	}
	if s := string(sum); strings.Contains(s, "Warns") || strings.Contains(s, "Errors") {
		problems = append(problems, "tshark expert summary:\n"+s)
	}
	return problems, seen, nil
}

func ipUDP(t *testing.T, src, dst string) []byte {
	payload := []byte("hello")
	u := lisp.IPUDP{Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst), TTL: 63, PayloadLen: uint16(len(payload))}
	b := make([]byte, u.Len()+len(payload))
	copy(b[u.Len():], payload)
	if u.Encode(b) == 0 {
		t.Fatal("encode")
	}
	return b
}
