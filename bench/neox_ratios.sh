#!/usr/bin/env bash
# GPT-NeoX inference from one command: bench/decoder_infer --arch neox against the PyTorch eager peer
# (../shared/peers/torch_neox_infer.py, GPTNeoXForCausalLM's maths) on a random model of Pythia-160M's shape
# (12 layers, width 768, 12 heads, MLP 3072, vocabulary 50304, rotary on a quarter of each head, parallel
# residual, untied embed_out), alternately for --rounds rounds, both with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
# unset (a user's machine); medians and ratios of prefill 1 x 1024 (every position's logits, as the peer computes
# them) against the GEMM floor, and decoding 64 tokens after 960 (batch 1, KV cache) against the bandwidth floor.
# Usage: bench/neox_ratios.sh [--rounds N] [--threads N] [--peer PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
peer=../shared/peers/torch_neox_infer.py
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "neox_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets decoder_infer
have_peer=0
peer_available neox_ratios.sh "$peer" && have_peer=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ours() { build/bench/decoder_infer --arch neox --threads "$threads" "$@"; }
theirs() { /usr/bin/python3 "$peer" --threads "$threads" "$@"; }
for ((r = 1; r <= rounds; r++)); do
  ours --prefill 1024 --decode 0 >"$tmp/ours.pre.$r"
  ours --prefill 960 --decode 64 >"$tmp/ours.dec.$r"
  if ((have_peer)); then
    theirs --prefill 1024 --decode 0 >"$tmp/peer.pre.$r"
    theirs --prefill 960 --decode 64 >"$tmp/peer.dec.$r"
  fi
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
grep -h "^headlab" "$tmp/ours.dec.1"
o_pre=$(pick "$tmp/ours.pre.*" "prefill" "tokens/s") o_dec=$(pick "$tmp/ours.dec.*" "decode" "tokens/s")
f_pre=$(pct "$tmp/ours.pre.*" "prefill") f_dec=$(paired_pct "$tmp/ours.dec.*" "decode")
p_pre=nan p_dec=nan
if ((have_peer)); then
  p_pre=$(pick "$tmp/peer.pre.*" "prefill" "tokens/s") p_dec=$(pick "$tmp/peer.dec.*" "decode" "tokens/s")
fi
printf '%-46s %10s %10s %8s %9s\n' "" "headlab" "PyTorch" ratio "of floor"
awk -v o="$o_pre" -v p="$p_pre" -v f="$f_pre" -v o2="$o_dec" -v p2="$p_dec" -v f2="$f_dec" 'BEGIN {
  r1 = (p == "nan") ? "-" : sprintf("%.2fx", o / p); r2 = (p2 == "nan") ? "-" : sprintf("%.2fx", o2 / p2)
  printf "%-46s %10.0f %10s %8s %8s%%\n", "prefill 1 x 1024, every position (tokens/s)", o, p, r1, f
  printf "%-46s %10.1f %10s %8s %8s%%\n", "decode 64 after 960 (tokens/s)", o2, p2, r2, f2 }'
