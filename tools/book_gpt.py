"""The GPT model of "Build a Large Language Model from Scratch" (Sebastian Raschka), chapter 4, in
PyTorch, as headlab's GPTModel mirrors it (ARCHITECTURE.md section 5).

Written from the book's chapter 3 and 4 code: CausalAttention, the fused MultiHeadAttention (one
W_query/W_key/W_value split into heads, out_proj), LayerNorm (scale/shift, biased variance, eps 1e-5),
GELU (tanh approximation), FeedForward, TransformerBlock and GPTModel, plus generate_text_simple.
One addition, used by headlab's "wrapper" attention variant: the config key "attention" picks
either the fused MultiHeadAttention ("fused", the book's chapter 4 choice) or the chapter 3
MultiHeadAttentionWrapper of per-head CausalAttention modules followed by an out_proj Linear
(emb_dim -> emb_dim), so both layouts of headlab checkpoints load with load_state_dict(strict=True).

Two more headlab extensions, both inert unless used, so the modules compute exactly the book's
function: every attention module keeps its attention weights (before dropout) in
`.attention_weights` after a forward pass ((B, T, T) for CausalAttention, (B, H, T, T) for the
multi-head modules), and the multi-head modules take an optional per-head gate vector,
`forward(x, gates=None)` with gates (H,): head h's context is multiplied by gates[h] before the heads
are concatenated (None = all ones, the book). In a GPTModel, set `block.gates` of a
TransformerBlock to such a tensor (requires_grad for the head-importance gradient). This is the one
definition of these modules in tools/: tools/make_fixtures.py (through fixtures_book.py) builds the
C++ tests' fixtures with it (as LayerNormBook, GELUBook and CausalMultiHeadAttention), and
export_torch.py / import_torch.py check checkpoints against it.

The causal masks are buffers, as in the book, so they are part of state_dict():
  fused:   trf_blocks.{i}.att.mask
  wrapper: trf_blocks.{i}.att.heads.{j}.mask

Usage:
    from book_gpt import GPTModel
    model = GPTModel({"vocab_size": 13, "context_length": 10, "emb_dim": 32, "n_heads": 2,
                      "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False, "attention": "fused"})
"""
import torch
import torch.nn as nn

BOOK_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")


class CausalAttention(nn.Module):
    """Chapter 3: one causal self-attention head."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        self.attention_weights = attn_weights  # (b, num_tokens, num_tokens)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values


class MultiHeadAttentionWrapper(nn.Module):
    """Chapter 3: num_heads CausalAttention heads, outputs concatenated. out_proj=True adds the
    Linear(num_heads * d_out, num_heads * d_out) that headlab's wrapper variant of the GPT uses;
    gates (num_heads,) scale each head's output before the concatenation."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, out_proj=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)])
        self.out_proj = nn.Linear(num_heads * d_out, num_heads * d_out) if out_proj else None

    def forward(self, x, gates=None):
        outs = []
        for h, head in enumerate(self.heads):
            o = head(x)
            outs.append(o if gates is None else gates[h] * o)
        self.attention_weights = torch.stack([head.attention_weights for head in self.heads], dim=1)
        out = torch.cat(outs, dim=-1)
        return self.out_proj(out) if self.out_proj is not None else out


