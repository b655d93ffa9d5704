package main

import (
	"fmt"
	"strings"
	"testing"

	"braid/bench/internal/drive"
)

const (
	c1 = "0123456789abcdef0123456789abcdef01234567"
	c2 = "89abcdef0123456789abcdef0123456789abcdef"
)

func section(title, commit string) string {
	return "## " + title + "\n\n" + fmt.Sprintf(drive.CommitLine, commit, "2026-11-24 16:00 UTC") + "\n\nsome text\n\n| a | b |\n\n### sub\n\ntext\n\n"
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		md    string
		wrong []string // what the error must name; none: the file passes
	}{
		{"one commit", header(c1, 5) + section("A", c1) + section("B", c1), nil},
		{"a section on another commit", header(c1, 5) + section("A", c1) + section("B", c2), []string{`"B" ran on ` + c2}},
		{"a section without its commit", header(c1, 5) + section("A", c1) + "## B\n\nno commit line\n", []string{`"B" names no commit`}},
		{"a dirty section", header(c1, 5) + section("A", c1+"-dirty"), []string{`"A" ran on ` + c1 + "-dirty"}},
		{"a dirty run", header(c1+"-dirty", 5) + section("A", c1+"-dirty"), []string{"not a clean commit"}},
		{"no header", section("A", c1), []string{"no header"}},
		{"no sections", header(c1, 5), []string{"no sections"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := check(tc.md)
			if len(tc.wrong) == 0 {
				if err != nil || got != c1 {
					t.Fatalf("check = %q, %v; want %s, nil", got, err, c1)
				}
				return
			}
			if err == nil {
				t.Fatalf("check passed; want an error naming %q", tc.wrong)
			}
			for _, w := range tc.wrong {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// The header the file is written with is the one check reads.
func TestHeaderRoundTrip(t *testing.T) {
	m := headerRE.FindStringSubmatch(header(c2, 5))
	if m == nil || m[1] != c2 {
		t.Fatalf("header does not parse back: %v", m)
	}
}
