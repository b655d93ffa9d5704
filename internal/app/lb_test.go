package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/mplb"
	"braid/internal/lab/labtest"
	"braid/internal/lb"
)

func TestLBHelpAndUsage(t *testing.T) {
	code, out, _ := run("lb", "--help")
	if code != exitOK || !strings.Contains(out, "MP_JOIN SYN goes to the backend that owns its token") || !strings.Contains(out, "Example:") {
		t.Errorf("braid lb --help: %d %q", code, out)
	}
	if code, _, errOut := run("lb"); code != exitUsage || !strings.Contains(errOut, "--config") {
		t.Errorf("braid lb without config: %d %q", code, errOut)
	}
	if code, _, errOut := run("lb", "weight", "web1", "heavy"); code != exitUsage || !strings.Contains(errOut, `"heavy" is not a weight`) {
		t.Errorf("bad weight: %d %q", code, errOut)
	}
	if code, _, errOut := run("lb", "add", "web3"); code != exitUsage || !strings.Contains(errOut, "--mac is required") {
		t.Errorf("add without mac: %d %q", code, errOut)
	}
}

func TestLBCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte(`[lb]
interface = "lo"
[[lb.service]]
vip = "10.100.0.1:80"
[[lb.backend]]
name = "web1"
mac = "02:00:00:00:00:01"
`), 0o644)
	if code, out, errOut := run("lb", "check", "--config", good); code != exitOK || !strings.Contains(out, "valid: MPTCP-aware, mode mac, 1 services, 1 backends") {
		t.Errorf("check: %d %q %q", code, out, errOut)
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte(`[lb]
interface = "lo"
mode = "nat"
[[lb.service]]
vip = "10.100.0.1:80"
`), 0o644)
	code, _, errOut := run("lb", "check", "--config", bad)
	if code != exitError || !strings.Contains(errOut, "bad.toml:3: lb: mode \"nat\"") || !strings.Contains(errOut, "no backends") {
		t.Errorf("bad config: %d %q", code, errOut)
	}
}

