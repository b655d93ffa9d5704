package app

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/netns"
)

func TestLabHelp(t *testing.T) {
	for _, sub := range []string{"up", "down", "status", "exec", "link", "iface", "nat", "run", "demo"} {
		code, out, _ := run("lab", sub, "--help")
		if code != 0 || !strings.Contains(out, "Usage: braid lab "+sub) || !strings.Contains(out, "Example") {
			t.Errorf("braid lab %s --help: code %d, output:\n%s", sub, code, out)
		}
	}
	if code, out, _ := run("lab", "--help"); code != 0 || !strings.Contains(out, "Commands:") {
		t.Errorf("braid lab --help: %d %q", code, out)
	}
	if code, _, e := run("lab", "fly"); code != exitUsage || !strings.Contains(e, "fly") {
		t.Errorf("braid lab fly: %d %q", code, e)
	}
	if code, _, e := run("lab", "run", "nosuch"); code != exitUsage || !strings.Contains(e, "accuracy") {
		t.Errorf("unknown scenario should list the scenarios: %d %q", code, e)
	}
	// An --out that cannot be a directory fails before anything runs, not after the run.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, e := run("lab", "run", "rbpm", "--out", filepath.Join(notDir, "figures")); code != exitError || !strings.Contains(e, "--out") {
		t.Errorf("an unusable --out: %d %q", code, e)
	}
	if code, _, e := run("lab", "link", "a", "b", "--loss", "150%"); code != exitUsage || !strings.Contains(e, "loss") {
		t.Errorf("loss 150%%: %d %q", code, e)
	}
	if code, _, e := run("lab", "exec", "h1"); code != exitUsage || !strings.Contains(e, "CMD") {
		t.Errorf("exec without a command: %d %q", code, e)
	}
}

const goodTopology = `name = "cli"
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
a_addr = "10.98.0.1/24"
b_addr = "10.98.0.2/24"
rate = "20mbit"
delay = "5ms"
`

// Each mistake is reported with the file, the line and the reason, and nothing is created.
func TestLabUpRejectsBadFiles(t *testing.T) {
	cases := []struct {
		name, file, want string
		line             int
	}{
		{"unknown key", strings.Replace(goodTopology, `delay = "5ms"`, `delay = "5ms"
latency = "3ms"`, 1), `unknown key`, 13},
		{"negative delay", strings.Replace(goodTopology, `"5ms"`, `"-5ms"`, 1), "negative delay", 12},
		{"loss over 100", strings.Replace(goodTopology, `delay = "5ms"`, `loss = "150%"`, 1), "loss over 100", 12},
		{"unknown host", strings.Replace(goodTopology, `b = "b"`, `b = "c"`, 1), `"c"`, 8},
		{"duplicate address", strings.Replace(goodTopology, `10.98.0.2/24`, `10.98.0.1/24`, 1), "10.98.0.1", 10},
	}
	dir := t.TempDir()
	before, _ := netns.List(lab.NamePrefix)
	for _, c := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".toml")
		if err := os.WriteFile(path, []byte(c.file), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, e := run("lab", "up", path)
		if code == 0 {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		loc := regexp.MustCompile(regexp.QuoteMeta(path) + `:(\d+)`).FindStringSubmatch(e)
		if loc == nil || !strings.Contains(e, c.want) {
			t.Errorf("%s: error %q lacks %s:<line> or %q", c.name, e, path, c.want)
		} else if loc[1] != itoa(c.line) {
			t.Errorf("%s: error %q names line %s, want %d", c.name, e, loc[1], c.line)
		}
	}
	if after, _ := netns.List(lab.NamePrefix); len(after) != len(before) {
		t.Errorf("a rejected file created namespaces: before %v after %v", before, after)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// braidCmd runs this test binary as the braid command.
func braidCmd(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "BRAID_TEST_MAIN=1")
	return cmd
}

// Without the privilege to create namespaces, the lab says so in one line and exits non-zero.
func TestLabUpWithoutPrivilege(t *testing.T) {
	labtest.Require(t) // needs root to drop to another user
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	self, _ := os.Executable()
	bin := filepath.Join(dir, "braid")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "lab.toml")
	os.WriteFile(file, []byte(goodTopology), 0o644)
	for _, args := range [][]string{{"lab", "up", file}, {"lab", "demo"}, {"lab", "down"}} {
		cmd := braidCmd(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("braid %s as nobody: %v, want a non-zero exit", strings.Join(args, " "), err)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "root") {
			t.Errorf("braid %s as nobody: stderr %q, want one line about root", strings.Join(args, " "), stderr.String())
		}
	}
}

