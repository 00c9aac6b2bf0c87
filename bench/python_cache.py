"""run_with_cache of every head's attention pattern at GPT-2-small shape (12 x 12 heads, emb 768, vocabulary
50257, random weights), headlab's Python module against a PyTorch model with TransformerLens-style hook
points doing the same; and the call overhead of model(tokens) on a tiny model against the C++ call it makes.
Each side runs in its own process so that its peak resident memory is its own (bench/python_cache.sh runs
them in turn, alternately).

    python3 bench/python_cache.py make-folder DIR                  # a random GPT-2-small folder
    python3 bench/python_cache.py headlab DIR [--rows 8 --tokens 128 --repeats 3]
    python3 bench/python_cache.py torch DIR [...]
    python3 bench/python_cache.py overhead CHECKPOINT [--repeats 2000]
"""
import argparse
import json
import os
import resource
import shutil
import struct
import sys
import time

import numpy as np

C, L, H, V, CTX = 768, 12, 12, 50257, 1024


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_folder(out, vocab_dir):
    """GPT2Model's names and Conv1D layouts (in, out), float32, written as safetensors by hand."""
    rng = np.random.default_rng(0)
    t = {"wte.weight": (V, C), "wpe.weight": (CTX, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                  p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                  p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                  p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                  p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(t):
        n = int(np.prod(t[name])) * 4
        header[name] = {"dtype": "F32", "shape": list(t[name]), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(t):
            w = np.ones(t[name], np.float32) if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") \
                or name == "ln_f.weight" else (rng.standard_normal(t[name], dtype=np.float32) * 0.02)
            f.write(w.astype("<f4").tobytes())
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": H, "n_embd": C,
              "n_positions": CTX, "n_ctx": CTX, "vocab_size": V, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(vocab_dir, name), os.path.join(out, name))


def tokens_for(rows, T):
    return (np.arange(rows * T, dtype=np.int64).reshape(rows, T) * 7919) % V


def run_headlab(folder, rows, T, repeats):
    import headlab
    model = headlab.load(folder)
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(L)]
    tokens = tokens_for(rows, T)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, cache = model.run_with_cache(tokens, names=names)
        times.append(time.perf_counter() - start)
        assert len(cache) == L and cache[names[0]].shape == (rows, H, T, T)
        del cache
    return times


def run_torch(rows, T, repeats, threads):
    """GPT-2 small in PyTorch with a hook point on every attention pattern, TransformerLens's way: the
    pattern is an explicit softmax passed through an identity module whose forward hook stores it."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
            self.qkv, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
            self.fc, self.out = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
            self.hook_pattern = torch.nn.Identity()

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
            scores = q @ k.transpose(-1, -2) / (C // H) ** 0.5
            mask = torch.ones(T_, T_, dtype=torch.bool).triu(1)
            pattern = self.hook_pattern(scores.masked_fill(mask, float("-inf")).softmax(-1))
            z = (pattern @ v).transpose(1, 2).reshape(B, T_, C)
            x = x + self.proj(z)
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(CTX, C)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
            self.ln_f = torch.nn.LayerNorm(C)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            return self.ln_f(x) @ self.wte.weight.T

    model = GPT().eval()
    tokens = torch.from_numpy(tokens_for(rows, T))
    times = []
    for _ in range(repeats):
        cache = {}
        handles = [b.hook_pattern.register_forward_hook(
            lambda m, i, o, l=l: cache.__setitem__(f"blocks.{l}.attn.hook_pattern", o.detach()))
            for l, b in enumerate(model.blocks)]
        start = time.perf_counter()
        with torch.no_grad():
            model(tokens)
        times.append(time.perf_counter() - start)
        for h in handles:
            h.remove()
        assert len(cache) == L
        del cache
    return times


def overhead(checkpoint, repeats):
    import headlab
    model = headlab.load(checkpoint)
    tokens = model.to_tokens("the cat")
    model(tokens)
    per_call_cpp = model._time_forward(tokens, repeats)  # the C++ call alone, timed in C++
    start = time.perf_counter()
    for _ in range(repeats):
        model(tokens)
    per_call_py = (time.perf_counter() - start) / repeats
    return per_call_py, per_call_cpp


def main():
    p = argparse.ArgumentParser()
    p.add_argument("side", choices=["make-folder", "headlab", "torch", "overhead"])
    p.add_argument("path")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-dir", default=os.path.expanduser("~/.cache/headlab/gpt2"))
    a = p.parse_args()
    if a.side == "make-folder":
        make_folder(a.path, a.vocab_dir)
        return
    if a.side == "overhead":
        py, cpp = overhead(a.path, a.repeats)
        print(f"overhead: model(tokens) {py * 1e6:.1f} us per call from Python, {cpp * 1e6:.1f} us in C++: "
              f"{(py - cpp) * 1e6:.1f} us more")
        return
    times = run_headlab(a.path, a.rows, a.tokens, a.repeats) if a.side == "headlab" \
        else run_torch(a.rows, a.tokens, a.repeats, a.threads)
    print(f"{a.side}: run_with_cache of {L * H} head patterns, {a.rows} x {a.tokens} tokens: "
          f"median {sorted(times)[len(times) // 2]:.3f} s of {a.repeats}, peak resident {peak_mb():.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
