package app

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestMain lets tests run this test binary as the braid command (BRAID_TEST_MAIN=1), so that the
// command's own re-executions (lab up --detach) and privilege checks are exercised for real.
func TestMain(m *testing.M) {
	if os.Getenv("BRAID_TEST_MAIN") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// run calls Main in process and returns the exit code and both streams.
func run(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = Main(args, strings.NewReader(""), &o, &e)
	return code, o.String(), e.String()
}

func TestTopLevelHelp(t *testing.T) {
	code, out, _ := run("--help")
	if code != 0 || !strings.Contains(out, "lab") || !strings.Contains(out, "Usage") {
		t.Errorf("braid --help: code %d, output %q", code, out)
	}
	if code, _, errOut := run("frobnicate"); code != exitUsage || !strings.Contains(errOut, "frobnicate") {
		t.Errorf("unknown command: code %d, stderr %q", code, errOut)
	}
	if code, _, _ := run(); code != exitUsage {
		t.Errorf("no command: code %d", code)
	}
	if code, out, _ := run("version"); code != 0 || !strings.HasPrefix(out, "braid ") {
		t.Errorf("version: %d %q", code, out)
	}
}
