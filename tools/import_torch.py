#!/usr/bin/python3
"""Import a PyTorch GPTModel (the book's chapter 4 model, tools/book_gpt.py) into a headlab
checkpoint, so that a model trained with the book's code can be evaluated, sampled and ablated
with `headlab eval / generate / inspect / ablate`.

    /usr/bin/python3 tools/import_torch.py IN.pt OUT.h5 [--config JSON] [--task NAME
        [--task-option KEY=VALUE ...] [--text FILE]]

IN.pt is either what tools/export_torch.py writes ({"model_state_dict", "config", "headlab_config"};
also the book's chapter 5 {"model_state_dict": ...} checkpoints) or a bare state_dict.

The config comes from, in this order: --config (a JSON file or inline JSON text), the .pt's
"headlab_config", the .pt's "config". It is either a whole headlab config
({"model": ..., "tokenizer": ..., "task": ...}) or the book's GPT config alone (vocab_size,
context_length, emb_dim, n_heads, n_layers, drop_rate, qkv_bias, optionally attention
"fused" | "wrapper"); then --task names the headlab task the model was trained on, which gives the
tokenizer: copy/reverse/sort "0123456789>._", add "0123456789+=._", chars the sorted characters of
--text FILE (token id = position in that list).

OUT.h5 is written as headlab writes checkpoints (io/checkpoint.cpp): root attributes
format = "headlab-checkpoint", format_version = 1 (int64), config (JSON text); /model/<state_dict key>
float32, chunked, with the Fletcher32 checksum; the causal "mask" buffers are dropped (headlab
builds them). Written to a temporary name and renamed, as headlab does.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import book_gpt  # noqa: E402
from headlab_hdf5 import CHECKPOINT_FORMAT as FORMAT, CHECKPOINT_VERSION as VERSION  # noqa: E402
from headlab_hdf5 import set_link_phase_change  # noqa: E402

TASK_VOCAB = {
    "copy": list("0123456789>._"),
    "reverse": list("0123456789>._"),
    "sort": list("0123456789>._"),
    "add": list("0123456789+=._"),
}
TASK_OPTIONS = {  # what tasks/task.cpp's options_to_map stores per task (defaults of TaskOptions)
    "copy": {"seed": "1", "min_len": "4", "max_len": "8"},
    "reverse": {"seed": "1", "min_len": "4", "max_len": "8"},
    "sort": {"seed": "1", "min_len": "4", "max_len": "8"},
    "add": {"seed": "1", "n_digits": "3"},
    "chars": {"seed": "1", "text_path": "data/tiny.txt"},
}


class ImportError_(Exception):
    pass


def compact_group(parent, name):
    """Creates group `name` whose links stay compact, inside its checksummed object header, as
    headlab's writer keeps them (io/h5file.cpp): past 8 links HDF5 would move them to a fractal
    heap that 1.10 does not checksum, and a damaged one can crash the reader. h5py has no wrapper for
    H5Pset_link_phase_change, so headlab_hdf5 calls it through ctypes; where that fails the group is
    made with HDF5's defaults (still a valid checkpoint)."""
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    set_link_phase_change(gcpl, 65535, 65535)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode("utf-8"), gcpl=gcpl))


def load_pt(path):
    """(state_dict, config or None) of a .pt file."""
    if not os.path.exists(path):
        raise ImportError_(f"'{path}': no such file")
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # torch raises many kinds on a bad file
        raise ImportError_(f"'{path}': cannot be read by torch.load ({e})")
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), None
    if not isinstance(obj, dict):
        raise ImportError_(f"'{path}': expected a state_dict or a dict with 'model_state_dict', got {type(obj).__name__}")
    if "model_state_dict" in obj:
        cfg = obj.get("headlab_config") or obj.get("config")
        return obj["model_state_dict"], cfg
    if all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    raise ImportError_(f"'{path}': a dict without 'model_state_dict' whose values are not all tensors")


