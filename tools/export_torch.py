#!/usr/bin/python3
"""Export a headlab checkpoint to PyTorch: a state_dict for the book's chapter 4 GPTModel
(tools/book_gpt.py), plus the config.

    /usr/bin/python3 tools/export_torch.py CKPT.h5 OUT.pt [--bare]

OUT.pt holds, as the book's chapter 5 saves models,
    {"model_state_dict": state_dict,   # every parameter (float32) plus the causal "mask" buffers
     "config": {...},                  # the book's GPT config keys plus "attention"
     "headlab_config": {...}}          # the checkpoint's whole config (tokenizer, task, training)
so that

    ck = torch.load("OUT.pt")
    model = book_gpt.GPTModel(ck["config"])
    model.load_state_dict(ck["model_state_dict"])      # strict

works. With --bare, OUT.pt is the state_dict alone and the config goes to OUT.json.
The export is checked before it is written: the state_dict is loaded into book_gpt.GPTModel with
strict=True. Needs Debian's python3-torch and python3-h5py (run with /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from headlab_hdf5 import CHECKPOINT_FORMAT as FORMAT, CHECKPOINT_VERSION as VERSION, attr_str  # noqa: E402
# torch (and book_gpt, which needs it) are imported once the checkpoint has been read: importing
# torch takes seconds, and a bad file is reported without it.


class ExportError(Exception):
    pass


def read_checkpoint(path):
    """(headlab config, {name: float32 ndarray}) of a headlab checkpoint, validated."""
    where = f"checkpoint '{path}'"
    if not os.path.exists(path):
        raise ExportError(f"{where}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ExportError(f"{where}: is not an HDF5 file or is damaged ({e})")
    with f:
        if "format" not in f.attrs or attr_str(f, "format") != FORMAT:
            raise ExportError(f"{where}: not a headlab checkpoint (the root attribute 'format' is missing or is not "
                              f"'{FORMAT}')")
        version = int(np.asarray(f.attrs.get("format_version", -1)))
        if version != VERSION:
            raise ExportError(f"{where}: format_version {version} is not supported (this tool reads {VERSION})")
        try:
            config = json.loads(attr_str(f, "config"))
        except (KeyError, ValueError) as e:
            raise ExportError(f"{where}: the root attribute 'config' is missing or not valid JSON ({e})")
        if "model" not in config:
            raise ExportError(f"{where}: config has no 'model' section")
        if "model" not in f:
            raise ExportError(f"{where}: group /model is missing")
        params = {}
        for name, ds in f["model"].items():
            try:
                params[name] = np.asarray(ds[()], dtype=np.float32)  # h5py verifies Fletcher32
            except OSError as e:
                raise ExportError(f"{where}: dataset model/{name} cannot be read (the file is damaged: {e})")
    return config, params


def book_config(model_cfg, where):
    if model_cfg.get("kept_heads"):
        raise ExportError(f"{where}: the model has physically pruned heads (kept_heads); the book's GPTModel needs "
                          f"n_heads heads in every layer, so it cannot be exported")
    from book_gpt import BOOK_KEYS  # imports torch: only once the checkpoint has been read
    cfg = {k: model_cfg[k] for k in BOOK_KEYS}
    cfg["attention"] = model_cfg.get("attention", "fused")
    return cfg


def export(ckpt, out, bare=False):
    where = f"checkpoint '{ckpt}'"
    config, params = read_checkpoint(ckpt)
    cfg = book_config(config["model"], where)
    import torch
    import book_gpt
    expected = book_gpt.expected_parameters(cfg)
    for name, shape in expected.items():
        if name not in params:
            raise ExportError(f"{where}: parameter {name} is missing")
        if tuple(params[name].shape) != shape:
            raise ExportError(f"{where}: parameter {name} has shape {list(params[name].shape)}, model expects "
                              f"{list(shape)}")
    extra = sorted(set(params) - set(expected))
    if extra:
        raise ExportError(f"{where}: dataset model/{extra[0]} is not a parameter of the model its config describes")

    model = book_gpt.GPTModel(cfg)
    tensors = {n: torch.from_numpy(a.copy()) for n, a in params.items()}
    tensors.update(book_gpt.mask_buffers(cfg))
    state_dict = {k: tensors[k] for k in model.state_dict().keys()}  # the model's own key order
    model.load_state_dict(state_dict, strict=True)  # the check: every key, every shape

    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        if bare:
            torch.save(state_dict, tmp)
            with open(os.path.splitext(out)[0] + ".json", "w") as f:
                json.dump({"config": cfg, "headlab_config": config}, f, indent=2, sort_keys=True)
        else:
            torch.save({"model_state_dict": state_dict, "config": cfg, "headlab_config": config}, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return cfg, len(params)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="headlab checkpoint (.h5)")
    p.add_argument("out", help="PyTorch file to write (.pt)")
    p.add_argument("--bare", action="store_true", help="write the state_dict alone (config to OUT.json)")
    args = p.parse_args(argv)
    try:
        cfg, n = export(args.checkpoint, args.out, args.bare)
    except ExportError as e:
        print(f"export_torch: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {n} parameters of a {cfg['n_layers']}-layer {cfg['attention']} GPT "
          f"(emb {cfg['emb_dim']}, {cfg['n_heads']} heads, vocab {cfg['vocab_size']}, context {cfg['context_length']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
