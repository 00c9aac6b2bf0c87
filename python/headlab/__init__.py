"""headlab: a small, fast toolkit for studying attention heads.

    import headlab
    model = headlab.load("gpt2/")                   # a GPT-2 folder or a headlab checkpoint (.h5)
    tokens = model.to_tokens("When Mary and John went to the store, John gave a drink to")
    logits = model(tokens)                          # (1, T, vocab) float32, a NumPy array
    logits, cache = model.run_with_cache(tokens, names=["blocks.5.attn.hook_pattern"])
    model.run_with_hooks(tokens, {"blocks.9.attn.hook_z": lambda z, name: z * 0})
    headlab.heads(model, task="ioi")                # what `headlab heads --task ioi` computes, as arrays
    headlab.circuit(model, task="ioi", tau=0.01)    # and `headlab circuit`'s edges
    headlab.train(task="reverse", steps=500, out="runs/r", callback=print)   # `headlab train`, its options

Arrays cross without copies (headlab.Model's docs say when one happens). PyTorch tensors go in through
DLPack: as_array(t) is numpy.from_dlpack(t) for anything with __dlpack__, and torch.from_dlpack(array)
takes headlab's arrays back, sharing memory both ways.
"""
import os as _os
import re as _re
import shutil as _shutil
import subprocess as _subprocess

import numpy as _np

from ._headlab import Error, Model, _roundtrip, ablate, attention, circuit, heads, load  # noqa: F401

__all__ = ["Error", "Model", "load", "ablate", "attention", "heads", "circuit", "train", "as_array"]


def as_array(x):
    """x as a NumPy array without a copy where one is possible: DLPack (a PyTorch CPU tensor) or the
    buffer protocol; anything else through numpy.asarray."""
    if hasattr(x, "__dlpack__") and not isinstance(x, _np.ndarray):
        return _np.from_dlpack(x)
    return _np.asarray(x)


def _command():
    """The headlab command beside this module: $HEADLAB_BINARY, the build tree's, or the one on PATH."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    for path in (_os.environ.get("HEADLAB_BINARY"), _os.path.join(here, "..", "..", "headlab"),
                 _shutil.which("headlab")):
        if path and _os.path.isfile(path) and _os.access(path, _os.X_OK):
            return path
    raise Error("headlab.train: the headlab command was found neither beside the module nor on PATH "
                "(set HEADLAB_BINARY)")


_STEP = _re.compile(r"^step (\d+)/(\d+)\s+loss ([0-9.eE+-]+|nan|inf)")
_EVAL = _re.compile(r"^eval step (\d+): .*val loss ([0-9.eE+-]+)")
_WROTE = _re.compile(r"^wrote (.+?\.h5)( \(|$)")


def train(callback=None, **options):
    """`headlab train` with the command's options as keywords (lr=3e-3 is --lr 3e-3; a True flag is given
    bare, False and None are left out), run as its own process so that Ctrl-C, divergence and checkpoints
    behave as they do on the command line. callback(event) is called for every progress line, event a dict:
    {"step", "steps", "loss", "line"} for a training step, {"step", "val_loss", "line"} for an evaluation,
    {"line"} otherwise. Returns the path of the last checkpoint; a failed run raises headlab.Error with the
    command's message."""
    args = [_command(), "train"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    process = _subprocess.Popen(args, stdout=_subprocess.PIPE, stderr=_subprocess.PIPE, text=True)
    checkpoint = None
    for line in process.stdout:
        line = line.rstrip("\n")
        step, evaluation = _STEP.match(line), _EVAL.match(line)
        wrote = _WROTE.match(line)
        if wrote:
            checkpoint = wrote[1]
        if callback is None:
            continue
        if step:
            callback({"step": int(step[1]), "steps": int(step[2]), "loss": float(step[3]), "line": line})
        elif evaluation:
            callback({"step": int(evaluation[1]), "val_loss": float(evaluation[2]), "line": line})
        else:
            callback({"line": line})
    error = process.stderr.read()
    if process.wait() != 0:
        raise Error(error.strip() or f"headlab train exited {process.returncode}")
    return checkpoint
