package xtr

import (
	"bytes"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

var attacker = netip.MustParseAddrPort("10.66.0.66:4342")

func record(prefix string, ttl uint32, locs ...string) lisp.Record {
	p := netip.MustParsePrefix(prefix)
	r := lisp.Record{TTL: ttl, MaskLen: uint8(p.Bits()), Authoritative: true, EID: lisp.AddrFrom(p.Addr())}
	for _, l := range locs {
		r.Locators = append(r.Locators, lisp.Locator{Priority: 1, Weight: 1, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr(l))})
	}
	return r
}

// TestXtrForgedMapReplies (issue 18, item 5): replies that carry the right nonce but come from
// neither the resolver asked nor the mapping's own locators, or that map more than the query
// (0.0.0.0/0, the site's own EIDs), install nothing; the request stays pending and the right
// answer is still taken.
func TestXtrForgedMapReplies(t *testing.T) {
	x, rs := testXTR(t)
	now := time.Now()
	p := packetTo(t, "192.168.2.5:7")
	x.encap(p, len(p)-headroom)
	_, req := rs.request()
	forged := []struct {
		name string
		from netip.AddrPort
		rec  lisp.Record
	}{
		{"default route from an attacker", attacker, record("0.0.0.0/0", 1440, attacker.Addr().String())},
		{"the query's /24 from an attacker naming another RLOC", attacker, record("192.168.2.0/24", 1440, "10.0.3.1")},
		{"default route from the resolver", rs.addr(), record("0.0.0.0/0", 1440, "10.0.3.1")},
		{"a /7 from the resolver", rs.addr(), record("192.0.0.0/7", 1440, "10.0.3.1")},
		{"the site's own EIDs from the resolver", rs.addr(), record("192.168.0.0/16", 1440, "10.0.3.1")},
		{"a prefix without the query", rs.addr(), record("192.168.3.0/24", 1440, "10.0.3.1")},
	}
	for _, f := range forged {
		x.control(now, 0, f.from, replyBytes(&lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{f.rec}}))
		st := x.Status()
		if len(st.Cache) != 1 || !st.Cache[0].Pending {
			t.Fatalf("%s: installed %+v", f.name, st.Cache)
		}
	}
	if got := x.Counters()[DropReplyRecord]; got != uint64(len(forged)) {
		t.Fatalf("%d records refused, want %d", got, len(forged))
	}
	// The remote ETR answers for itself from one of its locators (forwarded request): taken.
	etr := netip.MustParseAddrPort("10.0.3.1:4342")
	x.control(now, 0, etr, replyBytes(&lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{record("192.168.2.0/24", 10, "10.0.3.1", "10.0.4.1")}}))
	st := x.Status()
	if len(st.Cache) != 1 || st.Cache[0].Pending || st.Cache[0].Prefix != netip.MustParsePrefix("192.168.2.0/24") {
		t.Fatalf("the ETR's own answer not installed: %+v", st.Cache)
	}
	if x.Counters()[CountTxPackets]+x.Counters()[DropSend] != 1 {
		t.Fatalf("the held packet did not leave: %v", x.Counters())
	}

	// A negative reply wider than a /8 is narrowed to the /8 around the query.
	p = packetTo(t, "8.8.8.8:53")
	x.encap(p, len(p)-headroom)
	_, req = rs.request()
	x.control(now, 0, rs.addr(), replyBytes(&lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{{TTL: 15, Action: lisp.ActNativelyForward, Authoritative: true,
		EID: lisp.AddrFrom(netip.MustParseAddr("0.0.0.0"))}}}))
	x.mu.RLock()
	q, e, ok := x.cache.Lookup(netip.MustParseAddr("8.8.8.8"))
	_, _, wide := x.cache.Lookup(netip.MustParseAddr("9.9.9.9"))
	x.mu.RUnlock()
	if !ok || !e.negative || q != netip.MustParsePrefix("8.0.0.0/8") || wide {
		t.Fatalf("negative 0.0.0.0/0 installed as %v (9.9.9.9 covered: %v)", q, wide)
	}
}

// TestXtrNoncesUnpredictable: Map-Request nonces come from crypto/rand; a run of them has no
// repeats and uses the whole 64 bits (a weak generator seeded from the clock, as some
// implementations use, fails the second check).
func TestXtrNoncesUnpredictable(t *testing.T) {
	var or, and uint64 = 0, ^uint64(0)
	seen := map[uint64]bool{}
	for range 256 {
		n := randomNonce()
		if seen[n] {
			t.Fatal("nonce repeated")
		}
		seen[n] = true
		or |= n
		and &= n
	}
	if or != ^uint64(0) || and != 0 {
		t.Fatalf("nonce bits stuck: or %#x and %#x", or, and)
	}
}

