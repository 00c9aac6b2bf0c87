"""The fixtures of "Build a Large Language Model from Scratch" ch. 3/4 modules, for
tools/make_fixtures.py: CausalAttention, MultiHeadAttentionWrapper, the fused MultiHeadAttention
(called CausalMultiHeadAttention here, since d2l's has the book's name), the layers (Linear, Embedding,
LayerNorm both ways, GELU both ways, FeedForward) and GPTModel. The modules themselves are in
tools/book_gpt.py, shared with the interop tools; this file has their self-checks, fixtures and the
GPT fixtures' verification.
"""
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from book_gpt import CausalAttention, FeedForward, GPTModel, MultiHeadAttentionWrapper, expected_parameters
from book_gpt import GELU as GELUBook
from book_gpt import LayerNorm as LayerNormBook
from book_gpt import MultiHeadAttention as CausalMultiHeadAttention  # (d2l's has the book's name)
from fixtures_common import (INDEX, assert_close, call_idx, call_x, call_x_gates, load_params, read_group,
                             run_module, write_h5)

# ----------------------------------------------------------------------------------------------
# Self-checks against the book's printed outputs and between equivalent formulations
# ----------------------------------------------------------------------------------------------


def book_self_checks():
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the seeds' printed numbers are float32 runs

    # book ch. 3: the printed wrapper / fused outputs (torch.manual_seed(123), d_in 3, d_out 2, 2 heads)
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
    batch = torch.stack((inputs, inputs), dim=0)
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(3, 2, batch.shape[1], 0.0, num_heads=2)
    got = mha(batch)
    printed = torch.tensor(
        [[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5874, 0.0058, 0.5891, 0.3257],
         [-0.6300, -0.0632, 0.6202, 0.3860], [-0.5675, -0.0843, 0.5478, 0.3589],
         [-0.5526, -0.0981, 0.5321, 0.3428], [-0.5299, -0.1081, 0.5077, 0.3493]])
    assert got.shape == (2, 6, 4)
    assert torch.allclose(got, printed.expand(2, 6, 4), atol=6e-5), got
    torch.manual_seed(123)
    mha = CausalMultiHeadAttention(3, 2, batch.shape[1], 0.0, num_heads=2)
    got = mha(batch)
    printed = torch.tensor(
        [[0.3190, 0.4858], [0.2943, 0.3897], [0.2856, 0.3593],
         [0.2693, 0.3873], [0.2639, 0.3928], [0.2575, 0.4028]])
    assert got.shape == (2, 6, 2)
    assert torch.allclose(got, printed.expand(2, 6, 2), atol=6e-5), got

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1)
    # fused == wrapper + out_proj when the fused weights are the heads' weights stacked
    H, d_in, D, T = 3, 5, 2, 4
    wrap = MultiHeadAttentionWrapper(d_in, D, 6, 0.0, H, qkv_bias=True, out_proj=True)
    fused = CausalMultiHeadAttention(d_in, H * D, 6, 0.0, H, qkv_bias=True)
    with torch.no_grad():
        for nm in ("W_query", "W_key", "W_value"):
            getattr(fused, nm).weight.copy_(torch.cat([getattr(h, nm).weight for h in wrap.heads], 0))
            getattr(fused, nm).bias.copy_(torch.cat([getattr(h, nm).bias for h in wrap.heads], 0))
        fused.out_proj.weight.copy_(wrap.out_proj.weight)
        fused.out_proj.bias.copy_(wrap.out_proj.bias)
    x = torch.randn(2, T, d_in)
    g = torch.tensor([1.0, 0.0, 0.5])
    assert torch.allclose(wrap(x, g), fused(x, g), atol=1e-12)
    assert torch.allclose(wrap.attention_weights, fused.attention_weights, atol=1e-12)

    # book GELU == PyTorch's tanh GELU; book LayerNorm == nn.LayerNorm with the same affine params
    x = torch.randn(50) * 3
    assert torch.allclose(GELUBook()(x), F.gelu(x, approximate="tanh"), atol=1e-14)
    ln, lnb = nn.LayerNorm(7), LayerNormBook(7)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(7))
        ln.bias.copy_(torch.randn(7))
        lnb.scale.copy_(ln.weight)
        lnb.shift.copy_(ln.bias)
    x = torch.randn(3, 7)
    assert torch.allclose(ln(x), lnb(x), atol=1e-12)
    torch.set_default_dtype(prev)


