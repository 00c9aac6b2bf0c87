#!/usr/bin/env bash
# cpack -G DEB of the build tree BUILD: the package's dependencies are Debian's package names, and what
# it holds runs: unpacked into a scratch root (dpkg-deb -x, so the test leaves the system as it was), the
# command starts and, when the module was built, python3 imports headlab from it.
# Usage: tests/package_deb.sh BUILD
set -euo pipefail
build=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" >/dev/null)
deb=$(ls "$tmp"/out/headlab_*.deb)
depends=$(dpkg-deb -f "$deb" Depends)
echo "package_deb: $(basename "$deb"): Depends: $depends"
for p in libopenblas-openmp-dev libhdf5-dev libplplot-dev libpcre2-dev libsentencepiece-dev libicu-dev libzip-dev python3-numpy libgomp1; do  # Debian names
  grep -q "$p" <<<"$depends" || { echo "package_deb: Depends lacks $p" >&2; exit 1; }
done
dpkg-deb -x "$deb" "$tmp/root"
"$tmp/root/usr/bin/headlab" --help >/dev/null
test -f "$tmp/root/usr/lib/cmake/headlab/headlabConfig.cmake" || ls "$tmp"/root/usr/lib/*/cmake/headlab/headlabConfig.cmake >/dev/null
if [[ -f "$build/python/headlab/__init__.py" ]]; then
  (cd "$tmp" && PYTHONPATH="$tmp/root/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import headlab, os; assert headlab.__file__.startswith(os.environ['PYTHONPATH']), headlab.__file__")
fi
echo "package_deb: built, unpacked, the command and the module run"
