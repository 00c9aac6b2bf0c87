#!/usr/bin/python3
"""Writes tests/fixtures/gguf: small GGUF files (llama.cpp's format, version 3) for tests/test_gguf.cpp.

- types.gguf: one tensor of every type headlab reads (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), each beside
  "expected.<name>", its float32 values dequantized here in numpy straight from ggml's block layouts
  (ggml-common.h), one rounding per product or difference as ggml-quants.c writes them;
- llama.gguf, qwen2.gguf, qwen3.gguf, olmo2.gguf, phi3.gguf, gemma.gguf, gemma2.gguf, gemma3.gguf, gpt2.gguf,
  gptneox.gguf, gptneox_sequential.gguf: the Hugging Face folder fixtures of tests/fixtures/*_folders
  (tools/fixtures_*_folders.py) as llama.cpp's convert_hf_to_gguf.py lays them out: its tensor names and metadata
  keys, a llama's q/k rows permuted to interleaved pairs, Gemma's norms with its 1 added, GPT-2's Conv1D weights transposed and its
  head written as a copy of the embedding, GPT-NeoX's per-head query_key_value regrouped into q | k | v blocks;
- llama_q8_0.gguf: llama.gguf with every matrix whose rows hold whole blocks of 32 (all but ffn_down, 56 wide)
  quantized to Q8_0 here as ggml's quantize_row_q8_0_ref does (d = max |x| / 127 stored as float16, q = x / d
  rounded half away from zero, in float32), the way a quantized file reaches a user;
- gpt2_tokenizer.gguf, llama_tokenizer.gguf: tiny random models whose metadata carry a tokenizer
  (tokenizer.ggml.model gpt2: byte-level tokens and merges; llama: SentencePiece pieces with scores);
  the small ones are copied to tests/fuzz/corpus/gguf, the seeds of tests/fuzz/fuzz_gguf.cpp.

The GGUF writer follows ggml's docs/gguf.md; the PyPI gguf package is not used. Run with Debian's python3 (numpy):
    /usr/bin/python3 tools/fixtures_gguf.py
"""
import json
import os
import struct

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "gguf")

# GGUF value types and ggml tensor types
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 13, 14, 30
SCALAR = {UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<?"}


# ---- the writer ----
def gguf_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, v):
    if vtype == STRING:
        return gguf_string(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_value(etype, x) for x in items)
    return struct.pack(SCALAR[vtype], v)