# ----------------------------------------------------------------------------------------------
# Module fixtures
# ----------------------------------------------------------------------------------------------

FACTORY = {  # module attribute -> constructor from the file's config (make_fixtures.verify)
    "CausalAttention": lambda c: CausalAttention(**c),
    "MultiHeadAttentionWrapper": lambda c: MultiHeadAttentionWrapper(**c),
    "CausalMultiHeadAttention": lambda c: CausalMultiHeadAttention(**c),
    "Linear": lambda c: nn.Linear(**c),
    "Embedding": lambda c: nn.Embedding(**c),
    "LayerNorm": lambda c: nn.LayerNorm(c["normalized_shape"], eps=c["eps"]),
    "LayerNormBook": lambda c: LayerNormBook(c["emb_dim"]),
    "GELU": lambda c: GELUBook() if c["approximate"] == "tanh" else nn.GELU(),
    "FeedForward": lambda c: FeedForward(c),
}


def book_fixtures(out):
    R = torch.randn

    # --- CausalAttention ------------------------------------------------------------------------
    for seed, (fname, d_in, d_out, ctx, qkv_bias, B, T, desc) in enumerate([
        ("causal_T4_ctx6.h5", 3, 2, 6, False, 2, 4, "d_in 3, d_out 2, T 4 < context_length 6, no qkv bias"),
        ("causal_T5_ctx8_qkvbias.h5", 4, 3, 8, True, 2, 5, "d_in 4, d_out 3, T 5 < context_length 8, qkv_bias"),
        ("causal_T6_ctx6.h5", 5, 4, 6, False, 1, 6, "d_in 5, d_out 4, T = context_length 6, batch 1"),
    ]):
        torch.manual_seed(500 + seed)
        cfg = {"d_in": d_in, "d_out": d_out, "context_length": ctx, "dropout": 0.0, "qkv_bias": qkv_bias}
        m = CausalAttention(**cfg)
        run_module(out, fname, "CausalAttention", cfg, desc, m, call_x, {"x": R(B, T, d_in)}, seed=500 + seed)

    # --- MultiHeadAttentionWrapper --------------------------------------------------------------
    for seed, (fname, d_in, d_out, ctx, H, qkv_bias, proj, B, T, gates, desc) in enumerate([
        ("wrapper_h1_T4_ctx6.h5", 4, 3, 6, 1, False, False, 2, 4, None, "1 head, d_in 4, d_out 3, T 4, ctx 6"),
        ("wrapper_h2_qkvbias.h5", 3, 2, 6, 2, True, False, 2, 6, None,
         "2 heads, d_in 3, d_out 2, T = ctx 6, qkv_bias, no out_proj"),
        ("wrapper_h4_outproj_gates.h5", 5, 2, 8, 4, False, True, 2, 5, [1.0, 0.0, 0.5, 1.5],
         "4 heads, d_in 5, d_out 2, T 5, ctx 8, out_proj, gates [1, 0, 0.5, 1.5]"),
        ("wrapper_h2_outproj_qkvbias.h5", 4, 3, 8, 2, True, True, 2, 6, None,
         "2 heads, d_in 4, d_out 3, T 6, ctx 8, qkv_bias and out_proj"),
    ]):
        torch.manual_seed(600 + seed)
        cfg = {"d_in": d_in, "d_out": d_out, "context_length": ctx, "dropout": 0.0, "num_heads": H,
               "qkv_bias": qkv_bias, "out_proj": proj}
        m = MultiHeadAttentionWrapper(**cfg)
        run_module(out, fname, "MultiHeadAttentionWrapper", cfg, desc, m, call_x_gates, {"x": R(B, T, d_in)},
                   gates=gates if gates is not None else [1.0] * H, seed=600 + seed)

    # --- CausalMultiHeadAttention (fused) -------------------------------------------------------
    for seed, (fname, d_in, d_out, ctx, H, qkv_bias, B, T, gates, desc) in enumerate([
        ("cmha_h1.h5", 4, 4, 6, 1, False, 2, 4, None, "1 head, d_in 4, d_out 4, T 4, ctx 6"),
        ("cmha_h2_qkvbias.h5", 3, 6, 6, 2, True, 2, 6, None, "2 heads, d_in 3, d_out 6, T = ctx 6, qkv_bias"),
        ("cmha_h4_gates.h5", 5, 8, 8, 4, False, 2, 5, [1.0, 0.0, 0.5, 1.5],
         "4 heads, d_in 5, d_out 8, T 5, ctx 8, gates [1, 0, 0.5, 1.5]"),
        ("cmha_h8_qkvbias.h5", 6, 16, 8, 8, True, 2, 5, None, "8 heads, d_in 6, d_out 16, T 5, ctx 8, qkv_bias"),
    ]):
        torch.manual_seed(700 + seed)
        cfg = {"d_in": d_in, "d_out": d_out, "context_length": ctx, "dropout": 0.0, "num_heads": H,
               "qkv_bias": qkv_bias}
        m = CausalMultiHeadAttention(**cfg)
        run_module(out, fname, "CausalMultiHeadAttention", cfg, desc, m, call_x_gates, {"x": R(B, T, d_in)},
                   gates=gates if gates is not None else [1.0] * H, seed=700 + seed)

    # --- layers -----------------------------------------------------------------------------------
    torch.manual_seed(800)
    cfg = {"in_features": 4, "out_features": 5, "bias": True}
    run_module(out, "linear_bias.h5", "Linear", cfg, "Linear(4, 5), input (2, 3, 4) (extra batch dim)",
               nn.Linear(**cfg), call_x, {"x": R(2, 3, 4)}, seed=800)
    torch.manual_seed(801)
    cfg = {"in_features": 3, "out_features": 2, "bias": False}
    run_module(out, "linear_nobias.h5", "Linear", cfg, "Linear(3, 2, bias=False), input (4, 3)",
               nn.Linear(**cfg), call_x, {"x": R(4, 3)}, seed=801)
    torch.manual_seed(802)
    cfg = {"num_embeddings": 7, "embedding_dim": 4}
    idx = torch.tensor([[1, 3, 3, 0, 6], [2, 3, 1, 1, 5]], dtype=torch.int64)
    run_module(out, "embedding.h5", "Embedding", cfg,
               "Embedding(7, 4), idx (2, 5) with repeats (3 three times, 1 three times): scatter-add gradient; "
               "row 4 unused (zero gradient)", nn.Embedding(**cfg), call_idx, {"idx": idx}, seed=802)
    torch.manual_seed(803)
    cfg = {"normalized_shape": 8, "eps": 1e-5}
    run_module(out, "layernorm_torch.h5", "LayerNorm", cfg,
               "nn.LayerNorm(8) (params weight/bias, perturbed from ones/zeros), input (2, 3, 8)",
               nn.LayerNorm(8, eps=1e-5), call_x, {"x": R(2, 3, 8) * 2 + 0.5}, seed=803, perturb=("weight", "bias"))
    torch.manual_seed(804)
    cfg = {"emb_dim": 8, "eps": 1e-5}
    run_module(out, "layernorm_book.h5", "LayerNormBook", cfg,
               "book LayerNorm(8) (params scale/shift, perturbed), biased variance, input (2, 3, 8)",
               LayerNormBook(8), call_x, {"x": R(2, 3, 8) * 2 + 0.5}, seed=804, perturb=("scale", "shift"))
    torch.manual_seed(805)
    run_module(out, "gelu_tanh.h5", "GELU", {"approximate": "tanh"},
               "book GELU (tanh approximation), input (2, 3, 5) scaled by 3", GELUBook(), call_x,
               {"x": R(2, 3, 5) * 3}, seed=805)
    torch.manual_seed(806)
    run_module(out, "gelu_erf.h5", "GELU", {"approximate": "none"},
               "exact GELU x * Phi(x) (nn.GELU()), input (2, 3, 5) scaled by 3", nn.GELU(), call_x,
               {"x": R(2, 3, 5) * 3}, seed=806)
    torch.manual_seed(807)
    cfg = {"emb_dim": 6}
    run_module(out, "feedforward.h5", "FeedForward", cfg,
               "book FeedForward(emb_dim 6): layers.0 Linear(6, 24), GELU tanh, layers.2 Linear(24, 6), "
               "input (2, 3, 6)",
               FeedForward(cfg), call_x, {"x": R(2, 3, 6)}, seed=807)


