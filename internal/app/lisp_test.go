package app

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/config"
	"braid/internal/wire/lisp"
)

func TestLispHelp(t *testing.T) {
	for _, c := range []string{"mapserver", "xtr", "lig"} {
		code, out, _ := run(c, "--help")
		if code != exitOK || !strings.Contains(out, "Example:") || !strings.Contains(out, "braid "+c) {
			t.Errorf("braid %s --help: %d\n%s", c, code, out)
		}
	}
	if code, _, errOut := run("lig", "192.168.2.1"); code != exitUsage || !strings.Contains(errOut, "--resolver") {
		t.Errorf("lig without resolver: %d %q", code, errOut)
	}
	if code, _, errOut := run("lig", "not-an-eid", "--resolver", "10.0.0.1"); code != exitUsage || !strings.Contains(errOut, "not-an-eid") {
		t.Errorf("lig bad EID: %d %q", code, errOut)
	}
}

func writeFile(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "site.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLispCheck(t *testing.T) {
	file := writeFile(t, `
[xtr]
eid_prefixes = ["192.168.1.0/24"]
map_resolvers = ["10.0.9.1:4342"]
  [[xtr.rloc]]
  address = "10.0.1.1"
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  key = "k-0123456789abcdef"
[mapserver]
  [[mapserver.site]]
  name = "s1"
  key = "k-0123456789abcdef"
  eid_prefixes = ["192.168.1.0/24"]
`)
	if code, out, errOut := run("xtr", "check", "--config", file); code != exitOK || !strings.Contains(out, "1 RLOCs") {
		t.Errorf("xtr check: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := run("mapserver", "check", "--config", file); code != exitOK || !strings.Contains(out, "map-server and map-resolver") {
		t.Errorf("mapserver check: %d %q %q", code, out, errOut)
	}
	bad := writeFile(t, "[xtr]\neid_prefixes = [\"192.168.1.0/24\"]\nmap_resolvers = [\"10.0.9.1:4342\"]\n  [[xtr.rloc]]\n  address = \"10.0.1.1\"\n  interface = \"no-such-if0\"\n")
	if code, _, errOut := run("xtr", "check", "--config", bad); code != exitError || !strings.Contains(errOut, ":6: rloc 1: interface \"no-such-if0\" does not exist") {
		t.Errorf("xtr check of a bad file: %d %q", code, errOut)
	}
}

// TestLigAgainstMapserver runs a map server on loopback, registers a site with it as an ETR
// would, and asks it with braid lig: a proxy reply for the site, a negative reply elsewhere;
// braid mapserver show lists the registration.
func TestLigAgainstMapserver(t *testing.T) {
	cfg := config.MapserverDefaults()
	cfg.Listen = netip.MustParseAddrPort("127.0.0.1:0")
	cfg.Metrics = "127.0.0.1:0"
	cfg.Control = ""
	cfg.Sites = []config.LispSite{{Name: "site2", Key: "site2-secret", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.2.0/24")}}}
	ms, err := startMapserver(&cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ms.run(ctx, &cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := ms.conn.LocalAddr().(*net.UDPAddr).AddrPort()

	// Register 192.168.2.0/24 with two locators, asking for proxy replies and a notify; the
	// nonce is the time of sending, as the site's default replay = "timestamp" wants.
	m := lisp.MapRegister{Flags: lisp.RegProxyReply | lisp.RegWantNotify, Nonce: uint64(time.Now().UnixNano()), AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32),
		Records: []lisp.Record{{TTL: 10, MaskLen: 24, Authoritative: true, EID: lisp.AddrFrom(netip.MustParseAddr("192.168.2.0")), Locators: []lisp.Locator{
			{Priority: 1, Weight: 60, Flags: lisp.LocLocal | lisp.LocReachable, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.3.1"))},
			{Priority: 2, Weight: 40, Flags: lisp.LocLocal, Addr: lisp.AddrFrom(netip.MustParseAddr("10.0.4.1"))}}}}}
	b := make([]byte, m.Len())
	m.Encode(b)
	lisp.Sign(b, []byte("site2-secret"))
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil || lisp.Type(buf[:n]) != lisp.TypeMapNotify || lisp.Verify(buf[:n], []byte("site2-secret")) != nil {
		t.Fatalf("no valid Map-Notify: %v", err)
	}

	code, out, errOut := run("lig", "192.168.2.77", "--resolver", addr.String(), "--timeout", "1s")
	if code != exitOK {
		t.Fatalf("lig: %d %s", code, errOut)
	}
	for _, want := range []string{"192.168.2.0/24  TTL 10 min, proxy reply", "10.0.3.1  1         60      up", "10.0.4.1  2         40      down", "round trip"} {
		if !strings.Contains(out, want) {
			t.Errorf("lig output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = run("lig", "192.0.2.1", "--resolver", addr.String())
	if code != exitOK || !strings.Contains(out, "192.0.0.0/9  negative, action natively-forward, TTL 15 min") {
		t.Errorf("lig negative: %d\n%s", code, out)
	}
	code, out, errOut = run("mapserver", "show", "--metrics", ms.web.Addr())
	if code != exitOK || !strings.Contains(out, "site2") || !strings.Contains(out, "192.168.2.0/24") || !hasRow(out, "negative_replies_sent", "1") {
		t.Errorf("mapserver show: %d %s\n%s", code, errOut, out)
	}
	// Nothing answers on a closed port: lig gives up with a message.
	pc, _ := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	silent := pc.LocalAddr().String()
	if code, _, errOut := run("lig", "192.168.2.1", "--resolver", silent, "--count", "2", "--timeout", "100ms"); code != exitError || !strings.Contains(errOut, "no Map-Reply") {
		t.Errorf("lig to a silent resolver: %d %q", code, errOut)
	}
	pc.Close()
}

// hasRow reports whether a line of a printed table has exactly these fields.
func hasRow(out string, fields ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(l), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

// TestLigInnerSourceOtherFamily (issue 18, item 9): asking for an EID of the other family than
// the resolver's, lig puts an address of this host of the EID's family in the inner header,
// not 0.0.0.0 or ::.
func TestLigInnerSourceOtherFamily(t *testing.T) {
	for _, tc := range []struct{ eid, local string }{{"fd00:2::1", "127.0.0.1:4000"}, {"192.168.2.1", "[::1]:4000"}} {
		eid := netip.MustParseAddr(tc.eid)
		b, err := ligRequest(eid, netip.MustParseAddrPort(tc.local), 1)
		if err != nil {
			t.Skipf("%v (this host has no address of that family)", err)
		}
		var e lisp.ECM
		if _, err := e.Decode(b); err != nil {
			t.Fatal(err)
		}
		src := e.Inner.Src.Addr()
		if src.Is4() != eid.Is4() || src.IsUnspecified() || !src.IsValid() {
			t.Errorf("EID %v from %v: inner source %v", eid, tc.local, src)
		}
	}
}
