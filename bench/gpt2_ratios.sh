#!/usr/bin/env bash
# GPT-2 inference speed from one command: bench/decoder_infer against the PyTorch eager peer
# (../shared/peers/torch_gpt2_infer.py, GPT2LMHeadModel's maths) on a random GPT-2-small shape (or
# --model DIR), alternately for --rounds rounds; medians and ratios of prefill (1 x 1024 tokens, every
# position's logits, as the peer computes them) and KV-cached decoding (64 tokens after a 960-token
# prompt, batch 1), each against its floor, both measured by decoder_infer: GEMM FLOPs over the SGEMM rate
# (the fastest any round measured), and a token's bytes over the rate at which they are read where they lie,
# measured beside each timed decoding (the median of each round's percentage).
# Then, unless --inference-only: loading and memory (bench/gpt2_memory.sh), the 144-head zero-ablation
# sweep against PyTorch hooks (bench/gpt2_heads.sh) and the tokenizer's speed (bench/bpe_tokenize), so
# one command prints every GPT-2 figure docs/performance.md quotes.
# Usage: bench/gpt2_ratios.sh [--rounds N] [--threads N] [--model DIR] [--peer PATH] [--inference-only]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2 model="" everything=1
peer=../shared/peers/torch_gpt2_infer.py
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    --inference-only) everything=0; shift ;;
    *) echo "gpt2_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets decoder_infer
have_peer=0
peer_available gpt2_ratios.sh "$peer" && have_peer=1
model_args=()
[[ -n "$model" ]] && model_args=(--model "$model")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Each program once per round and case: prefill (1 x 1024, no decoding), then decoding (960 + 64).
for ((r = 1; r <= rounds; r++)); do
  build/bench/decoder_infer --arch gpt "${model_args[@]}" --threads "$threads" --prefill 1024 --decode 0 >"$tmp/ours.pre.$r"
  build/bench/decoder_infer --arch gpt "${model_args[@]}" --threads "$threads" --prefill 960 --decode 64 >"$tmp/ours.dec.$r"
  if ((have_peer)); then
    /usr/bin/python3 "$peer" "${model_args[@]}" --threads "$threads" --prefill 1024 --decode 0 >"$tmp/peer.pre.$r"
    /usr/bin/python3 "$peer" "${model_args[@]}" --threads "$threads" --prefill 960 --decode 64 >"$tmp/peer.dec.$r"
  fi
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
head -1 "$tmp/ours.dec.1" | grep -q '^load' && head -1 "$tmp/ours.dec.1"
grep -h "^headlab" "$tmp/ours.dec.1"
o_pre=$(pick "$tmp/ours.pre.*" "prefill" "tokens/s") o_gen=$(pick "$tmp/ours.dec.*" "generate's prefill" "tokens/s")
o_dec=$(pick "$tmp/ours.dec.*" "decode" "tokens/s")
f_pre=$(pct "$tmp/ours.pre.*" "prefill") f_dec=$(paired_pct "$tmp/ours.dec.*" "decode")
p_pre=nan p_dec=nan
if ((have_peer)); then
  p_pre=$(pick "$tmp/peer.pre.*" "prefill" "tokens/s") p_dec=$(pick "$tmp/peer.dec.*" "decode" "tokens/s")
fi
printf '%-52s %12s %12s %8s %9s\n' "" "headlab" "PyTorch" ratio "of floor"
awk -v o="$o_pre" -v p="$p_pre" -v f="$f_pre" -v o2="$o_dec" -v p2="$p_dec" -v f2="$f_dec" -v g="$o_gen" 'BEGIN {
  r = (p == "nan") ? "-" : sprintf("%.2fx", o / p); r2 = (p2 == "nan") ? "-" : sprintf("%.2fx", o2 / p2)
  printf "%-52s %12.0f %12s %8s %8s%%\n", "prefill 1 x 1024, every position (tokens/s)", o, p, r, f
  printf "%-52s %12.0f %12s %8s %9s\n", "generate prefill 1 x 960, last position (tokens/s)", g, "-", "-", "-"
  printf "%-52s %12.1f %12s %8s %8s%%\n", "decode 64 after 960, KV cache (tokens/s)", o2, p2, r2, f2 }'
((everything)) || exit 0
echo
bench/gpt2_memory.sh --rounds "$rounds" --threads "$threads"
echo
bench/gpt2_heads.sh --rounds "$(( rounds < 2 ? rounds : 2 ))" --threads "$threads"
echo
cmake --build build -j"$(nproc)" --target bpe_tokenize >/dev/null
build/bench/bpe_tokenize "${XDG_CACHE_HOME:-$HOME/.cache}/headlab/gpt2"
