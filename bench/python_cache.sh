#!/usr/bin/env bash
# The Python module's figures (bench/python_cache.py): run_with_cache of all 144 head patterns of a
# GPT-2-small-shaped model over 8 x 128 tokens, headlab against PyTorch hooks, each in its own process,
# alternately for --rounds rounds (medians of time and peak resident memory); then the call overhead of
# model(tokens) on a tiny model against the C++ call it makes.
# Usage: bench/python_cache.sh [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "python_cache.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets headlab_python headlab_cli
export PYTHONPATH=$PWD/build/python OMP_NUM_THREADS=$threads
py=/usr/bin/python3
have_peer=0
peer_available python_cache.sh bench/python_cache.py && have_peer=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$py bench/python_cache.py make-folder "$tmp/gpt2"
for ((r = 1; r <= rounds; r++)); do
  $py bench/python_cache.py headlab "$tmp/gpt2" --threads "$threads" >"$tmp/ours.$r"
  ((have_peer)) && $py bench/python_cache.py torch "$tmp/gpt2" --threads "$threads" >"$tmp/peer.$r"
  echo "round $r/$rounds done" >&2
done
printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
field() { grep -ho "$1 [0-9.]*" "$2"/"$3".* | awk '{print $NF}' | median; }
ours_s=$(field median "$tmp" ours) ours_mb=$(field resident "$tmp" ours)
peer_s=nan peer_mb=nan
if ((have_peer)); then peer_s=$(field median "$tmp" peer) peer_mb=$(field resident "$tmp" peer); fi
awk -v o="$ours_s" -v p="$peer_s" -v om="$ours_mb" -v pm="$peer_mb" 'BEGIN {
  printf "%-58s %10s %10s %8s\n", "run_with_cache, 144 patterns, GPT-2 small, 8 x 128", "headlab", "PyTorch", "ratio"
  printf "%-58s %10.3f %10s %8s\n", "  seconds (median)", o, p, (p == "nan") ? "-" : sprintf("%.2fx", p / o)
  printf "%-58s %10.0f %10s %8s\n", "  peak resident memory (MB, whole process)", om, pm, (pm == "nan") ? "-" : sprintf("%.2fx", pm / om) }'
# The call overhead, on a tiny chars model trained for two steps.
build/headlab train --task chars --text data/tiny.txt --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 \
  --batch-size 2 --steps 2 --eval-every 2 --eval-batches 1 --threads 1 --out "$tmp/tiny" >/dev/null
OMP_NUM_THREADS=1 $py bench/python_cache.py overhead "$tmp/tiny/checkpoint.h5" --repeats 5000
