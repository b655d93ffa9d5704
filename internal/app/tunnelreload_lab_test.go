package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// TestTunnelReload (issue 17, item 4) runs the real daemon: site a starts with peers b and c,
// each behind an uplink of its own; while a file crosses to b and a 10 ms ping runs to it, a
// new site file (c and its uplink out, d and its uplink in) is applied with 'braid tunnel
// reload'. b's session is the same before and after, its ping never stops for 100 ms, the file
// arrives intact, d is reached and c is gone. A broken file is then refused, by 'braid tunnel
// reload' (non-zero, file:line in its output) and by SIGHUP (logged, daemon running), and
// nothing changes.
func TestTunnelReload(t *testing.T) {
	labtest.Require(t)
	peers := []string{"b", "c", "d"}
	tp := &topo.Topology{Name: "reload", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}}
	for i, h := range peers {
		shape := topo.Shape{Delay: 2 * time.Millisecond}
		if h == "b" {
			shape.Rate = 20e6 // so that the transfer lasts across the reload
		}
		tp.Links = append(tp.Links, topo.Link{
			A:  topo.Endpoint{Host: "a", Ifname: "to" + h, Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i+1))}},
			B:  topo.Endpoint{Host: h, Ifname: "up0", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i+1))}},
			AB: shape, BA: shape,
		})
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	keys := map[string]session.PrivateKey{}
	for _, h := range []string{"a", "b", "c", "d"} {
		keys[h], _ = session.GenerateKey()
	}
	inner := map[string]string{"a": "10.255.0.1", "b": "10.255.0.2", "c": "10.255.0.3", "d": "10.255.0.4"}
	index := map[string]int{"b": 1, "c": 2, "d": 3}
	header := func(h string) string {
		return fmt.Sprintf("[tunnel]\nprivate_key = %q\ninterface = \"braid0\"\naddress = [\"%s/24\"]\nmetrics = \"\"\n\n", keys[h].String(), inner[h])
	}
	// a's site file with peers ps, each on the uplink towards it.
	siteA := func(ps ...string) string {
		var b strings.Builder
		b.WriteString(header("a"))
		for _, p := range ps {
			fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"to%s\"\ninterface = \"to%s\"\naddress = \"10.9.%d.1\"\n\n", p, p, index[p])
		}
		for _, p := range ps {
			fmt.Fprintf(&b, "[[tunnel.peer]]\nname = %q\npublic_key = %q\nroutes = [\"%s/32\"]\npath = [{ uplink = \"to%s\", remote = \"10.9.%d.2:4754\" }]\n\n",
				p, keys[p].Public().String(), inner[p], p, index[p])
		}
		return b.String()
	}
	write := func(name, content string) string {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	logs := map[string]*lockedWriter{}
	logOf := func(h string) string {
		l := logs[h]
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.w.String()
	}
	start := func(h, file string) *exec.Cmd {
		cmd := exec.Command(self, "tunnel", "--config", file)
		logs[h] = &lockedWriter{w: &strings.Builder{}}
		cmd.Stderr = logs[h]
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	fileA := write("a.toml", siteA("b", "c"))
	daemonA := start("a", fileA)
	for _, h := range peers {
		site := header(h) + fmt.Sprintf("[[tunnel.uplink]]\nname = \"up0\"\ninterface = \"up0\"\naddress = \"10.9.%d.2\"\n\n", index[h]) +
			fmt.Sprintf("[[tunnel.peer]]\nname = \"a\"\npublic_key = %q\nroutes = [\"10.255.0.1/32\"]\npath = [{ uplink = \"up0\", remote = \"10.9.%d.1:4754\" }]\n",
				keys["a"].Public().String(), index[h])
		start(h, write(h+".toml", site))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dump := func() string {
		var b strings.Builder
		for _, h := range []string{"a", "b", "c", "d"} {
			fmt.Fprintf(&b, "--- log of %s:\n%s\n", h, logOf(h))
		}
		return b.String()
	}
	tryStatus := func() (*tunnel.Status, error) {
		out, err := l.Host("a").Run(ctx, self, "status", "--json")
		if err != nil {
			return nil, fmt.Errorf("braid status in a: %v\n%s", err, out)
		}
		var rep statusReport
		if err := json.Unmarshal(out, &rep); err != nil || rep.Tunnel == nil {
			return nil, fmt.Errorf("braid status --json in a: %v\n%s", err, out)
		}
		return rep.Tunnel, nil
	}
	status := func() *tunnel.Status {
		t.Helper()
		st, err := tryStatus()
		if err != nil {
			t.Fatalf("%v\n%s", err, dump())
		}
		return st
	}
	peerOf := func(st *tunnel.Status, name string) *tunnel.PeerStatus {
		for i := range st.Peers {
			if st.Peers[i].Name == name {
				return &st.Peers[i]
			}
		}
		return nil
	}
	names := func(st *tunnel.Status) []string {
		var out []string
		for _, p := range st.Peers {
			out = append(out, p.Name)
		}
		return out
	}
	waitSessions := func(want ...string) *tunnel.Status {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			st, err := tryStatus() // the daemon may not serve its control socket yet
			if err != nil {
				if time.Now().After(deadline) {
					t.Fatalf("%v\n%s", err, dump())
				}
				continue
			}
			ok := true
			for _, w := range want {
				if p := peerOf(st, w); p == nil || !p.Session {
					ok = false
				}
			}
			if ok {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("no session with each of %v after 10 s: peers %v\n%s", want, names(st), dump())
			}
		}
	}
	waitSessions("b", "c")
	reaches := func(h string) error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		gap, err := kit.Ping(pctx, l.Host("a"), l.Host(h), netip.MustParseAddr(inner[h]), 500*time.Millisecond)
		if err == nil && gap > 300*time.Millisecond {
			err = fmt.Errorf("longest gap %v", gap)
		}
		return err
	}
	if err := reaches("c"); err != nil {
		t.Fatalf("c before the reload: %v", err)
	}
	ageB := peerOf(status(), "b").SessionAge

	// The reload, during a transfer to b and a ping to it.
	addr := netip.AddrPortFrom(netip.MustParseAddr(inner["b"]), 5201).String()
	stopServer, err := kit.StartServer(ctx, l.Host("b"), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer()
	fileDone := make(chan traffic.FileResult, 1)
	go func() {
		f, err := traffic.File(ctx, l.Host("a").Dial, addr, traffic.FileOptions{Size: 6 << 20, Seed: 17})
		if err != nil {
			t.Errorf("transfer to b across the reload: %v", err)
		}
		fileDone <- f
	}()
	type reloadOut struct {
		out []byte
		err error
		at  time.Duration
	}
	reloaded := make(chan reloadOut, 1)
	t0 := time.Now()
	timer := time.AfterFunc(1500*time.Millisecond, func() {
		write("a.toml", siteA("b", "d"))
		out, err := l.Host("a").Run(ctx, self, "tunnel", "reload")
		reloaded <- reloadOut{out, err, time.Since(t0)}
	})
	defer timer.Stop()
	worst, err := kit.Ping(ctx, l.Host("a"), l.Host("b"), netip.MustParseAddr(inner["b"]), 4*time.Second)
	if err != nil {
		t.Fatalf("ping b: %v\n%s", err, dump())
	}
	r := <-reloaded
	f := <-fileDone
	t.Logf("reload at %v: %s(err %v); longest gap in the 10 ms ping to b %v; transfer %v", r.at.Round(time.Millisecond), r.out, r.err, worst, f)
	if r.err != nil {
		t.Fatalf("braid tunnel reload: %v\n%s\n%s", r.err, r.out, dump())
	}
	if !strings.Contains(string(r.out), "peers added d") || !strings.Contains(string(r.out), "peers removed c") {
		t.Errorf("braid tunnel reload says %q, want d added and c removed", r.out)
	}
	if worst >= 100*time.Millisecond {
		t.Errorf("longest time without a ping reply from b across the reload: %v, want under 100 ms", worst)
	}
	if !f.Intact {
		t.Errorf("the file to b is not intact across the reload: %+v", f)
	}
	st := waitSessions("b", "d")
	if got := names(st); !slices.Equal(got, []string{"b", "d"}) {
		t.Errorf("peers after the reload: %v, want [b d]", got)
	}
	if age := peerOf(st, "b").SessionAge; age <= ageB {
		t.Errorf("b's session is %v old after the reload, %v before: it was replaced", age, ageB)
	}
	if err := reaches("d"); err != nil {
		t.Errorf("d after the reload: %v\n%s", err, dump())
	}
	if err := reaches("c"); err == nil {
		t.Errorf("c still answers after the reload removed it")
	}

	// A broken file: refused by 'braid tunnel reload' and by SIGHUP, nothing changes.
	broken := strings.Replace(siteA("b", "d"), inner["d"]+"/32", inner["d"]+"/33", 1)
	line := 1 + strings.Count(broken[:strings.Index(broken, "/33")], "\n")
	write("a.toml", broken)
	before := status()
	out, err := l.Host("a").Run(ctx, self, "tunnel", "reload")
	t.Logf("braid tunnel reload, broken file: %v\n%s", err, out)
	if err == nil {
		t.Errorf("braid tunnel reload of a broken file exits 0")
	}
	if where := fmt.Sprintf("%s:%d", fileA, line); !strings.Contains(string(out), where) {
		t.Errorf("braid tunnel reload of a broken file does not say %s:\n%s", where, out)
	}
	if err := daemonA.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); strings.Count(logOf("a"), "reload refused") < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no second 'reload refused' in a's log 3 s after SIGHUP:\n%s", logOf("a"))
		}
	}
	after := status()
	if !slices.Equal(names(before), names(after)) {
		t.Errorf("peers after the refused reloads: %v, before %v", names(after), names(before))
	}
	for _, n := range names(after) {
		if b, a := peerOf(before, n), peerOf(after, n); a.SessionAge <= b.SessionAge || len(a.Paths) != len(b.Paths) {
			t.Errorf("peer %s changed across the refused reloads: %+v, before %+v", n, a, b)
		}
	}
	if err := reaches("d"); err != nil {
		t.Errorf("d after the refused reloads: %v", err)
	}
	if err := reaches("b"); err != nil {
		t.Errorf("b after the refused reloads: %v", err)
	}
	if !strings.Contains(logOf("a"), fmt.Sprintf("%s:%d", fileA, line)) {
		t.Errorf("a's log does not name %s:%d", fileA, line)
	}
}
