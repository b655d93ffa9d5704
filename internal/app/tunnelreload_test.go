package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/config"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// SIGHUP stops no daemon: it runs the role's reload, or logs that there is none. (The signals
// come on a channel of the test's: in a test binary that has run a lab test, a real SIGHUP
// is the lab's, which removes the labs and ends the process.)
func TestSignalHangupDoesNotStop(t *testing.T) {
	var sb strings.Builder
	lw := &lockedWriter{w: &sb}
	logged := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return sb.String() }
	sig := make(chan os.Signal, 1)
	ctx, cancel := withHangup(context.Background(), sig, "braid test", slog.New(slog.NewTextHandler(lw, nil)), "site.toml")
	defer cancel()
	sig <- syscall.SIGHUP
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(logged(), "not supported for braid test"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line after SIGHUP: %q", logged())
		}
	}
	got := make(chan string, 1)
	onHangup(ctx, func(file string) { got <- file })
	sig <- syscall.SIGHUP
	select {
	case f := <-got:
		if f != "site.toml" {
			t.Errorf("reload of %q, want site.toml", f)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("SIGHUP did not run the reload")
	}
	if ctx.Err() != nil {
		t.Fatal("SIGHUP ended the context")
	}
}

func TestReloadRestartOnly(t *testing.T) {
	load := func(t *testing.T) *config.Tunnel {
		t.Helper()
		data, err := os.ReadFile("../config/testdata/site-a.toml")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.LoadTunnel("site-a.toml", data, reloadEnv{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	for _, tc := range []struct {
		name   string
		change func(c *config.Tunnel)
		want   string // "" applies
	}{
		{"nothing", func(*config.Tunnel) {}, ""},
		{"peers", func(c *config.Tunnel) { c.Peers = c.Peers[:0] }, ""},
		{"uplinks and scheduler", func(c *config.Tunnel) { c.Uplinks = c.Uplinks[:1]; c.Scheduler = "wrr" }, ""},
		{"interface", func(c *config.Tunnel) { c.Interface = "other0" }, "interface changed"},
		{"mtu and probe interval", func(c *config.Tunnel) { c.MTU = 1300; c.Braid.ProbeInterval = time.Second }, "mtu, probe_interval changed"},
		{"encryption", func(c *config.Tunnel) { c.Braid.Encryption = !c.Braid.Encryption }, "encryption changed"},
		{"shards", func(c *config.Tunnel) { c.Braid.Shards = 3 }, "shards changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := load(t), load(t)
			tc.change(cur)
			err := restartOnly(old, cur)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tunnel.ErrReloadNeedsRestart)):
				t.Errorf("got %v, want %q and ErrReloadNeedsRestart", err, tc.want)
			}
		})
	}
}

// reloadEnv is a machine with every interface, and a key in every file.
type reloadEnv struct{}

func (reloadEnv) InterfaceExists(string) bool { return true }

func (reloadEnv) ReadFile(string) ([]byte, error) { return []byte(testKey.String() + "\n"), nil }

var testKey, _ = session.GenerateKey()
