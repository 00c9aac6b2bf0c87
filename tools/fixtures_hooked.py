"""Small random models of the hooked family (nn/hooked.cpp) with a float64 PyTorch twin's logits
(tests/fixtures/hooked/).

Neither TransformerLens nor the grokking code is a Debian package, so each twin is its forward written out
here in torch, in float64, on its own file's layout; the weights are then written under headlab's names (the
mapping a reader of those files does):

  grokking (Nanda et al.'s transformers.py): embed.W_E (C, V): token t is column t; pos_embed.W_pos (n_ctx, C);
    attn.W_Q/W_K/W_V (H, D, C), scores q.k / sqrt(D), causal softmax, z flattened head-major, attn.W_O (C, H*D);
    no norms; mlp.W_in (F, C) + b_in, ReLU, mlp.W_out (C, F) + b_out; x += attn(x); x += mlp(x);
    unembed.W_U (C, V_out), logits = x W_U.
    -> tok_emb.weight = W_E^T, W_query.weight = W_Q.reshape(H*D, C), out_proj.weight = W_O,
       ff.layers.0 = (W_in, b_in), ff.layers.2 = (W_out, b_out), out_head.weight = W_U^T.
  TransformerLens (HookedTransformer): embed.W_E (V, C); W_Q/W_K/W_V (H, C, D), b_Q/b_K/b_V (H, D); W_O (H, D, C),
    b_O (C); ln1/ln2/ln_final .w/.b, LayerNorm eps 1e-5; mlp.W_in (C, F) + b_in, gelu_new (tanh), W_out (F, C) + b_out;
    unembed.W_U (C, V_out) + b_U.
    -> tok_emb.weight = W_E, W_query.weight = W_Q.permute(0, 2, 1).reshape(H*D, C), .bias = b_Q.reshape(H*D),
       out_proj.weight = W_O.reshape(H*D, C)^T, .bias = b_O, norm1/norm2/final_norm .weight/.bias = ln1/ln2/ln_final
       .w/.b, ff.layers.0.weight = W_in^T, ff.layers.2.weight = W_out^T, out_head.weight = W_U^T, .bias = b_U.

Variants (reference.json: each one's section, ids and logits; <name>.safetensors: its weights, F32):
  grokking_addition   the 5-digit addition layout: no norms, ReLU MLP, 12 input tokens and 10 outputs, no
                      attention biases, no b_U
  grokking_induction  the induction layout: 2 attention-only layers, no norms, head_dim apart from the width
  lens_gpt2           TransformerLens's GPT-2 layout: LayerNorm, gelu_new, every bias, b_U, head_dim apart

Usage: /usr/bin/python3 tools/fixtures_hooked.py [--out tests/fixtures/hooked]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import os

import torch

from fixtures_gpt2_folders import representable, write_safetensors

VARIANTS = {
    "grokking_addition": dict(layout="grokking", vocab=12, out_vocab=10, ctx=18, C=16, H=4, D=4, F=32, layers=1,
                              attn_only=False),
    "grokking_induction": dict(layout="grokking", vocab=20, out_vocab=20, ctx=12, C=12, H=4, D=4, F=0, layers=2,
                               attn_only=True),
    "lens_gpt2": dict(layout="lens", vocab=24, out_vocab=24, ctx=10, C=16, H=2, D=6, F=40, layers=2,
                      attn_only=False),
}
EPS = 1e-5


def random_weights(v, seed):
    """The file's own tensors (its names and shapes), values float32, bfloat16 and float16 hold exactly."""
    g = torch.Generator().manual_seed(seed)
    V, Vo, P, C, H, D, F = v["vocab"], v["out_vocab"], v["ctx"], v["C"], v["H"], v["D"], v["F"]

    def rnd(*shape, scale=0.3):
        return representable(torch.randn(*shape, generator=g) * scale)

    grok = v["layout"] == "grokking"
    w = {"embed.W_E": rnd(C, V) if grok else rnd(V, C), "pos_embed.W_pos": rnd(P, C), "unembed.W_U": rnd(C, Vo)}
    if not grok:
        w["unembed.b_U"] = rnd(Vo, scale=0.1)
        w["ln_final.w"], w["ln_final.b"] = representable(1 + rnd(C, scale=0.1)), rnd(C, scale=0.1)
    for i in range(v["layers"]):
        p = f"blocks.{i}."
        for m in "QKV":
            w[p + "attn.W_" + m] = rnd(H, D, C) if grok else rnd(H, C, D)
            if not grok:
                w[p + "attn.b_" + m] = rnd(H, D, scale=0.1)
        w[p + "attn.W_O"] = rnd(C, H * D) if grok else rnd(H, D, C)
        if not grok:
            w[p + "attn.b_O"] = rnd(C, scale=0.1)
            for ln in ("ln1", "ln2"):
                w[p + ln + ".w"], w[p + ln + ".b"] = representable(1 + rnd(C, scale=0.1)), rnd(C, scale=0.1)
        if not v["attn_only"]:
            w[p + "mlp.W_in"] = rnd(F, C) if grok else rnd(C, F)
            w[p + "mlp.b_in"] = rnd(F, scale=0.1)
            w[p + "mlp.W_out"] = rnd(C, F) if grok else rnd(F, C)
            w[p + "mlp.b_out"] = rnd(C, scale=0.1)
    return w


