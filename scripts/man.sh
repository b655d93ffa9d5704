#!/usr/bin/env bash
# man.sh BRAID OUTDIR VERSION: writes the man pages braid.1 and braid-COMMAND.1, one per command
# that 'braid --help' lists, into OUTDIR, rendered by help2man from the binary's own --help
# text (the manual each command prints), so that the pages never drift from the program.
set -euo pipefail
braid=$(realpath "$1") out=$2 version=$3
command -v help2man >/dev/null || { echo "man.sh: help2man is missing (scripts/deps.sh installs it)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
h2m() { # NAME SUMMARY: render the --help of the program $tmp/NAME
  help2man --no-info --no-discard-stderr --section=1 --source="braid $version" \
    --version-string="$version" --name="$2" "$tmp/$1" >"$out/$1.1"
}
ln -s "$braid" "$tmp/braid"
h2m braid "bonds several network paths into connections faster than any one path"
# 'braid --help' lists the commands as "  NAME   SUMMARY" between "Commands:" and a blank line.
"$braid" --help | sed -n '/^Commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z0-9-]*\) \+\(.*\)$/\1\t\2/p' |
  while IFS=$'\t' read -r cmd summary; do
    [ "$cmd" = version ] && continue
    # The further synopsis lines under "Usage:" become help2man's "or:" lines.
    printf '#!/bin/sh\n"%s" %s "$@" 2>&1 | sed "/^Usage:/,/^\$/s/^       braid /   or: braid /"\n' "$braid" "$cmd" >"$tmp/braid-$cmd"
    chmod +x "$tmp/braid-$cmd"
    h2m "braid-$cmd" "$summary"
  done
