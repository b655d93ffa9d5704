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
	control := []string{"braid/internal/config", "braid/internal/app", "braid/internal/experiment"}
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

// The lab is imported only by tests, benchmarks, the lab itself, the experiments and
// internal/app/lab.go.
func TestLabImporters(t *testing.T) {
	for _, f := range goFiles(t) {
		if f.test || under(f.pkg, "braid/internal/lab") || under(f.pkg, "braid/internal/experiment") || under(f.pkg, "braid/bench") || f.path == "internal/app/lab.go" {
			continue
		}
		for _, im := range f.imports {
			if under(im, "braid/internal/lab") {
				t.Errorf("%s imports %s: only tests, benchmarks, the experiments and internal/app/lab.go may import the lab", f.path, im)
			}
		}
	}
}

// The experiments are run by `braid lab` (internal/app/lab.go), benchmarks and tests only.
func TestExperimentImporters(t *testing.T) {
	for _, f := range goFiles(t) {
		if f.test || under(f.pkg, "braid/internal/experiment") || under(f.pkg, "braid/bench") || f.path == "internal/app/lab.go" {
			continue
		}
		for _, im := range f.imports {
			if under(im, "braid/internal/experiment") {
				t.Errorf("%s imports %s: only tests, benchmarks and internal/app/lab.go may import the experiments", f.path, im)
			}
		}
	}
}

// rolePackages are braid's roles; the lab is the engine they are tested on and knows none of them.
var rolePackages = []string{"braid/internal/tunnel", "braid/internal/proxy", "braid/internal/lb", "braid/internal/lisp", "braid/internal/mptcp"}

// engineViolations returns each file of internal/lab (its tests included) that reaches a role
// package, directly or through other packages of the module (their non-test files).
func engineViolations(files []goFile) []string {
	deps := map[string][]string{}
	for _, f := range files {
		if !f.test {
			deps[f.pkg] = append(deps[f.pkg], f.imports...)
		}
	}
	// via returns the chain of imports from im to a role package, or nil.
	memo := map[string][]string{}
	var via func(im string, seen map[string]bool) []string
	via = func(im string, seen map[string]bool) []string {
		if slices.ContainsFunc(rolePackages, func(r string) bool { return under(im, r) }) {
			return []string{im}
		}
		if c, ok := memo[im]; ok {
			return c
		}
		if seen[im] || !under(im, module) {
			return nil
		}
		seen[im] = true
		for _, d := range deps[im] {
			if c := via(d, seen); c != nil {
				memo[im] = append([]string{im}, c...)
				return memo[im]
			}
		}
		memo[im] = nil
		return nil
	}
	var out []string
	engine := false
	for _, f := range files {
		if !under(f.pkg, "braid/internal/lab") {
			continue
		}
		engine = true
		for _, im := range f.imports {
			if c := via(im, map[string]bool{}); c != nil {
				out = append(out, fmt.Sprintf("%s imports %s: the lab is the engine and imports no role package (experiments live in internal/experiment)", f.path, strings.Join(c, " -> ")))
			}
		}
	}
	if !engine {
		out = append(out, "the engine rule names braid/internal/lab, which has no Go files: it would check nothing")
	}
	return out
}

// internal/lab and its subpackages (tests included) import no role package, not even through
// another package: the reproductions, the demo and the roles' starters live in
// internal/experiment.
func TestLabImportsNoRole(t *testing.T) {
	for _, v := range engineViolations(goFiles(t)) {
		t.Error(v)
	}
}

// The rule reports a role reached through another package and a direct one.
func TestLabImportsNoRoleBites(t *testing.T) {
	files := goFiles(t)
	base := len(engineViolations(files))
	through := goFile{path: "internal/lab/x_test.go", pkg: "braid/internal/lab", test: true, imports: []string{"braid/internal/experiment/roles"}}
	direct := goFile{path: "internal/lab/y/y.go", pkg: "braid/internal/lab/y", imports: []string{"braid/internal/lb/maglev"}}
	v := engineViolations(append(slices.Clone(files), through, direct))
	joined := strings.Join(v, "\n")
	if len(v)-base != 2 || !strings.Contains(joined, "internal/lab/x_test.go imports braid/internal/experiment/roles -> braid/internal/") ||
		!strings.Contains(joined, "internal/lab/y/y.go imports braid/internal/lb/maglev:") {
		t.Errorf("got %q", joined)
	}
}

// papers are the reproductions, one package each; they share code only through kit and roles.
var papers = []string{"mptgre", "federation", "mplb", "amptcp", "rbpm"}

// layoutViolations returns what breaks the experiments' layout: a missing package, an
// experiment importing another one but kit and roles, kit importing a role.
func layoutViolations(files []goFile) []string {
	var out []string
	pkgs := map[string]bool{}
	for _, f := range files {
		pkgs[f.pkg] = true
	}
	shared := []string{"braid/internal/experiment/kit", "braid/internal/experiment/roles"}
	for _, p := range append(slices.Clone(papers), "demo", "accuracy", "kit", "roles") {
		if !pkgs["braid/internal/experiment/"+p] {
			out = append(out, fmt.Sprintf("braid/internal/experiment/%s has no Go files", p))
		}
	}
	for _, f := range files {
		if !under(f.pkg, "braid/internal/experiment") || f.pkg == "braid/internal/experiment" {
			continue
		}
		for _, im := range f.imports {
			if !under(im, "braid/internal/experiment") || im == f.pkg || slices.Contains(shared, im) {
				continue
			}
			out = append(out, fmt.Sprintf("%s imports %s: experiments share code through kit and roles only", f.path, im))
		}
		if f.pkg == "braid/internal/experiment/kit" && !f.test {
			for _, im := range f.imports {
				if im == "braid/internal/experiment/roles" || slices.ContainsFunc(rolePackages, func(r string) bool { return under(im, r) }) {
					out = append(out, fmt.Sprintf("%s imports %s: kit is below the roles' starters and imports no role package", f.path, im))
				}
			}
		}
	}
	return out
}

// Each paper has its own package, the demo and the accuracy check theirs; none imports another
// experiment but kit and roles, and kit imports no role package.
func TestExperimentLayout(t *testing.T) {
	for _, v := range layoutViolations(goFiles(t)) {
		t.Error(v)
	}
}

// The layout rule reports a paper importing another, kit importing a role, a paper gone.
func TestExperimentLayoutBites(t *testing.T) {
	files := goFiles(t)
	base := len(layoutViolations(files))
	var without []goFile
	for _, f := range files {
		if f.pkg != "braid/internal/experiment/mptgre" {
			without = append(without, f)
		}
	}
	bad := append(without,
		goFile{path: "internal/experiment/rbpm/x.go", pkg: "braid/internal/experiment/rbpm", imports: []string{"braid/internal/experiment/mplb"}},
		goFile{path: "internal/experiment/kit/y.go", pkg: "braid/internal/experiment/kit", imports: []string{"braid/internal/tunnel"}})
	v := layoutViolations(bad)
	joined := strings.Join(v, "\n")
	if len(v)-base != 3 || !strings.Contains(joined, "experiment/mptgre has no Go files") ||
		!strings.Contains(joined, "rbpm/x.go imports braid/internal/experiment/mplb") || !strings.Contains(joined, "kit/y.go imports braid/internal/tunnel") {
		t.Errorf("got %q", joined)
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
