package app

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel/session"
)

func TestTunnelHelpAndCheck(t *testing.T) {
	if code, out, _ := run("tunnel", "--help"); code != 0 || !strings.Contains(out, "Example") {
		t.Errorf("tunnel --help: %d %q", code, out)
	}
	if code, _, e := run("tunnel"); code != exitUsage || !strings.Contains(e, "--config") {
		t.Errorf("tunnel without --config: %d %q", code, e)
	}
	bad := filepath.Join(t.TempDir(), "site.toml")
	os.WriteFile(bad, []byte("[tunnel]\nprobe_intreval = \"50ms\"\n"), 0o644)
	code, _, e := run("tunnel", "check", "--config", bad)
	if code != exitError || !strings.Contains(e, bad+":2") || !strings.Contains(e, "probe_intreval") {
		t.Errorf("tunnel check of a typo: %d %q", code, e)
	}
	if code, _, e := run("tunnel", "path", "sideways", "x", "1"); code != exitUsage || !strings.Contains(e, "up|down") {
		t.Errorf("tunnel path sideways: %d %q", code, e)
	}
}

// siteFile writes the [tunnel] section of one end of a two-path tunnel between lab hosts a
// (side 0) and b (side 1).
func siteFile(t *testing.T, dir string, side int, own session.PrivateKey, peer session.PublicKey) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[tunnel]\nprivate_key = %q\ninterface = \"braid0\"\naddress = [\"10.255.0.%d/24\"]\n", own.String(), side+1)
	fmt.Fprintf(&b, "control = %q\nmetrics = \"127.0.0.1:9473\"\n", filepath.Join(dir, fmt.Sprintf("ctl%d.sock", side)))
	for i := range 2 {
		fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up%d\"\ninterface = \"eth%d\"\naddress = \"10.9.%d.%d\"\n", i, i, i, side+1)
	}
	fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"other\"\npublic_key = %q\nroutes = [\"10.255.0.%d/32\"]\n", peer.String(), 2-side)
	for i := range 2 {
		fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up%d\"\nremote = \"10.9.%d.%d:4754\"\n", i, i, 2-side)
	}
	path := filepath.Join(dir, fmt.Sprintf("site-%d.toml", side))
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The tunnel as an operator runs it: `braid tunnel --config` on two sites, `braid status`,
// Prometheus metrics, and `braid tunnel path down` while traffic flows.
func TestTunnelCommand(t *testing.T) {
	labtest.Require(t)
	tp := &topo.Topology{Name: "tuncli", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	for i := range 2 {
		tp.Links = append(tp.Links, topo.Link{
			A:  topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i))}},
			B:  topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i))}},
			AB: topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}, BA: topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond},
		})
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	ka, _ := session.GenerateKey()
	kb, _ := session.GenerateKey()
	files := []string{siteFile(t, dir, 0, ka, kb.Public()), siteFile(t, dir, 1, kb, ka.Public())}
	logs := make([]*strings.Builder, 2)
	for i, h := range []string{"a", "b"} {
		cmd := exec.Command(self, "tunnel", "--config", files[i])
		logs[i] = &strings.Builder{}
		cmd.Stderr = &lockedWriter{w: logs[i]}
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	status := func() string {
		out, _ := l.Host("a").Run(ctx, self, "status")
		return string(out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(status(), " up ") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("tunnel not up after 10 s; status:\n%s\nlogs a:\n%s\nlogs b:\n%s", status(), logs[0], logs[1])
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Site a's status shows the paths up as soon as the handshake is done, which can be before
	// site b has put its inner address on its device: listen once it is there.
	stop, err := kit.StartServer(ctx, l.Host("b"), "10.255.0.2:5201")
	for errors.Is(err, syscall.EADDRNOTAVAIL) && time.Now().Before(deadline.Add(10*time.Second)) {
		time.Sleep(50 * time.Millisecond)
		stop, err = kit.StartServer(ctx, l.Host("b"), "10.255.0.2:5201")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	out, err := l.Host("a").Run(ctx, self, "tunnel", "path", "down", "other", "1", "--control", filepath.Join(dir, "ctl0.sock"))
	if err != nil {
		t.Fatalf("tunnel path down: %v %s", err, out)
	}
	f, err := traffic.File(ctx, l.Host("a").Dial, "10.255.0.2:5201", traffic.FileOptions{Size: 2 << 20, Seed: 9})
	if err != nil || !f.Intact {
		t.Fatalf("file over the tunnel: %v %v", err, f)
	}
	st := status()
	if !strings.Contains(st, "admin-down") || !strings.Contains(st, "peer other: session") || !strings.Contains(st, "send queue") ||
		!strings.Contains(st, "gaps given up (lost)") {
		t.Errorf("status after path down:\n%s", st)
	}
	if got := l.Links()[0].Stats(0).Packets; got > 200 {
		// probes only: the file went over path 2
		t.Errorf("path 1 carried %d packets after it was set down", got)
	}
	metrics := httpGet(t, ctx, l.Host("a").Dial, "127.0.0.1:9473", "/metrics")
	for _, want := range []string{`braid_tunnel_path_up{peer="other",path="2"`, "braid_tunnel_delivered_total",
		`braid_tunnel_peer_send_queue_bytes{peer="other"}`, `braid_tunnel_peer_reorder_lost_total{peer="other"}`, "braid_tunnel_resent_total"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, metrics)
		}
	}
}

func httpGet(t *testing.T, ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr, path string) string {
	t.Helper()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	return b.String()
}

// lockedWriter lets a process's output be read while it runs.
type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// mpt mode through the command line: two braid endpoints speaking MPT's protocol.
func TestTunnelCommandMPT(t *testing.T) {
	labtest.Require(t)
	tp := &topo.Topology{Name: "tunmpt", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	for i := range 2 {
		tp.Links = append(tp.Links, topo.Link{
			A: topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i))}},
			B: topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i))}},
		})
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	for side, h := range []string{"a", "b"} {
		var b strings.Builder
		fmt.Fprintf(&b, "[tunnel]\nmode = \"mpt\"\naddress = [\"10.255.0.%d/24\"]\ncontrol = %q\n", side+1, filepath.Join(dir, h+".sock"))
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up%d\"\ninterface = \"eth%d\"\naddress = \"10.9.%d.%d\"\n", i, i, i, side+1)
		}
		fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"other\"\nroutes = [\"10.255.0.%d/32\"]\nreorder_window = 64\nkeepalive = \"100ms\"\nremote_tunnel_ip = \"10.255.0.%d\"\n", 2-side, 2-side)
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up%d\"\nremote = \"10.9.%d.%d:4754\"\n", i, i, 2-side)
		}
		file := filepath.Join(dir, h+".toml")
		os.WriteFile(file, []byte(b.String()), 0o600)
		cmd := exec.Command(self, "tunnel", "--config", file)
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop, err := kit.StartServer(ctx, l.Host("b"), "0.0.0.0:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var f traffic.FileResult
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if f, err = traffic.File(ctx, l.Host("a").Dial, "10.255.0.2:5201", traffic.FileOptions{Size: 2 << 20, Seed: 4}); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || !f.Intact {
		t.Fatalf("file over the mpt tunnel: %v %v", err, f)
	}
	out, _ := l.Host("a").Run(ctx, self, "status")
	if !strings.Contains(string(out), "mpt mode") || strings.Count(string(out), " up ") < 2 {
		t.Errorf("status of the mpt tunnel:\n%s", out)
	}
}
