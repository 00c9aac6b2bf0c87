#!/usr/bin/python3
"""PyTorch reference fixtures for headlab's C++ tests (tests/fixtures/*.h5, index.json, schedules.json).

Run with Debian's PyTorch:  /usr/bin/python3 tools/make_fixtures.py [--out tests/fixtures]
The reference modules are written from the seed texts plus headlab's two extensions (masked_softmax
gives all-zero rows, and zero gradients, where nothing is valid; every multi-head module takes a
per-head gate vector): the d2l.ai 10.3 / 10.5 ones below, the "Build a Large Language Model from
Scratch" ch. 3/4 ones (CausalAttention up to GPTModel) from tools/book_gpt.py, which the interop tools
use too. Everything is computed in float64 with dropout p = 0; re-running writes byte-identical files.
The layout is documented in tests/fixtures/README.md.
"""
import os
import platform

# OpenBLAS (Debian's torch and numpy use it) picks its matrix kernels by CPU or by OPENBLAS_CORETYPE,
# and the kernels differ in the last bits of float64 results. The committed fixtures were written
# with the Prescott kernels (plain SSE3, OpenBLAS's fallback, there on every x86-64 CPU), so they are
# pinned here, overriding the environment: a re-run is then byte-identical on any x86-64 machine
# (with another core type, about 30 files differ by a few ulps). OpenBLAS reads the variable when it
# loads, so this comes before numpy and torch are imported.
if platform.machine() in ("x86_64", "AMD64"):
    os.environ["OPENBLAS_CORETYPE"] = "Prescott"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from book_gpt import (CausalAttention, FeedForward, GPTModel, MultiHeadAttentionWrapper,  # noqa: E402
                      expected_parameters)
from book_gpt import GELU as GELUBook  # noqa: E402
from book_gpt import LayerNorm as LayerNormBook  # noqa: E402
from book_gpt import MultiHeadAttention as CausalMultiHeadAttention  # noqa: E402  (d2l's has the book's name)
from headlab_hdf5 import attr_str, set_dset_no_attrs_hint, set_link_phase_change  # noqa: E402

# ----------------------------------------------------------------------------------------------
# d2l reference modules (the book's are in book_gpt.py). Shape legend: B = batch, Q = queries,
# K = key-value pairs, T = tokens, H = heads, D = head size.
# ----------------------------------------------------------------------------------------------


def sequence_mask_d2l(X, valid_len, value=0.0):
    """d2l's sequence_mask: X (N, K), valid_len (N,); entries at positions >= valid_len := value."""
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X = X.clone()
    X[~mask] = value
    return X


