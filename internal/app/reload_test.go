package app

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestReloadCommands: 'braid ROLE reload' of lb, mapserver, xtr and pm documents itself, takes
// no arguments, and says when the role is not running (exit 1).
func TestReloadCommands(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, role := range []string{"lb", "mapserver", "xtr", "pm"} {
		code, out, _ := run(role, "reload", "--help")
		if code != exitOK || !strings.Contains(out, "braid "+role+" reload [--control SOCKET]") || !strings.Contains(out, "'reload' (or SIGHUP to the daemon)") {
			t.Errorf("braid %s reload --help: %d %q", role, code, out)
		}
		if code, _, errOut := run(role, "reload", "extra"); code != exitUsage || !strings.Contains(errOut, "no arguments expected") {
			t.Errorf("braid %s reload extra: %d %q", role, code, errOut)
		}
		if code, _, errOut := run(role, "reload", "--control", sock); code != exitError || !strings.Contains(errOut, "is the "+role+" running?") {
			t.Errorf("braid %s reload, nothing running: %d %q", role, code, errOut)
		}
	}
}