func TestLBShow(t *testing.T) {
	st := lb.Status{Mode: "mac", Aware: true, Counters: map[string]uint64{"join_steered": 12, "drop_join_unknown_token": 3},
		Backends: []lb.BackendStatus{{Name: "web1", Index: 0, Weight: 1, State: "active", Flows: 5, Joins: 12, Tokens: 1},
			{Name: "web2", Index: 1, Weight: 0, State: "drained", Health: "10.0.0.2:80", HealthError: "refused"}},
		Tokens: []lb.TokenStatus{{Token: "bad4a582", Backend: "web1", Version: 1, AgeMS: 1500, Closing: true}}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(st) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	addr := ln.Addr().String()
	code, out, errOut := run("lb", "backends", "--addr", addr)
	if code != exitOK || !strings.Contains(out, "web2") || !strings.Contains(out, "drained") || !strings.Contains(out, "10.0.0.2:80 (refused)") {
		t.Errorf("backends: %d %q %q", code, out, errOut)
	}
	code, out, _ = run("lb", "tokens", "--addr", addr)
	if code != exitOK || !strings.Contains(out, "bad4a582") || !strings.Contains(out, "closing") || !strings.Contains(out, "1.5s") {
		t.Errorf("tokens: %d %q", code, out)
	}
	code, out, _ = run("lb", "status", "--addr", addr)
	if code != exitOK || !regexp.MustCompile(`drop_join_unknown_token +3\n`).MatchString(out) || !strings.Contains(out, "MPTCP-aware, 2 backends, 1 tokens") {
		t.Errorf("status: %d %q", code, out)
	}
	code, out, _ = run("lb", "tokens", "--addr", addr, "--json")
	if code != exitOK || !strings.Contains(out, `"token": "bad4a582"`) {
		t.Errorf("tokens --json: %d %q", code, out)
	}
	if code, _, errOut := run("lb", "status", "--addr", "127.0.0.1:1"); code != exitError || !strings.Contains(errOut, "is it running") {
		t.Errorf("nothing running: %d %q", code, errOut)
	}
}

// TestLBCommandLab runs 'braid lb' itself (serveLB from a site file) as the balancer of the
// MPLB lab, drives it with real MPTCP connections, and uses its control socket and status.
func TestLBCommandLab(t *testing.T) {
	labtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 2
	l := labtest.Up(t, mplb.MPLBTopology(n, 0))
	if err := mplb.MPLBPrepare(l, n); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var backends strings.Builder
	for k := 0; k < n; k++ {
		s, err := mplb.MPLBBackendSpec(l, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&backends, "[[lb.backend]]\nname = \"b%d\"\nmac = \"%s\"\ninterface = \"l%d\"\n", k, s.Target.MAC, k)
	}
	dir := t.TempDir()
	control := filepath.Join(dir, "lb.sock")
	site := filepath.Join(dir, "site.toml")
	os.WriteFile(site, []byte(fmt.Sprintf(`[lb]
interface = "lc0"
interfaces = ["lc1"]
attach = "generic"
metrics = "127.0.0.1:9476"
control = %q
[[lb.service]]
vip = "%s:%d"
%s`, control, mplb.MPLBVIP, mplb.MPLBPort, backends.String())), 0o644)

	// The balancer runs on a thread of the lb host until runCtx ends.
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- l.Host("lb").NS.Spawn(func() error {
			cfg, err := loadLBConfig(site)
			if err != nil {
				return err
			}
			return serveLB(runCtx, cfg, slog.New(slog.DiscardHandler))
		})
	}()
	defer func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("braid lb: %v", err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(control); err == nil {
			break
		}
		select {
		case err := <-errc:
			t.Fatalf("braid lb stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("braid lb did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	status := func() lb.Status {
		t.Helper()
		var c net.Conn
		err := l.Host("lb").NS.Do(func() error {
			var err error
			c, err = net.Dial("tcp", "127.0.0.1:9476")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "GET /status HTTP/1.0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st lb.Status
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("status %q: %v", body, err)
		}
		return st
	}

	if err := mplb.MPLBEndpoint(ctx, l); err != nil {
		t.Fatal(err)
	}
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 40; i++ {
		c, err := mplb.MPLBDial(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := mplb.MPLBAsk(c); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for status().Counters["join_steered"] < 40 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	st := status()
	if st.Counters["join_steered"] != 40 || st.Counters["token_learned"] != 40 || st.Counters["drop_join_unknown_token"] != 0 {
		t.Fatalf("counters %v", st.Counters)
	}
	if len(st.Tokens) != 40 || len(st.Backends) != 2 || st.Backends[0].Tokens+st.Backends[1].Tokens != 40 {
		t.Fatalf("status: %d tokens, backends %+v", len(st.Tokens), st.Backends)
	}
	// Drain b0 through the control socket: new connections all go to b1.
	if code, _, errOut := run("lb", "drain", "b0", "--control", control); code != exitOK {
		t.Fatalf("drain: %d %s", code, errOut)
	}
	for i := 0; i < 20; i++ {
		c, err := mplb.MPLBDial(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if k, err := mplb.MPLBAsk(c); err != nil || k != 1 {
			t.Fatalf("after draining b0 a new connection reached b%d (%v)", k, err)
		}
	}
	if st := status(); st.Backends[0].State != "drained" {
		t.Fatalf("b0 is %s", st.Backends[0].State)
	}
	// braid status through the control socket: the services, the backends with their state,
	// the tokens and the counters.
	code, out, errOut := run("status", "--control", control)
	if code != exitOK || !strings.Contains(out, "load balancer: services [") || !regexp.MustCompile(`b0 +0 +drained`).MatchString(out) ||
		!strings.Contains(out, "60 tokens") || !regexp.MustCompile(`join_steered +[1-9]`).MatchString(out) {
		t.Errorf("braid status --control: %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := run("lb", "weight", "nosuch", "1", "--control", control); code != exitError || !strings.Contains(errOut, "no such backend") {
		t.Fatalf("unknown backend: %d %q", code, errOut)
	}
}