def masked_softmax_d2l(X, valid_lens):
    """d2l 10.3 verbatim (the -1e6 trick): used only to check masked_softmax below."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask_d2l(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


def masked_softmax(X, valid_lens):
    """headlab's masked softmax. X: (B, Q, K); valid_lens None, (B,) or (B, Q) (int64).

    Same as d2l except that a row with valid length 0 is all zeros with zero gradient (d2l gives
    uniform weights 1/K there). Masked entries are excluded from the softmax, not set to -1e6.
    """
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    B, Q, K = X.shape
    if valid_lens.dim() == 1:
        valid_lens = valid_lens[:, None].expand(B, Q)  # same as d2l's repeat_interleave over Q
    mask = torch.arange(K)[None, None, :] < valid_lens[:, :, None]  # (B, Q, K)
    any_valid = mask.any(dim=-1, keepdim=True)  # (B, Q, 1)
    # -inf where masked; rows with nothing valid get finite zeros so softmax stays NaN-free,
    # and the final multiply by the mask zeroes them (and their gradient).
    Xm = torch.where(mask, X, torch.full_like(X, -math.inf))
    Xm = torch.where(any_valid, Xm, torch.zeros_like(X))
    return F.softmax(Xm, dim=-1) * mask.to(X.dtype)


class DotProductAttention(nn.Module):
    """d2l 10.3: scaled dot-product attention."""

    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    # queries: (B, Q, d), keys: (B, K, d), values: (B, K, v), valid_lens: (B,) or (B, Q)
    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class AdditiveAttention(nn.Module):
    """d2l 10.3: additive attention."""

    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = queries.unsqueeze(2) + keys.unsqueeze(1)  # (B, Q, K, num_hiddens)
        features = torch.tanh(features)
        scores = self.w_v(features).squeeze(-1)  # (B, Q, K)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def transpose_qkv(X, num_heads):
    """d2l 10.5: (B, n, num_hiddens) -> (B * H, n, num_hiddens / H)."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    """d2l 10.5: reverse of transpose_qkv."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadAttention(nn.Module):
    """d2l 10.5 multi-head attention, plus a per-head gate on each head's context."""

    def __init__(self, key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    # gates: (H,) or None (= ones)
    def forward(self, queries, keys, values, valid_lens=None, gates=None):
        H = self.num_heads
        queries = transpose_qkv(self.W_q(queries), H)
        keys = transpose_qkv(self.W_k(keys), H)
        values = transpose_qkv(self.W_v(values), H)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=H, dim=0)
        output = self.attention(queries, keys, values, valid_lens)  # (B * H, Q, D)
        if gates is not None:
            BH, Qn, D = output.shape
            output = (output.reshape(-1, H, Qn, D) * gates.reshape(1, H, 1, 1)).reshape(BH, Qn, D)
        w = self.attention.attention_weights
        self.attention_weights = w.reshape(-1, H, w.shape[1], w.shape[2])  # (B, H, Q, K)
        output_concat = transpose_output(output, H)
        return self.W_o(output_concat)


# ----------------------------------------------------------------------------------------------
# Self-checks against the seeds' printed examples and between equivalent formulations.
# ----------------------------------------------------------------------------------------------


def self_checks():
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the seeds' printed numbers are float32 runs

    # d2l 10.3: keys ones(2,10,2), values arange(40), valid_lens [2, 6] -> [[2,3,4,5]], [[10,11,12,13]]
    torch.manual_seed(0)
    keys = torch.ones((2, 10, 2))
    values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    valid_lens = torch.tensor([2, 6])
    expect = torch.tensor([[[2.0, 3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0, 13.0]]])
    queries = torch.normal(0, 1, (2, 1, 20))
    att = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
    att.eval()
    out = att(queries, keys, values, valid_lens)
    assert torch.allclose(out, expect, atol=1e-5), out
    w = att.attention_weights.reshape(2, 10)
    assert torch.allclose(w[0, :2], torch.full((2,), 0.5)) and torch.all(w[0, 2:] == 0)
    assert torch.allclose(w[1, :6], torch.full((6,), 1 / 6)) and torch.all(w[1, 6:] == 0)
    queries = torch.normal(0, 1, (2, 1, 2))
    att = DotProductAttention(dropout=0.5)
    att.eval()
    out = att(queries, keys, values, valid_lens)
    assert torch.allclose(out, expect, atol=1e-5), out

    # d2l 10.3 masked_softmax examples (random inputs: check structure, and agreement with d2l's code)
    X = torch.rand(2, 2, 4)
    y = masked_softmax(X, torch.tensor([2, 3]))
    assert torch.allclose(y, masked_softmax_d2l(X, torch.tensor([2, 3])))
    assert torch.all(y[0, :, 2:] == 0) and torch.all(y[1, :, 3:] == 0)
    assert torch.allclose(y.sum(-1), torch.ones(2, 2))
    y = masked_softmax(X, torch.tensor([[1, 3], [2, 4]]))
    assert torch.allclose(y, masked_softmax_d2l(X, torch.tensor([[1, 3], [2, 4]])))
    assert torch.equal(y[0, 0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # the one deliberate difference: a zero valid length gives zeros, not d2l's uniform 1/K
    y = masked_softmax(X, torch.tensor([[0, 3], [2, 4]]))
    assert torch.equal(y[0, 0], torch.zeros(4))
    assert torch.allclose(masked_softmax_d2l(X, torch.tensor([[0, 3], [2, 4]]))[0, 0], torch.full((4,), 0.25))

    # d2l 10.5: shapes of the toy example (num_hiddens 100, 5 heads, valid_lens [3, 2])
    attention = MultiHeadAttention(100, 100, 100, 100, 5, 0.5)
    attention.eval()
    Xq, Y = torch.ones((2, 4, 100)), torch.ones((2, 6, 100))
    assert attention(Xq, Y, Y, torch.tensor([3, 2])).shape == (2, 4, 100)
    assert attention.attention.attention_weights.shape == (10, 4, 6)
    assert attention.attention_weights.shape == (2, 5, 4, 6)

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
    # masked_softmax: no NaN, zero gradient in fully masked rows; float64 gradcheck
    X = torch.randn(2, 3, 4, requires_grad=True)
    vl = torch.tensor([[0, 2, 4], [1, 0, 3]])
    assert torch.autograd.gradcheck(lambda t: masked_softmax(t, vl), (X,))
    masked_softmax(X, vl).pow(2).sum().backward()
    assert torch.all(X.grad[0, 0] == 0) and torch.all(X.grad[1, 1] == 0) and torch.isfinite(X.grad).all()

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

    # d2l MHA with one head == W_o(DotProductAttention(W_q q, W_k k, W_v v))
    m = MultiHeadAttention(3, 4, 5, 6, 1, 0.0, bias=True)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 3), torch.randn(2, 5, 5)
    ref = m.W_o(DotProductAttention(0.0)(m.W_q(q), m.W_k(k), m.W_v(v), torch.tensor([2, 5])))
    assert torch.allclose(m(q, k, v, torch.tensor([2, 5])), ref, atol=1e-12)

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
# HDF5 writing (deterministic: no timestamps, 1.8 file format = compact groups, small files; the
# two size-saving properties h5py 3.7 does not expose are set through headlab_hdf5, and where they
# cannot be, files are bigger with the same content).
# ----------------------------------------------------------------------------------------------


def _gcpl():
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)  # no timestamps: re-runs give byte-identical files
    set_link_phase_change(gcpl, 10000, 9000)  # links stay in the object header (compact)
    return gcpl


