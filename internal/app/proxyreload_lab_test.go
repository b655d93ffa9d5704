package app

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/federation"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/proxy/ident"
	"braid/internal/traffic"
)

// TestProxyReload reloads a running proxy (p1) while a download of tenant blue runs through
// it: the reload (SIGHUP) replaces tenant red's peer site2 by a new peer site3. The download
// is not interrupted (every byte intact, no reset), red's connection to the removed peer is
// cut, red's pool now serves site3; then a file with a mistake, applied with 'braid proxy
// reload', is refused with its file:line and the running configuration stays as it was.
func TestProxyReload(t *testing.T) {
	labtest.Require(t)
	// One 100 Mbit/s WAN link: the download lasts a few seconds, long enough to reload under it.
	l := labtest.Up(t, federation.FederationTopology("preload", true, topo.Shape{Rate: 100e6}))
	c, p1h, p2h, s := l.Host("c"), l.Host("p1"), l.Host("p2"), l.Host("s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		t.Fatal(err)
	}
	k3, _ := ident.Generate()
	self, _ := os.Executable()
	t.Setenv("BRAID_TEST_MAIN", "1")
	dir := t.TempDir()
	site1 := string(federation.FedSite{Side: 1, Links: 1, Key: k1, PeerKey: k2.Public()}.Bytes())
	p1, err := roles.StartProxy(p1h, self, dir, []byte(site1))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := roles.StartProxy(p2h, self, dir, federation.FedSite{Side: 2, Links: 1, Key: k2, PeerKey: k1.Public()}.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p1.Stop()
		p2.Stop()
		if t.Failed() {
			t.Logf("p1 log:\n%s\np2 log:\n%s", p1.Log(), p2.Log())
		}
	})
	if err := roles.WaitProxyPair(ctx, p1, p2, true, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	stop, err := kit.StartServer(ctx, s, federation.FedServer4+":5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	origin := &originServer{}
	origin.serve(t, s, federation.FedServerRed+":5300")

	// Red's connection to site2, open across the reload.
	_, redConn, err := whoamiFrom(ctx, c, federation.FedClientRed, federation.FedServerRed+":5300")
	if err != nil {
		t.Fatalf("red before the reload: %v", err)
	}
	defer redConn.Close()

	type result struct {
		r   traffic.FileResult
		err error
	}
	const size = 96 << 20
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		r, err := traffic.File(ctx, c.Dial, federation.FedServer4+":5201", traffic.FileOptions{Size: size, Seed: 18, Reverse: true})
		done <- result{r, err}
	}()
	time.Sleep(1500 * time.Millisecond)

	// Red's peer site2 goes, site3 comes (an address nobody answers: its pool keeps trying).
	i := strings.Index(site1, "[[proxy.tenant]]\nname = \"red\"")
	if i < 0 {
		t.Fatalf("no tenant red in\n%s", site1)
	}
	reloaded := site1[:i] + fmt.Sprintf(`[[proxy.tenant]]
name = "red"
networks = ["10.1.1.0/24"]
port = %d
peer_port = %d
  [[proxy.tenant.peer]]
  name = "site3"
  address = ["10.9.0.3:%d"]
  networks = ["10.3.1.0/24"]
  public_key = %q
`, federation.FedRedPort, federation.FedRedPeer, federation.FedRedPeer, k3.Public().String())
	if err := os.WriteFile(p1.File, []byte(reloaded), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p1.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p1.Log(), "msg=reloaded") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(p1.Log(), "msg=reloaded") {
		t.Fatal("SIGHUP: no reload logged")
	}
	reloadAt := time.Since(start)
	select {
	case r := <-done:
		t.Fatalf("the download ended (%v, %v) before the reload: the test would prove nothing", r.r, r.err)
	default:
	}
	t.Logf("reloaded after %.1f s of the download", reloadAt.Seconds())

	// What a user checks: red's old connection is cut, the pools follow the file.
	redConn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := redConn.Write([]byte("after\n")); err == nil {
		_, err = redConn.Read(make([]byte, 64))
		if err == nil || strings.Contains(err.Error(), "timeout") {
			t.Errorf("red's connection to the removed peer still works after the reload (%v)", err)
		}
	}
	peersOf := func() map[string][]string {
		st, err := roles.ProxyStatus(ctx, p1h)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, tn := range st.Proxy.Tenants {
			for name := range tn.PoolReady {
				out[tn.Name] = append(out[tn.Name], name)
			}
			slices.Sort(out[tn.Name])
		}
		return out
	}
	after := peersOf()
	if fmt.Sprint(after) != "map[blue:[site2] red:[site3]]" {
		t.Errorf("peers after the reload: %v, want blue: site2, red: site3", after)
	}

	// A file with a mistake: refused with its line, nothing changes.
	lines := strings.Split(reloaded, "\n")
	bad := -1
	for j, ln := range lines {
		if strings.HasPrefix(ln, "  networks = [\"10.3.1.0/24\"]") {
			lines[j], bad = "  networks = [\"10.3.1.0/33\"]", j+1
		}
	}
	if bad < 0 {
		t.Fatal("no line to break")
	}
	if err := os.WriteFile(p1.File, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := p1h.Run(ctx, self, "proxy", "reload")
	want := fmt.Sprintf("%s:%d", p1.File, bad)
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("braid proxy reload of a broken file: %v\n%s\nwant a refusal naming %s", err, out, want)
	}
	if now := peersOf(); fmt.Sprint(now) != fmt.Sprint(after) {
		t.Errorf("a refused reload changed the peers: %v -> %v", after, now)
	}
	if !strings.Contains(p1.Log(), "reload refused") {
		t.Error("the refusal is not logged")
	}
	// The good file again, with the command: applied, and it changes nothing.
	if err := os.WriteFile(p1.File, []byte(reloaded), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := p1h.Run(ctx, self, "proxy", "reload"); err != nil || !strings.Contains(string(out), "nothing changed") {
		t.Errorf("braid proxy reload of the running file: %v %s", err, out)
	}

	r := <-done
	if r.err != nil {
		t.Fatalf("the download across the reload: %v", r.err)
	}
	if !r.r.Intact {
		t.Errorf("the download across the reload: %v", r.r)
	}
	t.Logf("download of %d MiB across the reload: %v (%.1f s)", size>>20, r.r, time.Since(start).Seconds())
	// And blue still serves a new connection.
	if r, err := traffic.File(ctx, c.Dial, federation.FedServer4+":5201", traffic.FileOptions{Size: 1 << 20, Seed: 19}); err != nil || !r.Intact {
		t.Errorf("blue after the reloads: %v %v", r, err)
	}
}