// The whole command-line life of a lab: up --detach, status, exec, link, down.
func TestLabCommandLine(t *testing.T) {
	labtest.Require(t)
	self, _ := os.Executable()
	file := filepath.Join(t.TempDir(), "lab.toml")
	os.WriteFile(file, []byte(goodTopology), 0o644)

	out, err := braidCmd(self, "lab", "up", file, "--detach").CombinedOutput()
	if err != nil {
		t.Fatalf("lab up --detach: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`lab ([0-9a-f]{6}) is up in the background \(pid (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		lab.ReapStale(nil)
		if m := regexp.MustCompile(`^lab ([0-9a-f]{6}) `).FindStringSubmatch(string(out)); m != nil {
			lab.Down(lab.DownOptions{ID: m[1], Wait: 5 * time.Second})
		}
		t.Fatalf("lab up --detach printed no ID and pid:\n%s", out)
	}
	id := m[1]
	t.Cleanup(func() { lab.Down(lab.DownOptions{ID: id, Wait: 5 * time.Second}) })

	out, err = braidCmd(self, "lab", "status").CombinedOutput()
	if err != nil || !strings.Contains(string(out), id) || !strings.Contains(string(out), "20 Mbit/s") {
		t.Errorf("lab status: %v\n%s", err, out)
	}
	// /proc/net/dev lists the interfaces of the reader's namespace: a's TUN, not the machine's.
	out, err = braidCmd(self, "lab", "exec", "--lab", id, "a", "--", "cat", "/proc/net/dev").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "eth0") || !strings.Contains(string(out), "lo") {
		t.Errorf("lab exec a -- cat /proc/net/dev: %v\n%s", err, out)
	}
	cmd := braidCmd(self, "lab", "exec", "--lab", id, "a", "--", "sh", "-c", "exit 7")
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 7 {
		t.Errorf("lab exec should pass the exit status on: %v", err)
	}
	out, err = braidCmd(self, "lab", "link", "--lab", id, "a", "b", "--delay", "30ms", "--dir", "ab").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "30ms") {
		t.Errorf("lab link --delay 30ms: %v\n%s", err, out)
	}
	out, err = braidCmd(self, "lab", "link", "--lab", id, "a", "b", "--down").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CUT") {
		t.Errorf("lab link --down: %v\n%s", err, out)
	}
	out, err = braidCmd(self, "lab", "link", "--lab", id, "a", "nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nope") {
		t.Errorf("lab link to an unknown host: %v\n%s", err, out)
	}
	st, err := lab.ReadState(id)
	if err != nil {
		t.Fatal(err)
	}
	out, err = braidCmd(self, "lab", "down", "--lab", id).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "stopped lab "+id) {
		t.Errorf("lab down: %v\n%s", err, out)
	}
	assertNamespacesGone(t, st.Namespaces, "lab down")
}

// `braid lab down` removes what a killed `braid lab up` left behind.
func TestLabDownAfterKill(t *testing.T) {
	labtest.Require(t)
	self, _ := os.Executable()
	file := filepath.Join(t.TempDir(), "lab.toml")
	os.WriteFile(file, []byte(goodTopology), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up := braidCmd(self, "lab", "up", file)
	stdout, _ := up.StdoutPipe()
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Process.Kill(); up.Wait() })
	var id string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && ctx.Err() == nil {
		if m := regexp.MustCompile(`^lab ([0-9a-f]{6}) is up`).FindStringSubmatch(sc.Text()); m != nil {
			id = m[1]
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if id == "" {
		t.Fatal("lab up did not report its ID")
	}
	st, err := lab.ReadState(id)
	if err != nil {
		t.Fatal(err)
	}
	up.Process.Kill()
	up.Wait()
	out, err := braidCmd(self, "lab", "down", "--lab", id).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "left by dead pid") {
		t.Errorf("lab down after kill: %v\n%s", err, out)
	}
	assertNamespacesGone(t, st.Namespaces, "lab down")
}

// Ctrl-C during the demo ends it with 130 and leaves nothing behind.
func TestDemoInterrupted(t *testing.T) {
	labtest.Require(t)
	self, _ := os.Executable()
	cmd := braidCmd(self, "lab", "demo")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		lab.ReapStale(nil)
	})
	var st lab.State
	deadline := time.Now().Add(30 * time.Second)
	for st.ID == "" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		running, _ := lab.Running()
		for _, s := range running {
			if s.PID == cmd.Process.Pid {
				st = s
			}
		}
	}
	if st.ID == "" {
		t.Fatal("the demo's lab did not come up within 30 s")
	}
	time.Sleep(2 * time.Second) // into the measurements
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Errorf("interrupted demo: %v, want exit status %d", err, exitInterrupted)
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr %q does not say it was interrupted", stderr.String())
	}
	assertNamespacesGone(t, st.Namespaces, "the interrupted demo")
}

func assertNamespacesGone(t *testing.T, names []string, after string) {
	t.Helper()
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netns.Dir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s survived %s", n, after)
		}
	}
}
