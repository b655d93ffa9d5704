#!/usr/bin/env bash
# Installs what building and testing braid needs on a fresh Debian machine: a Go toolchain
# (>= the go.mod version) and the module dependencies. Idempotent and quiet when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_go=$(awk '/^go /{print $2; exit}' go.mod)
have_go() {
  command -v go >/dev/null 2>&1 || return 1
  local v; v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$need_go" "$v" | sort -V | head -n1)" = "$need_go" ]
}
if ! have_go; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do
    [ -x "$d/go" ] && export PATH="$d:$PATH"
  done
fi
if ! have_go; then
  echo "deps: installing Go from Debian packages (need go >= $need_go)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq golang-go >/dev/null
  have_go || { echo "deps: Go >= $need_go is required; found $(go version 2>/dev/null || echo none)" >&2; exit 1; }
fi
go mod download
[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200 2>/dev/null || true; }
# tshark: the tests use it as an independent decoder of the LISP messages braid sends.
if ! command -v tshark >/dev/null 2>&1; then
  echo "deps: installing tshark (Debian package)" >&2
  echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq tshark >/dev/null
fi
# clang, llvm and libbpf-dev: braid lb's XDP program is compiled from internal/lb/xdp/lb.c, and
# a test checks that the committed object matches the source.
if ! command -v clang >/dev/null 2>&1 || ! command -v llvm-strip >/dev/null 2>&1 || [ ! -e /usr/include/bpf/bpf_helpers.h ]; then
  echo "deps: installing clang, llvm, libbpf-dev (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq clang llvm libbpf-dev >/dev/null
fi
# nftables and curl: braid proxy installs its interception with nft, and its tests use curl as
# an ordinary SOCKS5 client.
if ! command -v nft >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "deps: installing nftables, curl (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq nftables curl >/dev/null
fi
