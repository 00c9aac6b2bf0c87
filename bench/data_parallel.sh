#!/usr/bin/env bash
# Data-parallel training speed (docs/data-parallel.md): the same run (same seed, global batch and
# steps) as 2 MPI ranks x 1 thread, 1 process x 2 threads each taking its rows (--parallel data, what
# --parallel auto picks for these models), 1 process x 2 threads splitting every op (--parallel ops)
# and 1 process x 1 thread, interleaved for --rounds rounds so that all see the same machine noise; the
# median training tokens/s of each (headlab train's own figure: the steps' time with their evaluations
# and checkpoints, without start-up) and rank 0's share of time in the gradient allreduce.
# Usage: bench/data_parallel.sh [--rounds N] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 steps=300
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "data_parallel.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
command -v mpirun >/dev/null || { echo "data_parallel.sh: needs mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
build_targets headlab_cli
build/headlab --version | grep -q 'MPI data parallel: built' || {
  echo "data_parallel.sh: build/ has no MPI (install libopenmpi-dev, reconfigure with -DHEADLAB_MPI=ON)" >&2; exit 1; }
# Open MPI: root needs consent; vader's single copy needs ptrace rights that containers lack.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none


models=("reverse --task reverse --emb-dim 64 --n-heads 4 --n-layers 2 --batch-size 64"
        "chars --task chars --emb-dim 128 --n-heads 4 --n-layers 4 --context-length 128 --batch-size 32")
modes=("2x1" "1x2-data" "1x2-ops" "1x1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for model in "${models[@]}"; do
    read -r name args <<<"$model"
    for mode in "${modes[@]}"; do
      common=(train $args --steps "$steps" --eval-every "$steps" --eval-batches 1 --save-every "$steps" --log-every "$steps"
              --out "$tmp/run")
      case $mode in
        2x1) mpirun -np 2 build/headlab "${common[@]}" --threads 1 >"$tmp/out" ;;
        1x2-data) build/headlab "${common[@]}" --threads 2 --parallel data >"$tmp/out" ;;
        1x2-ops) build/headlab "${common[@]}" --threads 2 --parallel ops >"$tmp/out" ;;
        1x1) build/headlab "${common[@]}" --threads 1 >"$tmp/out" ;;
      esac
      rm -rf "$tmp/run"
      grep -o "([0-9.]*k tok/s)" "$tmp/out" | tr -d '(k' | cut -d' ' -f1 >>"$tmp/$name-$mode.rate"
      grep -o "s ([0-9.]*%) in the gradient allreduce" "$tmp/out" | grep -o "[0-9.]*%" | tr -d % >>"$tmp/$name-$mode.comm" || true
    done
    echo "round $r/$rounds $name done" >&2
  done
done

printf '%s, %s steps, median of %s\n' "$(machine_line)" "$steps" "$rounds"
printf '%-10s %-9s %12s %10s %14s\n' model ranks "k tok/s" "vs 1x1" "allreduce %"
for model in "${models[@]}"; do
  read -r name args <<<"$model"
  base=$(median <"$tmp/$name-1x1.rate")
  for mode in "${modes[@]}"; do
    rate=$(median <"$tmp/$name-$mode.rate") comm=$(median <"$tmp/$name-$mode.comm")
    awk -v n="$name" -v m="$mode" -v r="$rate" -v b="$base" -v c="$comm" 'BEGIN {
      printf "%-10s %-9s %12.1f %9.2fx %14s\n", n, m, r, r / b, (c == "nan" ? "-" : c) }'
  done
done
