#!/usr/bin/env bash
# Loading a GPT-2-small folder and the memory of the commands that use it, from one command: a random
# GPT-2-small (124M float32, tied head) written as a Hugging Face folder with GPT-2's tokenizer files,
# then, for --rounds rounds: the load alone (bench/decoder_infer --model: seconds with a warm page cache,
# peak resident memory), `headlab eval` on a text (1024-token windows) and `headlab generate` (a
# 960-token prompt, 64 new tokens), each command's peak resident memory (/usr/bin/time) over the weights.
# Usage: bench/gpt2_memory.sh [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "gpt2_memory.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
vocab=${XDG_CACHE_HOME:-$HOME/.cache}/headlab/gpt2
[[ -f $vocab/vocab.json ]] || { echo "gpt2_memory.sh: no GPT-2 vocabulary in $vocab (scripts/install-deps.sh)" >&2; exit 1; }
build_targets decoder_infer headlab_cli

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/bench/decoder_infer --arch gpt --save "$tmp/gpt2" >/dev/null
cp "$vocab/vocab.json" "$vocab/merges.txt" "$tmp/gpt2/"
weights_mb=$(build/bench/decoder_infer --model "$tmp/gpt2" --prefill 8 --decode 0 --repeats 1 | grep -o "weights [0-9.]* MB" | cut -d' ' -f2)
# A text for eval (English, 8 windows of 1024 tokens) and a prompt of 960 tokens for generate.
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 >"$tmp/text.txt"
prompt=$(head -c 4000 "$tmp/text.txt")  # about 960 tokens; the table says how many
tokens=$(build/headlab tokenize "$tmp/gpt2" --prompt "$prompt" | wc -w)

peak_mb() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 / 1024}'; }
for ((r = 1; r <= rounds; r++)); do
  build/bench/decoder_infer --model "$tmp/gpt2" --prefill 8 --decode 0 --repeats 1 --threads "$threads" >"$tmp/load.$r"
  peak_mb build/headlab eval "$tmp/gpt2" --text "$tmp/text.txt" --stride 1024 --threads "$threads" >"$tmp/eval.$r"
  OMP_NUM_THREADS=$threads peak_mb build/headlab generate "$tmp/gpt2" --prompt "$prompt" --max-new-tokens 64 >"$tmp/gen.$r"
  echo "round $r/$rounds done" >&2
done
load_s=$(for f in "$tmp"/load.*; do grep "^load" "$f" | grep -o ": [0-9.]* s" | tr -dc '0-9.\n'; done | median)
load_mb=$(for f in "$tmp"/load.*; do grep "^load" "$f" | grep -o "peak resident [0-9.]*" | cut -d' ' -f3; done | median)
eval_mb=$(cat "$tmp"/eval.* | median) gen_mb=$(cat "$tmp"/gen.* | median)
printf '%s, %s threads; weights %s MB\n' "$(machine_line)" "$threads" "$weights_mb"
awk -v s="$load_s" -v l="$load_mb" -v e="$eval_mb" -v g="$gen_mb" -v w="$weights_mb" -v t="$tokens" 'BEGIN {
  printf "%-58s %10s %9s\n", "", "peak MB", "/ weights"
  printf "%-58s %10.0f %8.2fx\n", sprintf("load the folder (%.3f s, warm page cache)", s), l, l / w
  printf "%-58s %10.0f %8.2fx\n", "headlab eval --text (windows of 1024, stride 1024)", e, e / w
  printf "%-58s %10.0f %8.2fx\n", sprintf("headlab generate (%d-token prompt, 64 new)", t), g, g / w }'
