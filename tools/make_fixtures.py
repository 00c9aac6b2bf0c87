#!/usr/bin/python3
"""PyTorch reference fixtures for headlab's C++ tests (tests/fixtures/*.h5, index.json, schedules.json).

Run with Debian's PyTorch:  /usr/bin/python3 tools/make_fixtures.py [--out tests/fixtures]
The reference modules are written from the seed texts plus headlab's two extensions (masked_softmax
gives all-zero rows, and zero gradients, where nothing is valid; every multi-head module takes a
per-head gate vector): the d2l.ai 10.3 / 10.5 ones in tools/fixtures_d2l.py, d2l 10.7's Transformer
(with its two documented differences) in tools/fixtures_transformer.py, the "Build a Large
Language Model from Scratch" ch. 3/4 ones (CausalAttention up to GPTModel) from tools/book_gpt.py, which
the interop tools use too, with their fixtures in tools/fixtures_book.py; optimizer trajectories and LR
schedules are in tools/fixtures_optim.py, and the shared HDF5 writer and module-fixture runner in
tools/fixtures_common.py. This file is the command line, the driver and the verification. Everything is
computed in float64 with dropout p = 0; re-running writes byte-identical files.
The layout is documented in tests/fixtures/README.md.
"""
import os
import platform

# OpenBLAS (Debian's torch and numpy use it) picks its matrix kernels by CPU or by OPENBLAS_CORETYPE,
# and the kernels differ in the last bits of float64 results. The committed fixtures were written
# with the Prescott kernels (plain SSE3, OpenBLAS's fallback, there on every x86-64 CPU), so they are
# pinned here, overriding the environment: a re-run is then byte-identical on any x86-64 machine
# (with another core type, about 30 files differ by a few ulps). OpenBLAS reads the variable when it
# loads, so this comes before numpy and torch are imported.
if platform.machine() in ("x86_64", "AMD64"):
    os.environ["OPENBLAS_CORETYPE"] = "Prescott"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures_book  # noqa: E402
import fixtures_d2l  # noqa: E402
import fixtures_optim  # noqa: E402
import fixtures_transformer  # noqa: E402
from fixtures_common import CALL_FNS, INDEX, assert_close, load_params, read_group  # noqa: E402
from headlab_hdf5 import attr_str  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Verification: rebuild every fixture from nothing but its file (config + params + inputs) and
# recompute it, so a file that is not self-sufficient (or was written wrongly) fails here.
# ----------------------------------------------------------------------------------------------

# module attribute -> constructor(config)
FACTORY = {**fixtures_d2l.FACTORY, **fixtures_book.FACTORY, **fixtures_transformer.FACTORY}


def verify_module(f, fname, call):
    """Rebuild a module fixture from its config and params, re-run its call, compare everything."""
    cfg = json.loads(f.attrs["config"])
    model = FACTORY[attr_str(f, "module")](cfg)
    model.eval()
    load_params(model, read_group(f, "params"))
    ins = read_group(f, "inputs")
    lw = ins.pop("loss_weight")
    g = ins.pop("gates", None)
    for v in list(ins.values()) + ([g] if g is not None else []):
        if v.is_floating_point():
            v.requires_grad_(True)
    outp = CALL_FNS[call](model, ins, g)
    (outp * lw).sum().backward()
    assert_close(outp, torch.from_numpy(np.asarray(f["outputs/output"][()])), fname)
    if "outputs/attention_weights" in f:
        assert_close(model.attention_weights, torch.from_numpy(f["outputs/attention_weights"][()]), fname)
    for k, v in ins.items():
        if v.is_floating_point():
            assert_close(v.grad, torch.from_numpy(f[f"grads/inputs/{k}"][()]), (fname, k))
    if g is not None:
        assert_close(g.grad, torch.from_numpy(f["grads/inputs/gates"][()]), (fname, "gates"))
    for n, p in model.named_parameters():
        gr = p.grad if p.grad is not None else torch.zeros_like(p)
        assert_close(gr, torch.from_numpy(f[f"grads/params/{n}"][()]), (fname, n))
    assert set(f["params"]) == {n for n, _ in model.named_parameters()}


def verify(out):
    with open(os.path.join(out, "index.json")) as fh:
        index = json.load(fh)["files"]
    for e in index:
        with h5py.File(os.path.join(out, e["file"]), "r") as f:
            if e["kind"] == "module":
                verify_module(f, e["file"], e["call"])
            elif e["kind"] == "gpt":
                fixtures_book.verify_gpt(f, e["file"])
            else:
                fixtures_optim.verify_optim(f, e["file"])


# ----------------------------------------------------------------------------------------------


def self_checks():
    """Assert the reference modules against the seeds' printed examples and each other."""
    fixtures_d2l.d2l_self_checks()
    fixtures_book.book_self_checks()
    fixtures_transformer.transformer_self_checks()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)  # deterministic summation order
    self_checks()
    torch.set_default_dtype(torch.float64)
    # index.json lists the files in this order
    fixtures_d2l.d2l_fixtures(out)
    fixtures_book.book_fixtures(out)
    fixtures_book.gpt_fixture(out, "gpt_fused.h5", "fused", False, seed=1000)
    fixtures_book.gpt_fixture(out, "gpt_wrapper.h5", "wrapper", True, seed=1001)
    fixtures_optim.optim_fixtures(out)
    fixtures_optim.schedules(out)
    fixtures_transformer.transformer_fixtures(out)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"generator": "tools/make_fixtures.py", "torch": torch.__version__.split("+")[0],
                   "files": INDEX}, f, indent=1, sort_keys=True)
        f.write("\n")
    verify(out)
    print(f"wrote {len(INDEX)} HDF5 fixtures + index.json + schedules.json to {out}")


if __name__ == "__main__":
    sys.exit(main())
