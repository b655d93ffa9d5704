package app

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"braid/internal/config"
)

// The MPT configuration of internal/config/mptconf's tests.
var (
	mptDir       = filepath.Join("..", "config", "mptconf", "testdata", "conf")
	mptInterface = filepath.Join(mptDir, "interface.conf")
	mptSiteB     = filepath.Join(mptDir, "connections", "site-b.conf")
	mptIPv4      = filepath.Join(mptDir, "connections", "ipv4.conf")
)

// anyMachine has every interface and no files.
type anyMachine struct{}

func (anyMachine) InterfaceExists(string) bool { return true }

func (anyMachine) ReadFile(string) ([]byte, error) { return nil, os.ErrNotExist }

// importMPT runs 'braid tunnel import-mpt' through Main.
func importMPT(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return run(append([]string{"tunnel", "import-mpt"}, args...)...)
}

func TestImportMPT(t *testing.T) {
	code, out, errOut := importMPT(t, "--interface", mptInterface, mptSiteB, mptIPv4)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	cfg, err := config.LoadTunnel("site.toml", []byte(out), anyMachine{})
	if err != nil {
		t.Fatalf("the output does not load: %v\n%s", err, out)
	}
	if cfg.Mode != config.ModeMPT || len(cfg.Uplinks) != 3 || len(cfg.Peers) != 2 {
		t.Errorf("mode %s, %d uplinks, %d peers", cfg.Mode, len(cfg.Uplinks), len(cfg.Peers))
	}
	if p := cfg.Peers[0]; p.Name != "site-b" || p.Paths[1].Remote != netip.MustParseAddrPort("198.51.100.130:23456") || p.MPT.ReorderWindow != 900 {
		t.Errorf("peer %+v", p)
	}
	// The command ports and the control plane's authentication are carried over.
	if m := cfg.Peers[0].MPT; m.CmdPort != 60456 || m.RemoteCmdPort != 60456 || m.AuthType != 2 || len(m.AuthKey) != 16 {
		t.Errorf("command port settings %d %d %d %x", m.CmdPort, m.RemoteCmdPort, m.AuthType, m.AuthKey)
	}
	if strings.Contains(errOut, "cmdport_local") || strings.Contains(errOut, "remote_cmd_port") {
		t.Errorf("the command ports are warned away:\n%s", errOut)
	}
	// Warnings on stderr as file:line: warning: ...
	for _, want := range []string{
		mptSiteB + ":17: warning: auth_type 2",
		mptSiteB + ":39: warning: [path_1] gw_ipaddr 0.0.0.0",
		mptIPv4 + ":3: warning: no ip_ver",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}

	// --out writes the file, flags may follow the connection files, and an existing file is
	// not overwritten.
	dst := filepath.Join(t.TempDir(), "site.toml")
	if code, _, errOut := importMPT(t, mptSiteB, "--interface", mptInterface, "--out", dst); code != exitOK {
		t.Fatalf("--out: exit %d, %s", code, errOut)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the site file, holding auth_key, is not readable by its owner only: %v", fi.Mode())
	}
	data, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadTunnel(dst, data, anyMachine{}); err != nil {
		t.Errorf("--out file does not load: %v", err)
	}
	if code, _, errOut := importMPT(t, "--interface", mptInterface, "--out", dst, mptSiteB); code != exitError || !strings.Contains(errOut, "exists") {
		t.Errorf("existing --out: exit %d, %s", code, errOut)
	}
	if after, _ := os.ReadFile(dst); !bytes.Equal(after, data) {
		t.Error("the existing file was changed")
	}
}

func TestImportMPTErrors(t *testing.T) {
	if code, out, _ := importMPT(t, "--help"); code != exitOK || !strings.Contains(out, "Usage") || !strings.Contains(out, "Example") {
		t.Errorf("--help: exit %d, %q", code, out)
	}
	if code, _, errOut := importMPT(t, mptSiteB); code != exitUsage || !strings.Contains(errOut, "--interface") {
		t.Errorf("without --interface: exit %d, %s", code, errOut)
	}
	if code, _, _ := importMPT(t, "--interface", mptInterface); code != exitUsage {
		t.Errorf("without connection files: exit %d", code)
	}
	if code, _, _ := importMPT(t, "--bogus", "--interface", mptInterface, mptSiteB); code != exitUsage {
		t.Errorf("unknown flag: exit %d", code)
	}

	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.conf")
	if code, _, errOut := importMPT(t, "--interface", mptInterface, missing); code != exitError || !strings.Contains(errOut, missing) {
		t.Errorf("missing file: exit %d, %s", code, errOut)
	}
	bad := filepath.Join(dir, "bad.conf")
	os.WriteFile(bad, []byte("[connection]\nname = x\nthis is not ini\n"), 0o644)
	if code, _, errOut := importMPT(t, "--interface", mptInterface, bad); code != exitError || !strings.Contains(errOut, bad+":3: ") {
		t.Errorf("malformed file: exit %d, %s", code, errOut)
	}
	// interface.conf given as a connection file.
	if code, _, errOut := importMPT(t, "--interface", mptInterface, mptInterface); code != exitError || !strings.Contains(errOut, "no [connection] section") {
		t.Errorf("interface.conf as a connection: exit %d, %s", code, errOut)
	}
	// A value braid refuses: the error names the MPT file and line.
	refused := filepath.Join(dir, "refused.conf")
	os.WriteFile(refused, []byte("[connection]\nip_local = 10.0.0.9\nip_remote = 10.0.0.1\n[path_0]\ninterface_name = eth1\nprivate_ipaddr = 192.0.2.1\nremote_ipaddr = 198.51.100.1\n"), 0o644)
	if code, out, errOut := importMPT(t, "--interface", mptInterface, refused); code != exitError || out != "" || !strings.Contains(errOut, refused+":2: ") {
		t.Errorf("refused value: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
}

// The command itself, whether or not 'braid tunnel' dispatches it yet.
func TestTunnelImportMPTDirect(t *testing.T) {
	var o, e bytes.Buffer
	code := tunnelImportMPT(env{stdin: strings.NewReader(""), stdout: &o, stderr: &e}, []string{"--interface", mptInterface, mptSiteB})
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e.String())
	}
	if _, err := config.LoadTunnel("site.toml", o.Bytes(), anyMachine{}); err != nil {
		t.Errorf("the output does not load: %v", err)
	}
}
