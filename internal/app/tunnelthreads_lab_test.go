package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"braid/internal/gothreads"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/tunnel/session"
)

// TestTunnelThreads runs the daemon and reads its Go threads from 'braid status --json': by
// default (threads left out) one thread while the tunnel is idle, 'auto'; a reload with
// threads = 3 sets three at once, and a reload without it goes back to auto at one thread. The
// rule that raises the count under load is TestThreadsAuto* (internal/gothreads).
func TestTunnelThreads(t *testing.T) {
	labtest.Require(t)
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: auto has nothing to choose")
	}
	tp := &topo.Topology{Name: "threads", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}, Links: []topo.Link{{
		A: topo.Endpoint{Host: "a", Ifname: "up0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.1.1/24")}},
		B: topo.Endpoint{Host: "b", Ifname: "up0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.1.2/24")}},
	}}}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	priv, _ := session.GenerateKey()
	peer, _ := session.GenerateKey()
	site := func(extra string) string {
		return fmt.Sprintf("[tunnel]\nprivate_key = %q\ninterface = \"braid0\"\naddress = [\"10.255.0.1/24\"]\nmetrics = \"\"\n%s\n"+
			"[[tunnel.uplink]]\nname = \"up0\"\ninterface = \"up0\"\naddress = \"10.9.1.1\"\n\n"+
			"[[tunnel.peer]]\nname = \"b\"\npublic_key = %q\nroutes = [\"10.255.0.2/32\"]\npath = [{ uplink = \"up0\", remote = \"10.9.1.2:4754\" }]\n",
			priv.String(), extra, peer.Public().String())
	}
	file := filepath.Join(t.TempDir(), "a.toml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(site(""))
	log := &lockedWriter{w: &strings.Builder{}}
	cmd := exec.Command(self, "tunnel", "--config", file)
	cmd.Stderr = log
	if err := l.Host("a").Start(cmd); err != nil {
		t.Fatal(err)
	}
	logText := func() string {
		log.mu.Lock()
		defer log.mu.Unlock()
		return log.w.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	threads := func() (gothreads.Status, error) {
		out, err := l.Host("a").Run(ctx, self, "status", "--json")
		if err != nil {
			return gothreads.Status{}, fmt.Errorf("braid status: %v\n%s", err, out)
		}
		var rep statusReport
		if err := json.Unmarshal(out, &rep); err != nil || rep.Threads == nil {
			return gothreads.Status{}, fmt.Errorf("braid status --json has no threads: %v\n%s", err, out)
		}
		return *rep.Threads, nil
	}
	// wait until the status says want (the daemon may not serve its control socket yet, and a
	// reload's reply comes before a status would show a change it did not make)
	expect := func(what string, want func(gothreads.Status) bool) gothreads.Status {
		t.Helper()
		var st gothreads.Status
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if st, err = threads(); err == nil && want(st) {
				return st
			}
		}
		t.Fatalf("%s: threads %+v (%v)\n%s", what, st, err, logText())
		return st
	}
	st := expect("at start", func(s gothreads.Status) bool { return s.Setting == "auto" })
	if st.Threads != 1 || st.Max != runtime.NumCPU() {
		t.Errorf("an idle tunnel, threads left out: %+v, want auto at 1 thread of %d", st, runtime.NumCPU())
	}
	if !strings.Contains(logText(), "Go threads") {
		t.Errorf("the log does not say how many Go threads run the tunnel:\n%s", logText())
	}
	reload := func(content, says string) {
		t.Helper()
		write(content)
		out, err := l.Host("a").Run(ctx, self, "tunnel", "reload")
		if err != nil {
			t.Fatalf("braid tunnel reload: %v\n%s\n%s", err, out, logText())
		}
		if !strings.Contains(string(out), says) {
			t.Errorf("braid tunnel reload says %q, want %q in it", out, says)
		}
	}
	reload(site("threads = 3"), ": threads 3")
	if st := expect("after a reload with threads = 3", func(s gothreads.Status) bool { return s.Setting == "3" }); st.Threads != 3 {
		t.Errorf("threads = 3: %+v, want 3 threads", st)
	}
	reload(site(""), ": threads auto")
	if st := expect("after a reload without threads", func(s gothreads.Status) bool { return s.Setting == "auto" }); st.Threads != 1 {
		t.Errorf("back to auto, idle: %+v, want 1 thread", st)
	}
}
