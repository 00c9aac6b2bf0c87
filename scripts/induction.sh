#!/usr/bin/env bash
# Induction heads from scratch (Olsson et al. 2022, "In-context learning and induction heads"): a
# 1-layer and a 2-layer attention-only GPT trained on the same text with the same settings, every head
# scored while they train (train --track-heads), `headlab heads` and `headlab circuit --task induction`
# on both final checkpoints, and OUT/report.md: when the induction head formed, its score, the
# previous-token head it composes with (K-composition), the in-context-learning score before and after,
# the loss around the phase change, what ablating the head costs on repeated random tokens, the 2-layer
# model's circuit, and the same for the 1-layer model.
#
# Usage: scripts/induction.sh [--out DIR] [--text FILE] [--steps N] [--every N] [--headlab BINARY] [--quick]
#   The text (default): Debian's fortunes (package fortunes, installed by scripts/install-deps.sh),
#   2.5 MB of English, one character per token, written with more repetition (--repeat-prob 1: every
#   segment twice): on the plain text no induction head forms within this budget (docs/induction.md,
#   "What did not work, and what made it appear", has those runs).
#   --quick: a few steps on data/tiny.txt, to check that the pipeline runs (the test suite does).
set -euo pipefail

out=runs/induction text="" steps=3000 every=100 hl="" quick=0
value() {  # the value of option $1, or a usage error
  if (($# < 2)); then echo "induction.sh: $1 needs a value (see --help)" >&2; exit 2; fi
  printf '%s' "$2"
}
while (($#)); do
  case "$1" in
    --out) out=$(value "$@"); shift 2 ;;
    --text) text=$(value "$@"); shift 2 ;;
    --steps) steps=$(value "$@"); shift 2 ;;
    --every) every=$(value "$@"); shift 2 ;;
    --headlab) hl=$(value "$@"); shift 2 ;;
    --quick) quick=1 steps=20 every=10; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "induction.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# Paths as given, from where the script was called; then everything runs from the repository root.
out=$(realpath -m "$out")
[[ -n "$text" ]] && text=$(realpath -m "$text")
[[ -n "$hl" ]] && hl=$(realpath -m "$hl")
cd "$(dirname "$0")/.."
((quick)) && text=${text:-$PWD/data/tiny.txt}

mkdir -p "$out"
if [[ -z "$text" ]]; then
  corpus=/usr/share/games/fortunes
  if [[ ! -d "$corpus" ]]; then
    echo "induction.sh: no corpus: $corpus is missing; run scripts/install-deps.sh (it installs Debian's" \
         "fortunes) or pass --text FILE" >&2
    exit 1
  fi
  # Every fortune file in a fixed order, without the '%' lines between fortunes.
  text=$out/fortunes.txt
  find "$corpus" -maxdepth 1 -type f ! -name '*.dat' -print0 | LC_ALL=C sort -z | xargs -0 cat | grep -v '^%$' >"$text"
fi
if [[ -z "$hl" ]]; then
  ./scripts/build.sh --target headlab_cli >/dev/null
  hl=./build/headlab
fi

# The same data, seed and schedule for both models; only --n-layers differs. Every segment of 4..28
# characters is written twice, so that both copies fit in a context of 32: the time an induction head
# takes to form grows with the square of the context, and single characters recur too often in a long
# one for matching one of them to find the copy (docs/induction.md has the runs that did not).
ctx=32 span=28 batch=128 evals=(--eval-every 500)
if ((quick)); then evals=(--eval-every 10 --eval-batches 2); fi
settings=(--task chars --text "$text" --repeat-prob 1 --repeat-span "$span" --attn-only --n-heads 4 --emb-dim 128
          --context-length "$ctx" --batch-size "$batch" --steps "$steps" --lr 1e-2 --warmup 100 "${evals[@]}"
          --save-every 500 --track-heads "$every" --seed 1 --log-every 500)

for layers in 1 2; do
  run=$out/L$layers
  rm -rf "$run"
  start=$(date +%s.%N)
  "$hl" train "${settings[@]}" --n-layers "$layers" --out "$run" | tee "$run.log"
  "$hl" heads "$run/checkpoint.h5" --out "$run/heads" >"$run/heads.log"
  "$hl" heads "$run/checkpoint.h5" --task induction --out "$run/heads_pairs" >"$run/heads_pairs.log"
  "$hl" circuit "$run/checkpoint.h5" --task induction --out "$run/circuit" >"$run/circuit.log"
  awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", e - s }' >"$run.seconds"
done

# --- report.md -----------------------------------------------------------------------------------
trained() { grep -m1 '^trained ' "$out/L$1.log"; }  # "trained N steps in X s (Y tok/s)"
watched() { grep -m1 '^watching the model' "$out/L$1.log" || echo "(not tracked)"; }
labels() {  # the heads with a label, from heads.csv's last column
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "label") c = i; next }
           $c != "" { printf "L%sH%s %s; ", $1, $2, $c }' "$out/L$1/heads/heads.csv"
}
{
  echo "# Induction heads from scratch: a 1-layer and a 2-layer attention-only model"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(date -u +%Y-%m-%d)."
  echo "Text: \`$text\` ($(wc -c <"$text") bytes), characters as tokens, each segment of $((span / 6))..$span characters"
  echo "written twice; 90% for training, the last 10% held out (the scores below use held-out rows)."
  echo "Both models: \`headlab train ${settings[*]}\` with \`--n-layers 1\` or \`2\`:"
  echo "$steps steps of $batch x $ctx tokens, $((steps * batch * ctx)) tokens each."
  echo
  for layers in 2 1; do
    echo "## $layers layer$( ((layers > 1)) && echo s)"
    echo
    echo "- $(trained "$layers"); wall time with \`heads\`: $(cat "$out/L$layers.seconds") s"
    echo "- $(watched "$layers")"
    cat "$out/L$layers/heads_over_time.md"
    echo "- labels from \`headlab heads\` on the final checkpoint: $(labels "$layers")"
    grep '^- induction head\|^repeated random tokens' "$out/L$layers/heads.log" | sed 's/^\([^-]\)/- \1/' || true
    echo
    echo "![heads over time, L$layers](L$layers/heads_over_time.png)"
    echo
  done
  echo "![composition, 2 layers](L2/heads/composition.png)"
  echo
  echo "## The 2-layer model's heads on induction prompt pairs (\`headlab heads --task induction\`)"
  echo
  echo '```'
  sed -n '/^logit difference/p;/^heads, by the largest effect/,/^$/p' "$out/L2/heads_pairs.log" | sed '/^$/d'
  echo '```'
  echo
  echo "## The 2-layer model's circuit (\`headlab circuit --task induction\`)"
  echo
  grep '^prompt pairs\|^logit difference\|^attribution against\|^circuit (' "$out/L2/circuit.log" | sed 's/^/- /'
  echo
  echo '```'
  sed -n '/^circuit (/,/^$/p' "$out/L2/circuit.log" | sed '1d;/^$/d'
  echo '```'
  echo
  echo "![circuit, 2 layers](L2/circuit/circuit.png)"
} >"$out/report.md"
echo "wrote $out/report.md"
