"""headlab: a small, fast toolkit for studying attention heads.

    import headlab
    model = headlab.load("gpt2/")                   # a GPT-2 folder or a headlab checkpoint (.h5)
    tokens = model.to_tokens("When Mary and John went to the store, John gave a drink to")
    logits = model(tokens)                          # (1, T, vocab) float32, a NumPy array
    logits, cache = model.run_with_cache(tokens, names=["blocks.5.attn.hook_pattern"])
    model.run_with_hooks(tokens, {"blocks.9.attn.hook_z": lambda z, name: z * 0})
    headlab.heads(model, task="ioi")                # what `headlab heads --task ioi` computes, as arrays
    headlab.circuit(model, task="ioi", tau=0.01)    # and `headlab circuit`'s edges

Arrays cross without copies (headlab.Model's docs say when one happens). PyTorch tensors go in through
DLPack: as_array(t) is numpy.from_dlpack(t) for anything with __dlpack__, and torch.from_dlpack(array)
takes headlab's arrays back, sharing memory both ways.
"""
import numpy as _np

from ._headlab import Error, Model, _roundtrip, circuit, heads, load  # noqa: F401

__all__ = ["Error", "Model", "load", "heads", "circuit", "as_array"]


def as_array(x):
    """x as a NumPy array without a copy where one is possible: DLPack (a PyTorch CPU tensor) or the
    buffer protocol; anything else through numpy.asarray."""
    if hasattr(x, "__dlpack__") and not isinstance(x, _np.ndarray):
        return _np.from_dlpack(x)
    return _np.asarray(x)