def write_gguf(name, kv, tensors, alignment=32):
    """kv: [(key, type, value)]; tensors: [(name, ggml type, ne innermost first, bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, vtype, v in kv:
        out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
    offset, data = 0, b""
    for tname, ttype, ne, raw in tensors:
        out += gguf_string(tname) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", ttype, offset)
        pad = (-len(raw)) % alignment
        data += raw + b"\0" * pad
        offset += len(raw) + pad
    out += b"\0" * ((-len(out)) % alignment)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(out + data)


def f32_tensor(name, a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return (name, F32, list(reversed(a.shape)), a.tobytes())


# ---- ggml's blocks: random quants, finite scales; the reference dequantization from the layouts ----
def half(rng, n, scale):
    return (rng.standard_normal(n) * scale).astype("<f2")


def blocks_q8_0(rng, nb):
    d, q = half(rng, nb, 0.01), rng.integers(-128, 128, (nb, 32)).astype("i1")
    raw = b"".join(d[i].tobytes() + q[i].tobytes() for i in range(nb))
    return raw, (q.astype("f4") * d.astype("f4")[:, None]).ravel()


def blocks_q4_0(rng, nb):
    d, qs = half(rng, nb, 0.05), rng.integers(0, 256, (nb, 16)).astype("u1")
    raw = b"".join(d[i].tobytes() + qs[i].tobytes() for i in range(nb))
    x = np.concatenate([(qs & 15).astype("i4") - 8, (qs >> 4).astype("i4") - 8], axis=1)  # elements 0..15, 16..31
    return raw, (x.astype("f4") * d.astype("f4")[:, None]).ravel()


def scale_min_k4(scales):
    """(nb, 12) packed bytes -> (nb, 8) scales and mins of 6 bits."""
    s = scales.astype("i4")
    sc = np.zeros((len(s), 8), "i4")
    mn = np.zeros((len(s), 8), "i4")
    sc[:, :4], mn[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype("f4"), mn.astype("f4")


def k_quant_values(d, dmin, scales, q):
    """q: (nb, 8, 32) quants of the 8 sub-blocks of 32 -> y = (d * scale) * q - (dmin * min), each step in float32."""
    sc, mn = scale_min_k4(scales)
    d1 = d.astype("f4")[:, None] * sc
    m1 = dmin.astype("f4")[:, None] * mn
    return (d1[:, :, None] * q.astype("f4") - m1[:, :, None]).ravel()


def blocks_q4_k(rng, nb):
    d, dmin = half(rng, nb, 0.01), half(rng, nb, 0.01)
    scales, qs = rng.integers(0, 256, (nb, 12)).astype("u1"), rng.integers(0, 256, (nb, 128)).astype("u1")
    raw = b"".join(d[i].tobytes() + dmin[i].tobytes() + scales[i].tobytes() + qs[i].tobytes() for i in range(nb))
    chunks = qs.reshape(nb, 4, 32)  # each 64 elements: 32 bytes, low nibbles then high nibbles
    q = np.stack([chunks & 15, chunks >> 4], axis=2).reshape(nb, 8, 32)
    return raw, k_quant_values(d, dmin, scales, q)


def blocks_q5_k(rng, nb):
    d, dmin = half(rng, nb, 0.01), half(rng, nb, 0.01)
    scales = rng.integers(0, 256, (nb, 12)).astype("u1")
    qh, qs = rng.integers(0, 256, (nb, 32)).astype("u1"), rng.integers(0, 256, (nb, 128)).astype("u1")
    raw = b"".join(d[i].tobytes() + dmin[i].tobytes() + scales[i].tobytes() + qh[i].tobytes() + qs[i].tobytes()
                   for i in range(nb))
    chunks = qs.reshape(nb, 4, 32)
    low = np.stack([chunks & 15, chunks >> 4], axis=2).reshape(nb, 8, 32).astype("i4")
    high = np.stack([(qh >> j) & 1 for j in range(8)], axis=1).astype("i4")  # sub-block j's fifth bit: bit j of qh[l]
    return raw, k_quant_values(d, dmin, scales, low + 16 * high)


def blocks_q6_k(rng, nb):
    ql, qh = rng.integers(0, 256, (nb, 128)).astype("u1"), rng.integers(0, 256, (nb, 64)).astype("u1")
    sc, d = rng.integers(-128, 128, (nb, 16)).astype("i1"), half(rng, nb, 0.001)
    raw = b"".join(ql[i].tobytes() + qh[i].tobytes() + sc[i].tobytes() + d[i].tobytes() for i in range(nb))
    y = np.zeros((nb, 256), "f4")
    for half_ in range(2):  # each 128 elements: 64 bytes of ql, 32 of qh, 8 scales
        L, H, S = ql[:, 64 * half_:64 * half_ + 64].astype("i4"), qh[:, 32 * half_:32 * half_ + 32].astype("i4"), \
            sc[:, 8 * half_:8 * half_ + 8].astype("f4")
        quants = [(L[:, :32] & 15) | ((H & 3) << 4), (L[:, 32:] & 15) | (((H >> 2) & 3) << 4),
                  (L[:, :32] >> 4) | (((H >> 4) & 3) << 4), (L[:, 32:] >> 4) | (((H >> 6) & 3) << 4)]
        for k, q in enumerate(quants):  # element 32k + l, its scale 2k + l / 16
            scale = np.repeat(S[:, 2 * k:2 * k + 2], 16, axis=1)
            y[:, 128 * half_ + 32 * k:128 * half_ + 32 * k + 32] = \
                (d.astype("f4")[:, None] * scale) * (q - 32).astype("f4")
    return raw, y.ravel()


def write_types():
    rng = np.random.default_rng(7)
    tensors, expected = [], []
    x = rng.standard_normal((3, 64)).astype("f4")
    tensors.append(f32_tensor("f32", x))
    expected.append(f32_tensor("expected.f32", x))
    h = x.astype("<f2")
    tensors.append(("f16", F16, [64, 3], h.tobytes()))
    expected.append(f32_tensor("expected.f16", h.astype("f4")))
    b = (x.view("<u4") >> 16).astype("<u2")  # bfloat16: the top half of each float32
    tensors.append(("bf16", BF16, [64, 3], b.tobytes()))
    expected.append(f32_tensor("expected.bf16", (b.astype("<u4") << 16).view("<f4")))
    for name, ttype, make, per_row, rows in [("q8_0", Q8_0, blocks_q8_0, 64, 3), ("q4_0", Q4_0, blocks_q4_0, 64, 3),
                                             ("q4_k", Q4_K, blocks_q4_k, 256, 2), ("q5_k", Q5_K, blocks_q5_k, 256, 2),
                                             ("q6_k", Q6_K, blocks_q6_k, 256, 2)]:
        block = 32 if per_row == 64 else 256
        raw, values = make(rng, per_row * rows // block)
        tensors.append((name, ttype, [per_row, rows], raw))
        expected.append(f32_tensor("expected." + name, values.reshape(rows, per_row)))
    write_gguf("types.gguf", [("general.architecture", STRING, "none"), ("general.alignment", UINT32, 64)],
               tensors + expected, alignment=64)


# ---- the Hugging Face folder fixtures as GGUF ----
def read_safetensors(folder):
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(folder, f), "rb").read()
        n = struct.unpack_from("<Q", raw)[0]
        header = json.loads(raw[8:8 + n])
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b = raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]
            if e["dtype"] == "F32":
                a = np.frombuffer(b, "<f4")
            elif e["dtype"] == "F16":
                a = np.frombuffer(b, "<f2").astype("f4")
            elif e["dtype"] == "BF16":
                a = (np.frombuffer(b, "<u2").astype("<u4") << 16).view("<f4")
            else:
                continue
            out[name] = a.reshape(e["shape"])
    return out


def permute_rows(w, n_head):
    """Hugging Face's rotary halves -> Meta's interleaved pairs, as llama.cpp's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def folder(family, name):
    path = os.path.join(FIXTURES, family, name)
    return json.load(open(os.path.join(path, "config.json"))), read_safetensors(path)


