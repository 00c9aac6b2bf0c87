"""d2l.ai 10.7's encoder-decoder Transformer (the older edition whose 10.3/10.5 code is in
tools/fixtures_d2l.py) as reference modules, their self-checks and fixtures, for tools/make_fixtures.py:
PositionalEncoding (10.6), PositionWiseFFN, AddNorm, EncoderBlock, DecoderBlock, TransformerEncoder,
TransformerDecoder, EncoderDecoder (9.6) and MaskedSoftmaxCELoss (9.7).

Written as d2l writes them (argument lists, attribute names, so state_dict keys such as
"encoder.blks.block0.attention.W_q.weight" and "decoder.blks.block1.addnorm3.ln.bias"), on
fixtures_d2l's MultiHeadAttention and masked_softmax (headlab's: a row with valid length 0 is all
zeros). Beyond the text, as headlab's nn/transformer.h has them:
- nn.Linear with known input sizes (PositionWiseFFN takes ffn_num_input, as the older edition's
  code does; the newer one uses LazyLinear);
- every attention takes per-head gates (H,); the whole model takes gates (3, L, H): gates[0][l] for
  encoder block l's attention, gates[1][l] for decoder block l's attention1 (self), gates[2][l] for
  decoder block l's attention2 (cross);
- the decoder's attentions use `use_bias` as the encoder's do (d2l's DecoderBlock leaves them at
  the default, no bias); `max_len` reaches the positional encodings.
Two deliberate differences from d2l's code (where d2l's is only right in the case it runs):
(a) the decoder self-attention ALWAYS uses the causal dec_valid_lens (B, T) with values
    cache_len + t + 1 (t = 0..T-1, cache_len = positions already in state[2][i]); d2l builds
    dec_valid_lens = arange(1, T + 1) only in training mode and passes None otherwise, relying on
    decoding one token at a time (an eval-mode teacher-forced pass would then see the future);
(b) the positional encoding is offset by the number of positions already decoded (the cache length
    of state[2]); d2l always adds P[0 : T], i.e. position 0's encoding at every decoding step.
With an empty cache in training mode both agree with d2l; transformer_self_checks asserts that
against d2l's verbatim behaviour (d2l_verbatim=True), and that decoding in pieces equals decoding
all at once.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fixtures_common import (call_enc_dec_gates, call_enc_dec_masked_ce, call_idx_enc, call_idx_valid_lens, call_x, call_x_enc, call_x_valid_lens, call_x_y, run_module, vl)
from fixtures_d2l import MultiHeadAttention

# ----------------------------------------------------------------------------------------------
# Reference modules. B = batch, S = source tokens, T = target tokens, N = num_hiddens, L = layers,
# H = heads, V = vocabulary.
# ----------------------------------------------------------------------------------------------


class PositionalEncoding(nn.Module):
    """d2l 10.6: X + P[offset : offset + T], then dropout. P is a plain attribute (no state_dict entry).

    offset (headlab, difference (b)): the positions already decoded; d2l has no offset (always 0).
    """

    def __init__(self, num_hiddens, dropout, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float64).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float64) / num_hiddens)
        self.P[:, :, 0::2] = torch.sin(X)
        self.P[:, :, 1::2] = torch.cos(X)

    def forward(self, X, offset=0):
        X = X + self.P[:, offset:offset + X.shape[1], :].to(X.device)
        return self.dropout(X)


class PositionWiseFFN(nn.Module):
    """d2l 10.7: dense2(relu(dense1(X)))."""

    def __init__(self, ffn_num_input, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1 = nn.Linear(ffn_num_input, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """d2l 10.7: residual connection followed by layer normalization, ln(dropout(Y) + X)."""

    def __init__(self, normalized_shape, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class EncoderBlock(nn.Module):
    """d2l 10.7: Y = addnorm1(X, attention(X, X, X, valid_lens)); addnorm2(Y, ffn(Y))."""

    def __init__(self, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens,
                 num_heads, dropout, use_bias=False):
        super().__init__()
        self.attention = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                                            use_bias)
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm2 = AddNorm(norm_shape, dropout)

    def forward(self, X, valid_lens, gates=None):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens, gates))
        return self.addnorm2(Y, self.ffn(Y))


class DecoderBlock(nn.Module):
    """d2l 10.7's i-th decoder block; state = [enc_outputs, enc_valid_lens, [cache per block]].

    Difference (a): the self-attention is causal in every mode (dec_valid_lens = cache_len + t + 1);
    d2l_verbatim=True restores d2l's (masked only in training, None otherwise), for the self-checks.
    use_bias reaches both attentions (d2l's DecoderBlock leaves them without bias).
    """

    def __init__(self, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens,
                 num_heads, dropout, i, use_bias=False, d2l_verbatim=False):
        super().__init__()
        self.i = i
        self.d2l_verbatim = d2l_verbatim
        self.attention1 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                                             use_bias)
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.attention2 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                                             use_bias)
        self.addnorm2 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm3 = AddNorm(norm_shape, dropout)

    # gates1 / gates2: (H,) for attention1 (self) / attention2 (cross), or None (ones)
    def forward(self, X, state, gates1=None, gates2=None):
        enc_outputs, enc_valid_lens = state[0], state[1]
        cache_len = 0 if state[2][self.i] is None else state[2][self.i].shape[1]
        if state[2][self.i] is None:
            key_values = X
        else:
            key_values = torch.cat((state[2][self.i], X), dim=1)
        state[2][self.i] = key_values
        batch_size, num_steps, _ = X.shape
        if self.training or not self.d2l_verbatim:
            # (B, T): query t sees the cache and itself, cache_len + t + 1 keys (d2l: cache_len is 0)
            dec_valid_lens = torch.arange(cache_len + 1, cache_len + num_steps + 1, device=X.device).repeat(
                batch_size, 1)
        else:
            dec_valid_lens = None
        X2 = self.attention1(X, key_values, key_values, dec_valid_lens, gates1)
        Y = self.addnorm1(X, X2)
        Y2 = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens, gates2)
        Z = self.addnorm2(Y, Y2)
        return self.addnorm3(Z, self.ffn(Z)), state


class TransformerEncoder(nn.Module):
    """d2l 10.7: blks(pos_encoding(embedding(X) * sqrt(N)), valid_lens)."""

    def __init__(self, vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                 ffn_num_hiddens, num_heads, num_layers, dropout, use_bias=False, max_len=1000):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout, max_len)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module("block" + str(i), EncoderBlock(key_size, query_size, value_size, num_hiddens,
                                                                norm_shape, ffn_num_input, ffn_num_hiddens,
                                                                num_heads, dropout, use_bias))

    # gates: (L, H) or None
    def forward(self, X, valid_lens, gates=None):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        for i, blk in enumerate(self.blks):
            X = blk(X, valid_lens, None if gates is None else gates[i])
        return X


class TransformerDecoder(nn.Module):
    """d2l 10.7: dense(blks(pos_encoding(embedding(X) * sqrt(N)), state)), returns (logits, state).

    Difference (b): the positional encoding starts at the number of positions already decoded
    (the cache length of state[2]); d2l_verbatim=True starts at 0 as d2l does.
    """

    def __init__(self, vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                 ffn_num_hiddens, num_heads, num_layers, dropout, use_bias=False, max_len=1000, d2l_verbatim=False):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.num_layers = num_layers
        self.d2l_verbatim = d2l_verbatim
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout, max_len)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module("block" + str(i), DecoderBlock(key_size, query_size, value_size, num_hiddens,
                                                                norm_shape, ffn_num_input, ffn_num_hiddens,
                                                                num_heads, dropout, i, use_bias, d2l_verbatim))
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        return [enc_outputs, enc_valid_lens, [None] * self.num_layers]

    # gates: (2, L, H) (self, cross) or None
    def forward(self, X, state, gates=None):
        offset = 0 if self.d2l_verbatim or state[2][0] is None else state[2][0].shape[1]
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens), offset)
        for i, blk in enumerate(self.blks):
            X, state = blk(X, state, None if gates is None else gates[0][i], None if gates is None else gates[1][i])
        return self.dense(X), state


class EncoderDecoder(nn.Module):
    """d2l 9.6: decoder(dec_X, decoder.init_state(encoder(enc_X, enc_valid_lens), enc_valid_lens))."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    # gates: (3, L, H) (encoder, decoder self, cross) or None
    def forward(self, enc_X, dec_X, enc_valid_lens, gates=None):
        enc_outputs = self.encoder(enc_X, enc_valid_lens, None if gates is None else gates[0])
        dec_state = self.decoder.init_state(enc_outputs, enc_valid_lens)
        return self.decoder(dec_X, dec_state, None if gates is None else gates[1:])


def sequence_mask(X, valid_len, value=0):
    """d2l 9.7."""
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


class MaskedSoftmaxCELoss(nn.CrossEntropyLoss):
    """d2l 9.7 verbatim: pred (B, T, V), label (B, T), valid_len (B,) -> (B,) per-row mean over all T."""

    def forward(self, pred, label, valid_len):
        weights = torch.ones_like(label)
        weights = sequence_mask(weights, valid_len)
        self.reduction = 'none'
        unweighted_loss = super().forward(pred.permute(0, 2, 1), label)
        weighted_loss = (unweighted_loss * weights).mean(dim=1)
        return weighted_loss


def masked_ce(pred, label, valid_len):
    """The mean cross entropy over the valid target tokens: sum of d2l's per-token masked losses over
    valid_len.sum(). d2l's MaskedSoftmaxCELoss averages each row over all T positions (.mean(dim=1)),
    so this is MaskedSoftmaxCELoss(pred, label, valid_len).sum() * T / valid_len.sum() (d2l's
    train_seq2seq reports l.sum() / num_tokens, which is this divided by T)."""
    T = label.shape[1]
    return MaskedSoftmaxCELoss()(pred, label, valid_len).sum() * T / valid_len.sum()


# ----------------------------------------------------------------------------------------------
# Construction from a fixture's config (make_fixtures.verify): the blocks take headlab's BlockSizes
# fields (d2l's argument names), the encoder / decoder / EncoderDecoder headlab's TransformerConfig.
# ----------------------------------------------------------------------------------------------


def _coder_args(c, vocab):
    n = c["num_hiddens"]
    return dict(vocab_size=vocab, key_size=n, query_size=n, value_size=n, num_hiddens=n, norm_shape=n,
                ffn_num_input=n, ffn_num_hiddens=c["ffn_num_hiddens"], num_heads=c["num_heads"],
                num_layers=c["num_layers"], dropout=c["dropout"], use_bias=c["use_bias"], max_len=c["max_len"])


def make_encoder(c):
    return TransformerEncoder(**_coder_args(c, c["src_vocab_size"]))


def make_decoder(c):
    return TransformerDecoder(**_coder_args(c, c["tgt_vocab_size"]))


def make_encoder_decoder(c):
    return EncoderDecoder(make_encoder(c), make_decoder(c))


FACTORY = {  # module attribute -> constructor from the file's config (make_fixtures.verify)
    "PositionalEncoding": lambda c: PositionalEncoding(**c),
    "PositionWiseFFN": lambda c: PositionWiseFFN(**c),
    "AddNorm": lambda c: AddNorm(**c),
    "TransformerEncoderBlock": lambda c: EncoderBlock(**c),
    "TransformerDecoderBlock": lambda c: DecoderBlock(**c),
    "TransformerEncoder": make_encoder,
    "TransformerDecoder": make_decoder,
    "EncoderDecoder": make_encoder_decoder,
}

# ----------------------------------------------------------------------------------------------
# Self-checks against d2l's printed examples, d2l's own behaviour where headlab's agrees, and
# between equivalent formulations
# ----------------------------------------------------------------------------------------------


def _tiny_config(use_bias):
    return {"src_vocab_size": 7, "tgt_vocab_size": 9, "num_hiddens": 8, "ffn_num_hiddens": 10, "num_heads": 2,
            "num_layers": 2, "dropout": 0.0, "use_bias": use_bias, "max_len": 1000}


def transformer_self_checks():
    prev = torch.get_default_dtype()
    rng = torch.get_rng_state()
    torch.set_default_dtype(torch.float32)  # the seeds' printed numbers are float32 runs
    torch.manual_seed(0)

    # d2l 10.6: P[0] = [0, 1, 0, 1, ...]; P[t, 2i] = sin(t / 10000^(2i/N)), P[t, 2i+1] = cos(...)
    pe = PositionalEncoding(32, 0)
    assert pe.P.shape == (1, 1000, 32)
    assert torch.equal(pe.P[0, 0], torch.tensor([0.0, 1.0] * 16))
    assert abs(pe.P[0, 1, 0] - math.sin(1)) < 1e-7 and abs(pe.P[0, 1, 1] - math.cos(1)) < 1e-7
    assert abs(pe.P[0, 7, 6] - math.sin(7 / 10000 ** (6 / 32))) < 1e-6
    assert not list(pe.state_dict())  # P is no parameter and no buffer

    # d2l 10.7's shape examples
    ffn = PositionWiseFFN(4, 4, 8)
    ffn.eval()
    assert ffn(torch.ones((2, 3, 4)))[0].shape == (3, 8)
    add_norm = AddNorm([3, 4], 0.5)
    add_norm.eval()
    assert add_norm(torch.ones((2, 3, 4)), torch.ones((2, 3, 4))).shape == (2, 3, 4)
    X = torch.ones((2, 100, 24))
    valid_lens = torch.tensor([3, 2])
    encoder_blk = EncoderBlock(24, 24, 24, 24, [100, 24], 24, 48, 8, 0.5)
    encoder_blk.eval()
    assert encoder_blk(X, valid_lens).shape == (2, 100, 24)
    encoder = TransformerEncoder(200, 24, 24, 24, 24, [100, 24], 24, 48, 8, 2, 0.5)
    encoder.eval()
    assert encoder(torch.ones((2, 100), dtype=torch.long), valid_lens).shape == (2, 100, 24)
    decoder_blk = DecoderBlock(24, 24, 24, 24, [100, 24], 24, 48, 8, 0.5, 0)
    decoder_blk.eval()
    state = [encoder_blk(X, valid_lens), valid_lens, [None]]
    assert decoder_blk(X, state)[0].shape == (2, 100, 24)

    # d2l 9.7's printed example: loss(ones(3, 4, 10), ones((3, 4)), [4, 2, 0]) = [2.3026, 1.1513, 0]
    loss = MaskedSoftmaxCELoss()
    got = loss(torch.ones(3, 4, 10), torch.ones((3, 4), dtype=torch.long), torch.tensor([4, 2, 0]))
    assert torch.allclose(got, torch.tensor([2.3026, 1.1513, 0.0]), atol=1e-4), got

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1)
    # state_dict keys as d2l's (and headlab's)
    model = make_encoder_decoder(_tiny_config(False))
    keys = set(model.state_dict())
    for k in ["encoder.embedding.weight", "encoder.blks.block0.attention.W_q.weight",
              "encoder.blks.block0.addnorm1.ln.weight", "encoder.blks.block0.ffn.dense1.weight",
              "decoder.blks.block1.attention2.W_o.weight", "decoder.blks.block1.addnorm3.ln.bias",
              "decoder.dense.weight", "decoder.dense.bias"]:
        assert k in keys, k
    assert "encoder.blks.block0.attention.W_q.bias" not in keys
    assert "decoder.blks.block1.attention1.W_k.bias" in set(make_encoder_decoder(_tiny_config(True)).state_dict())
    assert all(not k.endswith(".P") for k in keys)

    # (a), (b): in training mode (dropout 0) with an empty cache, headlab's decoder is d2l's verbatim
    cfg = _tiny_config(True)
    ours = make_decoder(cfg)
    d2l = TransformerDecoder(**_coder_args(cfg, cfg["tgt_vocab_size"]), d2l_verbatim=True)
    d2l.load_state_dict(ours.state_dict())
    enc = torch.randn(3, 6, 8)
    enc_vl = torch.tensor([6, 0, 3])
    X = torch.randint(0, 9, (3, 5))
    ours.train()
    d2l.train()
    assert torch.allclose(ours(X, ours.init_state(enc, enc_vl))[0], d2l(X, d2l.init_state(enc, enc_vl))[0],
                          atol=1e-12)
    # ... and in eval mode: teacher forcing all at once == two pieces == one token at a time (d2l's
    # verbatim code differs from both: unmasked when all at once, position 0's encoding per step)
    ours.eval()
    d2l.eval()
    full = ours(X, ours.init_state(enc, enc_vl))[0]
    st = ours.init_state(enc, enc_vl)
    pieces = torch.cat([ours(X[:, :2], st)[0], ours(X[:, 2:], st)[0]], dim=1)
    assert torch.allclose(full, pieces, atol=1e-12)
    st = ours.init_state(enc, enc_vl)
    steps = torch.cat([ours(X[:, t:t + 1], st)[0] for t in range(5)], dim=1)
    assert torch.allclose(full, steps, atol=1e-12) and st[2][1].shape == (3, 5, 8)
    assert not torch.allclose(full, d2l(X, d2l.init_state(enc, enc_vl))[0], atol=1e-6)
    st = d2l.init_state(enc, enc_vl)
    d2l_steps = torch.cat([d2l(X[:, t:t + 1], st)[0] for t in range(5)], dim=1)
    assert torch.allclose(full[:, 0], d2l_steps[:, 0], atol=1e-12)
    assert not torch.allclose(full, d2l_steps, atol=1e-6)

    # gates of ones == no gates; gates[k][l] reach the right module
    model = make_encoder_decoder(cfg)
    model.eval()
    src = torch.randint(0, 7, (3, 6))
    base = model(src, X, enc_vl)[0]
    assert torch.allclose(model(src, X, enc_vl, torch.ones(3, 2, 2))[0], base, atol=1e-14)
    g = torch.ones(3, 2, 2)
    g[2, 1, 0] = 0.0
    for m, (k, l) in [(model.decoder.blks.block1.attention2, (2, 1)), (model.decoder.blks.block0.attention1, (1, 0)),
                      (model.encoder.blks.block1.attention, (0, 1))]:
        gk = torch.ones(3, 2, 2)
        gk[k, l] = torch.tensor([0.5, 2.0])
        seen = []
        h = m.register_forward_hook(lambda mod, args, out: seen.append(args[4] if len(args) > 4 else None))
        model(src, X, enc_vl, gk)
        h.remove()
        assert torch.equal(seen[0], torch.tensor([0.5, 2.0])), (k, l)

    # masked_ce == cross_entropy mean over the valid tokens (ignore_index on the rest)
    pred = torch.randn(3, 5, 9)
    label = torch.randint(0, 9, (3, 5))
    lvl = torch.tensor([5, 0, 2])
    ignored = label.masked_fill(torch.arange(5)[None, :] >= lvl[:, None], -100)
    assert torch.allclose(masked_ce(pred, label, lvl), F.cross_entropy(pred.reshape(-1, 9), ignored.reshape(-1)),
                          atol=1e-14)

    # float64 gradcheck of an encoder block with a zero valid length and of a decoder block
    blk = EncoderBlock(8, 8, 8, 8, 8, 8, 12, 2, 0.0, True)
    x = torch.randn(3, 4, 8, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: blk(t, torch.tensor([4, 0, 2])), (x,))
    dblk = DecoderBlock(8, 8, 8, 8, 8, 8, 12, 2, 0.0, 0, True)
    e = torch.randn(3, 5, 8, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, u: dblk(t, [u, torch.tensor([5, 0, 2]), [None]])[0], (x, e))

    torch.set_default_dtype(prev)
    torch.set_rng_state(rng)


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


