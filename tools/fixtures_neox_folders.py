"""Small random GPT-NeoX folders in the Hugging Face layout, in the variants real files come in, and
PyTorch's logits and greedy continuation for each (tests/fixtures/neox_folders/).

transformers is not a Debian package, so GPTNeoXForCausalLM's maths is written out here in torch from its
definition, in float64: LayerNorm with a bias; the fused query_key_value projection viewed per head as
[q | k | v] (view(B, T, H, 3 * D)); rotary embeddings on the first rotary_ndims = int(D * rotary_pct) dims
of each query and key head (rotate_half within them; inv_freq = base^(-2i/rotary_ndims)), the rest passed
through; causal softmax of q k^T / sqrt(D); attention.dense; the MLP dense_4h_to_h(gelu(dense_h_to_4h x))
with the exact (erf) GELU; the parallel residual x + attn(ln1 x) + mlp(ln2 x), or the sequential one;
final_layer_norm and embed_out. The safetensors writer (one file or shards) and the rounding to values
float16 and bfloat16 both hold exactly are fixtures_gpt2_folders.py's.

Variants (each its own sizes and weights; reference.json holds each one's ids, logits, prompt and greedy ids):
  parallel_quarter/      parallel residual, rotary_pct 0.25 (Pythia's), F32
  sequential_full/       use_parallel_residual false, rotary_pct 1.0, F32 in two shards
  parallel_f16_buffers/  parallel, rotary_pct 0.5, F16, with the buffers older files carry (attention.bias
                         BOOL, attention.masked_bias, attention.rotary_emb.inv_freq), tied embeddings

Usage: python3 tools/fixtures_neox_folders.py [--out tests/fixtures/neox_folders]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import os
import struct

import torch

from fixtures_gpt2_folders import representable, write_variants, write_weights

VARIANTS = {
    "parallel_quarter": dict(parallel=True, pct=0.25, heads=4, hidden=32, inter=64, tied=False, dtype="F32",
                             shards=1, buffers=False, base=10000.0),
    "sequential_full": dict(parallel=False, pct=1.0, heads=2, hidden=24, inter=40, tied=False, dtype="F32",
                            shards=2, buffers=False, base=500.0),
    "parallel_f16_buffers": dict(parallel=True, pct=0.5, heads=4, hidden=32, inter=48, tied=True, dtype="F16",
                                 shards=1, buffers=True, base=10000.0),
}
LAYERS, POSITIONS, VOCAB, EPS = 2, 16, 80, 1e-5


def rotary_ndims(v):
    return int(v["hidden"] // v["heads"] * v["pct"])


def random_weights(v, seed):
    g = torch.Generator().manual_seed(seed)
    C, F = v["hidden"], v["inter"]

    def rnd(*shape, scale=0.2):
        return representable(torch.randn(*shape, generator=g) * scale)

    w = {"gpt_neox.embed_in.weight": rnd(VOCAB, C),
         "gpt_neox.final_layer_norm.weight": representable(1 + rnd(C, scale=0.1)),
         "gpt_neox.final_layer_norm.bias": rnd(C, scale=0.1)}
    for i in range(LAYERS):
        p = f"gpt_neox.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w[p + norm + ".weight"] = representable(1 + rnd(C, scale=0.1))
            w[p + norm + ".bias"] = rnd(C, scale=0.1)
        w[p + "attention.query_key_value.weight"] = rnd(3 * C, C)
        w[p + "attention.query_key_value.bias"] = rnd(3 * C, scale=0.1)
        w[p + "attention.dense.weight"] = rnd(C, C)
        w[p + "attention.dense.bias"] = rnd(C, scale=0.1)
        w[p + "mlp.dense_h_to_4h.weight"] = rnd(F, C)
        w[p + "mlp.dense_h_to_4h.bias"] = rnd(F, scale=0.1)
        w[p + "mlp.dense_4h_to_h.weight"] = rnd(C, F)
        w[p + "mlp.dense_4h_to_h.bias"] = rnd(C, scale=0.1)
    if not v["tied"]:
        w["embed_out.weight"] = rnd(VOCAB, C)
    return w


def neox_logits(v, w, ids):
    """GPTNeoXForCausalLM's forward in eval mode, float64: ids (B, T) -> logits (B, T, V)."""
    w = {k: t.double() for k, t in w.items()}
    H, C = v["heads"], v["hidden"]
    D, R = C // H, rotary_ndims(v)
    B, T = ids.shape

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], EPS)

    def rotate_half(x):
        return torch.cat((-x[..., R // 2:], x[..., : R // 2]), dim=-1)

    inv_freq = 1.0 / (v["base"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()  # (T, R)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = w["gpt_neox.embed_in.weight"][ids]
    for i in range(LAYERS):
        p = f"gpt_neox.layers.{i}."
        a = ln(x, p + "input_layernorm")
        qkv = (a @ w[p + "attention.query_key_value.weight"].T + w[p + "attention.query_key_value.bias"])
        qkv = qkv.view(B, T, H, 3 * D).permute(0, 2, 1, 3)  # (B, H, T, 3D)
        q, k, vv = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]

        def rot(t):
            r, rest = t[..., :R], t[..., R:]
            return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)

        q, k = rot(q), rot(k)
        att = torch.softmax((q @ k.transpose(-1, -2) / D ** 0.5).masked_fill(mask, float("-inf")), dim=-1)
        attn = (att @ vv).transpose(1, 2).reshape(B, T, C) @ w[p + "attention.dense.weight"].T
        attn = attn + w[p + "attention.dense.bias"]

        def mlp(m):
            h = torch.nn.functional.gelu(m @ w[p + "mlp.dense_h_to_4h.weight"].T + w[p + "mlp.dense_h_to_4h.bias"])
            return h @ w[p + "mlp.dense_4h_to_h.weight"].T + w[p + "mlp.dense_4h_to_h.bias"]

        if v["parallel"]:
            x = x + attn + mlp(ln(x, p + "post_attention_layernorm"))
        else:
            x = x + attn
            x = x + mlp(ln(x, p + "post_attention_layernorm"))
    x = ln(x, "gpt_neox.final_layer_norm")
    return x @ w.get("embed_out.weight", w["gpt_neox.embed_in.weight"]).T



def config_json(v):
    c = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": v["hidden"],
         "intermediate_size": v["inter"], "num_hidden_layers": LAYERS, "num_attention_heads": v["heads"],
         "max_position_embeddings": POSITIONS, "vocab_size": VOCAB, "layer_norm_eps": EPS,
         "rotary_pct": v["pct"], "rotary_emb_base": v["base"], "use_parallel_residual": v["parallel"],
         "hidden_act": "gelu", "tie_word_embeddings": v["tied"], "attention_dropout": 0.0, "hidden_dropout": 0.0,
         "rope_scaling": None, "torch_dtype": "float16" if v["dtype"] == "F16" else "float32"}
    return json.dumps(c, indent=2) + "\n"


def add_buffers(path, v):
    """The buffers older GPT-NeoX files carry, appended to a one-file model in their own dtypes: attention.bias
    (BOOL (1, 1, P, P): the causal mask), attention.masked_bias (F32 scalar) and attention.rotary_emb.inv_freq
    (F32 (R/2))."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    R = rotary_ndims(v)
    inv_freq = 1.0 / (v["base"] ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    extra = {}
    for i in range(LAYERS):
        p = f"gpt_neox.layers.{i}.attention."
        extra[p + "bias"] = ("BOOL", [1, 1, POSITIONS, POSITIONS],
                             torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.uint8)).numpy().tobytes())
        extra[p + "masked_bias"] = ("F32", [], torch.tensor(-1e9, dtype=torch.float32).numpy().tobytes())
        extra[p + "rotary_emb.inv_freq"] = ("F32", [R // 2], inv_freq.numpy().tobytes())
    offset = len(data)
    for name, (dtype, shape, raw) in extra.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "neox_folders"))
    args = ap.parse_args()
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (2, POSITIONS), generator=g)
    prompt = [7, 19, 44, 2]

    def write(d, v, w):
        write_weights(d, w, v["dtype"], v["shards"])
        if v["buffers"]:
            add_buffers(os.path.join(d, "model.safetensors"), v)

    write_variants(args.out, VARIANTS, 300, ids, prompt, POSITIONS, random_weights, config_json, neox_logits, write)


if __name__ == "__main__":
    main()
