#!/usr/bin/env bash
# Installs what building and testing braid needs on a fresh Debian machine: a Go toolchain
# (>= the go.mod version) and the module dependencies. Idempotent and quiet when all is there.
#
# Go: a new-enough go on PATH (or in /usr/local/go/bin, /usr/lib/go/bin) is used as it is.
# Otherwise any go serves as a bootstrap (Debian's golang-go, Go 1.19 on bookworm, is installed
# if there is none) to fetch the required release from the Go module proxy, as the go command's
# own toolchain switching (Go 1.21 and later) does: the module
# golang.org/toolchain@v0.0.1-go<version>.<os>-<arch>, checked against the Go checksum database
# (sum.golang.org). It is installed into $BRAID_GO_DIR (default /usr/local/lib/go<version>) and
# linked as go and gofmt into $BRAID_GO_BIN (default /usr/local/bin, ahead of /usr/bin on
# Debian's PATH, so make and a new shell find it). BRAID_GO_SEARCH replaces the directories
# searched for an installed go (tests of this script use it).
set -euo pipefail
cd "$(dirname "$0")/.."

need_go=$(awk '/^go /{print $2; exit}' go.mod)
go_dir=${BRAID_GO_DIR:-/usr/local/lib/go$need_go}
go_bin=${BRAID_GO_BIN:-/usr/local/bin}
have_go() {
  command -v go >/dev/null 2>&1 || return 1
  local v; v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$need_go" "$v" | sort -V | head -n1)" = "$need_go" ]
}
if ! have_go; then
  for d in ${BRAID_GO_SEARCH-/usr/local/go/bin /usr/lib/go/bin} "$go_dir/bin"; do
    [ -x "$d/go" ] && export PATH="$d:$PATH"
  done
fi

# fetch_go downloads golang.org/toolchain@v0.0.1-go$need_go.<os>-<arch> with the go on PATH
# (any version: it only downloads a module) and installs it into $go_dir.
fetch_go() {
  local arch mod tmp dir
  case "$(uname -m)" in
    x86_64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; armv6l | armv7l) arch=armv6l ;;
    i386 | i686) arch=386 ;; ppc64le) arch=ppc64le ;; s390x) arch=s390x ;; riscv64) arch=riscv64 ;;
    *) echo "deps: no Go toolchain for machine $(uname -m)" >&2; return 1 ;;
  esac
  mod=golang.org/toolchain@v0.0.1-go$need_go.linux-$arch
  echo "deps: fetching $mod through the Go module proxy with $(go version)" >&2
  tmp=$(mktemp -d)
  # Outside any module, into a cache of its own; GOFLAGS of the caller could name flags the
  # bootstrap go does not know.
  local out
  out=$(cd "$tmp" && GOFLAGS= GO111MODULE=on GOMODCACHE="$tmp/cache" GOPATH="$tmp/gopath" go mod download -json "$mod" 2>&1) || true
  dir=$(printf '%s\n' "$out" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ -z "$dir" ] || [ ! -f "$dir/bin/go" ]; then
    echo "deps: go mod download $mod: $(printf '%s\n' "$out" | sed -n 's/^[[:space:]]*"Error": "\(.*\)"$/\1/p;/^go: /p')" >&2
    chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"
    return 1
  fi
  rm -rf "$go_dir.new" && mkdir -p "$(dirname "$go_dir")"
  cp -R "$dir" "$go_dir.new"
  chmod -R u+w,go-w "$go_dir.new"
  # Module zips keep no permission bits: the programs must be made executable again (the go
  # command does the same after its own download).
  find "$go_dir.new/bin" "$go_dir.new/pkg/tool" -type f -exec chmod 0755 {} +
  rm -rf "$go_dir" && mv "$go_dir.new" "$go_dir"
  chmod -R u+w "$tmp"; rm -rf "$tmp"
  mkdir -p "$go_bin"
  ln -sf "$go_dir/bin/go" "$go_bin/go"
  ln -sf "$go_dir/bin/gofmt" "$go_bin/gofmt"
  export PATH="$go_dir/bin:$PATH"
  echo "deps: installed $("$go_dir/bin/go" version | cut -d' ' -f3) in $go_dir, linked from $go_bin/go" >&2
}

if ! have_go; then
  if ! command -v go >/dev/null 2>&1; then
    echo "deps: installing Debian's Go to fetch Go $need_go with" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq golang-go >/dev/null
  fi
  found=$(go version 2>/dev/null || echo none)
  if ! fetch_go || ! have_go; then
    echo "deps: Go >= $need_go is required; found $found, and fetching golang.org/toolchain@v0.0.1-go$need_go" >&2
    echo "deps: through the Go module proxy ($(go env GOPROXY 2>/dev/null || echo GOPROXY unknown)) did not work. Install Go $need_go" >&2
    echo "deps: from https://go.dev/dl/ and put its bin directory first on PATH." >&2
    exit 1
  fi
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
# nftables and curl: braid proxy installs its interception with nft, the lab's NAT routers
# their masquerade, and the proxy's tests use curl as an ordinary SOCKS5 client.
if ! command -v nft >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "deps: installing nftables, curl (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq nftables curl >/dev/null
fi
# help2man renders the man pages (make install, make deb); systemd-analyze checks the units (packaging tests).
command -v help2man >/dev/null 2>&1 && command -v systemd-analyze >/dev/null 2>&1 || { echo "deps: installing help2man, systemd (Debian packages)" >&2; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq help2man systemd >/dev/null; }
# chromium, chromium-driver and python3-selenium: the status page's browser test
# (TestStatusPageBrowser) opens a daemon's live page in headless Chromium driven by Selenium.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 || ! /usr/bin/python3 -c 'import selenium' >/dev/null 2>&1; then
  echo "deps: installing chromium, chromium-driver, python3-selenium (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver python3-selenium >/dev/null
fi
# bird2: the upstream router of the load-balancer fleet lab (TestLBFleetECMP, braid lab repro mplb), to which every braid lb instance announces the VIP over BGP.
command -v bird >/dev/null 2>&1 || { echo "deps: installing bird2 (Debian package)" >&2; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq bird2 >/dev/null; }
