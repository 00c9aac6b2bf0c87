# What bench/*.sh share (sourced): building their targets, the median of numbers on stdin, and whether a
# PyTorch peer can run.
# build_targets TARGET...: builds them in build/ (configured Release first when it is not).
build_targets() {
  [[ -f build/CMakeCache.txt ]] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target "$@" >/dev/null
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# peer_available NAME SCRIPT: true when SCRIPT exists and Debian's python3 imports torch; otherwise says so.
peer_available() {
  if [[ -f "$2" ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then return 0; fi
  echo "$1: no PyTorch peer ($2 with python3-torch; apt-get install python3-torch): headlab only" >&2
  return 1
}
