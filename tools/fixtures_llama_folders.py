"""Small random LLaMA-family folders in the Hugging Face layout, in the variants real files come in, and
PyTorch's logits and greedy continuation for each (tests/fixtures/llama_folders/).

transformers is not a Debian package, so LlamaForCausalLM's maths (and Mistral's and Qwen2's, the same
function, and Qwen3's, which adds q_norm and k_norm: an RMSNorm over each head's D dims of the queries and keys,
one (D) weight all heads share, before rotary) is written out here in torch from its definition, in float64:
RMSNorm (x * rsqrt(mean(x^2) + eps) * w), rotary embeddings on halves (rotate_half; inv_freq = theta^(-2i/D)), grouped-query attention (repeat_kv),
causal softmax of q k^T / sqrt(D), SwiGLU (down(silu(gate x) * up x)), pre-norm blocks, the final norm and the
head (tied to embed_tokens unless lm_head.weight is given). The safetensors writer (one file or shards) and the
rounding to values float16 and bfloat16 both hold exactly are fixtures_gpt2_folders.py's.

The families in the same layout, from their modeling files: Olmo2ForCausalLM (no input_layernorm; each block's
attention and MLP outputs through post_attention_layernorm / post_feedforward_layernorm before the residual add;
q_norm and k_norm over the whole q_proj and k_proj outputs, before the view into heads); GemmaForCausalLM
(embeddings times sqrt(hidden_size); every RMSNorm scaled by (1 + w); GeGLU, gelu(gate, approximate="tanh") * up;
tied); Gemma3ForCausalLM (Gemma's with four norms a block, input_layernorm -> attention -> post_attention_layernorm
-> add, pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> add; q_norm / k_norm per head with
(1 + w); scores times query_pre_attn_scalar^-0.5; sliding layers rotated with rope_local_base_freq, the others with
rope_theta; layer_types, or sliding_window_pattern: layer i slides unless (i + 1) % pattern == 0). rope_scaling as
transformers' modeling_rope_utils computes inv_freq: linear (every frequency over factor) and llama3 (by wavelength),
on every layer but Gemma 3's local ones.

Variants (each its own sizes and weights; reference.json holds each one's ids, logits, prompt and greedy ids):
  gqa_tied/          llama, 4 query heads sharing 2 key/value heads, tied head, F32
  mqa_untied_f16/    llama, multi-query (1 key/value head), lm_head.weight, rope_theta 500, F16
  mha_mistral_bf16/  mistral, 4 key/value heads, sliding_window null, BF16 in two shards
  qwen2_bias/        qwen2, q/k/v biases, head_dim 12 (not hidden_size / heads), vocab padded past its use, F32
  qwen3_tied/        qwen3, q/k norms, head_dim 16 (q_proj 64 wide for hidden 32), 2 key/value heads, tied, F32
  qwen3_untied_bf16/ qwen3, q/k norms, head_dim 12, multi-query, lm_head.weight, BF16 in two shards
  mistral_window/    mistral, sliding_window 5 on every layer (the prompt and its continuation are 16), F32
  qwen2_window/      qwen2, use_sliding_window with max_window_layers 1: layer 1 sees 6 positions, layer 0 all
  qwen3_window/      qwen3, layer_types [sliding_attention, full_attention] with sliding_window 4
  phi3_window_gqa/   phi3: Phi-3's fused qkv_proj (q | k | v, unequal under grouped-query) and gate_up_proj
                     (gate | up), sliding_window 7 on every layer, 2 key/value heads, untied
  olmo2_gqa/         olmo2, 2 key/value heads, whole-projection q/k norms, untied, rope_theta 500000, F32
  olmo2_tied_bf16/   olmo2, multi-head, tied, BF16 in two shards
  gemma_mqa/         gemma, multi-query, head_dim 16 (q_proj 64 wide for hidden 32), F32
  gemma_bf16/        gemma, 2 key/value heads, BF16
  gemma3_pattern/    gemma3_text, sliding_window_pattern 2 (layer 0 sees 5 positions, layer 1 all), multi-query,
                     head_dim 16, query_pre_attn_scalar 24, rope_theta 1e6 / rope_local_base_freq 10000, F32
  gemma3_types_bf16/ gemma3_text, layer_types [full_attention, sliding_attention] with sliding_window 3, 2
                     key/value heads, BF16 in two shards
  llama3_scaled/     llama, rope_scaling llama3 (factor 8, low/high_freq_factor 1/4, original context 32): of head_dim
                     16's frequencies at theta 10000 the first kept, the second blended, the rest divided, BF16
  gemma3_linear/     gemma3_pattern's shape with rope_scaling linear (factor 4) on its global layer only
  gemma2_caps/       gemma2, soft-caps that bind (scores at 0.5, logits at 2), the even layers windowed (4; no
                     layer_types), head_dim 16, query_pre_attn_scalar 16, F32
  gemma2_types_bf16/ gemma2, layer_types [sliding_attention, full_attention] with sliding_window 6, the default caps
                     (50, 30), multi-query, BF16
A windowed layer's query i sees keys j with i - window < j <= i (transformers' sliding_window_overlay).

Usage: python3 tools/fixtures_llama_folders.py [--out tests/fixtures/llama_folders]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import math
import os

import torch

from fixtures_gpt2_folders import representable, write_variants, write_weights

VARIANTS = {
    "gqa_tied": dict(model_type="llama", heads=4, kv=2, hidden=32, inter=56, head_dim=None, theta=10000.0,
                     tied=True, bias=False, dtype="F32", shards=1),
    "mqa_untied_f16": dict(model_type="llama", heads=4, kv=1, hidden=32, inter=48, head_dim=None, theta=500.0,
                           tied=False, bias=False, dtype="F16", shards=1),
    "mha_mistral_bf16": dict(model_type="mistral", heads=4, kv=4, hidden=32, inter=40, head_dim=None,
                             theta=10000.0, tied=True, bias=False, dtype="BF16", shards=2),
    "qwen2_bias": dict(model_type="qwen2", heads=4, kv=2, hidden=32, inter=48, head_dim=12, theta=1000000.0,
                       tied=False, bias=True, dtype="F32", shards=1),
    "qwen3_tied": dict(model_type="qwen3", heads=4, kv=2, hidden=32, inter=48, head_dim=16, theta=1000000.0,
                       tied=True, bias=False, dtype="F32", shards=1),
    "qwen3_untied_bf16": dict(model_type="qwen3", heads=4, kv=1, hidden=32, inter=40, head_dim=12, theta=10000.0,
                              tied=False, bias=False, dtype="BF16", shards=2),
    "mistral_window": dict(model_type="mistral", heads=4, kv=2, hidden=32, inter=40, head_dim=None, theta=10000.0,
                           tied=False, bias=False, dtype="F32", shards=1, window=5, windowed=[0, 1]),
    "qwen2_window": dict(model_type="qwen2", heads=4, kv=2, hidden=32, inter=48, head_dim=None, theta=10000.0,
                         tied=True, bias=True, dtype="F32", shards=1, window=6, windowed=[1]),
    "qwen3_window": dict(model_type="qwen3", heads=4, kv=2, hidden=32, inter=48, head_dim=16, theta=10000.0,
                         tied=True, bias=False, dtype="F32", shards=1, window=4, windowed=[0], layer_types=True),
    "phi3_window_gqa": dict(model_type="phi3", heads=4, kv=2, hidden=32, inter=40, head_dim=None, theta=10000.0,
                            tied=False, bias=False, dtype="F32", shards=1, window=7, windowed=[0, 1]),
    "olmo2_gqa": dict(model_type="olmo2", heads=4, kv=2, hidden=32, inter=48, head_dim=None, theta=500000.0,
                      tied=False, bias=False, dtype="F32", shards=1),
    "olmo2_tied_bf16": dict(model_type="olmo2", heads=4, kv=4, hidden=32, inter=40, head_dim=None, theta=10000.0,
                            tied=True, bias=False, dtype="BF16", shards=2),
    "gemma_mqa": dict(model_type="gemma", heads=4, kv=1, hidden=32, inter=48, head_dim=16, theta=10000.0,
                      tied=True, bias=False, dtype="F32", shards=1),
    "gemma_bf16": dict(model_type="gemma", heads=4, kv=2, hidden=32, inter=40, head_dim=None, theta=10000.0,
                       tied=True, bias=False, dtype="BF16", shards=1),
    "gemma3_pattern": dict(model_type="gemma3_text", heads=4, kv=1, hidden=32, inter=48, head_dim=16, theta=1e6,
                           local_theta=10000.0, scalar=24, tied=True, bias=False, dtype="F32", shards=1, window=5,
                           windowed=[0], pattern=2),
    "gemma3_types_bf16": dict(model_type="gemma3_text", heads=4, kv=2, hidden=32, inter=40, head_dim=None,
                              theta=1e6, local_theta=10000.0, scalar=8, tied=True, bias=False, dtype="BF16",
                              shards=2, window=3, windowed=[1], layer_types=True),
    "gemma2_caps": dict(model_type="gemma2", heads=4, kv=2, hidden=32, inter=48, head_dim=16, theta=10000.0,
                        scalar=16, caps=(0.5, 2.0), tied=True, bias=False, dtype="F32", shards=1, window=4,
                        windowed=[0]),
    "gemma2_types_bf16": dict(model_type="gemma2", heads=4, kv=1, hidden=32, inter=40, head_dim=None, theta=10000.0,
                              scalar=8, caps=(50.0, 30.0), tied=True, bias=False, dtype="BF16", shards=1, window=6,
                              windowed=[0], layer_types=True),
    "llama3_scaled": dict(model_type="llama", heads=4, kv=2, hidden=32, inter=48, head_dim=16, theta=10000.0,
                          tied=True, bias=False, dtype="BF16", shards=1,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=32)),
    "gemma3_linear": dict(model_type="gemma3_text", heads=4, kv=1, hidden=32, inter=48, head_dim=16, theta=1e6,
                          local_theta=10000.0, scalar=16, tied=True, bias=False, dtype="F32", shards=1, window=5,
                          windowed=[0], pattern=2, rope_scaling=dict(rope_type="linear", factor=4.0)),
}
GEMMA = ("gemma", "gemma2", "gemma3_text")
POST_NORMS = ("olmo2", "gemma2", "gemma3_text")


def phi3_layout(w):
    """Phi3ForCausalLM's names: q | k | v rows in one qkv_proj, gate | up rows in one gate_up_proj."""
    out = {}
    for name, t in w.items():
        if ".self_attn.q_proj." in name:
            p = name.replace(".q_proj.", ".{}.")
            out[name.replace(".q_proj.", ".qkv_proj.")] = torch.cat([w[p.format(x)] for x in ("q_proj", "k_proj", "v_proj")])
        elif ".mlp.gate_proj." in name:
            out[name.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat([t, w[name.replace(".gate_proj.", ".up_proj.")]])
        elif not any(k in name for k in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = t
    return out
LAYERS, POSITIONS, VOCAB, EPS = 2, 16, 80, 1e-6


def head_dim(v):
    return v["head_dim"] or v["hidden"] // v["heads"]


def random_weights(v, seed):
    g = torch.Generator().manual_seed(seed)
    C, F, D = v["hidden"], v["inter"], head_dim(v)

    def rnd(*shape, scale=0.2):
        return representable(torch.randn(*shape, generator=g) * scale)

    gemma = v["model_type"] in GEMMA

    def norm_weight(n, scale=0.1):  # a gain near 1: Gemma's (1 + w) from w near 0
        return rnd(n, scale=scale) if gemma else representable(1 + rnd(n, scale=scale))

    w = {"model.embed_tokens.weight": rnd(VOCAB, C), "model.norm.weight": norm_weight(C)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        four = ["input", "post_attention", "pre_feedforward", "post_feedforward"]
        norms = {"olmo2": ["post_attention", "post_feedforward"], "gemma2": four, "gemma3_text": four}
        for n in norms.get(v["model_type"], ["input", "post_attention"]):
            w[p + n + "_layernorm.weight"] = norm_weight(C)
        for name, rows in (("q_proj", v["heads"] * D), ("k_proj", v["kv"] * D), ("v_proj", v["kv"] * D)):
            w[p + f"self_attn.{name}.weight"] = rnd(rows, C)
            if v["bias"]:
                w[p + f"self_attn.{name}.bias"] = rnd(rows, scale=0.1)
        w[p + "self_attn.o_proj.weight"] = rnd(C, v["heads"] * D)
        if v["model_type"] in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm_weight(D, 0.3)
            w[p + "self_attn.k_norm.weight"] = norm_weight(D, 0.3)
        if v["model_type"] == "olmo2":  # over the whole projections
            w[p + "self_attn.q_norm.weight"] = norm_weight(v["heads"] * D, 0.3)
            w[p + "self_attn.k_norm.weight"] = norm_weight(v["kv"] * D, 0.3)
        w[p + "mlp.gate_proj.weight"] = rnd(F, C)
        w[p + "mlp.up_proj.weight"] = rnd(F, C)
        w[p + "mlp.down_proj.weight"] = rnd(C, F)
    if not v["tied"]:
        w["lm_head.weight"] = rnd(VOCAB, C)
    return w


def llama_logits(v, w, ids):
    """LlamaForCausalLM's forward in eval mode, float64: ids (B, T) -> logits (B, T, V)."""
    w = {k: t.double() for k, t in w.items()}
    H, Hkv, D = v["heads"], v["kv"], head_dim(v)
    B, T = ids.shape
    kind = v["model_type"]
    gemma, post = kind in GEMMA, kind in POST_NORMS

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * ((1 + weight) if gemma else weight)

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)

    def rotation(theta, scaling=None):  # cos, sin (T, D)
        inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        if scaling and scaling["rope_type"] == "linear":  # _compute_linear_scaling_rope_parameters
            inv_freq = inv_freq / scaling["factor"]
        if scaling and scaling["rope_type"] == "llama3":  # _compute_llama3_parameters
            factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
            old = scaling["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
            smooth = (old / wavelen - low) / (high - low)
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            inv_freq = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        return torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    if v.get("window"):  # also hidden: keys window or more before the query
        local = mask | torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-v["window"])
    x = w["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * v["hidden"] ** 0.5
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        windowed = i in v.get("windowed", [])
        a = x if kind == "olmo2" else rms(x, w[p + "input_layernorm.weight"])

        def proj(name, heads):
            y = a @ w[p + f"self_attn.{name}.weight"].T
            if v["bias"]:
                y = y + w[p + f"self_attn.{name}.bias"]
            if kind == "olmo2" and name != "v_proj":  # Olmo2Attention: q_norm(q_proj(x)), the whole projection
                y = rms(y, w[p + f"self_attn.{name[0]}_norm.weight"])
            return y.view(B, T, heads, D).transpose(1, 2)

        q, k, vv = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
        if kind in ("qwen3", "gemma3_text"):  # q_norm(q_proj(x).view(..., D)), before rotary
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        own_base = windowed and v.get("local_theta")  # Gemma 3's local layers: their own base, no rope_scaling
        cos, sin = rotation(v["local_theta"], None) if own_base else rotation(v["theta"], v.get("rope_scaling"))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, vv = k.repeat_interleave(H // Hkv, dim=1), vv.repeat_interleave(H // Hkv, dim=1)
        scaling = v["scalar"] ** -0.5 if v.get("scalar") else D ** -0.5
        scores = q @ k.transpose(-1, -2) * scaling
        if v.get("caps"):  # Gemma 2's attn_logit_softcapping: before the mask
            scores = torch.tanh(scores / v["caps"][0]) * v["caps"][0]
        att = torch.softmax(scores.masked_fill(local if windowed else mask, float("-inf")), dim=-1)
        o = (att @ vv).transpose(1, 2).reshape(B, T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        x = x + (rms(o, w[p + "post_attention_layernorm.weight"]) if post else o)
        if kind == "olmo2":
            m = x
        else:
            m = rms(x, w[p + ("pre_feedforward_layernorm.weight" if post else "post_attention_layernorm.weight")])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        act = torch.nn.functional.gelu(gate, approximate="tanh") if gemma else torch.nn.functional.silu(gate)
        f = (act * up) @ w[p + "mlp.down_proj.weight"].T
        x = x + (rms(f, w[p + "post_feedforward_layernorm.weight"]) if post else f)
    x = rms(x, w["model.norm.weight"])
    logits = x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    if v.get("caps"):  # final_logit_softcapping
        logits = torch.tanh(logits / v["caps"][1]) * v["caps"][1]
    return logits



def config_json(v):
    c = {"architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                            "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                            "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                            "gemma3_text": "Gemma3ForCausalLM"}[v["model_type"]]],
         "model_type": v["model_type"], "hidden_size": v["hidden"], "intermediate_size": v["inter"],
         "num_hidden_layers": LAYERS, "num_attention_heads": v["heads"], "num_key_value_heads": v["kv"],
         "max_position_embeddings": POSITIONS, "vocab_size": VOCAB, "rms_norm_eps": EPS, "rope_theta": v["theta"],
         "hidden_act": "silu", "tie_word_embeddings": v["tied"], "attention_dropout": 0.0, "torch_dtype": "float32"}
    if v["head_dim"]:
        c["head_dim"] = v["head_dim"]
    if v["model_type"] == "llama":  # as Llama-3.2-1B's config.json has rope_scaling, where given
        c.update(attention_bias=False, mlp_bias=False, rope_scaling=v.get("rope_scaling"))
    if v["model_type"] == "mistral":
        c["sliding_window"] = v.get("window")
    if v["model_type"] == "phi3":  # as Phi-3-mini-4k-instruct's config.json has them
        c.update(sliding_window=v["window"], attention_bias=False, original_max_position_embeddings=POSITIONS,
                 rope_scaling=None, resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=0)
    if v["model_type"] == "qwen2":
        c.update(use_sliding_window=False, sliding_window=POSITIONS)
        if v.get("window"):
            c.update(use_sliding_window=True, sliding_window=v["window"], max_window_layers=v["windowed"][0])
    if v["model_type"] == "qwen3":  # as Qwen3-0.6B's config.json has them
        c.update(attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=LAYERS,
                 rope_scaling=None, layer_types=["full_attention"] * LAYERS, bos_token_id=151643,
                 eos_token_id=151645)
        if v.get("layer_types"):
            c.update(sliding_window=v["window"], use_sliding_window=True,
                     layer_types=["sliding_attention" if i in v["windowed"] else "full_attention"
                                  for i in range(LAYERS)])
    if v["model_type"] == "olmo2":  # as OLMo-2-0425-1B's config.json has them
        c.update(attention_bias=False, rope_scaling=None, pad_token_id=100277, eos_token_id=100257)
    if v["model_type"] == "gemma":  # as gemma-2b's: hidden_act is read past, hidden_activation decides
        c.update(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1)
    if v["model_type"] == "gemma2":  # as gemma-2-2b's config.json has them
        c.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", bos_token_id=2,
                 query_pre_attn_scalar=v["scalar"], sliding_window=v["window"], attention_bias=False,
                 attn_logit_softcapping=v["caps"][0], final_logit_softcapping=v["caps"][1], cache_implementation="hybrid")
        if v.get("layer_types"):
            c["layer_types"] = ["sliding_attention" if i in v["windowed"] else "full_attention" for i in range(LAYERS)]
    if v["model_type"] == "gemma3_text":  # as gemma-3-270m's config.json has them
        c.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", bos_token_id=2,
                 query_pre_attn_scalar=v["scalar"], rope_local_base_freq=v["local_theta"], sliding_window=v["window"],
                 attn_logit_softcapping=None, final_logit_softcapping=None, rope_scaling=v.get("rope_scaling"),
                 attention_bias=False)
        del c["hidden_act"]
        if v.get("pattern"):
            c["sliding_window_pattern"] = v["pattern"]
        if v.get("layer_types"):
            c["layer_types"] = ["sliding_attention" if i in v["windowed"] else "full_attention" for i in range(LAYERS)]
    return json.dumps(c, indent=2) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "llama_folders"))
    args = ap.parse_args()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB - 8, (2, POSITIONS), generator=g)  # the padded last 8 ids never appear
    prompt = [5, 17, 42, 3]

    def write(d, v, w):
        write_weights(d, phi3_layout(w) if v["model_type"] == "phi3" else w, v["dtype"], v["shards"])

    write_variants(args.out, VARIANTS, 100, ids, prompt, POSITIONS, random_weights, config_json, llama_logits, write)


if __name__ == "__main__":
    main()
