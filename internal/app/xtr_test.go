package app

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"braid/internal/config"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/wire/lisp"
)

// TestXtrCommand runs the commands as an operator would, in a lab of two multihomed LISP
// sites: braid mapserver in the core, braid xtr at each site from site files; the hosts reach
// each other, braid lig from a site shows the other site's mapping as its ETR answers it, and
// braid xtr show / braid mapserver show report the state.
func TestXtrCommand(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, roles.LispTopology(time.Millisecond, 0))
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	ms := filepath.Join(dir, "ms.toml")
	var msText strings.Builder
	fmt.Fprintf(&msText, "[mapserver]\nlisten = %q\nmetrics = %q\n", roles.LispMapServer, config.DefaultMapserverMetrics)
	for _, s := range roles.LispSites {
		fmt.Fprintf(&msText, "[[mapserver.site]]\nname = %q\nkey = %q\neid_prefixes = [%q, %q]\n", s.Name, longKey(s.Key), s.EIDs[0], s.EIDs[1])
	}
	os.WriteFile(ms, []byte(msText.String()), 0o600)
	logs := map[string]*strings.Builder{}
	start := func(host string, args ...string) {
		cmd := exec.Command(self, args...)
		logs[host] = &strings.Builder{}
		cmd.Stderr = &lockedWriter{w: logs[host]}
		if err := l.Host(host).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	// tshark in the core sees every control message and data packet on the RLOC links. Without
	// it (or without the privilege to capture) the test fails under BRAID_LAB_REQUIRED=1.
	tshark, haveTshark := labtest.Tool(t, "tshark")
	pcap := filepath.Join(dir, "core.pcap")
	var capture *exec.Cmd
	if haveTshark {
		capture = exec.Command(tshark, "-i", "any", "-w", pcap, "-f", "udp port 4341 or udp port 4342")
		capErr := &lockedWriter{w: &strings.Builder{}}
		capture.Stderr = capErr
		if err := l.Host("core").Start(capture); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if capture.ProcessState == nil {
				capture.Process.Kill()
				capture.Wait()
			}
		})
		waitCapturing(t, l.Host("ms"), pcap, capErr)
	}
	start("ms", "mapserver", "--config", ms)
	for i, s := range roles.LispSites {
		file := filepath.Join(dir, s.Name+".toml")
		text := fmt.Sprintf(`[xtr]
eid_prefixes = [%q, %q]
routes = ["192.168.0.0/16", "fd00::/16"]
map_resolvers = [%q]
probe_interval = "300ms"
down_after = "1s"
register_interval = "10s"
placement = true
`, s.EIDs[0], s.EIDs[1], roles.LispMapServer)
		for j, r := range s.RLOCs {
			text += fmt.Sprintf("[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = 50\n", r, s.Ifaces[j])
		}
		text += fmt.Sprintf("[[xtr.map_server]]\naddress = %q\nkey = %q\nalgorithm = \"hmac-sha%d\"\n", roles.LispMapServer, longKey(s.Key), []int{1, 256}[i])
		os.WriteFile(file, []byte(text), 0o600)
		for _, k := range []string{"ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			if err := l.Host(s.Router).NS.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
		start(s.Router, "xtr", "--config", file)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	show := func(host string, args ...string) string {
		out, _ := l.Host(host).Run(ctx, self, args...)
		return string(out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(show("xtr1", "xtr", "show"), "registered, last Map-Notify") || !strings.Contains(show("xtr2", "xtr", "show"), "registered, last Map-Notify") {
		if time.Now().After(deadline) {
			t.Fatalf("xTRs not registered after 10 s\nxtr1: %s\nlogs: %v", show("xtr1", "xtr", "show"), logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s1, s2 := roles.LispSites[0], roles.LispSites[1]
	if gap, err := kit.Ping(ctx, l.Host("h1"), l.Host("h2"), s2.HostIP[0], 1500*time.Millisecond); err != nil || gap > time.Second {
		t.Errorf("h1 -> h2 through the xTRs: longest gap %v, %v\nxtr1: %s\nlogs: %v", gap, err, show("xtr1", "xtr", "show"), logs)
	}
	if gap, err := kit.Ping(ctx, l.Host("h2"), l.Host("h1"), s1.HostIP[1], 1500*time.Millisecond); err != nil || gap > time.Second {
		t.Errorf("h2 -> h1 over IPv6: longest gap %v, %v", gap, err)
	}
	// The map server forwards lig's request to site 2's ETR, which answers with A=1.
	out := show("xtr1", "lig", s2.HostIP[0].String(), "--resolver", roles.LispMapServer.Addr().String())
	for _, want := range []string{"192.168.2.0/24  TTL 10 min, authoritative", "10.0.3.1", "10.0.4.1", "round trip"} {
		if !strings.Contains(out, want) {
			t.Errorf("lig output lacks %q:\n%s", want, out)
		}
	}
	x := show("xtr1", "xtr", "show")
	if !strings.Contains(x, "192.168.2.0/24  10.0.3.1 1/50 up, 10.0.4.1 1/50 up") || !strings.Contains(x, "10.0.1.1    10.0.3.1     up") {
		t.Errorf("xtr show:\n%s", x)
	}
	m := show("ms", "mapserver", "show")
	if !strings.Contains(m, "site1  192.168.1.0/24") || !strings.Contains(m, "site2  fd00:2::/64") || !strings.Contains(m, "map_requests_forwarded") {
		t.Errorf("mapserver show:\n%s", m)
	}
	// braid status without flags finds each role at its default address and shows its state.
	if st := show("ms", "status"); !strings.Contains(st, "map server: 2 sites registered, 4 EID prefixes; registrations accepted") ||
		!strings.Contains(st, "site1  192.168.1.0/24") {
		t.Errorf("braid status on the map server's host:\n%s", st)
	}
	if st := show("xtr1", "status"); !strings.Contains(st, "xtr: ") || !strings.Contains(st, "RLOC pairs") ||
		!strings.Contains(st, "10.0.1.1    10.0.3.1     up") {
		t.Errorf("braid status on xtr1's host:\n%s", st)
	}
	if capture == nil {
		labtest.Skip(t, "tshark is not installed: the capture was not checked (scripts/deps.sh installs it)")
	}
	capture.Process.Signal(os.Interrupt)
	capture.Wait()
	checkCapture(t, tshark, pcap)
}

// checkCapture has tshark dissect what braid sent on the wire: Map-Register, Map-Notify,
// Map-Request (ECM and RLOC-probes), Map-Reply and data packets all present, none malformed,
// no expert warning.
func checkCapture(t *testing.T, tshark, pcap string) {
	out, err := exec.Command(tshark, "-r", pcap, "-T", "fields", "-E", "separator=|", "-e", "frame.protocols", "-e", "lisp.type",
		"-e", "_ws.malformed", "-e", "_ws.expert.severity", "-e", "_ws.expert.message").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	seen := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(l, "|")
		if len(f) != 5 {
			t.Fatalf("tshark line %q", l)
		}
		if f[2] != "" || expertWarns(f[3]) {
			t.Errorf("tshark flags a frame: %s", l)
		}
		if strings.Contains(f[0], "lisp-data") {
			seen["data"]++
		} else if f[1] != "" {
			seen["type "+f[1]]++
		} else {
			t.Errorf("frame not dissected as LISP: %s", l)
		}
	}
	t.Logf("captured in the core: %v", seen)
	for _, k := range []string{"type 3", "type 4", "type 8,1", "type 1", "type 2", "data"} {
		if seen[k] == 0 {
			t.Errorf("no %s in the capture", k)
		}
	}
	sum, err := exec.Command(tshark, "-r", pcap, "-q", "-z", "expert,warn").Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(sum); strings.Contains(s, "Warns") || strings.Contains(s, "Errors") {
		t.Errorf("tshark expert summary:\n%s", s)
	}
}

// expertWarns reports whether tshark's expert severities (comma-separated) hold a warning or an
// error; comments, chats and notes (an echo reply, a sequence analysis) are information.
func expertWarns(severities string) bool {
	const piWarn = 0x00600000 // epan/proto.h
	for _, v := range strings.Split(severities, ",") {
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 0, 32); err == nil && n >= piWarn {
			return true
		} else if err != nil && strings.TrimSpace(v) != "" {
			return true
		}
	}
	return false
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// waitCapturing sends RLOC-probes across the core until the capture file grows: tshark has
// then started capturing (its "Capturing on" message comes before it does).
func waitCapturing(t *testing.T, from *lab.Host, pcap string, stderr fmt.Stringer) {
	pc, err := from.ListenPacket("udp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	req := lisp.MapRequest{Flags: lisp.ReqProbe, Nonce: 1, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(netip.MustParseAddr("10.0.9.1"))},
		Records: []lisp.RequestRecord{{MaskLen: 24, EID: lisp.AddrFrom(netip.MustParseAddr("192.168.1.0"))}}}
	b := make([]byte, req.Len())
	req.Encode(b)
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(roles.LispSites[0].RLOCs[0], lisp.ControlPort))
	var size int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		fi, err := os.Stat(pcap)
		if err != nil {
			continue
		}
		if size == 0 {
			size = fi.Size()
		} else if fi.Size() > size {
			return
		}
		pc.WriteTo(b, to)
	}
	t.Fatalf("tshark did not start capturing within 10 s (no privilege to capture?): %s", stderr)
}

// longKey makes a scenario key as long as the configuration wants (config.MinLispKey).
func longKey(k string) string { return k + "-0123456789" }