def parse_config(text):
    if os.path.exists(text):
        with open(text) as f:
            text = f.read()
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ImportError_(f"--config is neither a JSON file nor JSON text ({e})")
    if isinstance(cfg, dict) and ("headlab_config" in cfg or "config" in cfg) and "model" not in cfg \
            and "vocab_size" not in cfg:  # the OUT.json that export_torch.py --bare writes
        cfg = cfg.get("headlab_config") or cfg["config"]
    if not isinstance(cfg, dict):
        raise ImportError_(f"--config: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def headlab_config(cfg, task, task_options, text):
    """A whole headlab config from a whole one or from the book's model config plus the task."""
    if "model" in cfg:
        full = dict(cfg)
    else:
        full = {"model": cfg}
    model = dict(full["model"])
    missing = [k for k in book_gpt.BOOK_KEYS if k not in model]
    if missing:
        raise ImportError_(f"config: the model section is missing {missing}")
    model.setdefault("attention", "fused")
    if model["attention"] not in ("fused", "wrapper"):
        raise ImportError_(f"config: attention must be 'fused' or 'wrapper', got {model['attention']!r}")
    full["model"] = model
    if task:
        if task not in TASK_OPTIONS:
            raise ImportError_(f"--task: expected one of {sorted(TASK_OPTIONS)}, got {task!r}")
        opts = dict(TASK_OPTIONS[task])
        for kv in task_options:
            if "=" not in kv:
                raise ImportError_(f"--task-option: expected KEY=VALUE, got {kv!r}")
            k, v = kv.split("=", 1)
            if k not in opts:
                raise ImportError_(f"--task-option: task {task} has no option {k!r} (options: {sorted(opts)})")
            opts[k] = v
        if task == "chars":
            if not text:
                raise ImportError_("--task chars needs --text FILE (the text the model was trained on)")
            with open(text, encoding="utf-8") as f:
                vocab = sorted(set(f.read()))
            opts["text_path"] = os.path.abspath(text)
        else:
            vocab = TASK_VOCAB[task]
        full["task"] = {"name": task, "options": opts}
        full["tokenizer"] = {"type": "char", "vocab": vocab}
    if "task" not in full or "tokenizer" not in full:
        raise ImportError_("the config has no task and tokenizer sections: give --task (and --text for chars), or "
                           "a whole headlab config with --config")
    vocab = full["tokenizer"].get("vocab", [])
    if len(vocab) != model["vocab_size"]:
        raise ImportError_(f"the tokenizer has {len(vocab)} tokens but the model's vocab_size is {model['vocab_size']}")
    return full


def import_pt(src, out, config_text=None, task=None, task_options=(), text=None):
    state_dict, stored_cfg = load_pt(src)
    if config_text is not None:
        cfg = parse_config(config_text)
    elif stored_cfg is not None:
        cfg = stored_cfg
    else:
        raise ImportError_(f"'{src}' holds no config: give --config")
    full = headlab_config(cfg, task, task_options, text)
    model_cfg = full["model"]
    expected = book_gpt.expected_parameters(model_cfg)
    masks = book_gpt.mask_buffers(model_cfg)

    params = {}
    for name, t in state_dict.items():
        if name in masks or name.endswith(".mask"):
            if name not in masks:
                raise ImportError_(f"'{src}': buffer {name} does not belong to the model the config describes")
            continue
        if name not in expected:
            raise ImportError_(f"'{src}': {name} is not a parameter of the model the config describes")
        if tuple(t.shape) != expected[name]:
            raise ImportError_(f"'{src}': parameter {name} has shape {list(t.shape)}, model expects "
                               f"{list(expected[name])}")
        params[name] = t.detach().to(torch.float32).contiguous().numpy()
    for name in expected:
        if name not in params:
            raise ImportError_(f"'{src}': parameter {name} is missing")

    folder = os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(folder, f".{os.path.basename(out)}.tmp.{os.getpid()}")
    try:
        with h5py.File(tmp, "w", libver=("v110", "v110"), track_order=False) as f:
            def set_str(key, value):  # fixed-length UTF-8, as headlab writes string attributes
                data = value.encode("utf-8")
                f.attrs.create(key, np.array(data, dtype=h5py.string_dtype("utf-8", len(data))))
            set_str("format", FORMAT)
            f.attrs.create("format_version", np.int64(VERSION), dtype=np.int64)
            set_str("config", json.dumps(full, sort_keys=True, ensure_ascii=False))
            g = compact_group(f, "model")
            for name in expected:  # the model's parameter order
                a = params[name]
                chunks = a.shape if a.nbytes <= (1 << 20) else True  # about 1 MiB chunks, as headlab
                g.create_dataset(name, data=a, dtype=np.float32, chunks=chunks, fletcher32=True, track_times=False)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return full, len(params)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pt", help="PyTorch file (.pt): export_torch.py's output or a state_dict")
    p.add_argument("out", help="headlab checkpoint to write (.h5)")
    p.add_argument("--config", help="JSON file or JSON text: a headlab config or the book's GPT config")
    p.add_argument("--task", help="the headlab task the model was trained on (when the config has none)")
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task option, e.g. min_len=2 (repeatable)")
    p.add_argument("--text", help="chars: the text the model was trained on (gives the vocabulary)")
    args = p.parse_args(argv)
    try:
        full, n = import_pt(args.pt, args.out, args.config, args.task, args.task_option, args.text)
    except (ImportError_, OSError) as e:
        print(f"import_torch: {e}", file=sys.stderr)
        return 1
    m = full["model"]
    print(f"wrote {args.out}: {n} parameters of a {m['n_layers']}-layer {m['attention']} GPT for task "
          f"{full['task']['name']} (vocab {m['vocab_size']}, context {m['context_length']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
