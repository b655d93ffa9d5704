package page

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// The page and its files are served with the policy that keeps the browser on this origin, and
// with the content types a browser needs to run them; a path that is not the page's is 404.
func TestPageServed(t *testing.T) {
	mux := http.NewServeMux()
	Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, want := range map[string]struct{ ctype, body string }{
		"/":             {"text/html", `<script src="ui/app.js"`},
		"/ui/app.js":    {"javascript", "status.json"},
		"/ui/style.css": {"text/css", "canvas.chart"},
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want.ctype) || !strings.Contains(string(body), want.body) {
			t.Errorf("GET %s: %s, %q, body lacks %q", path, resp.Status, resp.Header.Get("Content-Type"), want.body)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: policy %q does not keep the page on its origin", path, csp)
		}
	}
	for _, path := range []string{"/nothing", "/ui/../page.go", "/ui/missing.js"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
}

// No embedded file names another host: no http(s):// or protocol-relative URL in an
// attribute, a fetch or an import (the policy would block it; this says which file).
func TestPageNamesNoOtherHost(t *testing.T) {
	remote := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|src\s*=\s*["']//`)
	n := 0
	fs.WalkDir(files, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, _ := files.ReadFile(p)
		for i, line := range strings.Split(string(b), "\n") {
			code := line
			if strings.HasSuffix(p, ".js") {
				code, _, _ = strings.Cut(line, "// ") // comments may mention anything
			}
			if m := remote.FindString(code); m != "" {
				t.Errorf("%s:%d names another host or import (%q): %s", p, i+1, m, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if n != 3 {
		t.Errorf("%d embedded files, want 3 (index.html, app.js, style.css)", n)
	}
}
