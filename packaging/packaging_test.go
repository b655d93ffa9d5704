// Package packaging holds what installs braid on a machine: the systemd units of every daemon
// role (systemd/), the Debian maintainer scripts (debian/), and the tests that check them, the
// example site files (examples/) and the package 'make deb' builds. docs/install.md explains
// the layout and each role's capabilities.
package packaging

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"braid/internal/config"
	"braid/internal/lab/labtest"
)

// roles are the daemon roles, each with a unit braid-ROLE@.service, and the capabilities and
// socket families each is given (docs/install.md, "Capabilities", says why). The units must
// say exactly this: a capability added or dropped is a decision to make here and in the doc.
var roles = []struct {
	name     string
	caps     []string
	families []string
	tunables string // ProtectKernelTunables: "no" where the role writes a sysctl
	tun      bool   // needs /dev/net/tun
}{
	{"tunnel", []string{"CAP_NET_ADMIN"}, []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}, "yes", true},
	{"proxy", []string{"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE"}, []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}, "no", false},
	{"lb", []string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"}, []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}, "yes", false},
	{"mapserver", nil, []string{"AF_INET", "AF_INET6", "AF_UNIX"}, "yes", false},
	{"xtr", []string{"CAP_NET_ADMIN"}, []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}, "yes", true},
	{"pm", []string{"CAP_NET_ADMIN"}, []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}, "no", false},
}

// examples maps each example site file to the roles whose sections it holds.
var examples = map[string][]string{
	"site-a.toml":       {"tunnel"},
	"site-b.toml":       {"tunnel"},
	"federation-a.toml": {"proxy"},
	"lb.toml":           {"lb"},
	"lisp-site1.toml":   {"xtr"},
	"mapserver.toml":    {"mapserver"},
	"mptcp-host.toml":   {"pm"},
}

// buildBraid builds the braid command once into a temporary directory and returns its path.
var buildBraid = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "braid-packaging-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "braid")
	cmd := exec.Command(goTool(), "build", "-trimpath", "-o", bin, "braid/cmd/braid")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func braid(t *testing.T) string {
	t.Helper()
	bin, err := buildBraid()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(unitExecEnv); spec != "" {
		unitExecMain(spec) // the test binary re-executed as a unit's service (unitexec_test.go)
	}
	code := m.Run()
	if bin, err := buildBraid(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	if builtDeb.dir != "" {
		os.RemoveAll(builtDeb.dir)
	}
	os.Exit(code)
}

// builtDeb is the package 'make deb' built for this run, shared by the tests that need one.
var builtDeb struct {
	once  sync.Once
	dir   string
	deb   string
	heads []string // HEAD before and after the build: the commit the package says is one of them
	err   error
}

// debPackage builds the Debian package with 'make deb' into a temporary directory, once per
// run, and returns its path.
func debPackage(t *testing.T) string {
	t.Helper()
	var tools []string
	for _, name := range []string{"make", "dpkg-deb", "help2man"} {
		p, ok := labtest.Tool(t, name)
		if !ok {
			labtest.Skip(t, name+" is not installed (scripts/deps.sh installs it)")
		}
		tools = append(tools, p)
	}
	b := &builtDeb
	b.once.Do(func() {
		gitHead := func() {
			if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
				b.heads = append(b.heads, strings.TrimSpace(string(out)))
			}
		}
		gitHead()
		if b.dir, b.err = os.MkdirTemp("", "braid-deb-"); b.err != nil {
			return
		}
		cmd := exec.Command(tools[0], "-C", "..", "--no-print-directory", "deb", "BIN="+filepath.Join(b.dir, "bin", "braid"), "DEBOUT="+b.dir)
		cmd.Env = append(os.Environ(), "MAKEFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("make deb: %v\n%s", err, out)
			return
		}
		debs, _ := filepath.Glob(filepath.Join(b.dir, "braid_*.deb"))
		if len(debs) != 1 {
			b.err = fmt.Errorf("make deb wrote %v, want one braid_*.deb in %s", debs, b.dir)
			return
		}
		b.deb = debs[0]
		gitHead()
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.deb
}

// unitKeys returns the values of each key of a unit file, in order.
func unitKeys(t *testing.T, file string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not a key=value line: %q", file, line)
		}
		keys[k] = append(keys[k], v)
	}
	return keys
}

