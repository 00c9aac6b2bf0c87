"""PyTorch hook peer of bench/gpt2_circuit: edge attribution patching and path patching on a
GPT-2-small-shaped model (random weights: the cost does not depend on them), written the way the
TransformerLens-based research code does them, with the fairest choices for the peer: logits only at
the last position, no full activation cache.

The model is TransformerLens's layout with per-head results (hook_result) and, for edge attribution,
split q/k/v inputs (use_split_qkv_input: the residual stream repeated per head, so that each head's
query, key and value input has its own hook and gradient; path patching into the logits runs without).
  --phase eap: Syed et al.'s edge attribution patching: a corrupted pass writes -outputs of every
    upstream node into a (B, T, nodes, C) tensor, a clean pass adds the clean outputs, and backward hooks
    on every receiver's input add grad . difference to the scores of its edges (one clean forward, one
    corrupted forward, one backward).
  --phase path: Wang et al.'s path patching of every head as sender to the logits: the clean and
    corrupted runs cached (head results and MLP outputs), then one forward per sender with every head and
    MLP frozen to its clean output except the sender, which gets its corrupted one. --senders-per-layer K
    times K senders of each layer and projects the sweep as 144 x the median pass (plus the two caching
    passes).
Prints the phase's seconds (median of --repeats) and the peak resident memory.

  /usr/bin/python3 bench/torch_circuit_peer.py --phase eap --threads 2
"""
import argparse, resource, statistics, time
import torch, torch.nn as nn, torch.nn.functional as F

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--phase", choices=["eap", "path"], required=True)
ap.add_argument("--rows", type=int, default=64)
ap.add_argument("--tokens", type=int, default=15)
ap.add_argument("--senders-per-layer", type=int, default=1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
V, CTX, C, H, L = 50257, 1024, 768, 12, 12
D = C // H


class HookedGPT(nn.Module):
    def __init__(s, split_qkv):
        super().__init__()
        s.split_qkv = split_qkv  # TransformerLens's use_split_qkv_input: what edge attribution needs
        s.tok, s.pos = nn.Embedding(V, C), nn.Embedding(CTX, C)
        p = lambda *shape: nn.Parameter(torch.randn(*shape) * 0.02)
        s.ln1 = nn.ModuleList(nn.LayerNorm(C) for _ in range(L))
        s.ln2 = nn.ModuleList(nn.LayerNorm(C) for _ in range(L))
        s.W_Q, s.W_K, s.W_V = (nn.ParameterList(p(H, C, D) for _ in range(L)) for _ in range(3))
        s.b_Q, s.b_K, s.b_V = (nn.ParameterList(p(H, D) for _ in range(L)) for _ in range(3))
        s.W_O, s.b_O = nn.ParameterList(p(H, D, C) for _ in range(L)), nn.ParameterList(p(C) for _ in range(L))
        s.fc1 = nn.ModuleList(nn.Linear(C, 4 * C) for _ in range(L))
        s.fc2 = nn.ModuleList(nn.Linear(4 * C, C) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)

    def forward(s, idx, direction, hooks={}):
        """idx (B, T); direction (B, C): W_U[answer] - W_U[wrong] -> the logit difference per row (B)."""
        hp = lambda name, x: hooks[name](x) if name in hooks else x
        B, T = idx.shape
        x = hp("embed", s.tok(idx) + s.pos(torch.arange(T)))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for l in range(L):
            qkv = []
            shared = None if s.split_qkv else s.ln1[l](x)  # (B, T, C)
            for kind, W, b in (("q", s.W_Q, s.b_Q), ("k", s.W_K, s.b_K), ("v", s.W_V, s.b_V)):
                if shared is None:
                    inp = hp(f"{l}.{kind}_input", x.unsqueeze(2).expand(B, T, H, C))  # (B, T, H, C)
                    qkv.append(torch.einsum("btnc,ncd->bntd", s.ln1[l](inp), W[l]) + b[l][:, None])
                else:
                    qkv.append(torch.einsum("btc,ncd->bntd", shared, W[l]) + b[l][:, None])
            q, k, v = qkv
            att = (q @ k.transpose(-2, -1)) * D**-0.5
            z = att.masked_fill(mask, float("-inf")).softmax(-1) @ v  # (B, H, T, D)
            result = hp(f"{l}.result", torch.einsum("bntd,ndc->btnc", z, s.W_O[l]))  # (B, T, H, C)
            x = x + result.sum(2) + s.b_O[l]
            mlp_in = hp(f"{l}.mlp_input", x)
            x = x + hp(f"{l}.mlp_out", s.fc2[l](F.gelu(s.fc1[l](s.ln2[l](mlp_in)), approximate="tanh")))
        last = hp("logits_input", x)[:, -1]  # (B, C): only the last position is scored
        return (s.ln_f(last) * direction).sum(-1)


model = HookedGPT(split_qkv=args.phase == "eap").eval()
B, T = args.rows, args.tokens
clean, corrupt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
direction = model.tok.weight[torch.randint(0, V, (B,))] - model.tok.weight[torch.randint(0, V, (B,))]
direction = direction.detach()
N = 1 + L * (H + 1)  # upstream nodes: embed, then per layer 12 heads and the MLP


def first_node(l):
    return 1 + l * (H + 1)


def eap():
    # sender-major, so that every receiver's scores are one GEMM against a prefix of it
    diff = torch.zeros(N, B * T * C)
    scores = torch.zeros(N, L * (3 * H + 1) + 1)  # [sender, receiver]

    def by_node(x, per_head):  # (B, T, H, C) or (B, T, C) -> (nodes, B*T*C)
        return (x.permute(2, 0, 1, 3) if per_head else x.unsqueeze(0)).reshape(-1, B * T * C)

    def writer(sign, at, per_head):
        def hook(x):
            d = by_node(x.detach(), per_head)
            diff[at : at + d.shape[0]] += sign * d
            return x
        return hook

    def hooks(sign):
        h = {"embed": writer(sign, 0, False)}
        for l in range(L):
            h[f"{l}.result"] = writer(sign, first_node(l), True)
            h[f"{l}.mlp_out"] = writer(sign, first_node(l) + H, False)
        return h

    with torch.no_grad():
        model(corrupt, direction, hooks(-1.0))
    h = hooks(1.0)

    def reader(receiver, upstream, per_head):
        def hook(x):
            def grad_hook(g):  # g (B, T, H, C) or (B, T, C)
                gg = by_node(g, per_head)
                scores[:upstream, receiver : receiver + gg.shape[0]] -= diff[:upstream] @ gg.T
            x.register_hook(grad_hook)
            return x
        return hook

    r = 0
    for l in range(L):
        for kind in "qkv":
            h[f"{l}.{kind}_input"] = reader(r, first_node(l), True)
            r += H
        h[f"{l}.mlp_input"] = reader(r, first_node(l) + H, False)
        r += 1
    h["logits_input"] = reader(r, N, False)
    model(clean, direction, h).mean().backward()
    return scores


def path_patching():
    clean_cache, corrupt_cache = {}, {}

    def saver(cache, name):
        def hook(x):
            cache[name] = x.detach()
            return x
        return hook

    t0 = time.perf_counter()
    with torch.no_grad():
        for cache, idx in ((clean_cache, clean), (corrupt_cache, corrupt)):
            model(idx, direction, {f"{l}.{k}": saver(cache, f"{l}.{k}") for l in range(L) for k in ("result", "mlp_out")})
    caching, passes = time.perf_counter() - t0, []
    for l in range(L):
        for h in range(args.senders_per_layer):
            def freeze(name, sender_head=None):
                def hook(x):
                    out = clean_cache[name].clone()
                    if sender_head is not None:
                        out[:, :, sender_head] = corrupt_cache[name][:, :, sender_head]
                    return out
                return hook
            hooks = {f"{m}.{k}": freeze(f"{m}.{k}") for m in range(L) for k in ("result", "mlp_out")}
            hooks[f"{l}.result"] = freeze(f"{l}.result", h)
            t0 = time.perf_counter()
            with torch.no_grad():
                model(clean, direction, hooks)
            passes.append(time.perf_counter() - t0)
    return caching, statistics.median(passes)


times = []
for _ in range(args.repeats):
    t0 = time.perf_counter()
    if args.phase == "eap":
        eap()
        times.append(time.perf_counter() - t0)
    else:  # the caching passes as measured, the 144 sender passes projected from the sample's median
        caching, per_pass = path_patching()
        times.append(caching + per_pass * L * H)
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"torch threads={args.threads} phase={args.phase} rows={B} tokens={T} "
      f"seconds_median={statistics.median(times):.3f} peak_mb={peak_mb:.0f}")