def _ensure_group(f, path):
    g = f
    for part in [p for p in path.split("/") if p]:
        if part not in g:
            h5py.h5g.create(g.id, part.encode(), gcpl=_gcpl())
        g = g[part]
    return g


def _np(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        t = t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64)
        t = t.numpy()
    a = np.asarray(t)  # (np.ascontiguousarray would turn 0-d into 1-d)
    return np.require(a.astype("<f8") if a.dtype.kind == "f" else a.astype("<i8"), requirements="C")


def _dataset(g, name, arr):
    """Contiguous float64 / int64 little-endian dataset; scalar dataspace for 0-d arrays."""
    space = h5py.h5s.create(h5py.h5s.SCALAR) if arr.ndim == 0 else h5py.h5s.create_simple(arr.shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)
    set_dset_no_attrs_hint(dcpl)  # minimal object header: halves the per-dataset cost
    ftype = h5py.h5t.IEEE_F64LE if arr.dtype.kind == "f" else h5py.h5t.STD_I64LE
    d = h5py.h5d.create(g.id, name.encode(), ftype, space, dcpl=dcpl)
    d.write(h5py.h5s.ALL, h5py.h5s.ALL, arr)


def write_h5(path, attrs, data, groups=()):
    """attrs: root attributes (str); data: {"group/.../name": tensor/array}; groups: made even if empty."""
    tmp = path + ".tmp"
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V18, h5py.h5f.LIBVER_V18)  # 1.8 format: compact groups
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)  # the root group too
    set_link_phase_change(fcpl, 10000, 9000)
    fid = h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl)
    with h5py.File(fid) as f:
        for k in sorted(attrs):
            # fixed-length UTF-8 strings: variable-length ones would cost a 4 KiB global heap per file
            b = attrs[k].encode("utf-8")
            f.attrs.create(k, np.array(b, dtype=f"S{max(1, len(b))}"),
                           dtype=h5py.string_dtype("utf-8", max(1, len(b))))
        for grp in groups:
            _ensure_group(f, grp)
        for key in data:
            grp_path, name = key.rsplit("/", 1) if "/" in key else ("", key)
            _dataset(_ensure_group(f, grp_path), name, _np(data[key]))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Module fixtures
