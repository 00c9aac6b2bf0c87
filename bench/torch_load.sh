#!/usr/bin/env bash
# Loading a PyTorch file against the same weights in safetensors: a random GPT-2-small (124M float32, tied head)
# written by bench/decoder_infer as a Hugging Face folder (model.safetensors), the same tensors saved by Debian's
# torch as pytorch_model.bin beside an identical config.json; then, interleaved for --rounds rounds, the load
# alone of each (bench/decoder_infer --model: seconds with a warm page cache, peak resident memory over the
# weights: one copy of the weights is 1.0x plus the process's own).
# Usage: bench/torch_load.sh [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=5 threads=2
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "torch_load.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "torch_load.sh: needs python3-torch (scripts/install-deps.sh --python)" >&2; exit 1; }
build_targets decoder_infer

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/bench/decoder_infer --arch gpt --save "$tmp/st" >/dev/null
mkdir -p "$tmp/pt" && cp "$tmp/st/config.json" "$tmp/pt/"
# safetensors -> torch.save, read with numpy (the format: 8-byte header length, JSON header, raw data).
/usr/bin/python3 - "$tmp/st/model.safetensors" "$tmp/pt/pytorch_model.bin" <<'PY'
import collections, json, struct, sys
import numpy as np, torch
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
sd = collections.OrderedDict()
for name, e in header.items():
    if name == "__metadata__": continue
    assert e["dtype"] == "F32"
    b, end = e["data_offsets"]
    sd[name] = torch.from_numpy(np.frombuffer(raw, np.float32, (end - b) // 4, 8 + n + b).reshape(e["shape"]).copy())
torch.save(sd, sys.argv[2])
PY
for ((r = 1; r <= rounds; r++)); do
  for f in st pt; do
    build/bench/decoder_infer --model "$tmp/$f" --prefill 8 --decode 0 --repeats 1 --threads "$threads" >"$tmp/$f.$r"
  done
done
printf '%s, %s threads\n' "$(machine_line)" "$threads"
for f in st pt; do
  s=$(for x in "$tmp/$f".*; do grep "^load" "$x" | grep -o ": [0-9.]* s" | tr -dc '0-9.\n'; done | median)
  mb=$(for x in "$tmp/$f".*; do grep "^load" "$x" | grep -o "peak resident [0-9.]*" | cut -d' ' -f3; done | median)
  w=$(grep -o "weights [0-9.]* MB" "$tmp/$f.1" | head -1 | cut -d' ' -f2)
  printf '%-34s %8.3f s %8.0f MB peak (%.2fx the weights)\n' \
    "$([[ $f == st ]] && echo "model.safetensors" || echo "pytorch_model.bin (torch.save)")" "$s" "$mb" \
    "$(awk -v m="$mb" -v w="$w" 'BEGIN { print m / w }')"
done
