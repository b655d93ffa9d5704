package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"braid/internal/config"
	"braid/internal/lab/labtest"
)

// A control socket file is never, not even for an instant, a socket others may connect to
// (issue 18 item 15): with the process's umask at 0, a watcher that examines the path as fast
// as it can while the socket is made, again and again, sees only mode 0600; the directory made
// for it is 0700. Another user (nobody) is refused on a socket file in a directory open to it,
// and on an abstract socket, which has no file mode (the peer's credentials are checked).
func TestControlSocketPrivate(t *testing.T) {
	labtest.Require(t) // needs root to run a command as another user
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	old := syscall.Umask(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := filepath.Join(dir, "run", "braid", "ctl.sock")
	var wrong atomic.Value
	var seen atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
				seen.Add(1)
				if p := fi.Mode().Perm(); p != 0o600 {
					wrong.Store(fmt.Sprintf("%04o", p))
				}
			}
		}
	})
	for range 300 {
		stop, err := serveControl(ctx, sock, func(pathRequest) error { return nil }, nil)
		if err != nil {
			close(done)
			syscall.Umask(old)
			t.Fatal(err)
		}
		stop()
	}
	close(done)
	wg.Wait()
	syscall.Umask(old)
	if w := wrong.Load(); w != nil {
		t.Errorf("the control socket was seen with mode %s (want only 0600), umask 0", w)
	}
	if seen.Load() == 0 {
		t.Error("the watcher never saw the socket: it watched nothing")
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory made for the socket: %v %v, want mode 0700", fi.Mode().Perm(), err)
	}
	t.Logf("the socket was examined %d times while it existed, 300 starts", seen.Load())

	// Another user: the socket file in a directory it may enter, and an abstract socket.
	os.Chmod(filepath.Dir(sock), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(sock)), 0o755)
	self, _ := os.Executable()
	bin := filepath.Join(dir, "braid")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{sock, fmt.Sprintf("@braid-test/%x", rand.Uint64())} {
		stop, err := serveControl(ctx, s, func(pathRequest) error { return nil }, func() any { return statusReport{Role: "tunnel"} })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := controlStatus(s); err != nil {
			t.Errorf("%s: root is refused: %v", s, err)
		}
		cmd := braidCmd(bin, "status", "--control", s)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Run()
		stop()
		if err == nil || !strings.Contains(strings.ToLower(out.String()), "permission denied") {
			t.Errorf("%s: braid status as nobody: %v %q, want a refusal (permission denied)", s, err, out.String())
		} else {
			t.Logf("%s as nobody: %s", s, strings.TrimSpace(out.String()))
		}
	}
}

// A metrics address that is not loopback and key files that others may read are warned of at
// start; loopback metrics and a 0600 key are not.
func TestExposureWarnings(t *testing.T) {
	dir := t.TempDir()
	open, private := filepath.Join(dir, "open.key"), filepath.Join(dir, "private.key")
	os.WriteFile(open, []byte("k\n"), 0o644)
	os.WriteFile(private, []byte("k\n"), 0o600)
	os.Chmod(open, 0o644) // whatever the umask
	for _, c := range []struct {
		metrics string
		keys    []string
		want    []string
	}{
		{"127.0.0.1:9473", []string{private}, nil},
		{"[::1]:9473", nil, nil},
		{"localhost:9473", nil, nil},
		{"", []string{private}, nil},
		{"0.0.0.0:9473", nil, []string{"0.0.0.0:9473 is not loopback"}},
		{":9473", nil, []string{"is not loopback"}},
		{"192.0.2.1:9473", []string{open}, []string{"192.0.2.1:9473 is not loopback", "open.key has mode 0644"}},
		{"127.0.0.1:9473", []string{open, filepath.Join(dir, "missing.key")}, []string{"open.key has mode 0644", "missing.key"}},
	} {
		var b bytes.Buffer
		warnExposure(slog.New(slog.NewTextHandler(&b, nil)), c.metrics, c.keys...)
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		if b.Len() == 0 {
			lines = nil
		}
		if len(lines) != len(c.want) {
			t.Errorf("metrics %q keys %v: %d warnings, want %d:\n%s", c.metrics, c.keys, len(lines), len(c.want), b.String())
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], w) {
				t.Errorf("metrics %q keys %v: warning %q, want a WARN containing %q", c.metrics, c.keys, lines[i], w)
			}
		}
	}
}

// A tunnel in mode mpt says at start, at WARN, that it has no authentication (issue 18 item
// 13); braid mode does not, and warns of its key file when others may read it.
func TestTunnelStartWarnings(t *testing.T) {
	key := filepath.Join(t.TempDir(), "site.key")
	os.WriteFile(key, []byte("k\n"), 0o600)
	os.Chmod(key, 0o640)
	for _, c := range []struct {
		cfg  config.Tunnel
		want []string
	}{
		{config.Tunnel{Mode: config.ModeMPT, Metrics: netip.MustParseAddrPort("127.0.0.1:9473")}, []string{"NO AUTHENTICATION"}},
		{config.Tunnel{Mode: config.ModeBraid, Braid: &config.BraidSettings{PrivateKeyFile: key}}, []string{"site.key has mode 0640"}},
		{config.Tunnel{Mode: config.ModeBraid, Metrics: netip.MustParseAddrPort("0.0.0.0:9473")}, []string{"is not loopback"}},
	} {
		var b bytes.Buffer
		tunnelStartWarnings(slog.New(slog.NewTextHandler(&b, nil)), &c.cfg)
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		if b.Len() == 0 {
			lines = nil
		}
		if len(lines) != len(c.want) {
			t.Errorf("mode %s: %d warnings, want %d:\n%s", c.cfg.Mode, len(lines), len(c.want), b.String())
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], w) {
				t.Errorf("mode %s: %q, want a WARN containing %q", c.cfg.Mode, lines[i], w)
			}
		}
	}
}
