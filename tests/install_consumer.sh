#!/usr/bin/env bash
# Installs the build tree BUILD into a scratch prefix (cmake --install), then builds tests/consumer
# against it with find_package(headlab) and runs it; checks the pkg-config file names the libraries.
# Usage: tests/install_consumer.sh BUILD
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -x "$tmp/prefix/bin/headlab"
"$tmp/prefix/bin/headlab" --help >/dev/null
cmake -S "$here/consumer" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
"$tmp/build/consumer"
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig" pkg-config --libs headlab |
  grep -q -- "-lheadlab -lheadlab_core"
echo "install_consumer: installed, found, built and ran"
