"""Small random GPT-2 folders in the Hugging Face layout, in every variant real files come in, and
PyTorch's logits and greedy continuation for them (tests/fixtures/gpt2_folders/).

transformers is not a Debian package, so GPT2LMHeadModel's maths is written out here in torch from
its definition: Conv1D (x @ W + b, W stored (in, out)), c_attn = [q | k | v], causal softmax of
q k^T / sqrt(D), gelu_new (the tanh approximation), LayerNorm eps 1e-5, pre-norm blocks, ln_f, and
the head tied to wte unless lm_head.weight is given. safetensors is not a Debian package either: the
format is written by hand (8-byte little-endian header length, JSON header, raw little-endian data).

One set of weights serves every variant: the values are rounded to numbers that float16 and
bfloat16 both hold exactly, so the F16 and BF16 files store the very same model and one reference
(reference.json) checks them all. Variants:
  lm_head_model/   GPT2LMHeadModel names (transformer.), tied head, F32, the old causal-mask buffers
  untied/          transformer. names plus lm_head.weight, tie_word_embeddings false, F32
  base_model_f16/  GPT2Model names (no prefix), F16
  sharded_bf16/    BF16 in two shards with model.safetensors.index.json

Usage: python3 tools/fixtures_gpt2_folders.py [--out tests/fixtures/gpt2_folders]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import math
import os
import struct

import torch

CONFIG = {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 16, "vocab_size": 96}


def representable(t):
    """t rounded to values both float16 and bfloat16 hold exactly (bf16's 8-bit significand, and
    nothing below float16's smallest normal number)."""
    t = t.to(torch.bfloat16).to(torch.float32)
    t[t.abs() < 2.0 ** -14] = 0.0
    assert torch.equal(t.to(torch.float16).to(torch.float32), t)
    return t


def random_weights(seed):
    g = torch.Generator().manual_seed(seed)
    C, V, P, L = CONFIG["n_embd"], CONFIG["vocab_size"], CONFIG["n_positions"], CONFIG["n_layer"]

    def rnd(*shape, scale=0.2):
        return representable(torch.randn(*shape, generator=g) * scale)

    w = {"wte.weight": rnd(V, C), "wpe.weight": rnd(P, C)}
    for i in range(L):
        h = f"h.{i}."
        w[h + "ln_1.weight"] = representable(1 + rnd(C, scale=0.1))
        w[h + "ln_1.bias"] = rnd(C, scale=0.1)
        w[h + "attn.c_attn.weight"] = rnd(C, 3 * C)
        w[h + "attn.c_attn.bias"] = rnd(3 * C, scale=0.1)
        w[h + "attn.c_proj.weight"] = rnd(C, C)
        w[h + "attn.c_proj.bias"] = rnd(C, scale=0.1)
        w[h + "ln_2.weight"] = representable(1 + rnd(C, scale=0.1))
        w[h + "ln_2.bias"] = rnd(C, scale=0.1)
        w[h + "mlp.c_fc.weight"] = rnd(C, 4 * C)
        w[h + "mlp.c_fc.bias"] = rnd(4 * C, scale=0.1)
        w[h + "mlp.c_proj.weight"] = rnd(4 * C, C)
        w[h + "mlp.c_proj.bias"] = rnd(C, scale=0.1)
    w["ln_f.weight"] = representable(1 + rnd(C, scale=0.1))
    w["ln_f.bias"] = rnd(C, scale=0.1)
    return w, rnd(V, C)  # the weights and an untied head


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_logits(w, ids, lm_head=None):
    """GPT2LMHeadModel's forward in eval mode: ids (B, T) -> logits (B, T, V)."""
    C, H = CONFIG["n_embd"], CONFIG["n_head"]
    D = C // H
    B, T = ids.shape
    ln = torch.nn.functional.layer_norm
    x = w["wte.weight"][ids] + w["wpe.weight"][torch.arange(T)]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for i in range(CONFIG["n_layer"]):
        h = f"h.{i}."
        a = ln(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], 1e-5)
        qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + ctx @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = ln(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], 1e-5)
        m = gelu_new(m @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"])
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = ln(x, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return x @ (w["wte.weight"] if lm_head is None else lm_head).T


def greedy_continuation(logits, prompt, n, positions):
    """n ids after prompt, each the argmax of logits(ids) (B, T, V) at the last of the last `positions` ids."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(logits(torch.tensor([ids[-positions:]]))[0, -1].argmax()))
    return ids[len(prompt):]


def greedy(w, prompt, n, lm_head=None):
    return greedy_continuation(lambda ids: gpt2_logits(w, ids, lm_head), prompt, n, CONFIG["n_positions"])


def write_variants(out, variants, first_seed, ids, prompt, positions, random_weights, config_json, logits, write):
    """Each variant's folder (config.json, and its weights through write(folder, v, w)) and reference.json: the
    twin's logits over ids and its greedy continuation of prompt (12 ids), per variant, seeds first_seed, + 1, ..."""
    reference = {}
    for seed, (name, v) in enumerate(variants.items()):
        w = random_weights(v, first_seed + seed)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(config_json(v))
        write(d, v, w)
        reference[name] = {"ids": ids.tolist(), "logits": logits(v, w, ids).tolist(), "prompt": prompt,
                           "greedy": greedy_continuation(lambda x: logits(v, w, x), prompt, 12, positions)}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f)
        f.write("\n")


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def write_safetensors(path, tensors, dtype):
    """tensors: {name: float32 tensor}, written as dtype ("F32", "F16", "BF16"), names sorted."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(DTYPES[dtype]).contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if dtype != "F32" else t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the safetensors writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_weights(folder, tensors, dtype, shards=1):
    """tensors in folder/model.safetensors, or split over `shards` files with model.safetensors.index.json."""
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors, dtype)
        return
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(folder, file), {n: tensors[n] for n in names[s::shards]}, dtype)
        weight_map.update({n: file for n in names[s::shards]})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def config_json(tied):
    c = dict(CONFIG, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=CONFIG["n_positions"],
             activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.1, embd_pdrop=0.1,
             attn_pdrop=0.1, n_inner=None, tie_word_embeddings=tied)
    return json.dumps(c, indent=2) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "gpt2_folders"))
    args = ap.parse_args()
    torch.manual_seed(0)
    w, head = random_weights(1234)
    L, P = CONFIG["n_layer"], CONFIG["n_positions"]
    mask = torch.tril(torch.ones(P, P)).view(1, 1, P, P)  # the old files' attn.bias buffer

    def folder(name, tensors, dtype, tied, shards=1):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(config_json(tied))
        write_weights(d, tensors, dtype, shards)

    prefixed = {"transformer." + k: v for k, v in w.items()}
    with_masks = dict(prefixed)
    for i in range(L):
        with_masks[f"transformer.h.{i}.attn.bias"] = mask
        with_masks[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    folder("lm_head_model", with_masks, "F32", tied=True)
    folder("untied", dict(prefixed, **{"lm_head.weight": head}), "F32", tied=False)
    folder("base_model_f16", w, "F16", tied=True)
    folder("sharded_bf16", prefixed, "BF16", tied=True, shards=2)

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, P), generator=g)
    prompt = [5, 17, 42, 3]
    ref = {
        "ids": ids.tolist(),
        "logits_tied": gpt2_logits(w, ids).tolist(),
        "logits_untied": gpt2_logits(w, ids, head).tolist(),
        "prompt": prompt,
        "greedy_tied": greedy(w, prompt, 24),
        "greedy_untied": greedy(w, prompt, 24, head),
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")


if __name__ == "__main__":
    main()
