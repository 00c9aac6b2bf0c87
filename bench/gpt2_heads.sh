#!/usr/bin/env bash
# Zero ablation of all 144 heads of a GPT-2-small shape over 8 x 128 tokens, from one command:
# bench/gpt2_heads (headlab's batched intervention engine, the whole sweep) against the PyTorch hook
# sweep (bench/torch_head_sweep_peer.py --config gpt2: a forward pass per head, as TransformerLens's
# run_with_hooks; --heads-per-layer passes of each layer timed, the sweep projected from their median),
# alternately for --rounds rounds; medians, the ratio, each side's peak resident memory, headlab's floor
# (at the fastest SGEMM rate any round measured).
# Usage: bench/gpt2_heads.sh [--rounds N] [--threads N] [--heads-per-layer K]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=2 threads=2 per_layer=1
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --heads-per-layer) per_layer=$2; shift 2 ;;
    *) echo "gpt2_heads.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets gpt2_heads
peer=bench/torch_head_sweep_peer.py have_peer=0
peer_available gpt2_heads.sh "$peer" && have_peer=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; r++)); do
  build/bench/gpt2_heads --threads "$threads" --repeats 1 >"$tmp/ours.$r"
  ((have_peer)) && /usr/bin/python3 "$peer" --config gpt2 --threads "$threads" --heads-per-layer "$per_layer" >"$tmp/peer.$r"
  echo "round $r/$rounds done" >&2
done
printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
ours=$(grep -ho ": [0-9.]* s (median" "$tmp"/ours.* | tr -dc '0-9.\n' | median)
ours_mb=$(grep -ho "peak resident [0-9.]*" "$tmp"/ours.* | cut -d' ' -f3 | median)
floor=$(grep -ho "floor [0-9.]* s" "$tmp"/ours.* | cut -d' ' -f2 | smallest)
peer_s=nan peer_mb=nan
if ((have_peer)); then
  peer_s=$(grep -ho "sweep_ms_median=[0-9.]*" "$tmp"/peer.* | cut -d= -f2 | awk '{print $1 / 1000}' | median)
  peer_mb=$(grep -ho "peak_mb=[0-9.]*" "$tmp"/peer.* | cut -d= -f2 | median)
fi
printf '%-50s %10s %10s %8s\n' "144 heads, zero ablation, 8 x 128 tokens" headlab PyTorch ratio
awk -v o="$ours" -v p="$peer_s" -v om="$ours_mb" -v pm="$peer_mb" -v f="$floor" 'BEGIN {
  r = (p == "nan") ? "-" : sprintf("%.2fx", p / o)
  printf "%-50s %10.1f %10s %8s\n", "sweep (s; PyTorch projected from its passes)", o, p, r
  printf "%-50s %10.0f %10s\n", "peak resident memory (MB)", om, pm
  printf "%-50s %10.1f\n", "headlab floor: the sweep'"'"'s GEMM FLOPs / SGEMM rate (s)", f }'