// recDevice counts the packets written to the device.
type recDevice struct {
	nullDevice
	writes [][]byte
}

func (d *recDevice) WriteBatch(pkts [][]byte) error {
	for _, b := range pkts {
		d.writes = append(d.writes, append([]byte(nil), b...))
	}
	return nil
}

// TestXtrETRSourceChecks (issue 18, item 6): the ETR does not deliver packets whose inner
// source is one of its own EIDs, nor, by default, packets whose outer source is not a locator
// of the mapping of their inner source; an unknown inner source is resolved first and its
// packets wait for the answer.
func TestXtrETRSourceChecks(t *testing.T) {
	x, rs := testXTR(t)
	dev := &recDevice{}
	x.o.Device = dev
	now := time.Now()
	mapped := netip.MustParseAddr("10.0.3.1")
	rec := record("192.168.2.0/24", 10, mapped.String())
	x.mu.Lock()
	x.installLocked(now, &rec)
	x.mu.Unlock()

	// The site's own EID as inner source, from the mapped RLOC or anywhere: dropped.
	x.decap(now, 0, mapped, ipUDP(t, "192.168.1.7:53", "192.168.1.1:53"))
	// Another site's EID from an address that is not its locator: dropped.
	x.decap(now, 0, attacker.Addr(), ipUDP(t, "192.168.2.5:53", "192.168.1.1:53"))
	if len(dev.writes) != 0 {
		t.Fatalf("spoofed packets delivered: %d", len(dev.writes))
	}
	if c := x.Counters(); c[DropSpoofedSource] != 1 || c[DropOuterSource] != 1 {
		t.Fatalf("counters %v", c)
	}
	// From its locator: delivered.
	x.decap(now, 0, mapped, ipUDP(t, "192.168.2.5:53", "192.168.1.1:53"))
	if len(dev.writes) != 1 {
		t.Fatal("legitimate packet not delivered")
	}

	// An inner source without a mapping: held while it is resolved, delivered when the
	// mapping lists the outer source, dropped when it does not.
	for _, tc := range []struct {
		eid, from, loc string
		delivered      bool
	}{{"192.168.5.5", "10.0.5.1", "10.0.5.1", true}, {"192.168.6.6", "10.66.0.66", "10.0.6.1", false}} {
		before := len(dev.writes)
		x.decap(now, 0, netip.MustParseAddr(tc.from), ipUDP(t, tc.eid+":53", "192.168.1.1:53"))
		if len(dev.writes) != before {
			t.Fatal("delivered before the mapping was known")
		}
		e, req := rs.request()
		if req.Records[0].EID.IP != netip.MustParseAddr(tc.eid) || e.Inner.Src.Addr() != netip.MustParseAddr("192.168.1.1") {
			t.Fatalf("resolution of the inner source: %+v %+v", e, req)
		}
		p := netip.PrefixFrom(netip.MustParseAddr(tc.eid), 24).Masked()
		x.control(now, 0, rs.addr(), replyBytes(&lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{record(p.String(), 10, tc.loc)}}))
		if got := len(dev.writes) - before; (got == 1) != tc.delivered || got > 1 {
			t.Fatalf("%s from %s with locator %s: %d delivered", tc.eid, tc.from, tc.loc, got)
		}
	}
	if c := x.Counters(); c[DropOuterSource] != 2 {
		t.Fatalf("counters %v", c)
	}

	// With the check off, any outer source is taken; own EIDs still are not.
	x.o.AnyOuterSource = true
	before := len(dev.writes)
	x.decap(now, 0, attacker.Addr(), ipUDP(t, "192.168.2.5:53", "192.168.1.1:53"))
	x.decap(now, 0, attacker.Addr(), ipUDP(t, "192.168.1.9:53", "192.168.1.1:53"))
	if len(dev.writes)-before != 1 {
		t.Fatalf("any_outer_source: %d delivered, want 1", len(dev.writes)-before)
	}
}

// TestXtrPendingBounded (issue 18, items 6 and 8): packets spoofed from (or sent to) many EIDs
// start at most MaxPending resolutions and grow the map-cache no further.
func TestXtrPendingBounded(t *testing.T) {
	x, _ := testXTR(t)
	x.o.MaxPending = 8
	now := time.Now()
	for i := range 100 {
		src := netip.AddrFrom4([4]byte{10, 200, byte(i), 1})
		x.decap(now, 0, attacker.Addr(), ipUDP(t, src.String()+":53", "192.168.1.1:53"))
	}
	if n := x.cacheLen(); n != 8 {
		t.Fatalf("%d map-cache entries, want 8", n)
	}
	if c := x.Counters(); c[DropPendingFull] != 92 || c[CountRequests] > 8 {
		t.Fatalf("counters %v", c)
	}
}