def perturb_layer_norms(model, seed):
    """Move every LayerNorm's weight / bias off ones / zeros (as run_module's perturb does for modules
    whose only weight / bias are the norm's), so swapped or ignored norm parameters would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.LayerNorm):
                for p in (mod.weight, mod.bias):
                    p.add_(0.3 * torch.randn(p.shape, generator=g))


def _block_config(n, ffn, heads, bias):
    return {"key_size": n, "query_size": n, "value_size": n, "num_hiddens": n, "norm_shape": n, "ffn_num_input": n,
            "ffn_num_hiddens": ffn, "num_heads": heads, "dropout": 0.0, "use_bias": bias}


def transformer_fixtures(out):
    R = torch.randn

    # --- PositionalEncoding, PositionWiseFFN, AddNorm ----------------------------------------------
    torch.manual_seed(1100)
    cfg = {"num_hiddens": 6, "dropout": 0.0, "max_len": 12}
    run_module(out, "transformer_posenc.h5", "PositionalEncoding", cfg,
               "X + P[0:T]: num_hiddens 6, max_len 12, input (2, 5, 6) (gradient of x = loss_weight)",
               PositionalEncoding(**cfg), call_x, {"x": R(2, 5, 6)}, seed=1100)
    torch.manual_seed(1101)
    cfg = {"ffn_num_input": 5, "ffn_num_hiddens": 7, "ffn_num_outputs": 4}
    run_module(out, "transformer_ffn.h5", "PositionWiseFFN", cfg,
               "dense2(relu(dense1(x))): Linear(5, 7), ReLU, Linear(7, 4), input (2, 3, 5) (some units inactive)",
               PositionWiseFFN(**cfg), call_x, {"x": R(2, 3, 5)}, seed=1101)
    torch.manual_seed(1102)
    cfg = {"normalized_shape": 8, "dropout": 0.0}
    run_module(out, "transformer_addnorm.h5", "AddNorm", cfg,
               "ln(dropout(y) + x): LayerNorm(8) (weight/bias perturbed), x and y (2, 3, 8)",
               AddNorm(**cfg), call_x_y, {"x": R(2, 3, 8) * 2 + 0.5, "y": R(2, 3, 8)}, seed=1102,
               perturb=("weight", "bias"))

    # --- blocks -----------------------------------------------------------------------------------
    torch.manual_seed(1110)
    cfg = _block_config(8, 10, 2, True)
    m = EncoderBlock(**cfg)
    perturb_layer_norms(m, 1110)
    run_module(out, "transformer_encoder_block.h5", "TransformerEncoderBlock", cfg,
               "encoder block, 2 heads, bias, num_hiddens 8, ffn 10; x (3, 5, 8), valid_lens [5, 2, 0] "
               "(row 2 fully padded); LayerNorms perturbed", m, call_x_valid_lens,
               {"x": R(3, 5, 8), "valid_lens": vl([5, 2, 0])}, seed=1110)
    torch.manual_seed(1111)
    cfg = {**_block_config(8, 10, 2, True), "i": 1}
    m = DecoderBlock(**cfg)
    perturb_layer_norms(m, 1111)
    run_module(out, "transformer_decoder_block.h5", "TransformerDecoderBlock", cfg,
               "decoder block i = 1, 2 heads, bias; x (3, 4, 8) with an empty cache (causal self-attention), "
               "enc_outputs (3, 6, 8), enc_valid_lens [6, 0, 3]; LayerNorms perturbed", m, call_x_enc,
               {"x": R(3, 4, 8), "enc_outputs": R(3, 6, 8), "enc_valid_lens": vl([6, 0, 3])}, seed=1111)

    # --- encoder, decoder ---------------------------------------------------------------------------
    cfg = _tiny_config(False)
    torch.manual_seed(1120)
    m = make_encoder(cfg)
    perturb_layer_norms(m, 1120)
    src = torch.tensor([[3, 5, 2, 6, 4, 2], [4, 4, 6, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.int64)
    run_module(out, "transformer_encoder.h5", "TransformerEncoder", cfg,
               "TransformerEncoder (src_vocab_size 7, 2 layers, 2 heads, no bias); idx (3, 6) padded with id 1, "
               "valid_lens [6, 3, 0]; LayerNorms perturbed", m, call_idx_valid_lens,
               {"idx": src, "valid_lens": vl([6, 3, 0])}, seed=1120)
    torch.manual_seed(1121)
    m = make_decoder(cfg)
    perturb_layer_norms(m, 1121)
    tgt = torch.tensor([[0, 4, 8, 2, 5], [0, 7, 3, 3, 1], [0, 6, 1, 1, 1]], dtype=torch.int64)
    run_module(out, "transformer_decoder.h5", "TransformerDecoder", cfg,
               "TransformerDecoder (tgt_vocab_size 9, 2 layers) from init_state: idx (3, 5), enc_outputs (3, 6, 8), "
               "enc_valid_lens [4, 0, 6]; causal self-attention; logits (3, 5, 9); LayerNorms perturbed",
               m, call_idx_enc, {"idx": tgt, "enc_outputs": R(3, 6, 8), "enc_valid_lens": vl([4, 0, 6])},
               seed=1121)

    # --- EncoderDecoder -----------------------------------------------------------------------------
    torch.manual_seed(1130)
    cfg_b = _tiny_config(True)
    m = make_encoder_decoder(cfg_b)
    perturb_layer_norms(m, 1130)
    gates = [[[1.0, 0.0], [0.5, 1.5]],  # encoder l = 0, 1
             [[2.0, 1.0], [1.0, 0.25]],  # decoder self-attention
             [[0.0, 0.75], [1.25, 1.0]]]  # cross-attention
    run_module(out, "transformer_encdec_gates.h5", "EncoderDecoder", cfg_b,
               "EncoderDecoder (src vocab 7, tgt vocab 9, 8 hiddens, 2 heads, 2 layers, ffn 10, bias): enc_X (2, 6) "
               "padded, dec_X (2, 5), enc_valid_lens [6, 2], gates (3, L, H) = [[[1, 0], [0.5, 1.5]], [[2, 1], "
               "[1, 0.25]], [[0, 0.75], [1.25, 1]]] (encoder, decoder self, cross); logits (2, 5, 9)",
               m, call_enc_dec_gates,
               {"enc_X": torch.tensor([[2, 5, 3, 6, 4, 2], [4, 6, 1, 1, 1, 1]], dtype=torch.int64),
                "dec_X": torch.tensor([[0, 4, 8, 3, 5], [0, 7, 2, 1, 1]], dtype=torch.int64),
                "enc_valid_lens": vl([6, 2])}, gates=gates, seed=1130)
    torch.manual_seed(1131)
    cfg_l1 = {**cfg, "num_heads": 4, "num_layers": 1}  # one layer keeps the file small
    m = make_encoder_decoder(cfg_l1)
    perturb_layer_norms(m, 1131)
    label = torch.tensor([[4, 8, 3, 5, 2], [7, 2, 1, 1, 1], [6, 1, 1, 1, 1], [5, 5, 3, 2, 1]], dtype=torch.int64)
    dec_X = torch.cat([torch.zeros(4, 1, dtype=torch.int64), label[:, :-1]], dim=1)  # bos 0, teacher forcing
    run_module(out, "transformer_encdec_loss.h5", "EncoderDecoder", cfg_l1,
               "EncoderDecoder (1 layer, 4 heads of size 2, no bias) loss: mean cross entropy over the valid target tokens (d2l's "
               "MaskedSoftmaxCELoss(...).sum() * T / label_valid_len.sum()); enc_X (4, 6) padded, enc_valid_lens "
               "[6, 2, 0, 4], dec_X = bos + label[:, :-1], label (4, 5), label_valid_len [5, 2, 0, 4] (10 tokens)",
               m, call_enc_dec_masked_ce,
               {"enc_X": torch.tensor([[3, 5, 2, 6, 4, 2], [4, 6, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1],
                                       [2, 2, 3, 5, 1, 1]], dtype=torch.int64),
                "dec_X": dec_X, "enc_valid_lens": vl([6, 2, 0, 4]), "label": label,
                "label_valid_len": vl([5, 2, 0, 4])}, seed=1131)
