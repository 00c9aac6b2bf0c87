#!/usr/bin/env bash
# The newer decoder families at their real shapes against the PyTorch eager peer on the nearest LLaMA shape (the peer,
# ../shared/peers/torch_llama_infer.py, is LlamaForCausalLM's maths: heads of width / heads, no q/k norms), random
# weights, alternately for --rounds rounds; medians and ratios of prefill 1 x 1024 (every position's logits) against
# the GEMM floor, and of decoding 64 tokens after 960 (batch 1, KV cache) against the bandwidth floor:
#   qwen3:  Qwen3-0.6B (28 layers, width 1024, 16 query heads of 128 sharing 8 key/value heads, q/k norms, SwiGLU
#           3072, vocabulary 151936, tied head); the peer's nearest: the same with heads of 64 (half the attention width);
#   gemma3: Gemma-3-270M (18 layers, width 640, 4 query heads of 256 sharing 1 key/value head, GeGLU 2048, vocabulary
#           262144, tied head, four norms a block, q/k norms, windows of 512 on 15 layers); the peer's nearest: the
#           same sizes with heads of 160 (width / heads) and SwiGLU, every layer global;
#   llama, llama_g: headlab on those nearest shapes too, so that what the new parts cost shows beside the width's.
# Usage: bench/family_ratios.sh [--rounds N] [--threads N] [--peer PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
peer=../shared/peers/torch_llama_infer.py
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "family_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets decoder_infer
have_peer=0
peer_available family_ratios.sh "$peer" && have_peer=1
near=(--layers 28 --dim 1024 --heads 16 --kv-heads 8 --hidden 3072 --vocab 151936)
near_g=(--layers 18 --dim 640 --heads 4 --kv-heads 1 --hidden 2048 --vocab 262144)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ours() { build/bench/decoder_infer --threads "$threads" --repeats 1 "$@"; }
for ((r = 1; r <= rounds; r++)); do
  ours --arch qwen3 --prefill 1024 --decode 0 >"$tmp/qwen3.pre.$r"
  ours --arch qwen3 --prefill 960 --decode 64 >"$tmp/qwen3.dec.$r"
  ours --arch llama "${near[@]}" --prefill 1024 --decode 0 >"$tmp/llama.pre.$r"
  ours --arch llama "${near[@]}" --prefill 960 --decode 64 >"$tmp/llama.dec.$r"
  ours --arch gemma3 --prefill 1024 --decode 0 >"$tmp/gemma3.pre.$r"
  ours --arch gemma3 --prefill 960 --decode 64 >"$tmp/gemma3.dec.$r"
  ours --arch llama "${near_g[@]}" --prefill 1024 --decode 0 >"$tmp/llama_g.pre.$r"
  ours --arch llama "${near_g[@]}" --prefill 960 --decode 64 >"$tmp/llama_g.dec.$r"
  if ((have_peer)); then
    for p in "" _g; do
      n="near$p[@]"
      /usr/bin/python3 "$peer" "${!n}" --threads "$threads" --repeats 1 --prefill 1024 --decode 0 >"$tmp/peer$p.pre.$r"
      /usr/bin/python3 "$peer" "${!n}" --threads "$threads" --repeats 1 --prefill 960 --decode 64 >"$tmp/peer$p.dec.$r"
    done
  fi
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
printf '%-52s %10s %10s %8s %9s\n' "" "headlab" "PyTorch" ratio "of floor"
for m in qwen3 llama gemma3 llama_g; do
  p_pre=nan p_dec=nan
  peer_of=peer
  [[ $m == gemma3 || $m == llama_g ]] && peer_of=peer_g
  if ((have_peer)); then
    p_pre=$(pick "$tmp/$peer_of.pre.*" "prefill" "tokens/s") p_dec=$(pick "$tmp/$peer_of.dec.*" "decode" "tokens/s")
  fi
  o_pre=$(pick "$tmp/$m.pre.*" "prefill" "tokens/s") o_dec=$(pick "$tmp/$m.dec.*" "decode" "tokens/s")
  f_pre=$(pct "$tmp/$m.pre.*" "prefill") f_dec=$(paired_pct "$tmp/$m.dec.*" "decode")
  awk -v m="$m" -v o="$o_pre" -v p="$p_pre" -v f="$f_pre" -v o2="$o_dec" -v p2="$p_dec" -v f2="$f_dec" 'BEGIN {
    r1 = (p == "nan") ? "-" : sprintf("%.2fx", o / p); r2 = (p2 == "nan") ? "-" : sprintf("%.2fx", o2 / p2)
    printf "%-52s %10.0f %10s %8s %8s%%\n", m ": prefill 1 x 1024, every position (tokens/s)", o, p, r1, f
    printf "%-52s %10.1f %10s %8s %8s%%\n", m ": decode 64 after 960 (tokens/s)", o2, p2, r2, f2 }'
done
