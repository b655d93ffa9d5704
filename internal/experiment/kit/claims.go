package kit

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// Claim is one claim a demo or repro verifies on what it measured: its paper's claim, or what
// the user of the demo would check (bytes intact, a rate within reach of the links).
type Claim struct {
	Name   string // what is claimed, e.g. "path A: file intact"
	OK     bool
	Detail string // the measured value beside its bound
}

// Claims collects a run's checks. Print writes them as PASS and FAIL lines; Err returns a
// *ClaimsFailed when one failed, which the command turns into a non-zero exit.
type Claims struct {
	List []Claim
}

// Add records a check; detail is formatted like fmt.Sprintf.
func (c *Claims) Add(name string, ok bool, detail string, args ...any) {
	c.List = append(c.List, Claim{Name: name, OK: ok, Detail: fmt.Sprintf(detail, args...)})
}

// Within records that v lies in [lo, hi]; unit formats the three values (e.g. "%.1f Mbit/s").
func (c *Claims) Within(name string, v, lo, hi float64, unit string) {
	f := func(x float64) string { return fmt.Sprintf(unit, x) }
	c.Add(name, v >= lo && v <= hi, "%s, bound %s to %s", f(v), f(lo), f(hi))
}

// AtLeast records that v >= lo.
func (c *Claims) AtLeast(name string, v, lo float64, unit string) {
	c.Add(name, v >= lo, "%s, bound >= %s", fmt.Sprintf(unit, v), fmt.Sprintf(unit, lo))
}

// AtMost records that v <= hi.
func (c *Claims) AtMost(name string, v, hi float64, unit string) {
	c.Add(name, v <= hi, "%s, bound <= %s", fmt.Sprintf(unit, v), fmt.Sprintf(unit, hi))
}

// Failed returns the checks that failed.
func (c *Claims) Failed() []Claim {
	var out []Claim
	for _, k := range c.List {
		if !k.OK {
			out = append(out, k)
		}
	}
	return out
}

// Print writes one line per check and a summary line.
func (c *Claims) Print(w io.Writer) {
	fmt.Fprintln(w, "\nchecks:")
	for _, k := range c.List {
		word := "PASS"
		if !k.OK {
			word = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s: %s\n", word, k.Name, k.Detail)
	}
	if n := len(c.Failed()); n > 0 {
		fmt.Fprintf(w, "checks: %d of %d FAILED\n", n, len(c.List))
	} else {
		fmt.Fprintf(w, "checks: all %d passed\n", len(c.List))
	}
}

// Err returns nil when every check passed (or there are none), else a *ClaimsFailed.
func (c *Claims) Err() error {
	f := c.Failed()
	if len(f) == 0 {
		return nil
	}
	return &ClaimsFailed{Failed: f, Total: len(c.List)}
}

// ErrClaims is what a *ClaimsFailed matches with errors.Is.
var ErrClaims = errors.New("scenario: a check failed")

// ClaimsFailed is a run that completed and measured, but whose checks did not all hold.
type ClaimsFailed struct {
	Failed []Claim
	Total  int
}

func (e *ClaimsFailed) Error() string {
	names := make([]string, len(e.Failed))
	for i, k := range e.Failed {
		names[i] = k.Name + " (" + k.Detail + ")"
	}
	return fmt.Sprintf("%d of %d checks failed: %s", len(e.Failed), e.Total, strings.Join(names, "; "))
}

func (e *ClaimsFailed) Is(target error) bool { return target == ErrClaims }
