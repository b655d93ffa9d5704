package app

import (
	"runtime"
	"strings"
	"testing"
)

// TestVersion checks 'braid version': the version and commit injected with -ldflags -X (as the
// Makefile does), and the Go version, each on its own line.
func TestVersion(t *testing.T) {
	defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
	Version, Commit = "v1.2.3-4-gabcdef0-dirty", "abcdef0123456789abcdef0123456789abcdef01"
	for _, arg := range []string{"version", "--version"} {
		code, out, errOut := run(arg)
		want := "braid v1.2.3-4-gabcdef0-dirty\ncommit abcdef0123456789abcdef0123456789abcdef01\nbuilt with " +
			runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\ntunnel protocol versions 2,3,4\n"
		if code != exitOK || out != want || errOut != "" {
			t.Errorf("braid %s: code %d, stdout %q, stderr %q; want code 0, stdout %q", arg, code, out, errOut, want)
		}
	}
	// Without an injected commit the build information's revision is used; a test binary
	// has none, which is said plainly.
	Commit = ""
	if _, out, _ := run("version"); !strings.Contains(out, "\ncommit ") || strings.Contains(out, "\ncommit \n") {
		t.Errorf("braid version without a commit: %q", out)
	}
}
