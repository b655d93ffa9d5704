package app

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"text/tabwriter"
	"time"

	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/wire/lisp"
)

func init() {
	commands["lig"] = command{summary: "ask a LISP map-resolver for an EID's mapping and print it (like LIG)", run: runLig}
}

const ligDoc = `Usage: braid lig EID --resolver ADDR[:PORT] [--count N] [--timeout D] [--source ADDR]

braid lig sends a Map-Request for EID (an IPv4 or IPv6 address) to a LISP map-resolver, in an
Encapsulated Control Message as resolvers expect, and prints the Map-Reply that answers it:
the EID prefix, its TTL, whether the answer is authoritative (from the site's ETR) or a proxy
reply, and each locator (RLOC) with its priority, weight and state (up when its R bit is set),
or, for a negative reply, the prefix and the action. It prints the round-trip time from the
request to the reply. The reply may come from the resolver or from the ETR it forwarded the
request to. Requests are sent again after --timeout, --count times in all.

Exit status: 0 with a reply, 1 when none came.

Example:
  braid lig 192.168.2.1 --resolver 10.0.9.1
  braid lig fd00:2::1 --resolver 10.0.9.1:4342 --count 5 --timeout 500ms
`

func runLig(e env, args []string) int {
	fs := newFlags(e, "braid lig", ligDoc)
	resolver := fs.String("resolver", "", "the map-resolver, `ADDR` or ADDR:PORT (port 4342 by default)")
	count := fs.Int("count", 3, "requests to send before giving up")
	timeout := fs.Duration("timeout", 2*time.Second, "wait this long for each reply")
	source := fs.String("source", "", "local `ADDRESS` to send from (default: the one routed to the resolver)")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 1 || *resolver == "" {
		fmt.Fprintln(e.stderr, "braid lig: expected EID --resolver ADDR (see 'braid lig --help')")
		return exitUsage
	}
	eid, err := netip.ParseAddr(pos[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "braid lig: %q is not an IPv4 or IPv6 address\n", pos[0])
		return exitUsage
	}
	res, err := parseResolver(*resolver)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid lig: --resolver %q: want ADDR or ADDR:PORT\n", *resolver)
		return exitUsage
	}
	if *count < 1 || *timeout <= 0 {
		fmt.Fprintln(e.stderr, "braid lig: --count must be at least 1 and --timeout positive")
		return exitUsage
	}
	var src netip.Addr
	if *source != "" {
		if src, err = netip.ParseAddr(*source); err != nil {
			fmt.Fprintf(e.stderr, "braid lig: --source %q is not an address\n", *source)
			return exitUsage
		}
	}
	r, err := lig(eid, res, src, *count, *timeout)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid lig: %v\n", err)
		return exitError
	}
	printLig(e.stdout, eid, r)
	return exitOK
}

func parseResolver(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, lisp.ControlPort), nil
	}
	return netip.ParseAddrPort(s)
}

// ligResult is the answer to a lig query.
type ligResult struct {
	From   netip.AddrPort
	RTT    time.Duration
	Tries  int
	Record lisp.Record
}

// lig sends Map-Requests for eid to res, from src (or the address routed toward res), until a
// reply comes or count requests went unanswered.
func lig(eid netip.Addr, res netip.AddrPort, src netip.Addr, count int, timeout time.Duration) (ligResult, error) {
	if !src.IsValid() {
		// The address the system routes toward the resolver: the ITR-RLOC replies come to.
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(res))
		if err != nil {
			return ligResult{}, err
		}
		src = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: src.AsSlice()})
	if err != nil {
		return ligResult{}, err
	}
	defer conn.Close()
	local := netip.AddrPortFrom(src, uint16(conn.LocalAddr().(*net.UDPAddr).Port))
	buf := make([]byte, 65536)
	for try := 1; try <= count; try++ {
		nonce := mapserver.Nonce()
		msg, err := ligRequest(eid, local, nonce)
		if err != nil {
			return ligResult{}, err
		}
		start := time.Now()
		if _, err := conn.WriteToUDPAddrPort(msg, res); err != nil {
			return ligResult{}, err
		}
		conn.SetReadDeadline(start.Add(timeout))
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break // timeout: next try
			}
			var rep lisp.MapReply
			if _, err := rep.Decode(buf[:n]); err != nil || rep.Nonce != nonce || len(rep.Records) == 0 {
				continue
			}
			return ligResult{From: from, RTT: time.Since(start), Tries: try, Record: rep.Records[0]}, nil
		}
	}
	return ligResult{}, fmt.Errorf("no Map-Reply for %v from %v after %d requests (%v each)", eid, res, count, timeout)
}