def twin_logits(v, w, ids):
    """The file's model in eval mode, float64: ids (B, T) -> logits (B, T, V_out)."""
    w = {k: t.double() for k, t in w.items()}
    grok, H, D = v["layout"] == "grokking", v["H"], v["D"]
    B, T = ids.shape
    mask = torch.tril(torch.ones(T, T))

    def ln(x, name):  # TransformerLens's LayerNorm: biased variance, eps inside the root
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + EPS).sqrt() * w[name + ".w"] + w[name + ".b"]

    def attn(x, p):
        if grok:  # transformers.py: einsum('ihd,bpd->biph'), scores tril - 1e10 (1 - mask), then / sqrt(D)
            q, k, vv = (torch.einsum("ihd,bpd->biph", w[p + "attn.W_" + m], x) for m in "QKV")
            scores = torch.einsum("biph,biqh->biqp", k, q)
            scores = torch.tril(scores) - 1e10 * (1 - mask)
            pattern = torch.softmax(scores / D ** 0.5, dim=-1)
            z = torch.einsum("biph,biqp->biqh", vv, pattern)  # (B, H, T, D)
            return torch.einsum("df,bqf->bqd", w[p + "attn.W_O"], z.permute(0, 2, 1, 3).reshape(B, T, H * D))
        q, k, vv = (torch.einsum("bpd,ndh->bpnh", x, w[p + "attn.W_" + m]) + w[p + "attn.b_" + m] for m in "QKV")
        scores = torch.einsum("bqnh,bknh->bnqk", q, k) / D ** 0.5
        pattern = torch.softmax(scores.masked_fill(mask == 0, float("-inf")), dim=-1)
        z = torch.einsum("bknh,bnqk->bqnh", vv, pattern)
        return torch.einsum("bqnh,nhd->bqd", z, w[p + "attn.W_O"]) + w[p + "attn.b_O"]

    def mlp(x, p):
        if grok:
            h = torch.relu(torch.einsum("md,bpd->bpm", w[p + "mlp.W_in"], x) + w[p + "mlp.b_in"])
            return torch.einsum("dm,bpm->bpd", w[p + "mlp.W_out"], h) + w[p + "mlp.b_out"]
        h = torch.nn.functional.gelu(x @ w[p + "mlp.W_in"] + w[p + "mlp.b_in"], approximate="tanh")
        return h @ w[p + "mlp.W_out"] + w[p + "mlp.b_out"]

    x = (w["embed.W_E"][:, ids].permute(1, 2, 0) if grok else w["embed.W_E"][ids]) + w["pos_embed.W_pos"][:T]
    for i in range(v["layers"]):
        p = f"blocks.{i}."
        x = x + attn(x if grok else ln(x, p + "ln1"), p)
        if not v["attn_only"]:
            x = x + mlp(x if grok else ln(x, p + "ln2"), p)
    if not grok:
        x = ln(x, "ln_final")
    return x @ w["unembed.W_U"] + w.get("unembed.b_U", 0)