func (x *XTR) cacheLen() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.cache.Len()
}

// TestXtrLCAFLocatorCopied (issue 18, item 8): a Map-Reply's locator in a raw LCAF is copied
// into the map-cache, not left pointing into the receive buffer, which the next datagram
// overwrites (and another goroutine may be writing).
func TestXtrLCAFLocatorCopied(t *testing.T) {
	x, rs := testXTR(t)
	p := packetTo(t, "192.168.2.5:7")
	x.encap(p, len(p)-headroom)
	_, req := rs.request()
	raw := []byte{0, 1, 10, 0, 3, 1}
	rec := record("192.168.2.0/24", 10, "10.0.3.1")
	rec.Locators = append(rec.Locators, lisp.Locator{Priority: 2, Weight: 1, Addr: lisp.Addr{AFI: lisp.AFILCAF, LCAFType: 1, Raw: slices.Clone(raw)}})
	buf := make([]byte, 65536)
	m := lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{rec}}
	n := m.Encode(buf)
	x.control(time.Now(), 0, rs.addr(), buf[:n])
	for i := range buf {
		buf[i] = 0xee
	}
	x.mu.RLock()
	_, e, ok := x.cache.Lookup(netip.MustParseAddr("192.168.2.5"))
	x.mu.RUnlock()
	if !ok || e.pending || len(e.locs) != 2 {
		t.Fatalf("not installed: %+v", e)
	}
	if got := e.locs[1].Addr.Raw; !bytes.Equal(got, raw) {
		t.Fatalf("the cached locator changed with the receive buffer: % x, want % x", got, raw)
	}
}

// TestXtrShortReplyAllocatesLittle (issue 18, item 8): a 24-byte Map-Reply that announces 255
// locators is refused before the decoder allocates room for them (it allocated 18 KB).
func TestXtrShortReplyAllocatesLittle(t *testing.T) {
	b := make([]byte, 24)
	b[0] = lisp.TypeMapReply << 4
	b[3] = 1      // one record
	b[12+4] = 255 // 255 locators
	b[12+5] = 32
	var m lisp.MapReply
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	const runs = 100
	for range runs {
		if _, err := m.Decode(b); err == nil {
			t.Fatal("decoded")
		}
	}
	runtime.ReadMemStats(&ms1)
	per := (ms1.TotalAlloc - ms0.TotalAlloc) / runs
	t.Logf("%d bytes allocated per 24-byte reply announcing 255 locators", per)
	if per > 1024 {
		t.Fatalf("%d bytes allocated per 24-byte reply", per)
	}
}

// TestXtrMapCacheBounded (issue 18, item 8): the map-cache holds at most MaxCacheEntries; the
// entry closest to expiry makes room.
func TestXtrMapCacheBounded(t *testing.T) {
	x, _ := testXTR(t)
	x.o.MaxCacheEntries = 4
	now := time.Now()
	for i := range 10 {
		r := record(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100, byte(i), 0}), 24).String(), uint32(10+i), "10.0.3.1")
		x.mu.Lock()
		x.installLocked(now, &r)
		x.mu.Unlock()
	}
	if n := x.cacheLen(); n != 4 || x.Counters()[CountCacheEvicted] != 6 {
		t.Fatalf("%d entries, %d evicted", n, x.Counters()[CountCacheEvicted])
	}
	x.mu.RLock()
	_, _, kept := x.cache.Lookup(netip.MustParseAddr("10.100.9.1"))
	x.mu.RUnlock()
	if !kept {
		t.Fatal("the newest, longest-lived entry was evicted")
	}
}

