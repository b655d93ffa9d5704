package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/scenario"
	"braid/internal/lisp/xtr"
)

// TestXTRReload runs 'braid mapserver' and two 'braid xtr' on the LISP lab, xtr1 with only its
// IPv4 EID prefix. While h1 pings h2 every 10 ms through the xTRs, xtr1 reloads a file that adds
// its IPv6 EID prefix and changes an RLOC's weight: the ping never stops for 300 ms, xtr1's
// map-cache entry for site 2 stays (no new Map-Request for it), and site 1's IPv6 EIDs become
// reachable from h2 (xtr1 registered its new mapping at once). A file with a mistake is then
// refused by 'braid xtr reload' with its file:line (exit 1) and changes nothing; SIGHUP
// applies the removal of the IPv6 prefix.
func TestXTRReload(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, scenario.LispTopology(time.Millisecond, 0))
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	ms := filepath.Join(dir, "ms.toml")
	var msText strings.Builder
	fmt.Fprintf(&msText, "[mapserver]\nlisten = %q\nmetrics = \"\"\n", scenario.LispMapServer)
	for _, s := range scenario.LispSites {
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
		s := scenario.LispSites[0]
		text := fmt.Sprintf("[xtr]\neid_prefixes = [%s]\nroutes = [\"192.168.0.0/16\", \"fd00::/16\"]\nmap_resolvers = [%q]\nprobe_interval = \"300ms\"\ndown_after = \"1s\"\nregister_interval = \"10s\"\nmetrics = \"\"\ncontrol = %q\n%s",
			eids, scenario.LispMapServer, control, extra)
		for j, r := range s.RLOCs {
			text += fmt.Sprintf("[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = %d\n", r, s.Ifaces[j], []int{50, weight2}[j])
		}
		text += fmt.Sprintf("[[xtr.map_server]]\naddress = %q\nkey = %q\n", scenario.LispMapServer, longKey(s.Key))
		if err := os.WriteFile(site1, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	v4 := fmt.Sprintf("%q", scenario.LispSites[0].EIDs[0])
	both := fmt.Sprintf("%q, %q", scenario.LispSites[0].EIDs[0], scenario.LispSites[0].EIDs[1])
	xtr1(v4, 50, "")
	s2 := scenario.LispSites[1]
	site2 := filepath.Join(dir, "site2.toml")
	text2 := fmt.Sprintf("[xtr]\neid_prefixes = [%q, %q]\nroutes = [\"192.168.0.0/16\", \"fd00::/16\"]\nmap_resolvers = [%q]\nprobe_interval = \"300ms\"\ndown_after = \"1s\"\nregister_interval = \"10s\"\nmetrics = \"\"\n",
		s2.EIDs[0], s2.EIDs[1], scenario.LispMapServer)
	for j, r := range s2.RLOCs {
		text2 += fmt.Sprintf("[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = 50\n", r, s2.Ifaces[j])
	}
	text2 += fmt.Sprintf("[[xtr.map_server]]\naddress = %q\nkey = %q\n", scenario.LispMapServer, longKey(s2.Key))
	os.WriteFile(site2, []byte(text2), 0o600)
	for _, s := range scenario.LispSites {
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
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := controlStatus(control); err == nil && registered(status()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("xtr1 not registered after 10 s:\n%s", logOf("xtr1"))
		}
	}
	// Warm up until h1 reaches h2 (xtr2 registered, site 2's mapping in xtr1's map-cache, site
	// 1's in xtr2's).
	for deadline := time.Now().Add(10 * time.Second); ; {
		gap, err := scenario.Ping(ctx, l.Host("h1"), l.Host("h2"), s2.HostIP[0], time.Second)
		if err == nil && gap < 300*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h1 -> h2 before the reload: longest gap %v, %v\n%s\n%s", gap, err, logOf("xtr1"), logOf("xtr2"))
		}
	}
	before := status()
	// The reload, during a 10 ms ping from h1 to h2.
	type pingOut struct {
		gap time.Duration
		err error
	}
	pinged := make(chan pingOut, 1)
	go func() {
		gap, err := scenario.Ping(ctx, l.Host("h1"), l.Host("h2"), s2.HostIP[0], 2500*time.Millisecond)
		pinged <- pingOut{gap, err}
	}()
	time.Sleep(time.Second)
	xtr1(both, 30, "")
	code, out, errOut := run("xtr", "reload", "--control", control)
	if code != exitOK || !strings.Contains(out, "eid prefix added fd00:1::/64") || !strings.Contains(out, "locator changed 10.0.2.1 priority 1 weight 30") {
		t.Fatalf("braid xtr reload: %d %q %q\n%s", code, out, errOut, logOf("xtr1"))
	}
	p := <-pinged
	t.Logf("h1 -> h2 every 10 ms across the reload: longest gap %v", p.gap)
	if p.err != nil || p.gap > 300*time.Millisecond {
		t.Errorf("h1 -> h2 across the reload: longest gap %v, %v\n%s", p.gap, p.err, logOf("xtr1"))
	}
	after := status()
	if after.Counters[xtr.CountRequests] != before.Counters[xtr.CountRequests] {
		t.Errorf("xtr1 sent Map-Requests across the reload (%d, before %d): its map-cache entry for site 2 did not stay",
			after.Counters[xtr.CountRequests], before.Counters[xtr.CountRequests])
	}
	// h2 reaches h1's IPv6 EID: xtr1 registered fd00:1::/64 right after the reload.
	if gap, err := scenario.Ping(ctx, l.Host("h2"), l.Host("h1"), scenario.LispSites[0].HostIP[1], 1500*time.Millisecond); err != nil || gap > time.Second {
		t.Errorf("h2 -> h1 over IPv6 after the reload: longest gap %v, %v\n%s", gap, err, logOf("xtr1"))
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
	if gap, err := scenario.Ping(ctx, l.Host("h1"), l.Host("h2"), s2.HostIP[0], 500*time.Millisecond); err != nil || gap > 300*time.Millisecond {
		t.Errorf("h1 -> h2 after SIGHUP: longest gap %v, %v", gap, err)
	}
}
