#!/usr/bin/env bash
# Fails if a lab left a network namespace behind. A namespace of a lab whose owner process is
# still running (another lab in use on this machine, not ours) is not left behind; every other
# braid namespace is.
set -euo pipefail
inuse=""
for f in /run/braid/lab/*.json; do
  [ -e "$f" ] || continue
  pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$f" | head -n1)
  id=$(basename "$f" .json)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    inuse="$inuse braid-$id-"
  fi
done
left=""
for ns in $(ls /run/netns 2>/dev/null | grep '^braid-' || true); do
  busy=no
  for p in $inuse; do
    case "$ns" in "$p"*) busy=yes ;; esac
  done
  [ "$busy" = no ] && left="$left $ns"
done
if [ -n "$left" ]; then
  echo "check-clean: namespaces left behind:$left" >&2
  exit 1
fi
echo "check-clean: no lab namespace left behind"
