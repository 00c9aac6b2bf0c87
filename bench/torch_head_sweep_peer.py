"""PyTorch eager peer of bench/bench_heads and bench/gpt2_heads: ablate every head of a GPT one at a
time, the way TransformerLens's run_with_hooks does it (a hook on each block's head contexts, one
forward pass per head and ablation kind). Same models and data sizes as those (random weights: the
cost does not depend on them): the unablated model, then zero (and for demo/chars mean) ablation of
every head, each pass scoring cross entropy and argmax over every batch. Prints the median time of the
whole sweep and the peak resident memory.

gpt2 (GPT-2 small: qkv bias, tied head; zero ablation over 8 x 128 tokens) takes one full forward per
pass, so a sweep is 145 passes of one cost: --heads-per-layer K times K heads of each layer (the passes
of the sweep it samples) and projects the sweep as (1 + layers x heads) x the median pass.

  /usr/bin/python3 bench/torch_head_sweep_peer.py --config demo --threads 2
  /usr/bin/python3 bench/torch_head_sweep_peer.py --config gpt2 --heads-per-layer 1 --threads 2
"""
import argparse, resource, statistics, time
import torch, torch.nn as nn

CONFIGS = {  # V, T, emb, heads, layers, batches, rows: as bench_heads and gpt2_heads
    "demo": (13, 18, 64, 4, 2, 8, 64),
    "chars": (61, 64, 128, 8, 4, 4, 32),
    "gpt2": (50257, 128, 768, 12, 12, 1, 8),
}
ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--config", choices=CONFIGS, default="demo")
ap.add_argument("--heads-per-layer", type=int, default=0, help="time only this many heads per layer (0: all)")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)


GPT2 = args.config == "gpt2"


class Block(nn.Module):  # the book's pre-LN block with the fused MultiHeadAttention (GPT-2: qkv bias)
    def __init__(s, d, h, T):
        super().__init__()
        s.h, s.ln1, s.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
        s.W_query, s.W_key, s.W_value = (nn.Linear(d, d, bias=GPT2) for _ in range(3))
        s.out_proj, s.fc1, s.fc2 = nn.Linear(d, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        s.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))
        s.hook_z = None  # ctx (B, H, T, D) -> ctx: TransformerLens's hook_z

    def forward(s, x):
        B, T, C = x.shape
        a = s.ln1(x)
        q, k, v = (w(a).view(B, T, s.h, -1).transpose(1, 2) for w in (s.W_query, s.W_key, s.W_value))
        att = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        z = att.masked_fill(s.mask[:T, :T], float("-inf")).softmax(-1) @ v
        if s.hook_z is not None:
            z = s.hook_z(z)
        x = x + s.out_proj(z.transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(nn.functional.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, T, d, h, L):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, d), nn.Embedding(T, d)
        s.blocks = nn.ModuleList(Block(d, h, T) for _ in range(L))
        s.ln_f, s.head = nn.LayerNorm(d), nn.Linear(d, V, bias=False)
        if GPT2:
            s.head.weight = s.tok.weight  # tied, as GPT2LMHeadModel

    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        return s.head(s.ln_f(x))


V, T, d, H, L, n_batches, B = CONFIGS[args.config]
model = GPT(V, T, d, H, L).eval()
data = [(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))) for _ in range(n_batches)]


def score():  # one evaluation: summed cross entropy and argmax accuracy over the batches
    loss, correct = 0.0, 0
    for idx, tgt in data:
        logits = model(idx)
        loss += nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="sum").item()
        correct += (logits.argmax(-1) == tgt).sum().item()
    return loss, correct


def mean_contexts():  # every head's mean context, as headlab's mean ablation uses (not timed: bench_heads
    stores = [[] for _ in model.blocks]  # takes them as given too)
    for blk, store in zip(model.blocks, stores):
        blk.hook_z = lambda z, store=store: store.append(z.mean((0, 2))) or z
    with torch.no_grad():
        score()
    for blk in model.blocks:
        blk.hook_z = None
    return [torch.stack(store).mean(0) for store in stores]  # per layer (H, D)


KINDS = ("zero",) if GPT2 else ("zero", "mean")
means = mean_contexts() if "mean" in KINDS else None
HEADS = range(args.heads_per_layer) if args.heads_per_layer else range(H)
passes = []  # seconds of each pass of the last sweep


def sweep():
    passes.clear()
    with torch.no_grad():
        t0 = time.perf_counter()
        results = [score()]
        passes.append(time.perf_counter() - t0)
        for l, blk in enumerate(model.blocks):
            for h in HEADS:
                for kind in KINDS:
                    def hook(z, h=h, kind=kind, m=means[l][h] if means else None):
                        z = z.clone()
                        z[:, h] = 0 if kind == "zero" else m
                        return z
                    blk.hook_z = hook
                    t0 = time.perf_counter()
                    results.append(score())
                    passes.append(time.perf_counter() - t0)
            blk.hook_z = None
    return results


if GPT2:  # one sampled sweep: every pass is a full forward of the same cost
    score()  # warm-up
    sweep()
    pass_s = statistics.median(passes)
    print(f"torch {torch.__version__} {args.config} threads={args.threads} heads={H * L} "
          f"pass_ms_median={1e3 * pass_s:.1f} ({len(passes)} passes timed) "
          f"sweep_ms_median={1e3 * pass_s * (1 + L * H * len(KINDS)):.1f} (projected) "
          f"peak_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
else:
    sweep()  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        sweep()
        times.append(time.perf_counter() - t0)
    print(f"torch {torch.__version__} {args.config} threads={args.threads} heads={H * L} "
          f"sweep_ms_median={1e3 * statistics.median(times):.1f} "
          f"peak_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