def base_kv(arch, ctx, emb, layers, ffn, heads):
    p = arch + "."
    return [("general.architecture", STRING, arch), ("general.name", STRING, arch + " fixture"),
            (p + "context_length", UINT32, ctx), (p + "embedding_length", UINT32, emb),
            (p + "block_count", UINT32, layers), (p + "feed_forward_length", UINT32, ffn),
            (p + "attention.head_count", UINT32, heads)]


def q8_0_tensor(name, a):
    """A float32 matrix (rows of whole blocks of 32) as ggml's reference quantizer writes Q8_0."""
    x = np.ascontiguousarray(a, dtype="<f4").reshape(-1, 32)
    d = (np.abs(x).max(axis=1) / np.float32(127)).astype("f4")
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype("f4")
    v = (x * inv[:, None]).astype("f4")
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype("i1")  # C's roundf: half away from zero
    raw = b"".join(d[i].astype("<f2").tobytes() + q[i].tobytes() for i in range(len(x)))
    return (name, Q8_0, list(reversed(a.shape)), raw)


def quantized_q8_0(tensors):
    """Every F32 matrix whose rows hold whole blocks of 32 as Q8_0; the rest as they are."""
    out = []
    for name, ttype, ne, raw in tensors:
        if ttype == F32 and len(ne) == 2 and ne[0] % 32 == 0:
            out.append(q8_0_tensor(name, np.frombuffer(raw, "<f4").reshape(ne[1], ne[0])))
        else:
            out.append((name, ttype, ne, raw))
    return out


GEMMA = ("gemma", "gemma2", "gemma3")


