"""The PyTorch peer of bench/sdpa_step.cpp: torch.nn.functional.scaled_dot_product_attention, causal,
float32 (TF32 off, torch's default), on (B, H, T, D) views of (B, T, H, D) inputs; forward under no_grad
and forward + backward from a fixed upstream gradient, each synchronised, medians of --repeats after 3
warm-ups. torch picks its own kernel for float32 (the memory-efficient one on a GPU; FlashAttention
takes half precision only); peak is torch.cuda.max_memory_allocated above the inputs.

Run with Debian's python3-torch (or the GPU machine's):  python3 bench/torch_sdpa_peer.py --device cuda
"""
import argparse
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--device", default="cpu")
ap.add_argument("--B", type=int, default=8); ap.add_argument("--H", type=int, default=12)
ap.add_argument("--T", type=int, default=1024); ap.add_argument("--D", type=int, default=64)
ap.add_argument("--repeats", type=int, default=20); ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads)
dev = torch.device(a.device)
cuda = dev.type == "cuda"
sync = torch.cuda.synchronize if cuda else (lambda: None)
g = torch.Generator().manual_seed(1)
q, k, v = (torch.randn(a.B, a.T, a.H, a.D, generator=g).to(dev).transpose(1, 2).detach().requires_grad_()
           for _ in range(3))
dout = torch.randn(a.B, a.H, a.T, a.D, generator=g).to(dev)


def forward():
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    sync()


def step():
    q.grad = k.grad = v.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    sync()


def median_ms(f):
    for _ in range(3):
        f()
    t = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        f()
        t.append((time.perf_counter() - t0) * 1e3)
    return sorted(t)[len(t) // 2]


fwd = median_ms(forward)
if cuda:
    live = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
both = median_ms(step)
peak = (torch.cuda.max_memory_allocated() - live) / 2**20 if cuda else float("nan")
unit = 2.0 * a.B * a.H * a.T * a.T * a.D / 2 / 1e9
print(f"torch {torch.__version__} sdpa device={a.device} B={a.B} H={a.H} T={a.T} D={a.D} causal float32: "
      f"forward {fwd:.3f} ms ({2 * unit / fwd * 1e3:.0f} GFLOP/s), forward+backward {both:.3f} ms "
      f"({7 * unit / both * 1e3:.0f} GFLOP/s), peak {peak:.1f} MiB")
if cuda:  # which of torch's attention kernels ran (float32: the memory-efficient one, or the math path's GEMMs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
    names = sorted({e.key for e in prof.key_averages() if "gemm" not in e.key.lower() or "fmha" in e.key.lower()})
    print("torch sdpa kernels:", "; ".join(n[:90] for n in names[:8]))
