// Package archtest enforces the import rules of docs/ARCHITECTURE.md, and the formatting and
// vetting that reviewers should not have to check.
package archtest

import (
	"go/build"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "braid"

// goFile is one non-generated Go file of the module.
type goFile struct {
	path    string // relative to the module root, slash-separated
	pkg     string // import path of its directory
	test    bool
	imports []string
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", dir, err)
	}
	return dir
}

func goFiles(t *testing.T) []goFile {
	t.Helper()
	root := moduleRoot(t)
	var out []goFile
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		gf := goFile{path: rel, pkg: module + "/" + filepath.ToSlash(filepath.Dir(rel)), test: strings.HasSuffix(p, "_test.go")}
		if filepath.Dir(rel) == "." {
			gf.pkg = module
		}
		for _, im := range f.Imports {
			v, _ := strconv.Unquote(im.Path.Value)
			gf.imports = append(gf.imports, v)
		}
		out = append(out, gf)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no Go files found")
	}
	return out
}

func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".") && first != module
}

func under(pkg, prefix string) bool { return pkg == prefix || strings.HasPrefix(pkg, prefix+"/") }

// Codecs import only the standard library and other codecs.
func TestWireImportsOnlyStd(t *testing.T) {
	for _, f := range goFiles(t) {
		if f.test || !under(f.pkg, "braid/internal/wire") {
			continue
		}
		for _, im := range f.imports {
			if !isStd(im) && !under(im, "braid/internal/wire") {
				t.Errorf("%s imports %s: codecs import only the standard library and other codecs", f.path, im)
			}
			if im == "log" || im == "log/slog" || im == "fmt" {
				t.Errorf("%s imports %s: codecs neither log nor format per packet", f.path, im)
			}
		}
	}
}

// Data paths never import config, app, lab or a logger.
var dataPaths = []string{"braid/internal/tunnel/dp", "braid/internal/sock", "braid/internal/tun", "braid/internal/lb/xdp", "braid/internal/lab/emu"}

func TestDataPathImports(t *testing.T) {
	banned := []string{"braid/internal/config", "braid/internal/app", "braid/internal/lab/scenario", "log", "log/slog"}
	for _, f := range goFiles(t) {
		if f.test {
			continue
		}
		for _, dp := range dataPaths {
			if !under(f.pkg, dp) {
				continue
			}
			for _, im := range f.imports {
				for _, b := range banned {
					if im == b || strings.HasPrefix(im, b+"/") {
						t.Errorf("%s imports %s: data paths get snapshots from control, never config, app or a logger", f.path, im)
					}
				}
				if under(im, "braid/internal/lab") && !under(f.pkg, "braid/internal/lab") {
					t.Errorf("%s imports %s: data paths never import the lab", f.path, im)
				}
			}
		}
	}
}

// Algorithms are pure: no I/O, no clock of their own.
var algorithms = []string{"braid/internal/sched", "braid/internal/tunnel/reorder", "braid/internal/tunnel/path", "braid/internal/mptcp/pm/core"}

func TestAlgorithmsArePure(t *testing.T) {
	banned := []string{"net", "os", "syscall", "golang.org/x/sys", "log", "log/slog", "os/exec"}
	for _, f := range goFiles(t) {
		if f.test {
			continue
		}
		for _, a := range algorithms {
			if !under(f.pkg, a) {
				continue
			}
			for _, im := range f.imports {
				for _, b := range banned {
					if under(im, b) {
						t.Errorf("%s imports %s: algorithms are pure functions, I/O stays outside", f.path, im)
					}
				}
			}
		}
	}
}

// The lab is imported only by tests, benchmarks, the lab itself and internal/app/lab.go.
func TestLabImporters(t *testing.T) {
	for _, f := range goFiles(t) {
		if f.test || under(f.pkg, "braid/internal/lab") || under(f.pkg, "braid/bench") || f.path == "internal/app/lab.go" {
			continue
		}
		for _, im := range f.imports {
			if under(im, "braid/internal/lab") {
				t.Errorf("%s imports %s: only tests, benchmarks and internal/app/lab.go may import the lab", f.path, im)
			}
		}
	}
}

// Only internal/app and cmd/braid build the program; nothing imports app.
func TestNothingImportsApp(t *testing.T) {
	for _, f := range goFiles(t) {
		if f.pkg == "braid/cmd/braid" || under(f.pkg, "braid/internal/app") {
			continue
		}
		for _, im := range f.imports {
			if under(im, "braid/internal/app") {
				t.Errorf("%s imports %s: app is the composition root", f.path, im)
			}
		}
	}
}

func TestGofmt(t *testing.T) {
	root := moduleRoot(t)
	for _, f := range goFiles(t) {
		src, err := os.ReadFile(filepath.Join(root, f.path))
		if err != nil {
			t.Fatal(err)
		}
		out, err := format.Source(src)
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
			continue
		}
		if string(out) != string(src) {
			t.Errorf("%s is not gofmt-formatted (run gofmt -w %s)", f.path, f.path)
		}
	}
}

func TestVet(t *testing.T) {
	goBin := filepath.Join(build.Default.GOROOT, "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "vet", "./...")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go vet ./...: %v\n%s", err, out)
	}
}
