package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"braid/internal/tunnel/session"
)

func TestKeygen(t *testing.T) {
	code, out, _ := run("keygen")
	priv, err := session.ParsePrivateKey(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("keygen: %d %q %v", code, out, err)
	}
	var o, e bytes.Buffer
	if code := Main([]string{"keygen", "--public"}, strings.NewReader(out), &o, &e); code != 0 {
		t.Fatalf("keygen --public: %d %s", code, e.String())
	}
	if strings.TrimSpace(o.String()) != priv.Public().String() {
		t.Errorf("public key %q, want %q", o.String(), priv.Public())
	}
	if code := Main([]string{"keygen", "--public"}, strings.NewReader("not a key\n"), &o, &e); code != exitError {
		t.Errorf("keygen --public with garbage: %d", code)
	}
	if _, out2, _ := run("keygen"); out2 == out {
		t.Error("two keys are equal")
	}

	file := filepath.Join(t.TempDir(), "site.key")
	if code, _, e := run("keygen", "--out", file); code != 0 {
		t.Fatalf("keygen --out: %d %s", code, e)
	}
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v mode %v", err, st.Mode())
	}
	if code, _, e := run("keygen", "--out", file); code == 0 || !strings.Contains(e, "exists") {
		t.Errorf("keygen --out over an existing file: %d %q", code, e)
	}
}
