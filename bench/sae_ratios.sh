#!/usr/bin/env bash
# Sparse autoencoder training from one command: bench/sae_train against the PyTorch eager peer
# (../shared/peers/torch_sae_train.py, SAELens-style dense training) at the issue's sizes (d_in 512, 16x: d_sae
# 8192, batches of 4096 random rows, Adam 3e-4), TopK (k 32) and ReLU (L1 5), alternately for --rounds rounds, both
# with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (a user's machine): median training tokens/s and their ratio,
# the last batch's explained variance on each side (the same after the same tokens, or the speed is not comparable),
# peak RSS, and headlab's step against its floor (its GEMM FLOPs over the SGEMM rate measured beside it).
# Usage: bench/sae_ratios.sh [--rounds N] [--threads N] [--peer PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=3 threads=2
peer=../shared/peers/torch_sae_train.py
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "sae_ratios.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
build_targets sae_train
have_peer=0
peer_available sae_ratios.sh "$peer" && have_peer=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
for ((r = 1; r <= rounds; r++)); do
  for arch in topk relu; do
    build/bench/sae_train --arch "$arch" --threads "$threads" >"$tmp/ours.$arch.$r"
    ((have_peer)) && /usr/bin/python3 "$peer" --arch "$arch" --threads "$threads" >"$tmp/peer.$arch.$r"
  done
  echo "round $r/$rounds done" >&2
done

printf '%s, %s threads\n' "$(machine_line)" "$threads"
((have_peer)) && peer_line
printf '%-34s %9s %9s %7s %8s %8s %8s %8s %8s\n' "" headlab PyTorch ratio "EV ours" "EV peer" "RSS ours" "RSS peer" \
  "of floor"
for arch in topk relu; do
  o=$(pick "$tmp/ours.$arch.*" "sae" "tokens/s")
  ev_o=$(for f in "$tmp"/ours.$arch.*; do grep -o "explained variance [-0-9.]*" "$f" | cut -d' ' -f3; done | median)
  rss_o=$(for f in "$tmp"/ours.$arch.*; do grep -o "peak RSS [0-9]*" "$f" | cut -d' ' -f3; done | median)
  fl=$(pct "$tmp/ours.$arch.*" "sae")
  p=nan ev_p=nan rss_p=nan
  if ((have_peer)); then
    p=$(pick "$tmp/peer.$arch.*" "sae" "tokens/s")
    ev_p=$(for f in "$tmp"/peer.$arch.*; do grep -o "explained variance [-0-9.]*" "$f" | cut -d' ' -f3; done | median)
    rss_p=$(for f in "$tmp"/peer.$arch.*; do grep -o "peak RSS [0-9]*" "$f" | cut -d' ' -f3; done | median)
  fi
  awk -v a="$arch" -v o="$o" -v p="$p" -v eo="$ev_o" -v ep="$ev_p" -v ro="$rss_o" -v rp="$rss_p" -v f="$fl" 'BEGIN {
    r = (p == "nan") ? "-" : sprintf("%.2fx", o / p)
    printf "%-34s %9.0f %9s %7s %8s %8s %8s %8s %7s%%\n", a " training (tokens/s)", o, p, r, eo, ep, ro " MB", rp " MB", f }'
done
