#!/usr/bin/env bash
# deb.sh ROOT GITVERSION OUTDIR: builds the Debian package of the tree ROOT (what 'make install
# DESTDIR=ROOT PREFIX=/usr' installed) with dpkg-deb, as OUTDIR/braid_VERSION_ARCH.deb. The
# maintainer scripts and the control file come from packaging/debian.
#
# The Debian version is derived from 'git describe --always --dirty' so that later commits sort
# later: a tag v1.2.3 gives 1.2.3, 3 commits after it 1.2.3+3.gHASH; without a tag
# 0~gitYYYYMMDDHHMMSS.HASH (the commit's time); a dirty tree adds .dirty.
set -euo pipefail
root=$1 gitversion=$2 out=$3
cd "$(dirname "$0")/.."
command -v dpkg-deb >/dev/null || { echo "deb.sh: dpkg-deb is missing (Debian's dpkg package)" >&2; exit 1; }

v=${gitversion%-dirty}
if [[ $v =~ ^v?([0-9][0-9A-Za-z.]*)(-([0-9]+)-g([0-9a-f]+))?$ ]]; then
  debversion=${BASH_REMATCH[1]}
  [ -n "${BASH_REMATCH[2]}" ] && debversion+="+${BASH_REMATCH[3]}.g${BASH_REMATCH[4]}"
else
  when=$(git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null || echo 0)
  debversion="0~git$when.${v//[^0-9A-Za-z.+~]/.}"
fi
[ "$v" != "$gitversion" ] && debversion+=".dirty"
arch=$(dpkg --print-architecture)

install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$debversion|" -e "s|@ARCH@|$arch|" -e "s|@SIZE@|$size|" -e "s|@GITVERSION@|$gitversion|" \
  packaging/debian/control.in >"$root/DEBIAN/control"
for s in postinst prerm postrm; do install -m 0755 "packaging/debian/$s" "$root/DEBIAN/$s"; done
# Every file installed under /etc is a conffile (none today: /etc/braid is created empty).
find "$root/etc" -type f 2>/dev/null | sed "s|^$root||" >"$root/DEBIAN/conffiles"
[ -s "$root/DEBIAN/conffiles" ] || rm -f "$root/DEBIAN/conffiles"

mkdir -p "$out"
deb="$out/braid_${debversion}_$arch.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