// TestUnitsVerify runs 'systemd-analyze verify' on an instance of every role's unit, installed
// as 'make install' installs it (@BINDIR@ replaced by the directory of a freshly built braid,
// since verify checks that ExecStart's program exists), and requires it to be silent; then it
// checks what each unit says against the roles table: command, site file, reload, runtime and
// configuration directories, capabilities, socket families and the sandbox.
func TestUnitsVerify(t *testing.T) {
	entries, _ := filepath.Glob("systemd/*.service")
	var want []string
	for _, r := range roles {
		want = append(want, "systemd/braid-"+r.name+"@.service")
	}
	slices.Sort(want)
	if !slices.Equal(entries, want) {
		t.Errorf("units %v, want one per daemon role: %v", entries, want)
	}
	for _, r := range roles {
		t.Run(r.name, func(t *testing.T) {
			k := unitKeys(t, "systemd/braid-"+r.name+"@.service")
			one := func(key, want string) {
				t.Helper()
				if got := k[key]; len(got) != 1 || got[0] != want {
					t.Errorf("%s = %q, want %q", key, got, want)
				}
			}
			one("ExecStart", "@BINDIR@/braid "+r.name+" --config /etc/braid/%i.toml")
			one("ExecReload", "/bin/kill -HUP $MAINPID")
			one("RuntimeDirectory", "braid/"+r.name+"-%i")
			one("ConfigurationDirectory", "braid")
			one("CapabilityBoundingSet", strings.Join(r.caps, " "))
			one("RestrictAddressFamilies", strings.Join(r.families, " "))
			one("ProtectKernelTunables", r.tunables)
			for _, key := range []string{"NoNewPrivileges", "ProtectHome", "PrivateTmp", "LockPersonality",
				"MemoryDenyWriteExecute", "ProtectKernelModules", "ProtectControlGroups", "RestrictNamespaces",
				"RestrictSUIDSGID", "RestrictRealtime"} {
				one(key, "yes")
			}
			one("ProtectSystem", "strict")
			one("SystemCallArchitectures", "native")
			if r.tun {
				one("DevicePolicy", "closed")
				one("DeviceAllow", "/dev/net/tun rw")
			} else {
				one("PrivateDevices", "yes")
			}
		})
	}

	analyze, ok := labtest.Tool(t, "systemd-analyze")
	if !ok {
		labtest.Skip(t, "systemd-analyze is not installed (Debian's systemd package; scripts/deps.sh installs it)")
	}
	bin := braid(t)
	dir := t.TempDir()
	for _, r := range roles {
		src, err := os.ReadFile("systemd/braid-" + r.name + "@.service")
		if err != nil {
			t.Fatal(err)
		}
		tmpl := filepath.Join(dir, "braid-"+r.name+"@.service")
		if err := os.WriteFile(tmpl, bytes.ReplaceAll(src, []byte("@BINDIR@"), []byte(filepath.Dir(bin))), 0o644); err != nil {
			t.Fatal(err)
		}
		inst := filepath.Join(dir, "braid-"+r.name+"@site-a.service")
		if err := os.Symlink(filepath.Base(tmpl), inst); err != nil {
			t.Fatal(err)
		}
		// --man=no: the man pages are installed by 'make install', not into this directory.
		out, err := exec.Command(analyze, "verify", "--man=no", tmpl, inst).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify braid-%s@site-a.service: %v\n%s", r.name, err, out)
		}
	}
}

// machine is a config.Env of a machine with every interface and the given files.
type machine map[string][]byte

func (machine) InterfaceExists(string) bool { return true }
func (m machine) ReadFile(name string) ([]byte, error) {
	if b, ok := m[filepath.Base(name)]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", name, os.ErrNotExist)
}

