package xdp

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedObjectsMatchSource regenerates the program with gen.go's go:generate line into
// a temporary directory and compares it with the committed lb_bpfel.o and lb_bpfel.go, so that
// the committed object can never drift from lb.c. Without clang the comparison is skipped,
// except under BRAID_LAB_REQUIRED=1 (CI), where that is a failure.
func TestGeneratedObjectsMatchSource(t *testing.T) {
	if _, err := exec.LookPath("clang"); err != nil {
		if os.Getenv("BRAID_LAB_REQUIRED") == "1" {
			t.Fatalf("BRAID_LAB_REQUIRED=1 but clang is absent (scripts/deps.sh installs it): %v", err)
		}
		t.Skipf("clang is absent, the committed objects cannot be checked: %v", err)
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "//go:generate go run github.com/cilium/ebpf/cmd/bpf2go "
	var line string
	for _, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(l, prefix) {
			line = strings.TrimPrefix(l, prefix)
		}
	}
	if line == "" {
		t.Fatal("gen.go has no bpf2go go:generate line")
	}
	dir := t.TempDir()
	args := append([]string{"run", "github.com/cilium/ebpf/cmd/bpf2go", "-output-dir", dir}, splitQuoted(line)...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOPACKAGE=xdp", "GOFILE=gen.go")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bpf2go: %v\n%s", err, out)
	}
	for _, f := range []string{"lb_bpfel.o", "lb_bpfel.go"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("committed %s differs from what lb.c compiles to: run 'go generate ./internal/lb/xdp'", f)
		}
	}
}

// splitQuoted splits s at spaces outside double quotes, removing the quotes.
func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	in, any := false, false
	for _, r := range s {
		switch {
		case r == '"':
			in, any = !in, true
		case r == ' ' && !in:
			if any {
				out = append(out, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if any {
		out = append(out, cur.String())
	}
	return out
}
