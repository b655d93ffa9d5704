#!/usr/bin/env bash
# Checks that bench/BENCH.md was written whole by one `make bench` on one clean commit: the
# header and every section name the same commit, and nothing but bench/BENCH.md differs from that
# commit (in the commits since and in the working tree). Run after `make bench`, and before
# committing the file (commit it alone, on top of the commit it names).
# Usage: scripts/check-bench.sh [FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-bench/BENCH.md}
commit=$(${GO:-go} run ./bench/internal/benchmd check "$file")
if ! git merge-base --is-ancestor "$commit" HEAD 2>/dev/null; then
	echo "check-bench: $file names $commit, which is not HEAD or an ancestor of it" >&2
	exit 1
fi
changed=$(git diff --name-only "$commit" -- . ":(exclude)bench/BENCH.md")
if [ -n "$changed" ]; then
	echo "check-bench: $file was measured on $commit, but these files differ from it:" >&2
	echo "$changed" >&2
	exit 1
fi
echo "check-bench: $file: every section ran on $commit, and only bench/BENCH.md changed since"
