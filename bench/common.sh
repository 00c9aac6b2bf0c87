# What bench/*.sh share (sourced): building their targets, the median of numbers on stdin, whether a
# PyTorch peer can run, and the machine line each result begins with.
# build_targets TARGET...: builds them in build/ (configured Release first when it is not).
build_targets() {
  [[ -f build/CMakeCache.txt ]] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target "$@" >/dev/null
}
# pick FILE-GLOB PREFIX UNIT: the number before UNIT on the line starting with PREFIX, each file, their median.
pick() {
  for f in $1; do [[ -f "$f" ]] && grep "^$2" "$f" | grep -o "[0-9.]* $3" | head -1 | cut -d' ' -f1; done | median
}
# pct FILE-GLOB PREFIX: the percentage of its floor that line's time ("PREFIX ...: TIME ms ... (floor F ms")
# reaches: the median time against the smallest floor of any file. Each run measures its own rate (SGEMM, or
# read bandwidth), and a run that met a slow moment of the host measured a low one: its floor was long, and
# flattered its time (GPT-2 path patching "75%" against a rate measured at 185 GFLOP/s, where others measured 256).
pct() {
  local t f
  t=$(for x in $1; do [[ -f "$x" ]] && grep "^$2" "$x" | grep -o ": [0-9.]* ms" | head -1 | tr -dc '0-9.\n'; done | median)
  f=$(for x in $1; do [[ -f "$x" ]] && grep "^$2" "$x" | grep -o "(floor [0-9.]* ms" | head -1 | cut -d' ' -f2; done | smallest)
  awk -v t="$t" -v f="$f" 'BEGIN { if (t == "nan" || f == "nan") print "nan"; else printf "%.0f\n", 100 * f / t }'
}
# paired_pct FILE-GLOB PREFIX: the median over files of the percentage each prints on that line ("(floor F ms...: P%"),
# where each run set its time against a floor measured beside it (decoding's read rate on its own pages).
paired_pct() {
  for x in $1; do [[ -f "$x" ]] && grep "^$2" "$x" | grep -o "(floor [0-9.]* ms[^:]*: [0-9.]*%" | head -1 | grep -o "[0-9.]*%$" | tr -d '%'; done | median
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# smallest: the least of the numbers on stdin ("nan" for none): a floor at the fastest rate any run measured.
smallest() { sort -g | awk 'NR == 1 {print; found = 1} END {if (!found) print "nan"}'; }
# peer_available NAME SCRIPT: true when SCRIPT exists and Debian's python3 imports torch; otherwise says so.
peer_available() {
  if [[ -f "$2" ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then return 0; fi
  echo "$1: no PyTorch peer ($2 with python3-torch; apt-get install python3-torch): headlab only" >&2
  return 1
}
# Benchmarks run as a user's machine runs: OpenBLAS picks its own kernels for this CPU. These machines set
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for the tests' safety, which on an AVX-512 host forces the Haswell
# kernels at about half the SGEMM rate (185 against 324 GFLOP/s); both sides of every comparison run without them.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
# The 1-minute load when the script began: figures from a loaded machine flatter headlab (its threads
# spin only briefly) and punish PyTorch (its threads spin long), so every result states it.
bench_start_load=$(cut -d' ' -f1 /proc/loadavg)
# machine_line: the CPU, its cores, the 1-minute load at the start and now (the run's own included), the date.
machine_line() {
  printf '%s, %s cores, load %s at start / %s at end, %s' "$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
    "$(nproc)" "$bench_start_load" "$(cut -d' ' -f1 /proc/loadavg)" "$(date -u +%F)"
}
# peer_line: the PyTorch peer's version and the BLAS its libraries resolve to (Debian's alternatives:
# the same torch ran 2-4x slower on one day of this machine than on the next, headlab unchanged, so
# every peer result records what it ran on).
peer_line() {
  local arch
  arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  printf 'peer: PyTorch %s; libblas.so.3 -> %s, libopenblas.so.0 -> %s\n' \
    "$(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
    "$(readlink -f "/usr/lib/$arch/libblas.so.3" 2>/dev/null || echo none)" \
    "$(readlink -f "/usr/lib/$arch/libopenblas.so.0" 2>/dev/null || echo none)"
}
