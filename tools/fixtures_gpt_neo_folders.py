"""Small random GPT-Neo folders in the Hugging Face layout, in the variants real files come in (TinyStories-1M..33M
are GPTNeoForCausalLM), and PyTorch's logits and greedy continuation for each (tests/fixtures/gpt_neo_folders/).

transformers is not a Debian package, so GPTNeoForCausalLM's maths is written out here in torch from its
definition, in float64: wte + wpe; per block x + attn(ln_1 x), x + mlp(ln_2 x) with LayerNorm (weight, bias,
layer_norm_epsilon); attention from q_proj, k_proj, v_proj without biases, the scores q k^T NOT divided by
sqrt(head size), causal, and in a "local" layer also hiding keys window_size or more positions back (the bias
buffer XOR tril(bias, -window_size)); out_proj with a bias; the MLP c_proj(gelu_new(c_fc x)) (GELU's tanh form);
ln_f and the head tied to wte. The safetensors writer and the rounding to values float16 and bfloat16 both hold
exactly are fixtures_gpt2_folders.py's.

Variants (each its own sizes and weights; reference.json holds each one's ids, logits, prompt and greedy ids):
  global_local/        attention_types [[["global", "local"], 1]], window_size 5 (shorter than the 16 positions), F32
  local_global_bin/    attention_layers ["local", "global"], window_size 4, intermediate_size null (4 x hidden), as
                       pytorch_model.bin with the mask buffers older files save (attn.attention.bias, masked_bias)
  wide_window_f16/     a window longer than the context (changes nothing), F16, 2 heads

Usage: python3 tools/fixtures_gpt_neo_folders.py [--out tests/fixtures/gpt_neo_folders]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import os

import torch

from fixtures_gpt2_folders import gelu_new, representable, write_variants, write_weights

VARIANTS = {
    "global_local": dict(kinds=["global", "local"], window=5, heads=4, hidden=32, inter=48, dtype="F32", bin=False,
                         types=True),
    "local_global_bin": dict(kinds=["local", "global"], window=4, heads=4, hidden=24, inter=None, dtype="F32",
                             bin=True, types=False),
    "wide_window_f16": dict(kinds=["global", "local"], window=256, heads=2, hidden=16, inter=40, dtype="F16",
                            bin=False, types=True),
}
LAYERS, POSITIONS, VOCAB, EPS = 2, 16, 80, 1e-5


def inter(v):
    return v["inter"] or 4 * v["hidden"]


def random_weights(v, seed):
    g = torch.Generator().manual_seed(seed)
    C, F = v["hidden"], inter(v)

    def rnd(*shape, scale=0.2):
        return representable(torch.randn(*shape, generator=g) * scale)

    w = {"transformer.wte.weight": rnd(VOCAB, C), "transformer.wpe.weight": rnd(POSITIONS, C, scale=0.1)}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = representable(1 + rnd(C, scale=0.1))
            w[p + ln + ".bias"] = rnd(C, scale=0.1)
        for name in ("q_proj", "k_proj", "v_proj"):
            w[p + f"attn.attention.{name}.weight"] = rnd(C, C)
        w[p + "attn.attention.out_proj.weight"] = rnd(C, C)
        w[p + "attn.attention.out_proj.bias"] = rnd(C, scale=0.1)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = rnd(F, C), rnd(F, scale=0.1)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = rnd(C, F), rnd(C, scale=0.1)
    w["transformer.ln_f.weight"] = representable(1 + rnd(C, scale=0.1))
    w["transformer.ln_f.bias"] = rnd(C, scale=0.1)
    return w



def gpt_neo_logits(v, w, ids):
    """GPTNeoForCausalLM's forward in eval mode, float64: ids (B, T) -> logits (B, T, V)."""
    w = {k: t.double() for k, t in w.items()}
    H, C = v["heads"], v["hidden"]
    D = C // H
    B, T = ids.shape
    ln = torch.nn.functional.layer_norm
    bias = torch.tril(torch.ones(T, T, dtype=torch.bool))
    local = bias ^ torch.tril(bias, -v["window"])
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        a = ln(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], EPS)

        def proj(name):
            return (a @ w[p + f"attn.attention.{name}.weight"].T).view(B, T, H, D).transpose(1, 2)

        q, k, vv = proj("q_proj"), proj("k_proj"), proj("v_proj")
        keep = local if v["kinds"][i] == "local" else bias
        att = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), dim=-1)  # unscaled
        o = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = x + o @ w[p + "attn.attention.out_proj.weight"].T + w[p + "attn.attention.out_proj.bias"]
        m = ln(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], EPS)
        h = gelu_new(m @ w[p + "mlp.c_fc.weight"].T + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"].T + w[p + "mlp.c_proj.bias"]
    x = ln(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], EPS)
    return x @ w["transformer.wte.weight"].T



def config_json(v):
    c = {"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", "hidden_size": v["hidden"],
         "num_layers": LAYERS, "num_heads": v["heads"], "intermediate_size": v["inter"], "vocab_size": VOCAB,
         "max_position_embeddings": POSITIONS, "window_size": v["window"], "activation_function": "gelu_new",
         "layer_norm_epsilon": EPS, "attention_dropout": 0.0, "embed_dropout": 0.0, "resid_dropout": 0.0,
         "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"}
    if v["types"]:
        c["attention_types"] = [[v["kinds"], LAYERS // len(v["kinds"])]]
    else:
        c["attention_layers"] = v["kinds"]
    return json.dumps(c, indent=2) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "gpt_neo_folders"))
    args = ap.parse_args()
    g = torch.Generator().manual_seed(17)
    ids = torch.randint(0, VOCAB, (2, POSITIONS), generator=g)
    prompt = [5, 17, 42, 3]

    def write(d, v, w):
        if not v["bin"]:
            write_weights(d, w, v["dtype"])
            return
        # torch.save's zip archive, as the Hub's pytorch_model.bin files are, with the buffers older files save
        sd = dict(w)
        sd["lm_head.weight"] = w["transformer.wte.weight"]
        for i in range(LAYERS):
            mask = torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.bool)).view(1, 1, POSITIONS, POSITIONS)
            if v["kinds"][i] == "local":
                mask = mask ^ torch.tril(mask, -v["window"])
            sd[f"transformer.h.{i}.attn.attention.bias"] = mask
            sd[f"transformer.h.{i}.attn.attention.masked_bias"] = torch.tensor(-1e9)
        torch.save(sd, os.path.join(d, "pytorch_model.bin"))

    write_variants(args.out, VARIANTS, 300, ids, prompt, POSITIONS, random_weights, config_json, gpt_neo_logits,
                   write)


if __name__ == "__main__":
    main()