def write_llama(out, family_folder, arch, quantize=False):
    """A llama-layout folder as convert_hf_to_gguf.py writes it for arch: a llama's q/k rows permuted to pairs;
    Gemma's norms with its 1 added (every *norm.weight); Gemma 2's and 3's four norms a block (post_attention_norm,
    ffn_norm for pre_feedforward_layernorm, post_ffw_norm) and OLMo-2's two (no attn_norm, ffn_norm); Phi-3's qkv_proj
    and gate_up_proj as they are (attn_qkv, ffn_up); no rope.freq_base for Gemma 1 and 2 (the loader's 10000)."""
    cfg, w = folder("llama_folders", family_folder)
    H, KV, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = cfg.get("head_dim") or C // H
    kv = base_kv(arch, cfg["max_position_embeddings"], C, cfg["num_hidden_layers"], cfg["intermediate_size"], H)
    kv += [(arch + ".attention.head_count_kv", UINT32, KV),
           (arch + ".attention.layer_norm_rms_epsilon", FLOAT32, cfg["rms_norm_eps"])]
    if arch not in ("gemma", "gemma2"):
        kv.append((arch + ".rope.freq_base", FLOAT32, cfg["rope_theta"]))
    kv += [(arch + ".rope.dimension_count", UINT32, D), (arch + ".vocab_size", UINT32, cfg["vocab_size"])]
    if D != C // H:
        kv += [(arch + ".attention.key_length", UINT32, D), (arch + ".attention.value_length", UINT32, D)]
    if arch == "gemma2":
        kv += [("gemma2.attn_logit_softcapping", FLOAT32, cfg["attn_logit_softcapping"]),
               ("gemma2.final_logit_softcapping", FLOAT32, cfg["final_logit_softcapping"])]
    if arch in ("gemma2", "gemma3", "phi3"):
        kv.append((arch + ".attention.sliding_window", UINT32, cfg["sliding_window"]))
    if arch == "gemma3":  # the folder's pattern (a newer llama.cpp's key; its loader's default is 6)
        kv.append(("gemma3.attention.sliding_window_pattern", UINT32, cfg["sliding_window_pattern"]))
        if cfg.get("rope_scaling"):
            kv += [("gemma3.rope.scaling.type", STRING, cfg["rope_scaling"]["rope_type"]),
                   ("gemma3.rope.scaling.factor", FLOAT32, cfg["rope_scaling"]["factor"])]
    if arch == "phi3":
        kv.append(("phi3.rope.scaling.original_context_length", UINT32, cfg["original_max_position_embeddings"]))
    gemma, post = arch in GEMMA, arch in ("gemma2", "gemma3", "olmo2")

    def norm(name, a):
        return f32_tensor(name, a + 1 if gemma else a)

    t = [f32_tensor("token_embd.weight", w["model.embed_tokens.weight"])]
    for l in range(cfg["num_hidden_layers"]):
        hf, g = f"model.layers.{l}.", f"blk.{l}."
        if arch == "phi3":
            t.append(f32_tensor(g + "attn_qkv.weight", w[hf + "self_attn.qkv_proj.weight"]))
        for proj, ours, heads in [("q_proj", "attn_q", H), ("k_proj", "attn_k", KV), ("v_proj", "attn_v", 0)]:
            for kind in ("weight", "bias"):
                a = w.get(hf + "self_attn." + proj + "." + kind)
                if a is None:
                    continue
                if arch == "llama" and heads:  # llama.cpp rotates a llama's adjacent pairs
                    a = permute_rows(a, heads)
                t.append(f32_tensor(g + ours + "." + kind, a))
        for n, ours in [("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")]:  # Qwen3's, Gemma 3's, OLMo-2's
            if hf + "self_attn." + n + ".weight" in w:
                t.append(norm(g + ours + ".weight", w[hf + "self_attn." + n + ".weight"]))
        t.append(f32_tensor(g + "attn_output.weight", w[hf + "self_attn.o_proj.weight"]))
        if arch == "phi3":
            t.append(f32_tensor(g + "ffn_up.weight", w[hf + "mlp.gate_up_proj.weight"]))
        else:
            t.append(f32_tensor(g + "ffn_gate.weight", w[hf + "mlp.gate_proj.weight"]))
            t.append(f32_tensor(g + "ffn_up.weight", w[hf + "mlp.up_proj.weight"]))
        t.append(f32_tensor(g + "ffn_down.weight", w[hf + "mlp.down_proj.weight"]))
        if arch != "olmo2":
            t.append(norm(g + "attn_norm.weight", w[hf + "input_layernorm.weight"]))
        if post:
            t.append(norm(g + "post_attention_norm.weight", w[hf + "post_attention_layernorm.weight"]))
            t.append(norm(g + "post_ffw_norm.weight", w[hf + "post_feedforward_layernorm.weight"]))
            if arch != "olmo2":
                t.append(norm(g + "ffn_norm.weight", w[hf + "pre_feedforward_layernorm.weight"]))
        else:
            t.append(norm(g + "ffn_norm.weight", w[hf + "post_attention_layernorm.weight"]))
    t.append(norm("output_norm.weight", w["model.norm.weight"]))
    if not cfg.get("tie_word_embeddings", False):
        t.append(f32_tensor("output.weight", w["lm_head.weight"]))
    write_gguf(out, kv, quantized_q8_0(t) if quantize else t)


