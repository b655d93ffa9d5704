package packaging

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

// exampleTopology gives two lab hosts the uplinks examples/site-a.toml and site-b.toml name, with
// their addresses, joined through an "isp" router: site A's fibre (wan0, 192.0.2.1) and LTE
// (wwan0, 203.0.113.10), site B's fibre (eth0, 198.51.100.1) and DSL (ppp0, 198.51.100.130).
// Each site reaches the other's networks over each uplink (a route per interface, as a host with
// two ISPs has; the tunnel binds each uplink's socket to its interface). Kernel links: what is
// tested is the installed service, not the paths.
func exampleTopology() *topo.Topology {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	route := func(dst, via, dev string, metric int) topo.Route {
		return topo.Route{Dst: p(dst), Via: a(via), Dev: dev, Metric: metric}
	}
	link := func(host, ifname, addr, ispAddr string) topo.Link {
		return topo.Link{Kernel: true,
			A: topo.Endpoint{Host: host, Ifname: ifname, Addrs: []netip.Prefix{p(addr)}},
			B: topo.Endpoint{Host: "isp", Addrs: []netip.Prefix{p(ispAddr)}}}
	}
	return &topo.Topology{Name: "debinstall",
		Hosts: []topo.Host{
			{Name: "a", Routes: []topo.Route{
				route("198.51.100.0/24", "192.0.2.254", "wan0", 1), route("198.51.100.0/24", "203.0.113.254", "wwan0", 2)}},
			{Name: "isp", Forward: true},
			{Name: "b", Routes: []topo.Route{
				route("192.0.2.0/24", "198.51.100.126", "eth0", 1), route("192.0.2.0/24", "198.51.100.254", "ppp0", 2),
				route("203.0.113.0/24", "198.51.100.126", "eth0", 1), route("203.0.113.0/24", "198.51.100.254", "ppp0", 2)}},
		},
		Links: []topo.Link{
			link("a", "wan0", "192.0.2.1/24", "192.0.2.254/24"),
			link("a", "wwan0", "203.0.113.10/24", "203.0.113.254/24"),
			link("b", "eth0", "198.51.100.1/25", "198.51.100.126/25"),
			link("b", "ppp0", "198.51.100.130/25", "198.51.100.254/25"),
		},
	}
}