# ----------------------------------------------------------------------------------------------
# GPTModel fixtures
# ----------------------------------------------------------------------------------------------


def gpt_fixture(out, fname, attention, qkv_bias, seed):
    cfg = {"vocab_size": 11, "context_length": 8, "emb_dim": 12, "n_heads": 4, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": qkv_bias, "attention": attention}
    torch.manual_seed(seed)
    model = GPTModel(cfg)
    model.eval()
    with torch.no_grad():  # perturb LayerNorm scale/shift away from ones/zeros
        for n, p in model.named_parameters():
            if n.endswith(".scale") or n.endswith(".shift"):
                p.add_(0.2 * torch.randn_like(p))
    idx = torch.randint(0, cfg["vocab_size"], (2, 6), dtype=torch.int64)
    targets = torch.randint(0, cfg["vocab_size"], (2, 6), dtype=torch.int64)
    targets[0, 1] = -100
    targets[1, 4] = -100
    targets[1, 5] = -100
    gates = []
    for blk in model.trf_blocks:
        blk.gates = torch.ones(cfg["n_heads"], requires_grad=True)
        gates.append(blk.gates)
    logits = model(idx)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    # the names and shapes (in order) that export_torch.py / import_torch.py check checkpoints against
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == list(expected_parameters(cfg).items())
    assert "out_head.bias" not in expected_parameters(cfg)
    assert ("trf_blocks.0.att.W_query.bias" in expected_parameters(cfg)) == (qkv_bias and attention == "fused")
    data = {}
    for n, p in model.named_parameters():
        data[f"params/{n}"] = p
    data["inputs/idx"] = idx
    data["inputs/targets"] = targets
    data["outputs/logits"] = logits
    data["outputs/loss"] = loss
    for n, p in model.named_parameters():
        data[f"grads/params/{n}"] = p.grad
    for i, g in enumerate(gates):
        data[f"grads/gates/trf_blocks.{i}.att"] = g.grad
    desc = (f"book ch. 4 GPTModel, {attention} attention, qkv_bias {qkv_bias}; idx (2, 6), targets with "
            f"3 ignore_index (-100) entries; loss = cross_entropy mean over non-ignored; LayerNorm "
            f"scale/shift perturbed from ones/zeros")
    write_h5(os.path.join(out, fname), {"module": "GPTModel", "config": json.dumps(cfg, sort_keys=True),
                                        "description": desc, "call": "logits = model(idx)"}, data)
    INDEX.append({"file": fname, "kind": "gpt", "module": "GPTModel", "config": cfg,
                  "call": "logits = model(idx)", "description": desc})


def verify_gpt(f, fname):
    """Rebuild the GPTModel from the file's config and params and recompute logits, loss and grads."""
    cfg = json.loads(f.attrs["config"])
    model = GPTModel(cfg)
    model.eval()
    load_params(model, read_group(f, "params"))
    logits = model(torch.from_numpy(f["inputs/idx"][()]))
    loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(f["inputs/targets"][()]).flatten())
    loss.backward()
    assert_close(logits, torch.from_numpy(f["outputs/logits"][()]), fname)
    assert_close(loss, torch.tensor(f["outputs/loss"][()]), fname)
    for n, p in model.named_parameters():
        assert_close(p.grad, torch.from_numpy(f[f"grads/params/{n}"][()]), (fname, n))
    assert set(f["params"]) == {n for n, _ in model.named_parameters()}