def write_gpt2(out, family_folder):
    cfg, w = folder("gpt2_folders", family_folder)
    p = "transformer." if "transformer.wte.weight" in w else ""
    C = cfg["n_embd"]
    kv = base_kv("gpt2", cfg["n_ctx"], C, cfg["n_layer"], 4 * C, cfg["n_head"])
    kv += [("gpt2.attention.layer_norm_epsilon", FLOAT32, cfg["layer_norm_epsilon"])]
    t = [f32_tensor("token_embd.weight", w[p + "wte.weight"]), f32_tensor("position_embd.weight", w[p + "wpe.weight"])]
    for l in range(cfg["n_layer"]):
        hf, g = f"{p}h.{l}.", f"blk.{l}."
        for src, dst, conv1d in [("ln_1", "attn_norm", False), ("attn.c_attn", "attn_qkv", True),
                                 ("attn.c_proj", "attn_output", True), ("ln_2", "ffn_norm", False),
                                 ("mlp.c_fc", "ffn_up", True), ("mlp.c_proj", "ffn_down", True)]:
            t.append(f32_tensor(g + dst + ".weight", w[hf + src + ".weight"].T if conv1d else w[hf + src + ".weight"]))
            t.append(f32_tensor(g + dst + ".bias", w[hf + src + ".bias"]))
    t += [f32_tensor("output_norm.weight", w[p + "ln_f.weight"]), f32_tensor("output_norm.bias", w[p + "ln_f.bias"])]
    # llama.cpp's converter writes GPT-2's head as a copy of wte (tied in the original model)
    t.append(f32_tensor("output.weight", w.get("lm_head.weight", w[p + "wte.weight"])))
    write_gguf(out, kv, t)


def write_neox(out, family_folder):
    cfg, w = folder("neox_folders", family_folder)
    H, C = cfg["num_attention_heads"], cfg["hidden_size"]
    D = C // H
    pct = cfg.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
    kv = base_kv("gptneox", cfg["max_position_embeddings"], C, cfg["num_hidden_layers"], cfg["intermediate_size"], H)
    kv += [("gptneox.rope.dimension_count", UINT32, int(pct * D)),
           ("gptneox.use_parallel_residual", BOOL, cfg.get("use_parallel_residual", True)),
           ("gptneox.rope.freq_base", FLOAT32, cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0))),
           ("gptneox.attention.layer_norm_epsilon", FLOAT32, cfg["layer_norm_eps"])]
    t = [f32_tensor("token_embd.weight", w["gpt_neox.embed_in.weight"])]
    for l in range(cfg["num_hidden_layers"]):
        hf, g = f"gpt_neox.layers.{l}.", f"blk.{l}."
        qkv = w[hf + "attention.query_key_value.weight"].reshape(H, 3, D, C)  # per head [q | k | v] -> blocks
        t.append(f32_tensor(g + "attn_qkv.weight", np.concatenate([qkv[:, i].reshape(-1, C) for i in range(3)])))
        b = w[hf + "attention.query_key_value.bias"].reshape(H, 3, D)
        t.append(f32_tensor(g + "attn_qkv.bias", np.concatenate([b[:, i].reshape(-1) for i in range(3)])))
        for src, dst in [("attention.dense", "attn_output"), ("input_layernorm", "attn_norm"),
                         ("post_attention_layernorm", "ffn_norm"), ("mlp.dense_h_to_4h", "ffn_up"),
                         ("mlp.dense_4h_to_h", "ffn_down")]:
            t += [f32_tensor(g + dst + ".weight", w[hf + src + ".weight"]),
                  f32_tensor(g + dst + ".bias", w[hf + src + ".bias"])]
    t += [f32_tensor("output_norm.weight", w["gpt_neox.final_layer_norm.weight"]),
          f32_tensor("output_norm.bias", w["gpt_neox.final_layer_norm.bias"])]
    if not cfg.get("tie_word_embeddings", False):
        t.append(f32_tensor("output.weight", w["embed_out.weight"]))
    write_gguf(out, kv, t)


