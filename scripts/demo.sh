#!/usr/bin/env bash
# The main job: build headlab, train the default GPT on the `reverse` task, then evaluate it,
# generate with it, inspect it, find which heads matter (ablate, heads) and compare the wrapper and
# fused attention forms, export it for PyTorch; then train d2l's encoder-decoder on number words and ablate its heads by
# kind. Everything lands in runs/demo/ and runs/demo-numbers/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The command, the Python module (build/python/headlab) and the C++ examples (build/examples/): what the README uses.
./scripts/build.sh --target headlab_cli --target headlab_python --target examples
hl=./build/headlab
out=runs/demo
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. train: a 2-layer, 4-head GPT learns to reverse digit strings (headlab train --help lists every option)"
$hl train --task reverse --out "$out" --overwrite "$@"  # (--overwrite: a second demo replaces the first's run)

say "2. eval: loss, token accuracy and exact-match accuracy on validation prompts never seen in training"
$hl eval "$out/checkpoint.h5"

say "3. generate: the model answers task inputs (greedy decoding; stdout is the prompt and its answer)"
for p in 31415 9876543 1200; do $hl generate "$out/checkpoint.h5" --prompt "$p"; done

say "4. inspect: what the checkpoint holds (config, parameters, training state, metrics)"
$hl inspect "$out/checkpoint.h5"

say "5. ablate: which heads matter (zero/mean/resample ablation in one batched pass, gradient importance, pruning curve by measured cost, pruned model fine-tuned 100 steps)"
$hl ablate "$out/checkpoint.h5" --out "$out/ablate" --prune 2 --finetune 100

say "6. heads: what each head does (direct logit attribution, activation patching with one prompt digit changed, head types)"
$hl heads "$out/checkpoint.h5" --out "$out/heads"

say "7. compare: the per-head wrapper against the fused multi-head attention (same maths, different cost)"
$hl compare --out "$out/compare"

say "7b. export: the GPT as a Hugging Face GPT2LMHeadModel folder (config.json, model.safetensors) that PyTorch loads"
$hl export "$out/checkpoint.h5" --out "$out/hf"

ed=runs/demo-numbers
say "8. translate: d2l's encoder-decoder Transformer learns English number words -> digits (source and target padded per batch, valid_lens)"
$hl train --arch encoder-decoder --task numbers --steps 1000 --out "$ed" --overwrite
$hl eval "$ed/checkpoint.h5"
for p in "three hundred and twelve" "forty two thousand and seven" "ninety nine"; do $hl generate "$ed/checkpoint.h5" --prompt "$p"; done

say "9. ablate the encoder-decoder: heads by kind (encoder self, decoder self, cross), Michel et al.'s best-head-only table, and every head's attention by kind"
$hl ablate "$ed/checkpoint.h5" --out "$ed/ablate" --prune 4
$hl attention "$ed/checkpoint.h5" --prompt "three hundred and twelve" --out "$ed/attention"

say "10. Python: the same checkpoint from Python (PYTHONPATH=build/python; Debian's python3, which the module is built for)"
PYTHONPATH=build/python /usr/bin/python3 - "$out/checkpoint.h5" <<'PY'
import sys, headlab
model = headlab.load(sys.argv[1])
tokens = model.to_tokens("31415")
logits, cache = model.run_with_cache(tokens)
print("tokens", model.to_str_tokens(tokens), "-> logits", logits.shape, "; layer 1's attention", cache["blocks.1.attn.hook_pattern"].shape)
print("generate:", model.generate("31415"))
PY

say "done: files in $out/ (checkpoint.h5, metrics.csv, ablate/report.md and PNGs, heads/report.md, compare/compare.csv and compare.png, hf/ for PyTorch) and $ed/ (the encoder-decoder, ablate/report.md, attention/attention.html: encoder, decoder and cross-attention on one page)"