# ----------------------------------------------------------------------------------------------

INDEX = []


def params_of(model):
    """Parameters under their state_dict names (buffers such as causal masks are not parameters)."""
    return list(model.named_parameters())


def run_module(out_dir, fname, module, config, description, model, call, inputs, gates=None,
               seed=0, perturb=()):
    """Forward with the given inputs, loss = sum(output * loss_weight), backward, write the file.

    call(model, inputs, gates) -> output; model.attention_weights is stored when present.
    inputs: {name: tensor}; float tensors get gradients, int64 ones (valid_lens, idx) do not.
    """
    model.eval()  # dropout p = 0 anyway; eval keeps dropout from touching the RNG
    torch.manual_seed(seed + 7919)
    with torch.no_grad():  # move affine params off their ones/zeros init so swaps would show
        for nm, p in model.named_parameters():
            if nm.split(".")[-1] in perturb:
                p.add_(0.3 * torch.randn_like(p))
    leaves = {}
    for k, v in inputs.items():
        if v is not None and v.is_floating_point():
            v = v.detach().clone().requires_grad_(True)
        leaves[k] = v
    g = None
    if gates is not None:
        g = torch.as_tensor(gates, dtype=torch.float64).clone().requires_grad_(True)
    params = params_of(model)
    init = {f"params/{n}": p.detach().clone() for n, p in params}
    out = call(model, leaves, g)
    loss_weight = torch.randn(out.shape)
    (out * loss_weight).sum().backward()
    data = dict(init)
    for k, v in leaves.items():
        if v is not None:
            data[f"inputs/{k}"] = v
    if g is not None:
        data["inputs/gates"] = g
    data["inputs/loss_weight"] = loss_weight
    data["outputs/output"] = out
    if getattr(model, "attention_weights", None) is not None:
        data["outputs/attention_weights"] = model.attention_weights
    for k, v in leaves.items():
        if v is not None and v.is_floating_point():
            assert torch.isfinite(v.grad).all()
            data[f"grads/inputs/{k}"] = v.grad
    if g is not None:
        data["grads/inputs/gates"] = g.grad
    for n, p in params:
        gr = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.isfinite(gr).all()
        data[f"grads/params/{n}"] = gr
    for k, v in data.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            assert torch.isfinite(v).all(), (fname, k)
    attrs = {"module": module, "config": json.dumps(config, sort_keys=True),
             "description": description, "call": call.__doc__}
    write_h5(os.path.join(out_dir, fname), attrs, data, groups=("params", "inputs", "outputs", "grads/params"))
    INDEX.append({"file": fname, "kind": "module", "module": module, "config": config,
                  "call": call.__doc__, "description": description})


def call_qkv(m, i, g):
    """module(queries, keys, values, valid_lens)"""
    return m(i["queries"], i["keys"], i["values"], i.get("valid_lens"))


def call_qkv_gates(m, i, g):
    """module(queries, keys, values, valid_lens, gates)"""
    return m(i["queries"], i["keys"], i["values"], i.get("valid_lens"), g)


def call_xxx_gates(m, i, g):
    """module(x, x, x, valid_lens, gates)"""
    return m(i["x"], i["x"], i["x"], i.get("valid_lens"), g)


def call_x(m, i, g):
    """module(x)"""
    return m(i["x"])


def call_x_gates(m, i, g):
    """module(x, gates)"""
    return m(i["x"], g)


def call_idx(m, i, g):
    """module(idx)"""
    return m(i["idx"])


class MaskedSoftmaxFn(nn.Module):
    def forward(self, x, valid_lens):
        self.attention_weights = None
        return masked_softmax(x, valid_lens)


def call_masked_softmax(m, i, g):
    """masked_softmax(x, valid_lens)"""
    return m(i["x"], i.get("valid_lens"))


def vl(v):
    return None if v is None else torch.tensor(v, dtype=torch.int64)


