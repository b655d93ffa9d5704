// Package archtest enforces the import rules of docs/ARCHITECTURE.md, and the formatting and
// vetting that reviewers should not have to check.
package archtest

import (
	"fmt"
	"go/build"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
//
// dataPaths are the packages that are data path through and through; mixedDataPaths keep
// their hot loops beside the control code that owns them (the tunnel's loops.go beside the
// peers and handshakes, the xTR's encapsulation loops beside the map-cache), so the package
// imports neither config, app nor the lab, and the named files import no logger either.
var dataPaths = []string{"braid/internal/sock", "braid/internal/tun", "braid/internal/lb/xdp", "braid/internal/lab/emu", "braid/internal/tunnel/session"}

var mixedDataPaths = []struct {
	pkg   string
	files []string // the hot loops, relative to the module root
}{
	{"braid/internal/tunnel", []string{"internal/tunnel/loops.go", "internal/tunnel/flight.go", "internal/tunnel/pmtu.go"}},
	{"braid/internal/lisp/xtr", []string{"internal/lisp/xtr/run.go", "internal/lisp/xtr/socket.go", "internal/lisp/xtr/select.go"}},
}

// dataPathViolations returns what breaks the data-path rule in files, and every rule that names
// a package or file which does not exist (such a rule would check nothing).
func dataPathViolations(files []goFile) []string {
	var out []string
	pkgs, paths := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		if !f.test {
			pkgs[f.pkg], paths[f.path] = true, true
		}
	}
	control := []string{"braid/internal/config", "braid/internal/app", "braid/internal/lab/scenario"}
	check := func(f goFile, noLogger bool) {
		for _, im := range f.imports {
			banned := slices.ContainsFunc(control, func(b string) bool { return under(im, b) })
			if noLogger && (im == "log" || im == "log/slog") {
				banned = true
			}
			if banned {
				out = append(out, fmt.Sprintf("%s imports %s: data paths get snapshots from control, never config, app or a logger", f.path, im))
			}
			if under(im, "braid/internal/lab") && !under(f.pkg, "braid/internal/lab") {
				out = append(out, fmt.Sprintf("%s imports %s: data paths never import the lab", f.path, im))
			}
		}
	}
	for _, dp := range dataPaths {
		if !pkgs[dp] {
			out = append(out, fmt.Sprintf("data-path rule names %s, which has no Go files: it would check nothing", dp))
		}
	}
	for _, m := range mixedDataPaths {
		if !pkgs[m.pkg] {
			out = append(out, fmt.Sprintf("data-path rule names %s, which has no Go files: it would check nothing", m.pkg))
		}
		for _, p := range m.files {
			if !paths[p] {
				out = append(out, fmt.Sprintf("data-path rule names %s, which does not exist: it would check nothing", p))
			}
		}
	}
	for _, f := range files {
		if f.test {
			continue
		}
		for _, dp := range dataPaths {
			if under(f.pkg, dp) {
				check(f, true)
			}
		}
		for _, m := range mixedDataPaths {
			if f.pkg != m.pkg {
				continue
			}
			check(f, slices.Contains(m.files, f.path))
		}
	}
	return out
}

func TestDataPathImports(t *testing.T) {
	for _, v := range dataPathViolations(goFiles(t)) {
		t.Error(v)
	}
}

// The rule itself: it reports an import it bans and a package or file it names that is gone.
func TestDataPathRuleBites(t *testing.T) {
	files := goFiles(t)
	base := len(dataPathViolations(files)) // the tree's own, which TestDataPathImports reports
	var loops goFile
	for _, f := range files {
		if f.path == "internal/tunnel/loops.go" {
			loops = f
		}
	}
	bad := loops
	bad.imports = append(slices.Clone(bad.imports), "log/slog")
	sock := goFile{path: "internal/sock/x.go", pkg: "braid/internal/sock", imports: []string{"braid/internal/config"}}
	v := strings.Join(dataPathViolations(append(slices.Clone(files), bad, sock)), "\n")
	if n := strings.Count(v, "\n") + 1 - base; n != 2 || !strings.Contains(v, "internal/tunnel/loops.go imports log/slog") || !strings.Contains(v, "internal/sock/x.go imports braid/internal/config") {
		t.Errorf("banned imports: got %q", v)
	}
	var without []goFile
	for _, f := range files {
		if f.pkg != "braid/internal/tun" && f.path != "internal/lisp/xtr/run.go" {
			without = append(without, f)
		}
	}
	v = strings.Join(dataPathViolations(without), "\n")
	if n := strings.Count(v, "\n") + 1 - base; n != 2 || !strings.Contains(v, "braid/internal/tun, which has no Go files") || !strings.Contains(v, "internal/lisp/xtr/run.go, which does not exist") {
		t.Errorf("missing package and file: got %q", v)
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