// TestXtrAnswersBounded (issue 18, item 7): an RLOC-probe is answered at its UDP source, which
// anyone can spoof; a probe asking 255 times for the site's EIDs draws at most a reply three
// times its size, and one victim gets at most 200 + 100/s replies.
func TestXtrAnswersBounded(t *testing.T) {
	x, _ := testXTR(t)
	vc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	victim := vc.LocalAddr().(*net.UDPAddr).AddrPort()
	req := lisp.MapRequest{Flags: lisp.ReqProbe, Nonce: 1, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(victim.Addr())}}
	for i := range 255 {
		req.Records = append(req.Records, lisp.RequestRecord{MaskLen: 32, EID: lisp.AddrFrom(netip.AddrFrom4([4]byte{192, 168, 1, byte(i)}))})
	}
	b := make([]byte, req.Len())
	req.Encode(b)
	now := time.Now()
	x.control(now, 0, victim, b)
	buf := make([]byte, 65536)
	vc.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := vc.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	f := float64(n) / float64(len(b))
	t.Logf("probe of %d bytes asking 255 times: reply of %d bytes (%.2fx)", len(b), n, f)
	if f > 3 {
		t.Fatalf("amplification %.1fx", f)
	}
	// A flood of one-record probes "from" the victim within one second.
	one := probeMessage(2, victim.Addr(), netip.MustParsePrefix("192.168.1.0/24"))
	for i := range 1000 {
		x.control(now.Add(time.Duration(i)*time.Millisecond), 0, victim, one)
	}
	if got := x.Counters()[CountRequestsIn]; got > 1+200+100+1 {
		t.Fatalf("%d replies to one address in one second", got)
	}
}

// forwardedECM is a Map-Request for eid as a map server forwards it, with the given ITR-RLOCs.
func forwardedECM(eid netip.Addr, port uint16, itrs ...netip.Addr) []byte {
	req := lisp.MapRequest{Nonce: 7, Records: []lisp.RequestRecord{{MaskLen: 32, EID: lisp.AddrFrom(eid)}}}
	for _, a := range itrs {
		req.ITRRLOCs = append(req.ITRRLOCs, lisp.AddrFrom(a))
	}
	src := netip.MustParseAddr("192.168.2.1")
	if !eid.Is4() {
		src = netip.MustParseAddr("fd00:2::1")
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(src, port), Dst: netip.AddrPortFrom(eid, lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	e.Encode(b)
	return b
}

// TestXtrForwardedRequestOtherFamily (issue 18, item 9): a forwarded Map-Request whose
// ITR-RLOCs are all of the other family is counted as such on a single-stack xTR, and a
// dual-stack xTR answers it from its link of that family.
func TestXtrForwardedRequestOtherFamily(t *testing.T) {
	x, rs := testXTR(t)
	x.control(time.Now(), 0, rs.addr(), forwardedECM(netip.MustParseAddr("192.168.1.5"), 4342, netip.MustParseAddr("2001:db8::9")))
	if c := x.Counters(); c[DropITRRLOCFamily] != 1 || c[DropControl] != 0 {
		t.Fatalf("counters %v", c)
	}

	v6, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer v6.Close()
	itr, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer itr.Close()
	x.o.Uplinks = append(x.o.Uplinks, &Uplink{Addr: netip.IPv6Loopback(), Control: v6})
	x.locals = append(x.locals, Loc{Addr: netip.IPv6Loopback(), Priority: 1, Weight: 1})
	x.o.Locators = append(x.o.Locators, Locator{Priority: 1, Weight: 1})
	port := uint16(itr.LocalAddr().(*net.UDPAddr).Port)
	// It arrives on the IPv4 uplink and names only an IPv6 ITR-RLOC.
	x.control(time.Now(), 0, rs.addr(), forwardedECM(netip.MustParseAddr("192.168.1.5"), port, netip.IPv6Loopback()))
	itr.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := itr.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer on the IPv6 link: %v (counters %v)", err, x.Counters())
	}
	var r lisp.MapReply
	if _, err := r.Decode(buf[:n]); err != nil || r.Nonce != 7 || from.Addr() != netip.IPv6Loopback() {
		t.Fatalf("answer %+v from %v: %v", r, from, err)
	}
}

// TestXtrRegisterRetransmission (issue 18, item 9): without a Map-Notify, a Map-Register is
// sent again after 1, 2 and 4 s, then only register_interval (60 s) after the last one (it was
// sent every second, forever).
func TestXtrRegisterRetransmission(t *testing.T) {
	x, _ := testXTR(t)
	start := time.Now()
	for ms := 0; ms <= 66_900; ms += 100 {
		x.tick(start.Add(time.Duration(ms) * time.Millisecond))
	}
	if got := x.Counters()[CountRegisters]; got != 4 {
		t.Fatalf("%d Map-Registers in 67 s without a Map-Notify, want 4 (at 0 s and again after 1, 2, 4 s)", got)
	}
	x.tick(start.Add(67 * time.Second))
	if got := x.Counters()[CountRegisters]; got != 5 {
		t.Fatalf("%d Map-Registers at 67 s, want the periodic 5th", got)
	}
}

// TestXtrJunkRepliesCheap (issue 18, items 5 and 8): Map-Replies with wrong nonces are matched
// through an index, not a walk of the map-cache, so a flood of them costs the same with a full
// cache as with an empty one.
func TestXtrJunkRepliesCheap(t *testing.T) {
	x, rs := testXTR(t)
	now := time.Now()
	x.mu.Lock()
	for i := range 65536 {
		r := record(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24).String(), 10, "10.0.3.1")
		x.installLocked(now, &r)
	}
	x.mu.Unlock()
	junk := replyBytes(&lisp.MapReply{Nonce: 1, Records: []lisp.Record{record("10.0.0.0/24", 10, "10.0.3.1")}})
	start := time.Now()
	const n = 20000
	for i := range n {
		junk[4] = byte(i)
		x.control(now, 0, rs.addr(), junk)
	}
	d := time.Since(start)
	t.Logf("%d junk replies with 65536 cache entries: %v (%v each)", n, d.Round(time.Millisecond), d/n)
	if x.Counters()[DropUnexpected] != n {
		t.Fatalf("counters %v", x.Counters())
	}
	if d > 2*time.Second {
		t.Fatalf("%d junk replies took %v", n, d)
	}
}

