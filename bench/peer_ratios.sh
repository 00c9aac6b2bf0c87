#!/usr/bin/env bash
# The CPU-speed figures of docs/performance.md, from one command: one AdamW step of the
# book's GPT in headlab (bench/gpt_step) against the PyTorch eager peer (../shared/peers/torch_gpt_cpu.py),
# run alternately for --rounds rounds so that both see the same machine noise; medians, the ratio, the
# GEMM floor (the step's FLOPs over the fastest SGEMM rate gpt_step measured first in any run on as many
# threads), the 2-thread speed-up (the toy step also as headlab train runs it on 2 threads: --parallel data,
# each thread its rows), and the step's peak memory at T = 256, 512, 1024 for the fused and the wrapper
# attention (its slope).
# Usage: bench/peer_ratios.sh [--rounds N] [--seconds S] [--peer PATH] [--no-memory]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 seconds=3 memory=1
peer=../shared/peers/torch_gpt_cpu.py
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    --no-memory) memory=0; shift ;;
    *) echo "peer_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets gpt_step
have_peer=0
peer_available peer_ratios.sh "$peer" && have_peer=1

field() { grep -o "[0-9.]* $1" | head -1 | cut -d' ' -f1; }  # the number before a unit

toy="--vocab-size 64 --context-length 64 --emb-dim 128 --n-heads 4 --n-layers 2 --batch-size 32"
long="--vocab-size 96 --context-length 512 --emb-dim 256 --n-heads 8 --n-layers 4 --batch-size 8"
rows=("toy 1 $toy" "toy 2 $toy" "toy-data 2 $toy" "long 2 $long")
declare -A ours
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for row in "${rows[@]}"; do
    read -r name threads args <<<"$row"
    key="$name/$threads"
    mode=ops
    [[ $name == *-data ]] && mode=data
    build/bench/gpt_step $args --threads "$threads" --parallel "$mode" --seconds "$seconds" >"$tmp/out"
    field "ms/step" <"$tmp/out" >>"$tmp/$name-$threads.ours"
    field "GFLOP/step" <"$tmp/out" >"$tmp/$name-$threads.gflop"
    grep -o "sgemm=[0-9.]*" "$tmp/out" | cut -d= -f2 >>"$tmp/rate-$threads"  # every run's, per thread count
    if ((have_peer)); then
      /usr/bin/python3 "$peer" $args --threads "$threads" --seconds "$seconds" | field "ms/step" >>"$tmp/$name-$threads.theirs"
    fi
    echo "round $r/$rounds $key done" >&2
  done
done

printf '%s\n' "$(machine_line)"
((have_peer)) && peer_line
printf '%-39s %7s %11s %11s %7s %9s %9s\n' config threads "headlab ms" "peer ms" ratio "floor ms" "of floor"
for row in "${rows[@]}"; do
  read -r name threads args <<<"$row"
  o=$(median <"$tmp/$name-$threads.ours") t=nan
  # The floor at the fastest SGEMM rate any run on as many threads measured (a run that met a slow moment of
  # the host measured a low rate, and its own floor would flatter it).
  f=$(awk -v g="$(cat "$tmp/$name-$threads.gflop")" -v r="$(sort -g "$tmp/rate-$threads" | tail -1)" \
    'BEGIN { print 1000 * g / r }')
  ((have_peer)) && t=$(median <"$tmp/$name-$threads.theirs")
  ours[$name/$threads]=$o
  label=$(echo "$args" | sed 's/--vocab-size /V=/; s/ --context-length / T=/; s/ --emb-dim / d=/; s/ --n-heads / h=/; s/ --n-layers / L=/; s/ --batch-size / B=/')
  [[ $name == *-data ]] && label="$label data"
  awk -v l="$label" -v th="$threads" -v o="$o" -v t="$t" -v f="$f" 'BEGIN {
    printf "%-39s %7d %11.1f %11s %7s %9.1f %8.0f%%\n", l, th, o, (t == "nan" ? "-" : sprintf("%.1f", t)),
           (t == "nan" ? "-" : sprintf("%.2fx", t / o)), f, 100 * f / o }'
done
awk -v a="${ours[toy/1]}" -v b="${ours[toy/2]}" -v c="${ours[toy-data/2]}" 'BEGIN {
  printf "toy: 2 threads are %.2fx faster than 1 (each op split), %.2fx (each thread its rows)\n", a / b, a / c }'

if ((memory)); then
  echo
  echo "step peak memory (MiB above parameters and optimizer state), V=96 d=256 h=8 L=4 B=8, 2 threads, each op split:"
  printf '%-8s %6s %10s %12s\n' attention T "peak MiB" "x per 2x T"
  for form in fused wrapper; do
    prev=""
    for T in 256 512 1024; do
      mib=$(build/bench/gpt_step --vocab-size 96 --context-length "$T" --emb-dim 256 --n-heads 8 --n-layers 4 \
        --batch-size 8 --threads 2 --seconds 0 --attention "$form" --parallel ops | grep -o "peak [0-9.]*" | cut -d' ' -f2)
      slope=$([[ -n "$prev" ]] && awk -v a="$prev" -v b="$mib" 'BEGIN { printf "%.2f", b / a }' || echo -)
      printf '%-8s %6d %10.1f %12s\n' "$form" "$T" "$mib" "$slope"
      prev=$mib
    done
  done
fi
