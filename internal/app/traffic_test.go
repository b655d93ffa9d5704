package app

import (
	"strings"
	"testing"
)

// braid traffic serve --cc: a congestion control the kernel does not offer stops the server at
// start, naming it; bulk --cc with --reverse points at the server's --cc, since the server sends.
func TestTrafficCCFlags(t *testing.T) {
	code, _, errOut := run("traffic", "serve", "--listen", "127.0.0.1:0", "--udp", "off", "--cc", "no-such-cc")
	if code == exitOK || !strings.Contains(errOut, "no-such-cc") {
		t.Errorf("serve --cc no-such-cc: code %d, stderr %q; want a failure naming it", code, errOut)
	}
	code, _, errOut = run("traffic", "bulk", "127.0.0.1", "--cc", "cubic", "--reverse")
	if code != exitUsage || !strings.Contains(errOut, "braid traffic serve --cc") {
		t.Errorf("bulk --cc --reverse: code %d, stderr %q; want a usage error naming serve --cc", code, errOut)
	}
	code, out, _ := run("traffic", "serve", "--help")
	if code != exitOK || !strings.Contains(out, "--cc") {
		t.Errorf("serve --help: code %d, no --cc in %q", code, out)
	}
}