// ligRequest is an ECM Map-Request for eid with local as the only ITR-RLOC (replies come back
// to local's port). The inner header goes from local to the EID, as LIG sends it; when the
// EID's family differs from local's, from an address of this host of the EID's family
// (innerSource), never 0.0.0.0 or ::, which map servers and ETRs may drop as a bogus source.
func ligRequest(eid netip.Addr, local netip.AddrPort, nonce uint64) ([]byte, error) {
	req := lisp.MapRequest{Nonce: nonce, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(local.Addr())},
		Records: []lisp.RequestRecord{{MaskLen: uint8(eid.BitLen()), EID: lisp.AddrFrom(eid)}}}
	innerSrc := local.Addr()
	if innerSrc.Is4() != eid.Is4() {
		var err error
		if innerSrc, err = innerSource(eid); err != nil {
			return nil, err
		}
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(innerSrc, local.Port()), Dst: netip.AddrPortFrom(eid, lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	if e.Encode(b) == 0 {
		return nil, fmt.Errorf("cannot encode a request for %v", eid)
	}
	return b, nil
}

// innerSource is the address of this host of eid's family for the inner header of a request:
// the one the system routes toward eid, else the first such address of an interface (global
// before loopback).
func innerSource(eid netip.Addr) (netip.Addr, error) {
	if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(eid, lisp.ControlPort))); err == nil {
		a := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
		c.Close()
		if a.Unmap().Is4() == eid.Is4() && !a.IsUnspecified() {
			return a.Unmap(), nil
		}
	}
	addrs, _ := net.InterfaceAddrs()
	var loop netip.Addr
	for _, ia := range addrs {
		p, err := netip.ParsePrefix(ia.String())
		if err != nil {
			continue
		}
		a := p.Addr().Unmap()
		if a.Is4() != eid.Is4() || a.IsUnspecified() || a.IsLinkLocalUnicast() {
			continue
		}
		if !a.IsLoopback() {
			return a, nil
		}
		if !loop.IsValid() {
			loop = a
		}
	}
	if loop.IsValid() {
		return loop, nil
	}
	fam := "IPv6"
	if eid.Is4() {
		fam = "IPv4"
	}
	return netip.Addr{}, fmt.Errorf("no %s address on this host for the inner header of a request for %v", fam, eid)
}

func printLig(w io.Writer, eid netip.Addr, r ligResult) {
	rec := r.Record
	p, _ := rec.Prefix()
	kind := "proxy reply (map server)"
	if rec.Authoritative {
		kind = "authoritative"
	}
	fmt.Fprintf(w, "Mapping for %v from %v, round trip %v (request %d):\n", eid, r.From, r.RTT.Round(time.Microsecond), r.Tries)
	if len(rec.Locators) == 0 {
		fmt.Fprintf(w, "  %v  negative, action %s, TTL %s, %s\n", p, xtr.ActionName(rec.Action), ttlString(rec.TTL), kind)
		return
	}
	fmt.Fprintf(w, "  %v  TTL %s, %s\n", p, ttlString(rec.TTL), kind)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  LOCATOR\tPRIORITY\tWEIGHT\tSTATE")
	for _, l := range rec.Locators {
		state := "down"
		if l.Flags&lisp.LocReachable != 0 {
			state = "up"
		}
		addr := "?"
		if l.Addr.IP.IsValid() {
			addr = l.Addr.IP.String()
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", addr, l.Priority, l.Weight, state)
	}
	tw.Flush()
}

func ttlString(ttl uint32) string {
	if ttl == 0xffffffff {
		return "unspecified"
	}
	return fmt.Sprintf("%d min", ttl)
}