def module_fixtures(out):
    R = torch.randn

    # --- masked_softmax -----------------------------------------------------------------------
    for seed, (fname, shape, lens, desc) in enumerate([
        ("masked_softmax_novl.h5", (2, 3, 5), None, "valid_lens None: plain softmax over the last axis"),
        ("masked_softmax_vl1d.h5", (3, 2, 4), [2, 0, 4],
         "valid_lens 1-D (B,) repeated over Q; batch 1 has length 0 (all-zero rows), batch 2 is full"),
        ("masked_softmax_vl2d.h5", (2, 3, 5), [[1, 3, 0], [5, 2, 4]],
         "valid_lens 2-D (B, Q) with a zero (row [0, 2] is all zeros) and a full row"),
    ]):
        torch.manual_seed(100 + seed)
        x = R(*shape) * 2
        run_module(out, fname, "masked_softmax", {}, desc, MaskedSoftmaxFn(), call_masked_softmax,
                   {"x": x, "valid_lens": vl(lens)}, seed=100 + seed)

    # --- DotProductAttention --------------------------------------------------------------------
    for seed, (fname, B, Q, K, d, v, lens, desc) in enumerate([
        ("dot_self_novl.h5", 2, 4, 4, 3, 5, None, "Q = K = 4, d 3, value size 5, no valid_lens"),
        ("dot_self_vl1d.h5", 3, 4, 4, 4, 3, [2, 0, 4], "Q = K = 4, valid_lens 1-D [2, 0, 4] (a zero)"),
        ("dot_cross_vl2d.h5", 2, 3, 5, 4, 6, [[1, 0, 5], [3, 2, 4]],
         "cross: Q 3, K 5, d 4, value size 6, valid_lens 2-D with a zero"),
        ("dot_cross_vl1d.h5", 2, 2, 6, 3, 2, [4, 6], "cross: Q 2, K 6, valid_lens 1-D [4, 6]"),
    ]):
        torch.manual_seed(200 + seed)
        cfg = {"dropout": 0.0}
        m = DotProductAttention(**cfg)
        ins = {"queries": R(B, Q, d), "keys": R(B, K, d), "values": R(B, K, v), "valid_lens": vl(lens)}
        run_module(out, fname, "DotProductAttention", cfg, desc, m, call_qkv, ins, seed=200 + seed)

    # --- AdditiveAttention ----------------------------------------------------------------------
    for seed, (fname, B, Q, K, qs, ks, nh, v, lens, desc) in enumerate([
        ("additive_self_novl.h5", 2, 4, 4, 3, 3, 5, 2, None, "Q = K = 4, query/key size 3, 5 hiddens"),
        ("additive_cross_vl1d.h5", 2, 3, 5, 4, 3, 6, 2, [3, 0],
         "cross: Q 3, K 5, query size 4, key size 3, value size 2, valid_lens 1-D [3, 0]"),
        ("additive_cross_vl2d.h5", 2, 2, 4, 5, 2, 4, 3, [[0, 2], [4, 1]],
         "cross: Q 2, K 4, query size 5, key size 2, value size 3, valid_lens 2-D with a zero"),
    ]):
        torch.manual_seed(300 + seed)
        cfg = {"key_size": ks, "query_size": qs, "num_hiddens": nh, "dropout": 0.0}
        m = AdditiveAttention(**cfg)
        ins = {"queries": R(B, Q, qs), "keys": R(B, K, ks), "values": R(B, K, v), "valid_lens": vl(lens)}
        run_module(out, fname, "AdditiveAttention", cfg, desc, m, call_qkv, ins, seed=300 + seed)

    # --- MultiHeadAttention (d2l) ---------------------------------------------------------------
    for seed, (fname, H, nh, bias, B, Q, K, qs, ks, vs, lens, gates, shared, desc) in enumerate([
        ("mha_h1_self_novl.h5", 1, 4, False, 2, 4, 4, 4, 4, 4, None, None, False,
         "1 head, num_hiddens 4, no bias, Q = K = 4, no valid_lens"),
        ("mha_h2_selfx_vl1d_bias.h5", 2, 6, True, 3, 5, 5, 5, 5, 5, [2, 0, 5], None, True,
         "2 heads, bias, true self-attention module(x, x, x) (gradient of x sums the three uses), "
         "valid_lens 1-D [2, 0, 5]"),
        ("mha_h2_cross_vl2d.h5", 2, 8, False, 2, 3, 5, 5, 3, 4, [[1, 5, 0], [3, 2, 4]], None, False,
         "2 heads, cross: Q 3, K 5, query 5 / key 3 / value 4 features, valid_lens 2-D with a zero"),
        ("mha_h4_cross_vl2d_gates.h5", 4, 8, True, 2, 3, 5, 5, 3, 6, [[2, 0, 5], [1, 4, 3]],
         [1.0, 0.0, 0.5, 1.5], False,
         "4 heads, bias, cross: Q 3, K 5, query 5 / key 3 / value 6, valid_lens 2-D with a zero, "
         "gates [1, 0, 0.5, 1.5]"),
        ("mha_h8_cross_vl1d_gates.h5", 8, 16, False, 2, 4, 6, 3, 5, 2, [0, 4], 
         [1.0, 0.0, 0.5, 0.25, 1.25, 0.0, 0.75, 2.0], False,
         "8 heads, num_hiddens 16, cross: Q 4, K 6, query 3 / key 5 / value 2, valid_lens 1-D [0, 4], "
         "gates [1, 0, 0.5, 0.25, 1.25, 0, 0.75, 2]"),
        ("mha_h4_self_novl_bias.h5", 4, 8, True, 2, 4, 4, 6, 6, 6, None, None, False,
         "4 heads, bias, Q = K = 4, equal feature sizes 6, no valid_lens"),
    ]):
        torch.manual_seed(400 + seed)
        cfg = {"key_size": ks, "query_size": qs, "value_size": vs, "num_hiddens": nh, "num_heads": H,
               "dropout": 0.0, "bias": bias}
        m = MultiHeadAttention(**cfg)
        if shared:
            ins, fn = {"x": R(B, Q, qs), "valid_lens": vl(lens)}, call_xxx_gates
        else:
            ins = {"queries": R(B, Q, qs), "keys": R(B, K, ks), "values": R(B, K, vs), "valid_lens": vl(lens)}
            fn = call_qkv_gates
        run_module(out, fname, "MultiHeadAttention", cfg, desc, m, fn, ins,
                   gates=gates if gates is not None else [1.0] * H, seed=400 + seed)

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


