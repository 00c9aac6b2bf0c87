"""Optimizer trajectories (SGD, Adam, AdamW on a small MLP, 10 steps each) and the learning-rate
schedules (schedules.json), for tools/make_fixtures.py, plus the optimizer fixtures' verification.
"""
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from fixtures_common import INDEX, assert_close, read_group, write_h5
from headlab_hdf5 import attr_str

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


def verify_optim(f, fname):
    """Re-run the optimizer from the file's params_init and hyperparameters; compare every step."""
    hyper = json.loads(f.attrs["hyperparameters"])
    torch.manual_seed(0)  # any init: the file's params_init replace it
    model = optim_model()
    model.load_state_dict(read_group(f, "params_init"))
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
            assert_close(p.detach(), torch.from_numpy(f[f"params_step_{k}/{n}"][()]), (fname, k, n))
