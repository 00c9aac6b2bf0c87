#!/usr/bin/env bash
# Quantized weights kept quantized (nn::to_quantized_weights: ggml's Q8_0 and Q4_K blocks, read as they are) against
# float32, on bench/llama_ratios.sh's model (SmolLM-135M's shape: 30 layers, width 576, 9 query heads sharing 3
# key/value heads, SwiGLU 1536, tied head, Llama 2's vocabulary of 32000; random weights), each dtype alternately
# for --rounds rounds, medians:
#   decoding 64 tokens after 960 (batch 1, KV cache): tokens/s, the ratio to float32's, and the share of the
#     bandwidth floor (the bytes a token reads where they lie: the blocks, the float32 rest, the KV cache, over
#     the read bandwidth decoder_infer measures beside it);
#   prefill 1 x 1024 (every position's logits): tokens/s and the ratio to float32's;
#   accuracy against float32, as decoder_infer states it (largest logit difference, mean KL, greedy agreement
#     over 256 tokens on random ids);
# then `headlab generate` (a 960-token prompt, 64 new) from checkpoints `headlab convert --dtype` wrote: peak
# resident memory and its ratio to float32's (needs ../shared/models/llama2-tokenizer/tokenizer.model).
# Usage: bench/quantized_ratios.sh [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=2 threads=2
tokenizer=../shared/models/llama2-tokenizer/tokenizer.model
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "quantized_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets decoder_infer headlab_cli
dtypes=(float32 q8_0 q4_k)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ours() { build/bench/decoder_infer --arch llama --vocab 32000 --threads "$threads" "$@"; }
for ((r = 1; r <= rounds; r++)); do
  for d in "${dtypes[@]}"; do
    ours --dtype "$d" --prefill 960 --decode 64 >"$tmp/$d.dec.$r"
    ours --dtype "$d" --prefill 1024 --decode 0 --agree 0 >"$tmp/$d.pre.$r"
  done
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
grep -h "^headlab" "$tmp/float32.dec.1"
f_dec=$(pick "$tmp/float32.dec.*" "decode" "tokens/s") f_pre=$(pick "$tmp/float32.pre.*" "prefill" "tokens/s")
printf '%-8s %14s %8s %10s %16s %8s\n' dtype "decode tok/s" ratio "of floor" "prefill tok/s" ratio
for d in "${dtypes[@]}"; do
  dec=$(pick "$tmp/$d.dec.*" "decode" "tokens/s") pre=$(pick "$tmp/$d.pre.*" "prefill" "tokens/s")
  floor=$(paired_pct "$tmp/$d.dec.*" "decode")
  awk -v d="$d" -v a="$dec" -v b="$f_dec" -v f="$floor" -v p="$pre" -v q="$f_pre" \
    'BEGIN { printf "%-8s %14.1f %7.2fx %9s%% %16.0f %7.2fx\n", d, a, a / b, f, p, p / q }'
done
for d in q8_0 q4_k; do grep -h "weights (" "$tmp/$d.dec.1"; done

echo
if [[ ! -f $tokenizer ]]; then
  echo "quantized_ratios.sh: no $tokenizer: generate's memory not measured" >&2
  exit 0
fi
ours --save "$tmp/model" >/dev/null
cp "$tokenizer" "$tmp/model/"
build/headlab convert "$tmp/model" --out "$tmp/float32.h5" >/dev/null
for d in q8_0 q4_k; do build/headlab convert "$tmp/model" --dtype "$d" --out "$tmp/$d.h5" >/dev/null; done
prompt=$(head -c 3600 /usr/share/common-licenses/GPL-3)  # about 960 tokens
peak_mb() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 / 1024}'; }
for ((r = 1; r <= rounds; r++)); do
  for d in "${dtypes[@]}"; do
    OMP_NUM_THREADS=$threads peak_mb build/headlab generate "$tmp/$d.h5" --prompt "$prompt" --max-new-tokens 64 \
      >"$tmp/$d.mem.$r"
  done
done
f_mb=$(cat "$tmp"/float32.mem.* | median)
for d in "${dtypes[@]}"; do
  mb=$(cat "$tmp/$d".mem.* | median) bytes=$(stat -c %s "$tmp/$d.h5")
  awk -v d="$d" -v m="$mb" -v f="$f_mb" -v b="$bytes" 'BEGIN {
    printf "headlab generate %s.h5 (%.0f MB file): peak resident %.0f MB, %.2fx float32'"'"'s\n", d, b / 1048576, m, m / f }'
done