# ---- models with a tokenizer in their metadata ----
def bytes_to_unicode():
    """GPT-2's byte -> printable character map (encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def random_llama(rng, vocab, C=8, F=12, layers=1, heads=2):
    t = [f32_tensor("token_embd.weight", rng.standard_normal((vocab, C)) * 0.5)]
    for l in range(layers):
        g = f"blk.{l}."
        for name, shape in [("attn_q", (C, C)), ("attn_k", (C, C)), ("attn_v", (C, C)), ("attn_output", (C, C)),
                            ("ffn_gate", (F, C)), ("ffn_up", (F, C)), ("ffn_down", (C, F))]:
            t.append(f32_tensor(g + name + ".weight", rng.standard_normal(shape) * 0.3))
        t += [f32_tensor(g + "attn_norm.weight", np.ones(C)), f32_tensor(g + "ffn_norm.weight", np.ones(C))]
    t.append(f32_tensor("output_norm.weight", np.ones(C)))
    kv = base_kv("llama", 16, C, layers, F, heads) + [("llama.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5)]
    return kv, t


def random_gpt2(rng, vocab, C=8, layers=1, heads=2, ctx=16):
    t = [f32_tensor("token_embd.weight", rng.standard_normal((vocab, C)) * 0.5),
         f32_tensor("position_embd.weight", rng.standard_normal((ctx, C)) * 0.1)]
    for l in range(layers):
        g = f"blk.{l}."
        for name, shape in [("attn_qkv", (3 * C, C)), ("attn_output", (C, C)), ("ffn_up", (4 * C, C)),
                            ("ffn_down", (C, 4 * C))]:
            t += [f32_tensor(g + name + ".weight", rng.standard_normal(shape) * 0.3),
                  f32_tensor(g + name + ".bias", np.zeros(shape[0]))]
        for name in ("attn_norm", "ffn_norm"):
            t += [f32_tensor(g + name + ".weight", np.ones(C)), f32_tensor(g + name + ".bias", np.zeros(C))]
    t += [f32_tensor("output_norm.weight", np.ones(C)), f32_tensor("output_norm.bias", np.zeros(C))]
    kv = base_kv("gpt2", ctx, C, layers, 4 * C, heads) + [("gpt2.attention.layer_norm_epsilon", FLOAT32, 1e-5)]
    return kv, t


def write_tokenizer_models():
    rng = np.random.default_rng(11)
    b2u = bytes_to_unicode()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a"]
    tokens = [b2u[b] for b in range(256)] + ["Ġt", "he", "Ġthe", "Ġa", "<|endoftext|>"]
    kv, t = random_gpt2(rng, len(tokens))
    kv += [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "gpt-2"),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
           ("tokenizer.ggml.token_type", ARRAY, (INT32, [1] * (len(tokens) - 1) + [3])),
           ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
           ("tokenizer.ggml.bos_token_id", UINT32, len(tokens) - 1),
           ("tokenizer.ggml.eos_token_id", UINT32, len(tokens) - 1)]
    write_gguf("gpt2_tokenizer.gguf", kv, t)

    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["▁", "▁t", "he", "▁the", "▁a"]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0]
    kv, t = random_llama(rng, len(pieces))
    kv += [("tokenizer.ggml.model", STRING, "llama"), ("tokenizer.ggml.tokens", ARRAY, (STRING, pieces)),
           ("tokenizer.ggml.scores", ARRAY, (FLOAT32, scores)),
           ("tokenizer.ggml.token_type", ARRAY, (INT32, [2, 3, 3] + [6] * 256 + [1] * 5)),
           ("tokenizer.ggml.bos_token_id", UINT32, 1), ("tokenizer.ggml.eos_token_id", UINT32, 2)]
    write_gguf("llama_tokenizer.gguf", kv, t)


def main():
    os.makedirs(OUT, exist_ok=True)
    write_types()
    write_llama("llama.gguf", "gqa_tied", "llama")
    write_llama("llama_q8_0.gguf", "gqa_tied", "llama", quantize=True)
    write_llama("qwen2.gguf", "qwen2_bias", "qwen2")
    write_llama("qwen3.gguf", "qwen3_untied_bf16", "qwen3")
    write_llama("olmo2.gguf", "olmo2_gqa", "olmo2")
    write_llama("phi3.gguf", "phi3_window_gqa", "phi3")
    write_llama("gemma.gguf", "gemma_mqa", "gemma")
    write_llama("gemma2.gguf", "gemma2_caps", "gemma2")
    write_llama("gemma3.gguf", "gemma3_linear", "gemma3")
    write_gpt2("gpt2.gguf", "lm_head_model")
    write_neox("gptneox.gguf", "parallel_quarter")
    write_neox("gptneox_sequential.gguf", "sequential_full")
    write_tokenizer_models()
    # The fuzz target's seeds (tests/fuzz/fuzz_gguf.cpp): the small files.
    seeds = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")
    os.makedirs(seeds, exist_ok=True)
    for f in ("types.gguf", "gpt2_tokenizer.gguf", "llama_tokenizer.gguf"):
        with open(os.path.join(OUT, f), "rb") as src, open(os.path.join(seeds, f), "wb") as dst:
            dst.write(src.read())
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))


if __name__ == "__main__":
    main()
