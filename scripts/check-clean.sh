#!/usr/bin/env bash
# Fails if a lab left a network namespace behind.
set -euo pipefail
left=$(ls /run/netns 2>/dev/null | grep '^braid-' || true)
if [ -n "$left" ]; then
  echo "check-clean: namespaces left behind: $left" >&2
  exit 1
fi
echo "check-clean: no lab namespace left behind"
