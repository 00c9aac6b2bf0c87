"""d2l.ai reference modules and their fixtures, for tools/make_fixtures.py: masked_softmax (d2l 10.3
plus headlab's zero rows), DotProductAttention and AdditiveAttention (10.3), MultiHeadAttention (10.5,
plus per-head gates); their self-checks against d2l's printed examples; the fixture files.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fixtures_common import call_masked_softmax, call_qkv, call_qkv_gates, call_xxx_gates, run_module, vl

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


class MaskedSoftmaxFn(nn.Module):
    def forward(self, x, valid_lens):
        self.attention_weights = None
        return masked_softmax(x, valid_lens)



# ----------------------------------------------------------------------------------------------
# Self-checks against d2l's printed examples and between equivalent formulations
# ----------------------------------------------------------------------------------------------


def d2l_self_checks():
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

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1)
    # masked_softmax: no NaN, zero gradient in fully masked rows; float64 gradcheck
    X = torch.randn(2, 3, 4, requires_grad=True)
    vl = torch.tensor([[0, 2, 4], [1, 0, 3]])
    assert torch.autograd.gradcheck(lambda t: masked_softmax(t, vl), (X,))
    masked_softmax(X, vl).pow(2).sum().backward()
    assert torch.all(X.grad[0, 0] == 0) and torch.all(X.grad[1, 1] == 0) and torch.isfinite(X.grad).all()

    # d2l MHA with one head == W_o(DotProductAttention(W_q q, W_k k, W_v v))
    m = MultiHeadAttention(3, 4, 5, 6, 1, 0.0, bias=True)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 3), torch.randn(2, 5, 5)
    ref = m.W_o(DotProductAttention(0.0)(m.W_q(q), m.W_k(k), m.W_v(v), torch.tensor([2, 5])))
    assert torch.allclose(m(q, k, v, torch.tensor([2, 5])), ref, atol=1e-12)
    torch.set_default_dtype(prev)


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------

FACTORY = {  # module attribute -> constructor from the file's config (make_fixtures.verify)
    "masked_softmax": lambda c: MaskedSoftmaxFn(),
    "DotProductAttention": lambda c: DotProductAttention(**c),
    "AdditiveAttention": lambda c: AdditiveAttention(**c),
    "MultiHeadAttention": lambda c: MultiHeadAttention(**c),
}


def d2l_fixtures(out):
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
