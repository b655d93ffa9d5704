package drive

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// CommitLine is how a section of bench/BENCH.md names the commit it ran on; bench/internal/
// checkbench parses it.
const CommitLine = "Run on commit `%s`, %s."

var commit = sync.OnceValue(func() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	// Untracked files count: an untracked source file is built as much as a tracked one.
	st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=normal").Output()
	if err != nil || len(strings.TrimSpace(string(st))) > 0 {
		c += "-dirty"
	}
	return c
})

// Commit is the commit the benchmark runs on (git rev-parse HEAD in the working directory),
// with "-dirty" when the working tree differs from it, as measured when first asked.
func Commit() string { return commit() }

// Section writes the heading of one section of bench/BENCH.md and the line naming the commit
// and the time it ran on.
func Section(w io.Writer, title string) {
	fmt.Fprintf(w, "## %s\n\n"+CommitLine+"\n", title, Commit(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if strings.HasSuffix(Commit(), "-dirty") {
		fmt.Fprintln(w, "\n**The working tree had changes not in this commit: these figures are not reproducible from it.**")
	}
	fmt.Fprintln(w)
}