// TestDebInstallTunnelService is an operator's first day, on a machine without a running
// systemd: the package 'make deb' builds is installed with dpkg (into a root of its own, with
// its maintainer scripts run), the example site files become /etc/braid/site-a.toml and
// site-b.toml with keys from the installed 'braid keygen', 'systemctl --root enable' enables both
// instances, and each site's braid-tunnel@ unit is started as systemd would start it (see
// unitExec) in a lab host whose uplinks are the example's. The two sites then carry TCP over IPv4
// and IPv6 through the tunnel, intact; the daemon runs with exactly the unit's capabilities,
// no_new_privs and the installed tree as its root, and opens sockets of the unit's families
// only; its metrics answer; the unit's ExecReload applies an edited site file while a transfer
// crosses, intact; SIGTERM (systemctl stop) ends it with status 0 and its TUN device gone. Then
// 'dpkg -r' removes every file of the package but the operator's site files and keys, and
// 'dpkg --purge' the enablement links too.
func TestDebInstallTunnelService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs the package: not with -short")
	}
	labtest.Require(t)
	deb := debPackage(t)
	dpkg, ok := labtest.Tool(t, "dpkg")
	if !ok {
		labtest.Skip(t, "dpkg is not installed")
	}
	systemctl, ok := labtest.Tool(t, "systemctl")
	if !ok {
		labtest.Skip(t, "systemctl is not installed (Debian's systemd package; scripts/deps.sh installs it)")
	}
	root := t.TempDir()
	at := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(at("var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) []byte {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	// The maintainer scripts run outside the root (there is no shell in it), told where it is by
	// DPKG_ROOT.
	dpkgIn := func(args ...string) []byte {
		t.Helper()
		return run(dpkg, append([]string{"--root=" + root, "--force-script-chrootless", "--log=" + at("dpkg.log")}, args...)...)
	}
	status := func() string {
		out, _ := exec.Command(dpkg+"-query", "--admindir="+at("var/lib/dpkg"), "-W", "-f=${db:Status-Abbrev}", "braid").Output()
		return strings.TrimSpace(string(out))
	}
	dpkgIn("-i", deb)
	if s := status(); s != "ii" {
		t.Fatalf("after dpkg -i the package's status is %q, want ii (installed)", s)
	}

	// The operator's part: keys, site files from the installed examples, instances enabled.
	bin := at("usr/bin/braid")
	sites := []string{"site-a", "site-b"}
	pub := map[string]string{}
	for _, s := range sites {
		run(bin, "keygen", "--out", at("etc/braid/"+s+".key"))
		cmd := exec.Command(bin, "keygen", "--public")
		key, err := os.Open(at("etc/braid/" + s + ".key"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = key
		out, err := cmd.Output()
		key.Close()
		if err != nil {
			t.Fatalf("braid keygen --public: %v", err)
		}
		pub[s] = strings.TrimSpace(string(out))
	}
	keyLine := regexp.MustCompile(`(?m)^public_key = "[^"]*"`)
	for i, s := range sites {
		b, err := os.ReadFile(at("usr/share/doc/braid/examples/" + s + ".toml"))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(keyLine.FindAllIndex(b, -1)); n != 1 {
			t.Fatalf("examples/%s.toml has %d public_key lines, want 1 (its peer's)", s, n)
		}
		b = keyLine.ReplaceAll(b, []byte(`public_key = "`+pub[sites[1-i]]+`"`))
		if err := os.WriteFile(at("etc/braid/"+s+".toml"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run(systemctl, "--root="+root, "enable", "braid-tunnel@site-a.service", "braid-tunnel@site-b.service")
	wants := at("etc/systemd/system/multi-user.target.wants")
	for _, s := range sites {
		if _, err := os.Readlink(filepath.Join(wants, "braid-tunnel@"+s+".service")); err != nil {
			t.Fatalf("systemctl enable made no link for braid-tunnel@%s: %v", s, err)
		}
	}

	unitFile := "/usr/lib/systemd/system/braid-tunnel@.service"
	ub, err := os.ReadFile(at(unitFile))
	if err != nil {
		t.Fatal(err)
	}
	unit, err := parseUnit(ub, "site-a")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.Up(t, exampleTopology())
	type daemon struct {
		cmd  *exec.Cmd
		log  *syncFile
		done chan error
	}
	start := func(host, site string) *daemon {
		spec, _ := json.Marshal(unitExecSpec{Root: root, Unit: unitFile, Instance: site})
		d := &daemon{cmd: exec.Command(self), log: newSyncFile(t, filepath.Join(t.TempDir(), site+".log")), done: make(chan error, 1)}
		d.cmd.Env = []string{unitExecEnv + "=" + string(spec)}
		d.cmd.Stdout, d.cmd.Stderr = d.log.File, d.log.File
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		if err := l.Host(host).Start(d.cmd); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		return d
	}
	a := start("a", "site-a")
	start("b", "site-b")
	ha, hb := l.Host("a"), l.Host("b")
	stopServer, err := labtest.Serve(hb, ":5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer()
	ctx := t.Context()
	for _, addr := range []string{"10.255.0.2:5201", "[fd00:ff::2]:5201"} {
		if err := kit.WaitReachable(ctx, ha, addr); err != nil {
			t.Fatalf("site B (%s) through the tunnel: %v\nsite-a's log:\n%s", addr, err, a.log)
		}
		r, err := traffic.File(ctx, ha.Dial, addr, traffic.FileOptions{Size: 4 << 20, Seed: 1})
		if err != nil || !r.Intact {
			t.Fatalf("4 MiB from site A to %s through the tunnel: %v %v", addr, r, err)
		}
		t.Logf("4 MiB through the installed tunnel to %s: %v", addr, r)
	}

	pid := a.cmd.Process.Pid
	checkSandbox(t, pid, root, unit)

	// The metrics the example site file asks for, inside site A.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return ha.Dial(ctx, network, addr) }}}
	resp, err := hc.Get("http://127.0.0.1:9473/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("braid_tunnel_")) {
		t.Errorf("GET /metrics in site A: %s, %d bytes, no braid_tunnel_ series", resp.Status, len(body))
	}

	// systemctl reload: an edited site file (the LTE uplink's capacity), applied by ExecReload
	// while a file crosses.
	site := at("etc/braid/site-a.toml")
	b, _ := os.ReadFile(site)
	edited := bytes.Replace(b, []byte(`capacity = "20mbit"`), []byte(`capacity = "30mbit"`), 1)
	if bytes.Equal(edited, b) {
		t.Fatal(`examples/site-a.toml no longer has capacity = "20mbit" (the line this test edits)`)
	}
	if err := os.WriteFile(site, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	type fileRun struct {
		r   traffic.FileResult
		err error
	}
	crossing := make(chan fileRun, 1)
	go func() {
		r, err := traffic.File(ctx, ha.Dial, "10.255.0.2:5201", traffic.FileOptions{Size: 32 << 20, Seed: 2})
		crossing <- fileRun{r, err}
	}()
	time.Sleep(300 * time.Millisecond)
	reload := slices.Clone(unit.ExecReload)
	for i := range reload {
		reload[i] = strings.ReplaceAll(reload[i], "$MAINPID", strconv.Itoa(pid))
	}
	run(reload[0], reload[1:]...)
	f := <-crossing
	if f.err != nil || !f.r.Intact {
		t.Errorf("32 MiB across the reload: %v %v", f.r, f.err)
	}
	reloaded := regexp.MustCompile(`msg="tunnel reloaded" change="[^"]*uplinks changed lte`)
	deadline := time.Now().Add(5 * time.Second)
	for !reloaded.MatchString(a.log.String()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("32 MiB across %s: %v; site A's log after it:\n%s", strings.Join(unit.ExecReload, " "), f.r, a.log)
	if !reloaded.MatchString(a.log.String()) {
		t.Errorf("site A's log does not show the reload applying the LTE uplink's new capacity")
	}
	select {
	case err := <-a.done:
		t.Fatalf("site A's tunnel exited after the reload: %v\n%s", err, a.log)
	default:
	}

	// systemctl stop: SIGTERM, a clean exit, the TUN device gone.
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("site A's tunnel stopped by SIGTERM: %v (systemd counts that a failure)\n%s", err, a.log)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("site A's tunnel still runs 10 s after SIGTERM")
	}
	if _, err := ha.InterfaceUp("braid0"); err == nil {
		t.Errorf("braid0 is still there after the tunnel stopped")
	}

	// Removal: the package's files go, the operator's stay; purge takes the enablement links.
	contents := run(dpkg+"-deb", "--contents", deb)
	dpkgIn("-r", "braid")
	if s := status(); s != "rc" {
		t.Errorf("after dpkg -r the package's status is %q, want rc (removed, configuration kept)", s)
	}
	for _, line := range strings.Split(string(contents), "\n") {
		fl := strings.Fields(line)
		if len(fl) < 6 || strings.HasPrefix(fl[0], "d") {
			continue
		}
		if p := strings.TrimPrefix(fl[5], "./"); fileExists(at(p)) {
			t.Errorf("dpkg -r left the package's /%s", p)
		}
	}
	for _, s := range sites {
		for _, f := range []string{s + ".toml", s + ".key"} {
			if !fileExists(at("etc/braid/" + f)) {
				t.Errorf("dpkg -r removed the operator's /etc/braid/%s", f)
			}
		}
	}
	dpkgIn("--purge", "braid")
	if s := status(); s != "" && s != "un" && s != "pn" {
		t.Errorf("after dpkg --purge the package's status is %q, want it gone", s)
	}
	var left []string
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		switch {
		case err != nil:
			return err
		case rel == "var/lib/dpkg" || rel == "etc/braid":
			return filepath.SkipDir // dpkg's database; the operator's site files (kept by design)
		case rel == "dpkg.log" || e.IsDir():
			return nil
		}
		left = append(left, "/"+rel)
		return nil
	})
	if len(left) > 0 {
		t.Errorf("after dpkg --purge the root still holds %v", left)
	}
	t.Logf("dpkg.log:\n%s", readFile(at("dpkg.log")))
}

// checkSandbox checks the running daemon pid against its unit: capabilities (effective,
// permitted and bounding exactly the unit's set, nothing inheritable or ambient), no_new_privs,
// the installed tree as its root, and every socket it holds of a family the unit allows.
func checkSandbox(t *testing.T, pid int, root string, u *unitService) {
	t.Helper()
	want, err := capMask(u.Caps)
	if err != nil {
		t.Fatal(err)
	}
	st := readFile(fmt.Sprintf("/proc/%d/status", pid))
	field := func(name string) string {
		for _, line := range strings.Split(st, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k == name {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	for name, w := range map[string]uint64{"CapEff": want, "CapPrm": want, "CapBnd": want, "CapInh": 0, "CapAmb": 0} {
		got, err := strconv.ParseUint(field(name), 16, 64)
		if err != nil || got != w {
			t.Errorf("the daemon's %s is %q, want %016x (%v)", name, field(name), w, u.Caps)
		}
	}
	if field("NoNewPrivs") != "1" {
		t.Errorf("the daemon's NoNewPrivs is %q, want 1", field("NoNewPrivs"))
	}
	if r, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || r != root {
		t.Errorf("the daemon's root is %q (%v), want the installed tree %s", r, err, root)
	}
	// Every socket's family, found by its inode in the tables of the daemon's network namespace.
	family := map[string]string{}
	for file, f := range map[string]struct {
		family string
		col    int
	}{
		"tcp": {"AF_INET", 9}, "udp": {"AF_INET", 9}, "raw": {"AF_INET", 9},
		"tcp6": {"AF_INET6", 9}, "udp6": {"AF_INET6", 9}, "raw6": {"AF_INET6", 9},
		"unix": {"AF_UNIX", 6}, "netlink": {"AF_NETLINK", 9}, "packet": {"AF_PACKET", 8},
	} {
		lines := strings.Split(readFile(fmt.Sprintf("/proc/%d/net/%s", pid, file)), "\n")
		for _, line := range lines[min(1, len(lines)):] {
			if fl := strings.Fields(line); len(fl) > f.col {
				family[fl[f.col]] = f.family
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		inode, ok := strings.CutPrefix(target, "socket:[")
		if err != nil || !ok {
			continue
		}
		inode = strings.TrimSuffix(inode, "]")
		fam := family[inode]
		if fam == "" {
			fam = "an unknown family"
		}
		seen[fam]++
		if !slices.Contains(u.Families, fam) {
			t.Errorf("the daemon holds a socket of %s (inode %s); the unit's RestrictAddressFamilies is %v", fam, inode, u.Families)
		}
	}
	t.Logf("the daemon's sockets by family: %v (unit allows %v); capabilities %v", seen, u.Families, u.Caps)
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// syncFile is a log file a daemon writes and the test reads while it runs.
type syncFile struct{ *os.File }

func newSyncFile(t *testing.T, path string) *syncFile {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &syncFile{f}
}

func (f *syncFile) String() string { return readFile(f.Name()) }
