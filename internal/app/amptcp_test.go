package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// braid pm check accepts an amptcp section; --policy amptcp on a file without resolvers is a
// usage error that says what is missing.
func TestPMCheckAMPTCP(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "amptcp.toml")
	os.WriteFile(good, []byte("[pm]\npolicy = \"amptcp\"\nresolvers = [\"10.0.9.1\"]\nrouting = \"bound\"\neid_prefixes = [\"192.168.0.0/16\"]\n"+
		"[[pm.uplink]]\nname = \"lo\"\ninterface = \"lo\"\naddress = \"127.0.0.1\"\n"), 0o644)
	if code, out, errOut := run("pm", "check", "--config", good); code != exitOK || !strings.Contains(out, "valid (policy amptcp, 1 uplinks)") {
		t.Errorf("good file: %d %q %q", code, out, errOut)
	}
	plain := filepath.Join(dir, "plain.toml")
	os.WriteFile(plain, []byte("[pm]\n[[pm.uplink]]\nname = \"lo\"\ninterface = \"lo\"\naddress = \"127.0.0.1\"\n"), 0o644)
	if code, _, errOut := run("pm", "--config", plain, "--policy", "amptcp"); code != exitUsage || !strings.Contains(errOut, "amptcp without resolvers") {
		t.Errorf("amptcp without resolvers: %d %q", code, errOut)
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[pm]\npolicy = \"amptcp\"\n[[pm.uplink]]\nname = \"lo\"\ninterface = \"lo\"\naddress = \"127.0.0.1\"\n"), 0o644)
	if code, _, errOut := run("pm", "check", "--config", bad); code != exitError || !strings.Contains(errOut, "bad.toml:2: pm: policy amptcp needs resolvers") {
		t.Errorf("bad file: %d %q", code, errOut)
	}
}