// TestExamples loads every example site file as its roles would, on a machine that has the
// interfaces it names and keys made by 'braid keygen' and 'braid proxy keygen', so that the
// examples the package installs stay valid as the configuration changes.
func TestExamples(t *testing.T) {
	files, _ := filepath.Glob("../examples/*.toml")
	for _, f := range files {
		if _, ok := examples[filepath.Base(f)]; !ok {
			t.Errorf("%s: not in the examples table of this test", f)
		}
	}
	bin := braid(t)
	keys := machine{}
	for _, k := range []struct{ file, cmd string }{
		{"site-a.key", "keygen"}, {"site-b.key", "keygen"}, {"federation-a.key", "proxy keygen"},
	} {
		out := filepath.Join(t.TempDir(), k.file)
		args := append(strings.Fields(k.cmd), "--out", out)
		if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("braid %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		keys[k.file], _ = os.ReadFile(out)
	}
	for name, rs := range examples {
		path := filepath.Join("../examples", name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
			continue
		}
		site := "/etc/braid/" + name
		for _, r := range rs {
			switch r {
			case "tunnel":
				_, err = config.LoadTunnel(site, data, keys)
			case "proxy":
				_, err = config.LoadProxy(site, data, keys)
			case "lb":
				_, err = config.LoadLB(site, data, keys)
			case "mapserver":
				_, err = config.LoadMapserver(site, data)
			case "xtr":
				_, err = config.LoadXTR(site, data, keys)
			case "pm":
				_, err = config.LoadPM(site, data, keys)
			default:
				t.Fatalf("%s: unknown role %s", name, r)
			}
			if err != nil {
				t.Errorf("examples/%s as braid %s: %v", name, r, err)
			}
		}
	}
}

// TestDeb builds the Debian package with 'make deb' (into a temporary directory) and reads it
// back with dpkg-deb: its control fields, that it holds the binary, every unit, every example
// site file, the man pages and the docs, and that the binary is static and says its version
// and commit.
func TestDeb(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package: not with -short")
	}
	deb := debPackage(t)
	dpkgDeb, _ := labtest.Tool(t, "dpkg-deb")
	heads := builtDeb.heads
	info, err := exec.Command(dpkgDeb, "--info", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --info: %v\n%s", err, info)
	}
	for _, want := range []string{" Package: braid\n", " Architecture: " + debArch() + "\n", " Version: ", " Maintainer: ",
		" Description: ", " postinst", " prerm", " postrm"} {
		if !bytes.Contains(info, []byte(want)) {
			t.Errorf("dpkg-deb --info has no %q:\n%s", want, info)
		}
	}

	contents, err := exec.Command(dpkgDeb, "--contents", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --contents: %v\n%s", err, contents)
	}
	files := map[string]bool{}
	for _, line := range strings.Split(string(contents), "\n") {
		if f := strings.Fields(line); len(f) >= 6 {
			files[strings.TrimPrefix(f[5], ".")] = true
		}
	}
	want := []string{"/usr/bin/braid", "/usr/share/man/man1/braid.1.gz", "/usr/share/doc/braid/install.md",
		"/usr/share/doc/braid/README.md", "/usr/share/doc/braid/tunnel.md", "/etc/braid/"}
	for _, r := range roles {
		want = append(want, "/usr/lib/systemd/system/braid-"+r.name+"@.service", "/usr/share/man/man1/braid-"+r.name+".1.gz")
	}
	for name := range examples {
		want = append(want, "/usr/share/doc/braid/examples/"+name)
	}
	for _, w := range want {
		if !files[w] {
			t.Errorf("the package has no %s; it has:\n%s", w, contents)
		}
	}

	root := t.TempDir()
	if b, err := exec.Command(dpkgDeb, "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, b)
	}
	unit, _ := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/braid-tunnel@.service"))
	if !bytes.Contains(unit, []byte("\nExecStart=/usr/bin/braid tunnel --config /etc/braid/%i.toml\n")) {
		t.Errorf("the packaged tunnel unit does not start /usr/bin/braid:\n%s", unit)
	}
	bin := filepath.Join(root, "usr/bin/braid")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the packaged braid is not static: it has %v", p.Type)
		}
	}
	f.Close()
	v, err := exec.Command(bin, "version").CombinedOutput()
	commitOK := slices.ContainsFunc(heads, func(h string) bool { return strings.Contains(string(v), "\ncommit "+h) })
	if err != nil || !strings.HasPrefix(string(v), "braid ") || !commitOK || !strings.Contains(string(v), runtime.Version()) {
		t.Errorf("packaged braid version: %v\n%s\nwant the version, commit %v and %s", err, v, heads, runtime.Version())
	}
}

// debArch is Debian's name of this machine's architecture.
func debArch() string {
	switch runtime.GOARCH {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	}
	return runtime.GOARCH
}
