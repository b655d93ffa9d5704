#!/usr/bin/env bash
# make bench: every driver under bench/ on one commit, -runs 5 (cellular 1), written whole into bench/BENCH.md,
# then checked by scripts/check-bench.sh. Refuses a working tree with changes (the figures would
# not belong to any commit) unless BENCH_DIRTY=1, which marks every section dirty, and which
# check-bench.sh then rejects.
# Usage: scripts/bench.sh DRIVER...
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
	if [ "${BENCH_DIRTY:-}" != 1 ]; then
		echo "make bench: the working tree has changes; commit them first (BENCH_DIRTY=1 runs anyway and marks every section dirty):" >&2
		git status --short >&2
		exit 1
	fi
	echo "make bench: WARNING: dirty working tree; every section will say so and check-bench.sh will fail" >&2
fi
start=$(git rev-parse HEAD)
mkdir -p bench/out
$GO run ./bench/internal/benchmd header -runs 5 > bench/out/header.md
# A driver that fails still has its section written when it wrote one (rbpm lists its failed
# runs and exits 1); one that wrote none gets a section naming no commit, which the check
# rejects. Either way make bench fails at the end, after writing the file.
failed=""
for b in "$@"; do
	t0=$(date +%s)
	rm -f bench/out/"$b".md
	runs=5
	# cellular: 42 flows of 60 s over LTE traces, about 46 minutes a run; five would take four
	# hours. Its section says how many runs its figures are.
	[ "$b" = cellular ] && runs=1
	if ! $GO run ./bench/"$b" -braid bin/braid -runs "$runs" -out bench/out/"$b".md; then
		failed="$failed $b"
	fi
	[ -s bench/out/"$b".md ] || printf '## bench/%s failed\n\nIt wrote no section.\n' "$b" > bench/out/"$b".md
	echo "make bench: $b took $(( $(date +%s) - t0 )) s" >&2
done
if [ "$(git rev-parse HEAD)" != "$start" ]; then
	echo "make bench: HEAD moved during the run ($start -> $(git rev-parse HEAD)); not writing bench/BENCH.md" >&2
	exit 1
fi
{
	cat bench/out/header.md
	for b in "$@"; do cat bench/out/"$b".md; echo; done
} > bench/BENCH.md
./scripts/check-bench.sh bench/BENCH.md
if [ -n "$failed" ]; then
	echo "make bench: these drivers failed (see their sections):$failed" >&2
	exit 1
fi
