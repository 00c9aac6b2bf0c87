#!/usr/bin/env bash
# Peak memory of `headlab sae features` (each feature's pre-activation split over heads, its logit effects) on a long
# prompt of a GPT-2-small-shaped decoder (12 layers x 12 heads, d_model 768, context 1024, random weights; the chars
# task, so no download) with TopK SAEs of 24,576 features (32x) on blocks.8.hook_resid_post (split over every head
# of layers 0-8 and a remainder) and blocks.8.attn.hook_z (its 12 heads), at 64 and 1,024 prompt tokens, beside the
# same model's `generate` of one token (the model's own footprint). Peak RSS from /usr/bin/time.
# Usage: bench/sae_features_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
build_targets headlab_cli
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
build/headlab train --task chars --text data/tiny.txt --n-layers 12 --emb-dim 768 --n-heads 12 --context-length 1024 \
  --steps 1 --batch-size 1 --eval-batches 1 --out "$tmp/model" > /dev/null
build/headlab sae train "$tmp/model/checkpoint.h5" --text data/tiny.txt --hook blocks.8.hook_resid_post \
  --hook blocks.8.attn.hook_z --arch topk --k 32 --expansion 32 --training-tokens 2048 --batch-size 1024 \
  --buffer-rows 2048 --tokens 256 --eval-tokens 256 --out "$tmp/saes" > /dev/null
echo "1-minute load before: $(cut -d' ' -f1 /proc/loadavg)"
echo "| run | prompt tokens | peak RSS | seconds |"
echo "|---|---|---|---|"
for tokens in 64 1024; do
  prompt=$(tr '\n' ' ' < data/tiny.txt | head -c "$tokens" || true)  # tr ends on head's SIGPIPE
  for run in generate blocks.8.hook_resid_post blocks.8.attn.hook_z; do
    if [[ $run == generate ]]; then
      cmd=(build/headlab generate "$tmp/model/checkpoint.h5" --prompt "$prompt" --max-new-tokens 1)
    else
      cmd=(build/headlab sae features "$tmp/model/checkpoint.h5" "$tmp/saes/$run" --prompt "$prompt" --features 10 --json)
    fi
    /usr/bin/time -f "%M %e" -o "$tmp/time" "${cmd[@]}" > /dev/null
    read -r kb s < "$tmp/time"
    echo "| $run | $tokens | $((kb / 1024)) MB | $s |"
  done
done
