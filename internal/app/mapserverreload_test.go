package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

// registerSite sends a Map-Register for prefix, signed with key, with one locator, to the
// map server at addr and waits for its Map-Notify.
func registerSite(addr netip.AddrPort, prefix netip.Prefix, key string, rloc netip.Addr) error {
	m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: uint64(time.Now().UnixNano()), AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32),
		Records: []lisp.Record{{TTL: 10, MaskLen: uint8(prefix.Bits()), Authoritative: true, EID: lisp.AddrFrom(prefix.Addr()), Locators: []lisp.Locator{
			{Priority: 1, Weight: 100, Flags: lisp.LocLocal | lisp.LocReachable, Addr: lisp.AddrFrom(rloc)}}}}}
	b := make([]byte, m.Len())
	m.Encode(b)
	lisp.Sign(b, []byte(key))
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return err
	}
	defer c.Close()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("no Map-Notify for %v: %w", prefix, err)
	}
	if lisp.Type(buf[:n]) != lisp.TypeMapNotify || lisp.Verify(buf[:n], []byte(key)) != nil {
		return fmt.Errorf("no valid Map-Notify for %v", prefix)
	}
	return nil
}

// TestMapServerReload runs a map server from a site file on loopback with site1 registered
// and asked for every 20 ms, and reloads a file that adds site2 and gives site3 a new key:
// every request for site1 is answered with its locator across the reload, its registration
// is the same one, site2 can register (it could not before), site3's old key is refused. A
// file with a mistake is then refused by 'braid mapserver reload' with its file:line (exit 1)
// and changes nothing; SIGHUP applies the removal of a site, whose registration goes.
func TestMapServerReload(t *testing.T) {
	dir := t.TempDir()
	control := filepath.Join(dir, "ms.sock")
	site := filepath.Join(dir, "ms.toml")
	siteText := func(sites ...string) string {
		s := fmt.Sprintf("[mapserver]\nlisten = \"127.0.0.1:0\"\nmetrics = \"\"\ncontrol = %q\n", control)
		for _, x := range sites {
			s += x
		}
		return s
	}
	lispSite := func(name, key, prefix string) string {
		return fmt.Sprintf("[[mapserver.site]]\nname = %q\nkey = %q\neid_prefixes = [%q]\nproxy_reply = true\n", name, key, prefix)
	}
	site1 := lispSite("site1", "site1-secret-0123", "192.168.1.0/24")
	os.WriteFile(site, []byte(siteText(site1, lispSite("site3", "site3-old-key-0123", "192.168.3.0/24"))), 0o600)

	cfg, err := loadMapserverConfig(site)
	if err != nil {
		t.Fatal(err)
	}
	lw := &lockedWriter{w: &strings.Builder{}}
	logged := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return lw.w.String() }
	log := slog.New(slog.NewTextHandler(lw, nil))
	ms, err := startMapserver(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	ctx, cancel := withHangup(context.Background(), hup, "braid mapserver", log, site)
	done := make(chan error, 1)
	go func() { done <- ms.run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := ms.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := controlStatus(control); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no control socket")
		}
	}
	rloc1 := netip.MustParseAddr("10.0.1.1")
	if err := registerSite(addr, netip.MustParsePrefix("192.168.1.0/24"), "site1-secret-0123", rloc1); err != nil {
		t.Fatal(err)
	}
	if err := registerSite(addr, netip.MustParsePrefix("192.168.2.0/24"), "site2-secret-0123", rloc1); err == nil {
		t.Fatal("site2 registered before it was configured")
	}
	registered := ms.srv.Registrations(time.Now())[0].Registered

	// site1 asked for every 20 ms until the reloads are done.
	var mu sync.Mutex
	asked, answered := 0, 0
	var bad []string
	stopAsking := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stopAsking:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r, err := lig(netip.MustParseAddr("192.168.1.7"), addr, netip.MustParseAddr("127.0.0.1"), 1, 2*time.Second)
			mu.Lock()
			asked++
			if err == nil && len(r.Record.Locators) == 1 && r.Record.Locators[0].Addr.IP == rloc1 {
				answered++
			} else {
				bad = append(bad, fmt.Sprintf("%+v %v", r.Record, err))
			}
			mu.Unlock()
		}
	})
	time.Sleep(200 * time.Millisecond)
	os.WriteFile(site, []byte(siteText(site1, lispSite("site2", "site2-secret-0123", "192.168.2.0/24"),
		lispSite("site3", "site3-new-key-0123", "192.168.3.0/24"))), 0o600)
	code, out, errOut := run("mapserver", "reload", "--control", control)
	if code != exitOK || !strings.Contains(out, "site added site2") || !strings.Contains(out, "site changed site3 (keys)") || strings.Contains(out, "site1") {
		t.Fatalf("braid mapserver reload: %d %q %q", code, out, errOut)
	}
	if err := registerSite(addr, netip.MustParsePrefix("192.168.2.0/24"), "site2-secret-0123", netip.MustParseAddr("10.0.2.1")); err != nil {
		t.Errorf("site2 after the reload: %v", err)
	}
	if err := registerSite(addr, netip.MustParsePrefix("192.168.3.0/24"), "site3-old-key-0123", rloc1); err == nil {
		t.Errorf("site3's old key still registers after the reload")
	}
	if err := registerSite(addr, netip.MustParsePrefix("192.168.3.0/24"), "site3-new-key-0123", rloc1); err != nil {
		t.Errorf("site3's new key: %v", err)
	}
	// A file with a mistake (line 13: a /33 in IPv4).
	os.WriteFile(site, []byte(siteText(site1, lispSite("site2", "site2-secret-0123", "192.168.2.0/33"))), 0o600)
	code, _, errOut = run("mapserver", "reload", "--control", control)
	if code != exitError || !strings.Contains(errOut, "ms.toml:13:") || !strings.Contains(errOut, "nothing changed") {
		t.Errorf("broken file: %d %q", code, errOut)
	}
	if regs := ms.srv.Registrations(time.Now()); len(regs) != 3 {
		t.Errorf("registrations after a refused reload: %+v", regs)
	}
	// SIGHUP: site3 removed, its registration with it.
	os.WriteFile(site, []byte(siteText(site1, lispSite("site2", "site2-secret-0123", "192.168.2.0/24"))), 0o600)
	hup <- syscall.SIGHUP
	for deadline := time.Now().Add(3 * time.Second); len(ms.srv.Registrations(time.Now())) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not remove site3: %+v\n%s", ms.srv.Registrations(time.Now()), logged())
		}
	}
	time.Sleep(200 * time.Millisecond)
	close(stopAsking)
	wg.Wait()
	regs := ms.srv.Registrations(time.Now())
	if regs[0].Site != "site1" || !regs[0].Registered.Equal(registered) {
		t.Errorf("site1's registration was replaced: %+v, registered at %v before", regs[0], registered)
	}
	t.Logf("site1 asked %d times across three reloads, answered with its locator %d times", asked, answered)
	if asked < 10 || answered != asked {
		t.Errorf("site1 answered %d of %d times: %v", answered, asked, bad)
	}
	for _, want := range []string{`msg="reload: site added" site=site2`, `msg="reload: site changed" site=site3 changed=[keys]`,
		`msg="reload: site removed" site=site3 registrations_dropped=[192.168.3.0/24]`, "reload refused: nothing changed"} {
		if !strings.Contains(logged(), want) {
			t.Errorf("log lacks %q:\n%s", want, logged())
		}
	}
}
