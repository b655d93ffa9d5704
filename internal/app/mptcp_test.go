package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/info"
	"braid/internal/traffic"
)

func TestMptcpHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{{"mptcp", "--help"}, {"pm", "--help"}, {"help", "pm"}, {"mptcp", "show", "--help"}} {
		code, out, _ := run(args...)
		if code != exitOK || !strings.Contains(out, "Example:") {
			t.Errorf("%v: code %d, output %q", args, code, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mptcp"}, "Usage: braid mptcp"},
		{[]string{"mptcp", "frob"}, `unknown command "frob"`},
		{[]string{"mptcp", "endpoints", "add"}, "add takes one address"},
		{[]string{"mptcp", "endpoints", "add", "10.0.0.1", "--flags", "subflow,bogus"}, `unknown flag "bogus"`},
		{[]string{"mptcp", "endpoints", "add", "10.0.0.300"}, `address "10.0.0.300"`},
		{[]string{"mptcp", "endpoints", "del", "nope"}, "neither an endpoint ID nor an address"},
		{[]string{"mptcp", "endpoints", "change", "1", "maybe"}, "backup or nobackup"},
		{[]string{"pm"}, "expected --config FILE"},
	} {
		code, _, errOut := run(c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

func TestPMCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("[pm]\npolicy = \"fullmesh\"\n[[pm.uplink]]\nname = \"lo\"\ninterface = \"lo\"\naddress = \"127.0.0.1\"\n"), 0o644)
	if code, out, errOut := run("pm", "check", "--config", good); code != exitOK || !strings.Contains(out, "valid (policy fullmesh, 1 uplinks)") {
		t.Errorf("good file: %d %q %q", code, out, errOut)
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[pm]\npolicy = \"fullmash\"\n[[pm.uplink]]\nname = \"x\"\ninterface = \"nosuchif0\"\naddress = \"127.0.0.1\"\n"), 0o644)
	code, _, errOut := run("pm", "check", "--config", bad)
	if code != exitError || !strings.Contains(errOut, `bad.toml:2: pm: policy "fullmash"`) || !strings.Contains(errOut, `bad.toml:5: uplink x: interface "nosuchif0" does not exist`) {
		t.Errorf("bad file: %d %q", code, errOut)
	}
	if code, _, errOut := run("pm", "--config", good, "--policy", "roundrobin"); code != exitUsage || !strings.Contains(errOut, `unknown policy "roundrobin"`) {
		t.Errorf("unknown policy flag: %d %q", code, errOut)
	}
}

// mptcpLab is two hosts joined by two 100 Mbit/s links, with a site file for host a's uplinks.
func mptcpLab(t *testing.T) (l *lab.Lab, site, self string) {
	t.Helper()
	shape := topo.Shape{Rate: 100e6, Delay: 2 * time.Millisecond}
	l = labtest.Up(t, kit.ParallelLinks("mpapp", shape, shape))
	site = filepath.Join(t.TempDir(), "site.toml")
	var b strings.Builder
	b.WriteString("[pm]\nmetrics = \"127.0.0.1:9475\"\npoll = \"50ms\"\n")
	for i, lk := range l.Links() {
		fmt.Fprintf(&b, "[[pm.uplink]]\nname = \"up%d\"\ninterface = %q\naddress = %q\n", i, lk.Spec.A.Ifname, lk.Spec.A.Addrs[0].Addr())
	}
	if err := os.WriteFile(site, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BRAID_TEST_MAIN", "1")
	return l, site, self
}

func runIn(t *testing.T, h *lab.Host, self string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := h.Run(ctx, self, args...)
	if err != nil {
		t.Fatalf("braid %v in %s: %v\n%s", args, h.Name, err, out)
	}
	return string(out)
}

// transfer sends n bytes over an MPTCP connection from a to b; once b has them all it calls
// open, if given, with the connection still open, then closes it.
func transfer(t *testing.T, a, b *lab.Host, n int64, open func()) {
	t.Helper()
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", "0.0.0.0:5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		k, _ := io.CopyN(io.Discard, c, n)
		got <- k
		io.Copy(io.Discard, c) // the connection stays open until the client closes it
	}()
	var c net.Conn
	if err := a.NS.Spawn(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.9.0.1:0"))}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp", "10.9.0.2:5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for sent := int64(0); sent < n; {
		k, err := c.Write(buf[:min(int64(len(buf)), n-sent)])
		if err != nil {
			t.Fatal(err)
		}
		sent += int64(k)
		if sent == int64(len(buf)) {
			time.Sleep(200 * time.Millisecond) // let the path manager add the subflows
		}
	}
	if k := <-got; k != n {
		t.Errorf("received %d bytes of %d", k, n)
	}
	time.Sleep(100 * time.Millisecond)
	if open != nil {
		open()
	}
	c.Close()
}

// braid mptcp on the lab: endpoints from the site file, limits, show and monitor of a
// connection the kernel's PM spreads over both uplinks.
func TestMptcpLab(t *testing.T) {
	l, site, self := mptcpLab(t)
	a, b := l.Host("a"), l.Host("b")
	out := runIn(t, a, self, "mptcp", "endpoints", "add", "--config", site)
	if strings.Count(out, "added") != 2 {
		t.Errorf("endpoints add: %q", out)
	}
	var eps []endpointJSON
	if err := json.Unmarshal([]byte(runIn(t, a, self, "mptcp", "endpoints", "--json")), &eps); err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[1].Address != "10.9.1.1" || eps[1].Dev != l.Links()[1].Spec.A.Ifname || len(eps[1].Flags) != 1 || eps[1].Flags[0] != "subflow" {
		t.Errorf("endpoints %+v", eps)
	}
	if out := runIn(t, a, self, "mptcp", "limits", "--subflows", "4", "--add-addr-accepted", "2"); out != "subflows 4 add_addr_accepted 2\n" {
		t.Errorf("limits: %q", out)
	}
	if out := runIn(t, a, self, "mptcp", "endpoints", "change", "2", "backup"); out != "" {
		t.Errorf("change: %q", out)
	}
	if out := runIn(t, a, self, "mptcp", "endpoints"); !strings.Contains(out, "subflow,backup") {
		t.Errorf("after change:\n%s", out)
	}
	runIn(t, a, self, "mptcp", "endpoints", "change", "2", "nobackup")

	// monitor runs in the background while a connection comes and goes.
	mon := exec.Command(self, "mptcp", "monitor", "--json")
	stdout, err := mon.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(mon); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	time.Sleep(300 * time.Millisecond) // monitor subscribed

	// show, while the connection is open: the subflows' bytes add up to what was sent.
	const n = 60 << 20
	transfer(t, a, b, n, func() {
		var conns []info.Conn
		out := runIn(t, a, self, "mptcp", "show", "--json")
		if err := json.Unmarshal([]byte(out), &conns); err != nil || len(conns) != 1 || len(conns[0].Subflows) != 2 {
			t.Fatalf("braid mptcp show --json: %v\n%s", err, out)
		}
		for _, s := range conns[0].Subflows {
			t.Logf("subflow %v -> %v: sent %d acked %d rtt %v cwnd %d rate %d B/s", s.Local, s.Remote, s.TCP.BytesSent, s.TCP.BytesAcked, s.TCP.RTT, s.TCP.SndCwnd, s.TCP.DeliveryRate)
			if s.TCP.BytesAcked < n/20 || s.TCP.RTT == 0 || s.TCP.SndCwnd == 0 {
				t.Errorf("subflow %v -> %v: %+v", s.Local, s.Remote, s.TCP)
			}
		}
		_, acked, _ := conns[0].SubflowBytes()
		if d := float64(acked) - n; d < -0.01*n || d > 0.01*n {
			t.Errorf("subflows acked %d bytes in all, the application sent %d", acked, n)
		}
		table := runIn(t, a, self, "mptcp", "show")
		for _, want := range []string{fmt.Sprintf("token %08x", conns[0].Info.Token), "10.9.1.1:", "ACKED", "RATE"} {
			if !strings.Contains(table, want) {
				t.Errorf("show table lacks %q:\n%s", want, table)
			}
		}
	})
	time.Sleep(300 * time.Millisecond)
	mon.Process.Signal(os.Interrupt)
	var kinds []string
	for ln := range lines {
		var ev struct {
			Type  string `json:"type"`
			Token uint32 `json:"token"`
		}
		if err := json.Unmarshal([]byte(ln), &ev); err != nil {
			t.Errorf("monitor line %q: %v", ln, err)
		}
		kinds = append(kinds, ev.Type)
	}
	mon.Wait()
	got := strings.Join(kinds, " ")
	for _, want := range []string{"created", "established", "sf_established", "closed"} {
		if !strings.Contains(got, want) {
			t.Errorf("monitor saw %q, missing %s", got, want)
		}
	}

	runIn(t, a, self, "mptcp", "endpoints", "del", "10.9.1.1")
	if out := runIn(t, a, self, "mptcp", "endpoints"); strings.Contains(out, "10.9.1.1") || !strings.Contains(out, "10.9.0.1") {
		t.Errorf("after del:\n%s", out)
	}
	runIn(t, a, self, "mptcp", "endpoints", "flush")
	if out := runIn(t, a, self, "mptcp", "endpoints", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("after flush: %q", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := a.Run(ctx, self, "mptcp", "endpoints", "del", "7"); err == nil || !strings.Contains(string(out), "delete endpoint id 7") {
		t.Errorf("deleting a missing endpoint: %v %s", err, out)
	} else {
		t.Logf("deleting a missing endpoint: %s", strings.TrimSpace(string(out)))
	}
}

// braid pm as a process: it manages the connection (two subflows), serves its metrics, gets
// 95 % of two equal links to one bulk transfer, and restores the namespace's PM type when it
// stops. In a namespace where MPTCP is disabled it
// says so.
func TestPMLab(t *testing.T) {
	l, site, self := mptcpLab(t)
	a, b := l.Host("a"), l.Host("b")
	lo, err := a.NS.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.NS.Netlink().LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "pm", "--config", site, "--policy", "fullmesh", "--log-format", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := a.Start(cmd); err != nil {
		t.Fatal(err)
	}
	// Wait for the metrics endpoint, inside a's namespace: the HTTP client dials from the namespace (its own goroutines would not be in it).
	client := http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: a.Dial}}
	get := func(path string) (string, error) {
		resp, err := client.Get("http://127.0.0.1:9475" + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		bb, err := io.ReadAll(resp.Body)
		return string(bb), err
	}
	for range 50 {
		if _, err = get("/metrics"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("pm metrics: %v\n%s", err, stderr.String())
	}
	transfer(t, a, b, 20<<20, nil)
	m, err := get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, "braid_pm_subflows_established_total 1") || !strings.Contains(m, "braid_pm_subflow_creates_total 1") {
		t.Errorf("metrics:\n%s\nlog:\n%s", m, stderr.String())
	}
	// Throughput: a bulk transfer with braid pm --policy fullmesh against twice what plain TCP
	// gets on one of the two equal links, in the same run. Without the second subflow the ratio
	// is 0.5; with it, 0.94-1.0 on an idle machine. The emulator shares the machine's two cores
	// with the rest of `make test`, and in one CI run two links read 0.940: the bound, 0.85,
	// tells a second subflow that carries its link from one that does not, without counting
	// the emulator's CPU against the path manager.
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", "0.0.0.0:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := traffic.NewServer(ln, nil)
	go srv.Serve(context.Background())
	defer srv.Close()
	dial := func(multipath bool) traffic.DialFunc {
		return func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := a.NS.Spawn(func() (err error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.9.0.1:0"))}
				d.SetMultipathTCP(multipath)
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		}
	}
	bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer bcancel()
	o := traffic.BulkOptions{Duration: 4 * time.Second, Interval: 500 * time.Millisecond}
	single, err := traffic.Bulk(bctx, dial(false), "10.9.0.2:5201", o)
	if err != nil {
		t.Fatal(err)
	}
	multi, err := traffic.Bulk(bctx, dial(true), "10.9.0.2:5201", o)
	if err != nil {
		t.Fatal(err)
	}
	ratio := multi.Steady / (2 * single.Steady)
	t.Logf("one link, TCP: %s\ntwo links, MPTCP with braid pm --policy fullmesh: %s\nratio to twice one link: %.3f", single, multi, ratio)
	if ratio < 0.85 {
		t.Errorf("fullmesh reached %.1f %% of two links (steady %.1f Mbit/s vs 2 x %.1f), want >= 85 %%", 100*ratio, multi.Steady/1e6, single.Steady/1e6)
	}

	if pt := runIn(t, a, "cat", "/proc/sys/net/mptcp/pm_type"); strings.TrimSpace(pt) != "1" {
		t.Errorf("pm_type while braid pm runs: %q", pt)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Errorf("braid pm exit: %v\n%s", err, stderr.String())
	}
	if pt := runIn(t, a, "cat", "/proc/sys/net/mptcp/pm_type"); strings.TrimSpace(pt) != "0" {
		t.Errorf("pm_type after braid pm: %q", pt)
	}

	// MPTCP disabled in the namespace.
	if err := b.NS.Sysctl("mptcp/enabled", "0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := b.Run(ctx, self, "pm", "--config", site)
	if err == nil || !strings.Contains(string(out), "MPTCP is disabled in this network namespace") {
		t.Errorf("braid pm with MPTCP disabled: %v\n%s", err, out)
	}
}

// Without CAP_NET_ADMIN, the commands that change the kernel's MPTCP say what is missing.
func TestMptcpWithoutPrivilege(t *testing.T) {
	l, site, self := mptcpLab(t)
	a := l.Host("a")
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir), filepath.Dir(site), filepath.Dir(filepath.Dir(site))} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(site, 0o644)
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "braid")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mptcp", "limits", "--subflows", "3"}, "needs CAP_NET_ADMIN"},
		{[]string{"mptcp", "endpoints", "add", "10.9.0.1"}, "needs CAP_NET_ADMIN"},
		{[]string{"pm", "--config", site, "--log-format", "json"}, "needs CAP_NET_ADMIN"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bin, c.args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := a.Start(cmd); err != nil {
			cancel()
			t.Fatal(err)
		}
		err := cmd.Wait()
		cancel()
		if err == nil || !strings.Contains(out.String(), c.want) {
			t.Errorf("braid %v as nobody: %v\n%s", c.args, err, out.String())
		} else {
			t.Logf("braid %v: %s", c.args, strings.TrimSpace(out.String()))
		}
	}
}
