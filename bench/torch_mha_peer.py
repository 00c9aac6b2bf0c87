"""The PyTorch eager peer of `headlab compare`: the same two forms of causal multi-head attention,
timed the same way, one JSON line per config on stdout.

wrapper = H book CausalAttention heads of width d_out/H, concatenated, then out_proj (d_out -> d_out);
fused   = the book's MultiHeadAttention (W_query, W_key, W_value, one view per head, out_proj).
With kv_heads (the config's optional 7th field, a divisor of heads; default heads) both forms are
grouped-query (multi-query at 1): the wrapper's heads of a group share one W_key/W_value module, and
the fused form's W_key/W_value have kv_heads * d_out/H rows, repeated to every query head with
repeat_interleave (transformers' repeat_kv).
headlab compare defines its forms so (analysis/compare.h); ../shared/peers/torch_mha_cpu.py leaves
out_proj out of its wrapper. Timing as in headlab: forwards first, then forward+backwards; each
`--warmup` untimed runs, then `--repeats` runs with the two forms in turn within each repeat;
medians and p25/p75 in milliseconds. forward runs
under no_grad; fwd+bwd is y = m(x), y.sum().backward() with gradients set to None before each.

Run with Debian's python3-torch:  python3 bench/torch_mha_peer.py --config small,32,64,128,128,4
"""
import argparse
import json
import time

import torch
import torch.nn as nn


class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, ctx, shared=None):  # shared: the group's first head (its W_key, W_value)
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = shared.W_key if shared else nn.Linear(d_in, d_out, bias=False)
        self.W_value = shared.W_value if shared else nn.Linear(d_in, d_out, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx), diagonal=1).bool())

    def forward(self, x):  # x: (B, T, d_in) -> (B, T, d_out)
        T = x.shape[1]
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        s = (q @ k.transpose(1, 2)).masked_fill(self.mask[:T, :T], -torch.inf)
        return torch.softmax(s / k.shape[-1] ** 0.5, dim=-1) @ v


class Wrapper(nn.Module):
    def __init__(self, d_in, d_out, ctx, heads, kv_heads):
        super().__init__()
        group = heads // kv_heads
        self.heads = nn.ModuleList()
        for h in range(heads):  # a group's later heads share its first head's W_key and W_value
            first = None if h % group == 0 else self.heads[h - h % group]
            self.heads.append(CausalAttention(d_in, d_out // heads, ctx, first))
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x):
        return self.out_proj(torch.cat([h(x) for h in self.heads], dim=-1))


class Fused(nn.Module):
    def __init__(self, d_in, d_out, ctx, heads, kv_heads):
        super().__init__()
        self.h, self.kv, self.hd, self.d_out = heads, kv_heads, d_out // heads, d_out
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, kv_heads * self.hd, bias=False)
        self.W_value = nn.Linear(d_in, kv_heads * self.hd, bias=False)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx), diagonal=1).bool())

    def forward(self, x):  # (B, T, d_in) -> (B, T, d_out); heads as (B, H, T, hd)
        B, T, _ = x.shape
        split = lambda t, n: t.view(B, T, n, self.hd).transpose(1, 2)
        repeat = lambda t: t.repeat_interleave(self.h // self.kv, dim=1)  # (B, kv, T, hd) -> (B, H, T, hd)
        q = split(self.W_query(x), self.h)
        k, v = repeat(split(self.W_key(x), self.kv)), repeat(split(self.W_value(x), self.kv))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], -torch.inf)
        w = torch.softmax(s / self.hd ** 0.5, dim=-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, T, self.d_out))


def quantiles(xs):
    xs = sorted(xs)
    at = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
    return {"median": at(0.5), "p25": at(0.25), "p75": at(0.75)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", required=True,
                    help="name,B,T,d_in,d_out,heads[,kv_heads] (repeatable)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    for spec in a.config:
        name, *dims = spec.split(",")
        B, T, d_in, d_out, H, *kv = map(int, dims)
        KV = kv[0] if kv else H
        torch.manual_seed(a.seed)
        forms = {"wrapper": Wrapper(d_in, d_out, T, H, KV), "fused": Fused(d_in, d_out, T, H, KV)}
        x = torch.randn(B, T, d_in, requires_grad=True)

        def forward(m):
            with torch.no_grad():
                m(x)

        def forward_backward(m):
            m.zero_grad(set_to_none=True)
            x.grad = None
            m(x).sum().backward()

        times = {f: {} for f in forms}
        for kind, run in (("forward", forward), ("forward_backward", forward_backward)):
            for f in forms:
                times[f][kind] = []
            for rep in range(a.warmup + a.repeats):
                for f, m in forms.items():
                    t0 = time.perf_counter()
                    run(m)
                    if rep >= a.warmup:
                        times[f][kind].append((time.perf_counter() - t0) * 1e3)
        row = {"name": name, "B": B, "T": T, "d_in": d_in, "d_out": d_out, "heads": H, "kv_heads": KV,
               "torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": a.repeats}
        for f in forms:
            row[f] = {kind: quantiles(ts) for kind, ts in times[f].items()}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
