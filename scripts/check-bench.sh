#!/usr/bin/env bash
# Checks that bench/BENCH.md was written whole by one `make bench` on one clean commit: the
# header and every section name the same commit, and nothing that can change a figure differs
# from that commit (in the commits since and in the working tree).
#
# What can: a Go file (tests left out: `go build` and `go run` leave them out too) of a package
# that bin/braid or a driver under bench/ is built from (`go list -deps`), and every file that is
# not Go source, but for these, which nothing a benchmark runs reads: Markdown (the docs and
# stored results; the embedded files are a TOML site and the metrics page), docs/, testdata/,
# .ci/ (CI's own steps: it runs the benchmarks only as `make bench-smoke`, whose output is not the
# record) and this script. So a change to the docs, to a test or to a package only tests use (the
# lab tests' helpers) leaves the figures standing; a change to the product, a driver, the lab, go.mod, the
# Makefile, the other scripts or the traces does not. Run after `make bench`, and before
# committing the file (commit it alone, on top of the commit it names).
# Usage: scripts/check-bench.sh [FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
file=${1:-bench/BENCH.md}
commit=$($GO run ./bench/internal/benchmd check "$file")
if ! git merge-base --is-ancestor "$commit" HEAD 2>/dev/null; then
	echo "check-bench: $file names $commit, which is not HEAD or an ancestor of it" >&2
	exit 1
fi
# The directories of the packages the benchmarks build, relative to the module's root.
root=$(pwd)
built=$($GO list -deps -f '{{if not .Standard}}{{.Dir}}{{end}}' ./cmd/braid ./bench/... | sed -n "s|^$root/||p")
changed=""
while IFS= read -r f; do
	[ -n "$f" ] || continue
	case "$f" in
	*_test.go | *.md | docs/* | */testdata/* | testdata/* | scripts/check-bench.sh | .ci/*) continue ;;
	*.go)
		grep -qxF "$(dirname "$f")" <<<"$built" || continue ;;
	esac
	changed="$changed$f"$'\n'
done < <(git diff --name-only "$commit" -- .; git ls-files --others --exclude-standard)
if [ -n "$changed" ]; then
	echo "check-bench: $file was measured on $commit, but these files, which a benchmark builds or reads, differ from it:" >&2
	printf '%s' "$changed" >&2
	exit 1
fi
echo "check-bench: $file: every section ran on $commit, and nothing a benchmark builds or reads changed since"
others=$(git diff --name-only "$commit" -- . ':(exclude)bench/BENCH.md')
if [ -n "$others" ]; then
	echo "check-bench: changed since, none of it built or read by a benchmark:" >&2
	echo "$others" | sed 's/^/  /' >&2
fi
