package app

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lisp/xtr"
)

// TestXTRReload runs 'braid mapserver' and two 'braid xtr' on the LISP lab, xtr1 with only its
// IPv4 EID prefix. While h1 sends h2 an echo request every 10 ms through the xTRs, xtr1 reloads
// a file that adds its IPv6 EID prefix and changes an RLOC's weight: no echo is lost (at most
// 2 %, for a loaded machine), xtr1's map-cache entry for site 2 stays (no new Map-Request for
// it), and site 1's IPv6 EIDs become reachable from h2 (xtr1 registered its new mapping at
// once). A file with a mistake is then
// refused by 'braid xtr reload' with its file:line (exit 1) and changes nothing; SIGHUP
// applies the removal of the IPv6 prefix.
func TestXTRReload(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, roles.LispTopology(time.Millisecond, 0))
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	ms := filepath.Join(dir, "ms.toml")
	var msText strings.Builder
	fmt.Fprintf(&msText, "[mapserver]\nlisten = %q\nmetrics = \"\"\n", roles.LispMapServer)
	for _, s := range roles.LispSites {
		fmt.Fprintf(&msText, "[[mapserver.site]]\nname = %q\nkey = %q\neid_prefixes = [%q, %q]\n", s.Name, longKey(s.Key), s.EIDs[0], s.EIDs[1])
	}
	os.WriteFile(ms, []byte(msText.String()), 0o600)
	logs := map[string]*lockedWriter{}
	logOf := func(h string) string { w := logs[h]; w.mu.Lock(); defer w.mu.Unlock(); return w.w.String() }
	procs := map[string]*exec.Cmd{}
	start := func(host string, args ...string) {
		cmd := exec.Command(self, args...)
		logs[host] = &lockedWriter{w: &strings.Builder{}}
		cmd.Stderr = logs[host]
		if err := l.Host(host).Start(cmd); err != nil {
			t.Fatal(err)
		}
		procs[host] = cmd
	}
	defer func() {
		for h := range logs {
			if strings.Contains(logOf(h), "DATA RACE") {
				t.Errorf("%s's log (built with -race) reports a data race:\n%s", h, logOf(h))
			}
		}
	}()
	start("ms", "mapserver", "--config", ms)
	control := filepath.Join(dir, "xtr1.sock")
	site1 := filepath.Join(dir, "site1.toml")
	// xtr1's file: eids, and rloc2's weight.
	xtr1 := func(eids string, weight2 int, extra string) {
		s := roles.LispSites[0]
		text := fmt.Sprintf("[xtr]\neid_prefixes = [%s]\nroutes = [\"192.168.0.0/16\", \"fd00::/16\"]\nmap_resolvers = [%q]\nprobe_interval = \"300ms\"\ndown_after = \"1s\"\nregister_interval = \"10s\"\nmetrics = \"\"\ncontrol = %q\n%s",
			eids, roles.LispMapServer, control, extra)
		for j, r := range s.RLOCs {
			text += fmt.Sprintf("[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = %d\n", r, s.Ifaces[j], []int{50, weight2}[j])
		}
		text += fmt.Sprintf("[[xtr.map_server]]\naddress = %q\nkey = %q\n", roles.LispMapServer, longKey(s.Key))
		if err := os.WriteFile(site1, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	v4 := fmt.Sprintf("%q", roles.LispSites[0].EIDs[0])
	both := fmt.Sprintf("%q, %q", roles.LispSites[0].EIDs[0], roles.LispSites[0].EIDs[1])
	xtr1(v4, 50, "")
	s2 := roles.LispSites[1]
	site2 := filepath.Join(dir, "site2.toml")
	control2 := filepath.Join(dir, "xtr2.sock")
	text2 := fmt.Sprintf("[xtr]\neid_prefixes = [%q, %q]\nroutes = [\"192.168.0.0/16\", \"fd00::/16\"]\nmap_resolvers = [%q]\nprobe_interval = \"300ms\"\ndown_after = \"1s\"\nregister_interval = \"10s\"\nmetrics = \"\"\ncontrol = %q\n",
		s2.EIDs[0], s2.EIDs[1], roles.LispMapServer, control2)
	for j, r := range s2.RLOCs {
		text2 += fmt.Sprintf("[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = 50\n", r, s2.Ifaces[j])
	}
	text2 += fmt.Sprintf("[[xtr.map_server]]\naddress = %q\nkey = %q\n", roles.LispMapServer, longKey(s2.Key))
	os.WriteFile(site2, []byte(text2), 0o600)
	for _, s := range roles.LispSites {
		for _, k := range []string{"ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			if err := l.Host(s.Router).NS.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	start("xtr1", "xtr", "--config", site1)
	start("xtr2", "xtr", "--config", site2)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	statusOf := func(control string) (xtr.Status, error) {
		raw, err := controlStatus(control)
		if err != nil {
			return xtr.Status{}, err
		}
		var st xtrStatus
		err = json.Unmarshal(raw, &st)
		return st.XTR, err
	}
	status := func() xtr.Status {
		t.Helper()
		raw, err := controlStatus(control)
		if err != nil {
			t.Fatalf("%v\n%s", err, logOf("xtr1"))
		}
		var st xtrStatus
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		return st.XTR
	}
	registered := func(st xtr.Status) bool { return len(st.Registrations) == 1 && st.Registrations[0].Registered }
	// Both registered before h1 asks for h2 (a site configured but not registered is answered
	// negatively for a minute).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st1, err1 := statusOf(control)
		st2, err2 := statusOf(control2)
		if err1 == nil && err2 == nil && registered(st1) && registered(st2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("xTRs not registered after 10 s:\n%s\n%s", logOf("xtr1"), logOf("xtr2"))
		}
	}
	// Warm up until h1 reaches h2 (xtr2 registered, site 2's mapping in xtr1's map-cache, site
	// 1's in xtr2's).
	for deadline := time.Now().Add(10 * time.Second); ; {
		gap, err := kit.Ping(ctx, l.Host("h1"), l.Host("h2"), s2.HostIP[0], time.Second)
		if err == nil && gap < 300*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h1 -> h2 before the reload: longest gap %v, %v\n%s\n%s", gap, err, logOf("xtr1"), logOf("xtr2"))
		}
	}
	before := status()
	// The reload, during a 10 ms echo from h1 to h2.
	echoes := make(chan echoRun, 1)
	go func() {
		echoes <- echo(ctx, l.Host("h1"), l.Host("h2"), netip.AddrPortFrom(s2.HostIP[0], 7), 3*time.Second)
	}()
	time.Sleep(time.Second)
	xtr1(both, 30, "")
	reloadAt := time.Now()
	code, out, errOut := run("xtr", "reload", "--control", control)
	if code != exitOK || !strings.Contains(out, "eid prefix added fd00:1::/64") || !strings.Contains(out, "locator changed 10.0.2.1 priority 1 weight 30") {
		t.Fatalf("braid xtr reload: %d %q %q\n%s", code, out, errOut, logOf("xtr1"))
	}
	e := <-echoes
	t.Logf("h1 -> h2 every 10 ms across the reload: %s (reload at %v)", e, reloadAt.Sub(e.start).Round(time.Millisecond))
	if e.err != nil || e.lost > e.sent/50 {
		t.Errorf("h1 -> h2 across the reload: %s, %v\n%s", e, e.err, logOf("xtr1"))
	}
	after := status()
	if after.Counters[xtr.CountRequests] != before.Counters[xtr.CountRequests] {
		t.Errorf("xtr1 sent Map-Requests across the reload (%d, before %d): its map-cache entry for site 2 did not stay",
			after.Counters[xtr.CountRequests], before.Counters[xtr.CountRequests])
	}
	// h2 reaches h1's IPv6 EID: xtr1 registered fd00:1::/64 right after the reload.
	if e := echo(ctx, l.Host("h2"), l.Host("h1"), netip.AddrPortFrom(roles.LispSites[0].HostIP[1], 7), time.Second); e.err != nil || e.lost > e.sent/10 {
		t.Errorf("h2 -> h1 over IPv6 after the reload: %s, %v\n%s", e, e.err, logOf("xtr1"))
	}
	if !strings.Contains(logOf("xtr1"), `msg="reload: eid prefix added" detail=fd00:1::/64`) {
		t.Errorf("xtr1's log lacks the change:\n%s", logOf("xtr1"))
	}
	// A file with a mistake (line 2: a /33 in IPv4): refused, nothing changes.
	xtr1(`"192.168.1.0/33"`, 30, "")
	code, _, errOut = run("xtr", "reload", "--control", control)
	if code != exitError || !strings.Contains(errOut, "site1.toml:2:") || !strings.Contains(errOut, "nothing changed") {
		t.Errorf("broken file: %d %q", code, errOut)
	}
	// A change only a restart applies: refused too.
	xtr1(both, 30, "placement = true\n")
	code, _, errOut = run("xtr", "reload", "--control", control)
	if code != exitError || !strings.Contains(errOut, "placement changed") {
		t.Errorf("placement: %d %q", code, errOut)
	}
	// SIGHUP: the IPv6 prefix removed again.
	xtr1(v4, 30, "")
	procs["xtr1"].Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(3 * time.Second); !strings.Contains(logOf("xtr1"), `msg="reload: eid prefix removed" detail=fd00:1::/64`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not remove fd00:1::/64:\n%s", logOf("xtr1"))
		}
	}
	if e := echo(ctx, l.Host("h1"), l.Host("h2"), netip.AddrPortFrom(s2.HostIP[0], 7), 500*time.Millisecond); e.err != nil || e.lost > e.sent/50 {
		t.Errorf("h1 -> h2 after SIGHUP: %s, %v", e, e.err)
	}
}