class MultiHeadAttention(nn.Module):
    """Chapter 3: the fused multi-head attention with weight splits; gates (num_heads,) scale each
    head's context before the heads are merged and out_proj is applied."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x, gates=None):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)  # (b, num_tokens, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)
        # (b, num_tokens, d_out) -> (b, num_tokens, num_heads, head_dim) -> (b, num_heads, num_tokens, head_dim)
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        self.attention_weights = attn_weights  # (b, num_heads, num_tokens, num_tokens)
        attn_weights = self.dropout(attn_weights)
        context_vec = attn_weights @ values  # (b, num_heads, num_tokens, head_dim)
        if gates is not None:
            context_vec = context_vec * gates.reshape(1, -1, 1, 1)
        context_vec = context_vec.transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class LayerNorm(nn.Module):
    """Chapter 4: scale and shift, biased variance."""

    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class GELU(nn.Module):
    """Chapter 4: the tanh approximation."""

    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    """Chapter 4: layers.0 Linear(d, 4d), GELU, layers.2 Linear(4d, d)."""

    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),
            GELU(),
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),
        )

    def forward(self, x):
        return self.layers(x)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.get("attention", "fused") == "fused":
            self.att = MultiHeadAttention(
                d_in=cfg["emb_dim"], d_out=cfg["emb_dim"], context_length=cfg["context_length"],
                num_heads=cfg["n_heads"], dropout=cfg["drop_rate"], qkv_bias=cfg["qkv_bias"])
        elif cfg["attention"] == "wrapper":
            self.att = MultiHeadAttentionWrapper(
                cfg["emb_dim"], cfg["emb_dim"] // cfg["n_heads"], cfg["context_length"], cfg["drop_rate"],
                cfg["n_heads"], cfg["qkv_bias"], out_proj=True)
        else:
            raise ValueError(f"attention must be 'fused' or 'wrapper', got {cfg['attention']!r}")
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])
        self.gates = None  # headlab: a (n_heads,) tensor set from outside gates the heads (None = the book)

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        x = self.att(x, self.gates)
        x = self.drop_shortcut(x)
        x = x + shortcut
        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = self.drop_shortcut(x)
        return x + shortcut


class GPTModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        missing = [k for k in BOOK_KEYS if k not in cfg]
        if missing:
            raise ValueError(f"GPT config: missing keys {missing}")
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx):
        batch_size, seq_len = in_idx.shape
        tok_embeds = self.tok_emb(in_idx)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = tok_embeds + pos_embeds
        x = self.drop_emb(x)
        x = self.trf_blocks(x)
        x = self.final_norm(x)
        return self.out_head(x)


def generate_text_simple(model, idx, max_new_tokens, context_size):
    """Chapter 4: greedy decoding, cropping the context to the last context_size tokens."""
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        idx_next = torch.argmax(torch.softmax(logits, dim=-1), dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def expected_parameters(cfg):
    """{state_dict key: shape} of every parameter (buffers excluded) of GPTModel(cfg), computed
    without building the model: ARCHITECTURE.md section 5's names, in registration order."""
    V, T, C, H, L = (cfg["vocab_size"], cfg["context_length"], cfg["emb_dim"], cfg["n_heads"], cfg["n_layers"])
    qkv_bias, attention = cfg["qkv_bias"], cfg.get("attention", "fused")
    if C % H:
        raise ValueError(f"GPT config: emb_dim {C} must be divisible by n_heads {H}")
    out = {"tok_emb.weight": (V, C), "pos_emb.weight": (T, C)}
    for i in range(L):
        b = f"trf_blocks.{i}."
        if attention == "fused":
            for w in ("W_query", "W_key", "W_value"):
                out[f"{b}att.{w}.weight"] = (C, C)
                if qkv_bias:
                    out[f"{b}att.{w}.bias"] = (C,)
        else:
            for j in range(H):
                for w in ("W_query", "W_key", "W_value"):
                    out[f"{b}att.heads.{j}.{w}.weight"] = (C // H, C)
                    if qkv_bias:
                        out[f"{b}att.heads.{j}.{w}.bias"] = (C // H,)
        out[f"{b}att.out_proj.weight"] = (C, C)
        out[f"{b}att.out_proj.bias"] = (C,)
        out[f"{b}ff.layers.0.weight"] = (4 * C, C)
        out[f"{b}ff.layers.0.bias"] = (4 * C,)
        out[f"{b}ff.layers.2.weight"] = (C, 4 * C)
        out[f"{b}ff.layers.2.bias"] = (C,)
        for n in ("norm1", "norm2"):
            out[f"{b}{n}.scale"] = (C,)
            out[f"{b}{n}.shift"] = (C,)
    out["final_norm.scale"] = (C,)
    out["final_norm.shift"] = (C,)
    out["out_head.weight"] = (V, C)
    return out


def mask_buffers(cfg):
    """The causal-mask buffers GPTModel(cfg) registers: {state_dict key: tensor}."""
    T = cfg["context_length"]
    mask = torch.triu(torch.ones(T, T), diagonal=1)
    names = []
    for i in range(cfg["n_layers"]):
        if cfg.get("attention", "fused") == "fused":
            names.append(f"trf_blocks.{i}.att.mask")
        else:
            names += [f"trf_blocks.{i}.att.heads.{j}.mask" for j in range(cfg["n_heads"])]
    return {n: mask.clone() for n in names}
