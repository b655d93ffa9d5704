// Command benchmd writes the header of bench/BENCH.md and checks the whole file.
//
//	go run ./bench/internal/benchmd header -runs 5   # the file's header, naming the commit
//	go run ./bench/internal/benchmd check FILE       # every section ran on the header's commit
//
// check prints the commit and exits 0 when the header and every section ("## " heading) name
// the same commit and none of them is dirty; otherwise it names each disagreement and exits 1.
// scripts/check-bench.sh runs it after `make bench`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/lab"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "header":
		fs := flag.NewFlagSet("header", flag.ExitOnError)
		runs := fs.Int("runs", 5, "runs per figure, as make bench passes them to the drivers")
		fs.Parse(os.Args[2:])
		fmt.Print(header(drive.Commit(), *runs))
	case "check":
		if len(os.Args) != 3 {
			usage()
		}
		b, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c, err := check(string(b))
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[2], err)
			os.Exit(1)
		}
		fmt.Println(c)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchmd header [-runs N] | benchmd check FILE")
	os.Exit(2)
}

// headerLine is how the file's header names its commit.
const headerLine = "Written whole by `make bench` on commit `%s`, %s."

func header(commit string, runs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# braid benchmarks\n\n"+headerLine+" Every section below names the\n"+
		"commit it ran on; scripts/check-bench.sh checks that they are this one. Do not edit by hand.\n\n",
		commit, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if strings.HasSuffix(commit, "-dirty") {
		fmt.Fprintf(&b, "**The working tree had changes not in this commit: these figures are not reproducible from it.**\n\n")
	}
	fmt.Fprintf(&b, "- machine: %d cores, %s, kernel %s\n- links emulated by: %s\n- runs: %d per figure, medians shown\n\n",
		runtime.NumCPU(), runtime.GOARCH, kernel(), lab.EmulatorName, runs)
	return b.String()
}

var (
	headerRE  = regexp.MustCompile("(?m)^" + strings.ReplaceAll(regexp.QuoteMeta(headerLine), "`%s`, %s", "`([^`]*)`, ([^.]*)"))
	sectionRE = regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(drive.CommitLine), "`%s`, %s", "`([^`]*)`, ([^.]*)"))
	commitRE  = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// check returns the commit the file's header names if every section names it too and none is
// dirty.
func check(md string) (string, error) {
	m := headerRE.FindStringSubmatch(md)
	if m == nil {
		return "", errors.New("no header naming the commit (\"Written whole by `make bench` on commit ...\")")
	}
	want := m[1]
	var errs []error
	if !commitRE.MatchString(want) {
		errs = append(errs, fmt.Errorf("header: commit %q is not a clean commit", want))
	}
	lines := strings.Split(md, "\n")
	sections := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "## ") {
			continue
		}
		sections++
		title := strings.TrimPrefix(l, "## ")
		got := ""
		for _, next := range lines[i+1:] {
			if strings.TrimSpace(next) == "" {
				continue
			}
			if s := sectionRE.FindStringSubmatch(next); s != nil {
				got = s[1]
			}
			break
		}
		switch {
		case got == "":
			errs = append(errs, fmt.Errorf("section %q names no commit", title))
		case got != want:
			errs = append(errs, fmt.Errorf("section %q ran on %s, the header names %s", title, got, want))
		}
	}
	if sections == 0 {
		errs = append(errs, errors.New("no sections"))
	}
	return want, errors.Join(errs...)
}

func kernel() string {
	var u syscall.Utsname
	syscall.Uname(&u)
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