// echoRun is what echo measured.
type echoRun struct {
	start      time.Time
	sent, lost int
	gap        time.Duration // longest time without a reply
	gapAt      time.Duration // when it began, from start
	err        error
}

func (e echoRun) String() string {
	return fmt.Sprintf("%d echoes, %d lost, longest gap %v from %v", e.sent, e.lost, e.gap.Round(time.Millisecond), e.gapAt.Round(time.Millisecond))
}

// echo sends a numbered UDP datagram every 10 ms for d from host from to an echo server it
// runs in host to at addr, and counts the replies that never came (waiting a second for late
// ones): a stalled process delays replies, a lost mapping loses them.
func echo(ctx context.Context, from, to *lab.Host, addr netip.AddrPort, d time.Duration) echoRun {
	r := echoRun{start: time.Now()}
	stop, err := kit.EchoServer(to, addr.String())
	if err != nil {
		r.err = err
		return r
	}
	defer stop()
	c, err := from.Dial(ctx, "udp", addr.String())
	if err != nil {
		r.err = err
		return r
	}
	defer c.Close()
	got := map[uint32]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		last := r.start
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			now := time.Now()
			if n == 4 {
				got[binary.BigEndian.Uint32(buf)] = true
			}
			if g := now.Sub(last); g > r.gap {
				r.gap, r.gapAt = g, last.Sub(r.start)
			}
			last = now
		}
	}()
	var b [4]byte
	for ; time.Since(r.start) < d; time.Sleep(10 * time.Millisecond) {
		binary.BigEndian.PutUint32(b[:], uint32(r.sent))
		c.Write(b[:])
		r.sent++
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	<-done
	r.lost = r.sent - len(got)
	return r
}