// TestXtrDecapAllocs: the ETR's source checks allocate nothing per packet.
func TestXtrDecapAllocs(t *testing.T) {
	x, _ := testXTR(t)
	rec := record("192.168.2.0/24", 10, "10.0.3.1")
	x.mu.Lock()
	x.installLocked(time.Now(), &rec)
	x.mu.Unlock()
	pkt := ipUDP(t, "192.168.2.5:53", "192.168.1.1:53")
	from := netip.MustParseAddr("10.0.3.1")
	now := time.Now()
	allocs := testing.AllocsPerRun(100, func() { x.decap(now, 0, from, pkt) })
	if allocs != 0 || x.Counters()[CountRxPackets] == 0 {
		t.Fatalf("%v allocations per packet (%d delivered)", allocs, x.Counters()[CountRxPackets])
	}
}

// TestXtrHeldBytesBounded (issue 18, item 8): big packets from many unresolved sources are held
// up to MaxHeldBytes in all, and the budget comes back when the resolutions end.
func TestXtrHeldBytesBounded(t *testing.T) {
	x, _ := testXTR(t)
	x.o.MaxHeldBytes = 64 << 10
	now := time.Now()
	big := make([]byte, 8000)
	for i := range 200 {
		src := netip.AddrFrom4([4]byte{10, 200, byte(i), 1})
		u := lisp.IPUDP{Src: netip.AddrPortFrom(src, 53), Dst: netip.MustParseAddrPort("192.168.1.1:53"), TTL: 64, PayloadLen: uint16(len(big))}
		pkt := make([]byte, u.Len()+len(big))
		u.Encode(pkt)
		x.decap(now, 0, attacker.Addr(), pkt)
	}
	x.mu.RLock()
	held := x.heldBytes
	x.mu.RUnlock()
	if held > 64<<10 || held == 0 {
		t.Fatalf("%d bytes held, want at most %d", held, 64<<10)
	}
	// The resolutions give up (nobody answers): everything held is freed.
	for s := 1; s <= 5; s++ {
		x.tick(now.Add(time.Duration(s) * 1100 * time.Millisecond))
	}
	x.mu.RLock()
	held, pending := x.heldBytes, x.pending
	x.mu.RUnlock()
	if held != 0 || pending != 0 {
		t.Fatalf("after the resolutions failed: %d bytes held, %d pending", held, pending)
	}
}

// TestXtrECMOnlyFromMapServers (issue 18, item 7): the ETR answers forwarded Map-Requests only
// when a map server it registers with forwarded them; from anyone else an ECM is a way to
// make it send replies to an address of the sender's choosing.
func TestXtrECMOnlyFromMapServers(t *testing.T) {
	x, rs := testXTR(t)
	ecm := forwardedECM(netip.MustParseAddr("192.168.1.5"), 4342, netip.MustParseAddr("127.0.0.1"))
	x.control(time.Now(), 0, attacker, ecm)
	if c := x.Counters(); c[DropECMSource] != 1 || c[CountRequestsIn] != 0 {
		t.Fatalf("ECM from a stranger: %v", c)
	}
	x.control(time.Now(), 0, rs.addr(), ecm)
	if c := x.Counters(); c[CountRequestsIn] != 1 {
		t.Fatalf("ECM from the map server not answered: %v", c)
	}
}