# ----------------------------------------------------------------------------------------------
# Optimizer trajectories and LR schedules
# ----------------------------------------------------------------------------------------------

OPTIMS = [
    ("optim_sgd.h5", "SGD", dict(lr=0.1)),
    ("optim_sgd_momentum.h5", "SGD", dict(lr=0.1, momentum=0.9)),
    ("optim_sgd_nesterov_wd.h5", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("optim_sgd_momentum_dampening.h5", "SGD", dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("optim_adam.h5", "Adam", dict(lr=0.01)),
    ("optim_adam_wd.h5", "Adam", dict(lr=0.01, weight_decay=0.01)),
    ("optim_adamw.h5", "AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("optim_adamw_betas.h5", "AdamW", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
]
HYPER_KEYS = {"SGD": ["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"],
              "Adam": ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"],
              "AdamW": ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"]}


OPTIM_MODULE = "Sequential(Linear(4,3),Tanh,Linear(3,2))"


def optim_model():
    """The optimizer fixtures' model (PyTorch default init from the current RNG state)."""
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def optim_fixtures(out):
    torch.manual_seed(900)
    x = torch.randn(8, 4)
    y = torch.randn(8, 2)
    for fname, cls, kw in OPTIMS:
        torch.manual_seed(901)  # same initial model for every optimizer
        model = optim_model()
        opt = getattr(torch.optim, cls)(model.parameters(), **kw)
        data = {"inputs/x": x, "inputs/y": y}
        for n, p in model.named_parameters():
            data[f"params_init/{n}"] = p.detach().clone()
        losses = []
        for k in range(1, 11):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            for n, p in model.named_parameters():
                data[f"params_step_{k}/{n}"] = p.detach().clone()
        data["losses"] = torch.tensor(losses)
        for n, p in model.named_parameters():
            st = opt.state[p]
            for key in ("exp_avg", "exp_avg_sq", "momentum_buffer", "step"):
                if st.get(key) is not None:
                    v = st[key]
                    data[f"state/{n}/{key}"] = torch.as_tensor(v, dtype=torch.float64).reshape(
                        v.shape if isinstance(v, torch.Tensor) else ())
        group = opt.param_groups[0]
        hyper = {k: (list(group[k]) if isinstance(group[k], tuple) else group[k]) for k in HYPER_KEYS[cls]}
        desc = (f"{cls}({', '.join(f'{k}={v}' for k, v in kw.items())}) on Sequential(Linear(4, 3), Tanh, "
                f"Linear(3, 2)), mse_loss, 10 steps")
        write_h5(os.path.join(out, fname), {"optimizer": cls, "hyperparameters": json.dumps(hyper, sort_keys=True),
                                            "description": desc, "module": OPTIM_MODULE},
                 data, groups=("state",))  # plain SGD keeps no state: /state stays empty
        INDEX.append({"file": fname, "kind": "optim", "module": OPTIM_MODULE,
                      "optimizer": cls, "hyperparameters": hyper, "description": desc})


def warmup_cosine_lr(t, lr, min_lr, warmup, total):
    if t < warmup:
        return lr * (t + 1) / warmup
    progress = min(1.0, (t - warmup) / (total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def schedules(out):
    lr, min_lr, warmup, total = 0.01, 0.001, 5, 40
    ours = [warmup_cosine_lr(t, lr, min_lr, warmup, total) for t in range(total + 1)]
    # the same schedule through PyTorch's LambdaLR (lr_t = lr * lambda(t)) as a cross-check
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: warmup_cosine_lr(t, lr, min_lr, warmup, total) / lr)
    via_torch = []
    for t in range(total + 1):
        via_torch.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert all(abs(a - b) <= 1e-15 for a, b in zip(ours, via_torch))
    assert ours[warmup - 1] == lr and abs(ours[warmup] - lr) < 1e-15 and abs(ours[total] - min_lr) < 1e-15
    opt = torch.optim.SGD([p], lr=0.1)
    step = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    step_lrs = []
    for t in range(total + 1):
        step_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        step.step()
    doc = {
        "steps": list(range(total + 1)),
        "warmup_cosine": {
            "lr": lr, "min_lr": min_lr, "warmup_steps": warmup, "total_steps": total,
            "formula": "t < warmup: lr * (t + 1) / warmup; else progress = min(1, (t - warmup) / (total - warmup)), "
                       "lr_t = min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * progress))",
            "lrs": ours},
        "step_lr": {
            "lr": 0.1, "step_size": 10, "gamma": 0.5,
            "formula": "torch.optim.lr_scheduler.StepLR: lr read from the param group before the t-th "
                       "optimizer.step(); scheduler.step() after each optimizer.step()",
            "lrs": step_lrs},
    }
    with open(os.path.join(out, "schedules.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# Verification: rebuild every fixture from nothing but its file (config + params + inputs) and
# recompute it, so a file that is not self-sufficient (or was written wrongly) fails here.
# ----------------------------------------------------------------------------------------------

FACTORY = {
    "masked_softmax": lambda c: MaskedSoftmaxFn(),
    "DotProductAttention": lambda c: DotProductAttention(**c),
    "AdditiveAttention": lambda c: AdditiveAttention(**c),
    "MultiHeadAttention": lambda c: MultiHeadAttention(**c),
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
CALL_FNS = {fn.__doc__: fn for fn in (call_qkv, call_qkv_gates, call_xxx_gates, call_x, call_x_gates, call_idx,
                                      call_masked_softmax)}


def _read(f, group):
    if group not in f:
        return {}
    return {k: torch.from_numpy(f[group][k][()]) for k in f[group]}


def _close(a, b, what):
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-13), what


def _load_params(model, params):
    missing, unexpected = model.load_state_dict(params, strict=False)
    assert not unexpected and all(k.endswith("mask") for k in missing), (missing, unexpected)


def verify(out):
    with open(os.path.join(out, "index.json")) as fh:
        index = json.load(fh)["files"]
    for e in index:
        with h5py.File(os.path.join(out, e["file"]), "r") as f:
            if e["kind"] == "module":
                cfg = json.loads(f.attrs["config"])
                model = FACTORY[attr_str(f, "module")](cfg)
                model.eval()
                _load_params(model, _read(f, "params"))
                ins = _read(f, "inputs")
                lw = ins.pop("loss_weight")
                g = ins.pop("gates", None)
                for v in list(ins.values()) + ([g] if g is not None else []):
                    if v.is_floating_point():
                        v.requires_grad_(True)
                outp = CALL_FNS[e["call"]](model, ins, g)
                (outp * lw).sum().backward()
                _close(outp, torch.from_numpy(f["outputs/output"][()]), e["file"])
                if "outputs/attention_weights" in f:
                    _close(model.attention_weights, torch.from_numpy(f["outputs/attention_weights"][()]), e["file"])
                for k, v in ins.items():
                    if v.is_floating_point():
                        _close(v.grad, torch.from_numpy(f[f"grads/inputs/{k}"][()]), (e["file"], k))
                if g is not None:
                    _close(g.grad, torch.from_numpy(f["grads/inputs/gates"][()]), (e["file"], "gates"))
                for n, p in model.named_parameters():
                    gr = p.grad if p.grad is not None else torch.zeros_like(p)
                    _close(gr, torch.from_numpy(f[f"grads/params/{n}"][()]), (e["file"], n))
                assert set(f["params"]) == {n for n, _ in model.named_parameters()}
            elif e["kind"] == "gpt":
                cfg = json.loads(f.attrs["config"])
                model = GPTModel(cfg)
                model.eval()
                _load_params(model, _read(f, "params"))
                logits = model(torch.from_numpy(f["inputs/idx"][()]))
                loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(f["inputs/targets"][()]).flatten())
                loss.backward()
                _close(logits, torch.from_numpy(f["outputs/logits"][()]), e["file"])
                _close(loss, torch.tensor(f["outputs/loss"][()]), e["file"])
                for n, p in model.named_parameters():
                    _close(p.grad, torch.from_numpy(f[f"grads/params/{n}"][()]), (e["file"], n))
                assert set(f["params"]) == {n for n, _ in model.named_parameters()}
            else:
                hyper = json.loads(f.attrs["hyperparameters"])
                torch.manual_seed(0)  # any init: the file's params_init replace it
                model = optim_model()
                model.load_state_dict(_read(f, "params_init"))
                opt = getattr(torch.optim, attr_str(f, "optimizer"))(model.parameters(), **hyper)
                x, y = torch.from_numpy(f["inputs/x"][()]), torch.from_numpy(f["inputs/y"][()])
                losses = f["losses"][()]
                for k in range(1, 11):
                    opt.zero_grad()
                    loss = F.mse_loss(model(x), y)
                    loss.backward()
                    opt.step()
                    assert abs(loss.item() - losses[k - 1]) <= 1e-13
                    for n, p in model.named_parameters():
                        _close(p.detach(), torch.from_numpy(f[f"params_step_{k}/{n}"][()]), (e["file"], k, n))


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)  # deterministic summation order
    self_checks()
    torch.set_default_dtype(torch.float64)
    module_fixtures(out)
    gpt_fixture(out, "gpt_fused.h5", "fused", False, seed=1000)
    gpt_fixture(out, "gpt_wrapper.h5", "wrapper", True, seed=1001)
    optim_fixtures(out)
    schedules(out)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"generator": "tools/make_fixtures.py", "torch": torch.__version__.split("+")[0],
                   "files": INDEX}, f, indent=1, sort_keys=True)
        f.write("\n")
    verify(out)
    print(f"wrote {len(INDEX)} HDF5 fixtures + index.json + schedules.json to {out}")


if __name__ == "__main__":
    sys.exit(main())
