#!/usr/bin/env bash
# Circuit analyses at GPT-2-small shape, 64 prompt pairs of 15 tokens (IOI's), from one command:
# bench/gpt2_circuit (headlab) against bench/torch_circuit_peer.py (PyTorch hooks, TransformerLens's
# layout), each phase in its own process, alternately for --rounds rounds: edge attribution patching over
# every edge, and path patching of all 144 heads into the logits. Medians, ratios, each side's peak
# resident memory, headlab's floor (at the fastest SGEMM rate any round measured).
# Usage: bench/gpt2_circuit.sh [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "gpt2_circuit.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets gpt2_circuit
peer=bench/torch_circuit_peer.py have_peer=0
peer_available gpt2_circuit.sh "$peer" && have_peer=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for phase in eap path; do
    build/bench/gpt2_circuit --phase "$phase" --threads "$threads" --repeats 1 >"$tmp/ours.$phase.$r"
    ((have_peer)) && /usr/bin/python3 "$peer" --phase "$phase" --threads "$threads" --repeats 1 >"$tmp/peer.$phase.$r"
  done
  echo "round $r/$rounds done" >&2
done
printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
printf '%-52s %10s %10s %8s\n' "GPT-2 small, 64 pairs x 15 tokens" headlab PyTorch ratio
for phase in eap path; do
  ours=$(grep -ho ": [0-9.]* s (median" "$tmp"/ours.$phase.* | tr -dc '0-9.\n' | median)
  ours_mb=$(grep -ho "peak resident [0-9.]*" "$tmp"/ours.$phase.* | cut -d' ' -f3 | median)
  floor=$(grep -ho "floor [0-9.]* s" "$tmp"/ours.$phase.* | cut -d' ' -f2 | smallest)
  peer_s=nan peer_mb=nan
  if ((have_peer)); then
    peer_s=$(grep -ho "seconds_median=[0-9.]*" "$tmp"/peer.$phase.* | cut -d= -f2 | median)
    peer_mb=$(grep -ho "peak_mb=[0-9.]*" "$tmp"/peer.$phase.* | cut -d= -f2 | median)
  fi
  name=$([[ $phase == eap ]] && echo "edge attribution, every edge" || echo "path patching, 144 heads -> logits")
  awk -v n="$name" -v o="$ours" -v p="$peer_s" -v om="$ours_mb" -v pm="$peer_mb" -v f="$floor" 'BEGIN {
    r = (p == "nan") ? "-" : sprintf("%.2fx", p / o); rm = (pm == "nan") ? "-" : sprintf("%.2fx", pm / om)
    printf "%-52s %10.2f %10s %8s\n", n " (s)", o, p, r
    printf "%-52s %10.0f %10s %8s\n", "  peak resident memory (MB)", om, pm, rm
    printf "%-52s %10.2f\n", "  headlab floor: GEMM FLOPs / SGEMM rate (s)", f }'
done