def headlab_weights(v, w):
    """The same tensors under headlab's names and shapes."""
    grok, H, D, C = v["layout"] == "grokking", v["H"], v["D"], v["C"]
    out = {"tok_emb.weight": w["embed.W_E"].T if grok else w["embed.W_E"], "pos_emb.weight": w["pos_embed.W_pos"],
           "out_head.weight": w["unembed.W_U"].T}
    if not grok:
        out["out_head.bias"] = w["unembed.b_U"]
        out["final_norm.weight"], out["final_norm.bias"] = w["ln_final.w"], w["ln_final.b"]
    for i in range(v["layers"]):
        p, q = f"blocks.{i}.", f"trf_blocks.{i}."
        for m, name in zip("QKV", ("W_query", "W_key", "W_value")):
            W = w[p + "attn.W_" + m]
            out[q + f"att.{name}.weight"] = W.reshape(H * D, C) if grok else W.permute(0, 2, 1).reshape(H * D, C)
            if not grok:
                out[q + f"att.{name}.bias"] = w[p + "attn.b_" + m].reshape(H * D)
        out[q + "att.out_proj.weight"] = w[p + "attn.W_O"] if grok else w[p + "attn.W_O"].reshape(H * D, C).T
        if not grok:
            out[q + "att.out_proj.bias"] = w[p + "attn.b_O"]
            for ln, norm in (("ln1", "norm1"), ("ln2", "norm2")):
                out[q + norm + ".weight"], out[q + norm + ".bias"] = w[p + ln + ".w"], w[p + ln + ".b"]
        if not v["attn_only"]:
            out[q + "ff.layers.0.weight"] = w[p + "mlp.W_in"] if grok else w[p + "mlp.W_in"].T
            out[q + "ff.layers.0.bias"] = w[p + "mlp.b_in"]
            out[q + "ff.layers.2.weight"] = w[p + "mlp.W_out"] if grok else w[p + "mlp.W_out"].T
            out[q + "ff.layers.2.bias"] = w[p + "mlp.b_out"]
    return {k: t.contiguous() for k, t in out.items()}


def section(v):
    """The hooked family's checkpoint section (nn/hooked.cpp) for the variant."""
    grok = v["layout"] == "grokking"
    s = {"arch": "hooked", "vocab_size": v["vocab"], "out_vocab_size": v["out_vocab"], "context_length": v["ctx"],
         "emb_dim": v["C"], "n_heads": v["H"], "head_dim": v["D"], "n_layers": v["layers"],
         "norm": "none" if grok else "layer_norm", "norm_eps": EPS, "qkv_bias": not grok, "out_bias": not grok,
         "unembed_bias": not grok, "attn_only": v["attn_only"]}
    if not v["attn_only"]:
        s.update(mlp="relu" if grok else "gelu_tanh", hidden_dim=v["F"])
    return s


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hooked"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    reference = {}
    for seed, (name, v) in enumerate(VARIANTS.items()):
        w = random_weights(v, 500 + seed)
        ids = torch.randint(0, v["vocab"], (2, v["ctx"]), generator=torch.Generator().manual_seed(21 + seed))
        write_safetensors(os.path.join(args.out, name + ".safetensors"), headlab_weights(v, w), "F32")
        reference[name] = {"section": section(v), "ids": ids.tolist(), "logits": twin_logits(v, w, ids).tolist()}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f)
        f.write("\n")


if __name__ == "__main__":
    main()
