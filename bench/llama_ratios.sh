#!/usr/bin/env bash
# LLaMA-family inference from one command: bench/decoder_infer --arch llama against the PyTorch eager peer
# (../shared/peers/torch_llama_infer.py, LlamaForCausalLM's maths) on a random model of SmolLM-135M's shape
# (30 layers, width 576, 9 query heads sharing 3 key/value heads, SwiGLU 1536, tied head) with Llama 2's
# vocabulary of 32000, alternately for --rounds rounds; medians and ratios of
#   prefill 1 x 1024 (every position's logits, as the peer computes them) against the GEMM floor;
#   decoding 64 tokens after 960 (batch 1, KV cache) against the bandwidth floor (weight and KV-cache bytes
#     per token over the read bandwidth decoder_infer measures);
#   the same model with multi-head attention (9 key/value heads): its KV cache and its decoding;
# then loading the model as a Hugging Face folder (seconds, warm page cache) and `headlab generate`'s peak
# resident memory over the weights (with ../shared/models/llama2-tokenizer/tokenizer.model, when present).
# Usage: bench/llama_ratios.sh [--rounds N] [--threads N] [--peer PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
peer=../shared/peers/torch_llama_infer.py
tokenizer=../shared/models/llama2-tokenizer/tokenizer.model
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "llama_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets decoder_infer headlab_cli
have_peer=0
peer_available llama_ratios.sh "$peer" && have_peer=1
shape=(--vocab 32000)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ours() { build/bench/decoder_infer --arch llama "${shape[@]}" --threads "$threads" "$@"; }
theirs() { /usr/bin/python3 "$peer" "${shape[@]}" --threads "$threads" "$@"; }
# Each program once per round and case: prefill (1 x 1024), decoding (960 + 64), decoding with 9 KV heads.
for ((r = 1; r <= rounds; r++)); do
  ours --prefill 1024 --decode 0 >"$tmp/ours.pre.$r"
  ours --prefill 960 --decode 64 >"$tmp/ours.dec.$r"
  ours --prefill 960 --decode 64 --kv-heads 9 >"$tmp/ours.mha.$r"
  if ((have_peer)); then
    theirs --prefill 1024 --decode 0 >"$tmp/peer.pre.$r"
    theirs --prefill 960 --decode 64 >"$tmp/peer.dec.$r"
    theirs --prefill 960 --decode 64 --kv-heads 9 >"$tmp/peer.mha.$r"
  fi
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
grep -h "^headlab" "$tmp/ours.dec.1"
o_pre=$(pick "$tmp/ours.pre.*" "prefill" "tokens/s") o_gen=$(pick "$tmp/ours.dec.*" "generate's prefill" "tokens/s")
o_dec=$(pick "$tmp/ours.dec.*" "decode" "tokens/s") o_mha=$(pick "$tmp/ours.mha.*" "decode" "tokens/s")
f_pre=$(pct "$tmp/ours.pre.*" "prefill") f_dec=$(paired_pct "$tmp/ours.dec.*" "decode") f_mha=$(paired_pct "$tmp/ours.mha.*" "decode")
kv_gqa=$(pick "$tmp/ours.dec.1" "kv cache" "bytes per token") kv_mha=$(pick "$tmp/ours.mha.1" "kv cache" "bytes per token")
p_pre=nan p_dec=nan p_mha=nan
if ((have_peer)); then
  p_pre=$(pick "$tmp/peer.pre.*" "prefill" "tokens/s") p_dec=$(pick "$tmp/peer.dec.*" "decode" "tokens/s")
  p_mha=$(pick "$tmp/peer.mha.*" "decode" "tokens/s")
fi
printf '%-58s %10s %10s %8s %9s\n' "" "headlab" "PyTorch" ratio "of floor"
awk -v o="$o_pre" -v p="$p_pre" -v f="$f_pre" -v g="$o_gen" -v o2="$o_dec" -v p2="$p_dec" -v f2="$f_dec" \
  -v o3="$o_mha" -v p3="$p_mha" -v f3="$f_mha" -v kg="$kv_gqa" -v km="$kv_mha" 'BEGIN {
  r1 = (p == "nan") ? "-" : sprintf("%.2fx", o / p); r2 = (p2 == "nan") ? "-" : sprintf("%.2fx", o2 / p2)
  r3 = (p3 == "nan") ? "-" : sprintf("%.2fx", o3 / p3)
  printf "%-58s %10.0f %10s %8s %8s%%\n", "prefill 1 x 1024, every position (tokens/s)", o, p, r1, f
  printf "%-58s %10.0f %10s %8s %9s\n", "generate prefill 1 x 960, last position, chunks (tokens/s)", g, "-", "-", "-"
  printf "%-58s %10.1f %10s %8s %8s%%\n", "decode 64 after 960, 3 KV heads (tokens/s)", o2, p2, r2, f2
  printf "%-58s %10.1f %10s %8s %8s%%\n", "decode 64 after 960, 9 KV heads: multi-head (tokens/s)", o3, p3, r3, f3
  printf "KV cache per token: %d bytes with 3 KV heads, %d with 9: %.2fx; multi-head decodes %.2fx slower here\n",
    kg, km, km / kg, o2 / o3 }'

# Loading and memory: the model as a Hugging Face folder with Llama 2's tokenizer.
echo
if [[ ! -f $tokenizer ]]; then
  echo "llama_ratios.sh: no $tokenizer: loading and generate's memory not measured" >&2
  exit 0
fi
build/bench/decoder_infer --arch llama "${shape[@]}" --save "$tmp/model" >/dev/null
cp "$tokenizer" "$tmp/model/"
weights_mb=$(build/bench/decoder_infer --model "$tmp/model" --prefill 8 --decode 0 --repeats 1 | grep -o "weights [0-9.]* MB" | cut -d' ' -f2)
prompt=$(head -c 3600 /usr/share/common-licenses/GPL-3)  # about 960 tokens; the table says how many
tokens=$(build/headlab tokenize "$tmp/model" --prompt "$prompt" | wc -w)
peak_mb() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 / 1024}'; }
for ((r = 1; r <= rounds; r++)); do
  build/bench/decoder_infer --model "$tmp/model" --prefill 8 --decode 0 --repeats 1 --threads "$threads" >"$tmp/load.$r"
  OMP_NUM_THREADS=$threads peak_mb build/headlab generate "$tmp/model" --prompt "$prompt" --max-new-tokens 64 >"$tmp/gen.$r"
done
load_s=$(for f in "$tmp"/load.*; do grep "^load" "$f" | grep -o ": [0-9.]* s" | tr -dc '0-9.\n'; done | median)
gen_mb=$(cat "$tmp"/gen.* | median)
awk -v s="$load_s" -v g="$gen_mb" -v w="$weights_mb" -v t="$tokens" 'BEGIN {
  printf "load the folder (float32 safetensors, warm page cache): %.3f s; weights %.0f MB\n", s, w
  printf "headlab generate (%d-token prompt, 64 new): peak resident %.0f MB, %.2fx the weights\n", t, g, g / w }'
