"""headlab: a small, fast toolkit for studying attention heads, with TransformerLens's habits.

    import headlab
    model = headlab.load("gpt2/")                   # a model folder, a headlab checkpoint (.h5), a llama2.c .bin
    tokens = model.to_tokens("When Mary and John went to the store, John gave a drink to")
    logits = model(tokens)                          # (1, T, vocab) float32, a NumPy array; model("text") too
    loss = model(["a text", "another"], return_type="loss")
    logits, cache = model.run_with_cache(tokens)    # cache["pattern", 9], cache["resid_pre", 3], cache["embed"]
    heads, labels = cache.stack_head_results(pos_slice=-1, return_labels=True)   # "L0H0", ...
    dla = cache.logit_attrs(heads, " Mary", " John", pos_slice=-1)   # each head's direct logit attribution
    model.run_with_hooks(tokens, {"blocks.9.attn.hook_z": lambda z, name: z * 0})
    _, cache, grads = model.run_with_cache(tokens, backward=lambda logits: logits[0, -1, 1234])
    model.generate("Once upon a time", max_new_tokens=20)      # `headlab generate`'s tokens
    headlab.heads(model, task="ioi")                # what `headlab heads --task ioi` computes, as arrays
    headlab.train(task="reverse", steps=500, out="runs/r", callback=print)   # `headlab train`, its options
    saes = headlab.sae.train(model, hooks=["blocks.3.attn.hook_z"], text="corpus.txt", out="saes")
    headlab.sae.features(model, saes[0], "When Mary and John ...")   # features split over heads, logit effects

Arrays cross without copies (headlab.Model's docs say when one happens). PyTorch tensors go in through
DLPack: as_array(t) is numpy.from_dlpack(t) for anything with __dlpack__, and torch.from_dlpack(array)
takes headlab's arrays back, sharing memory both ways.
"""
import os as _os
import re as _re
import shutil as _shutil
import subprocess as _subprocess

import numpy as _np

from . import _headlab, sae  # noqa: F401
from ._headlab import SAE, Error, Model, _roundtrip, ablate, attention, circuit, heads, load, logit_lens  # noqa: F401

__all__ = ["Error", "Model", "SAE", "ActivationCache", "load", "ablate", "attention", "heads", "circuit", "logit_lens",
           "train", "sae", "as_array", "get_act_name"]


def as_array(x):
    """x as a NumPy array without a copy where one is possible: DLPack (a PyTorch CPU tensor) or the
    buffer protocol; anything else through numpy.asarray."""
    if hasattr(x, "__dlpack__") and not isinstance(x, _np.ndarray):
        return _np.from_dlpack(x)
    return _np.asarray(x)


# ---- TransformerLens's names for hook points ----

_ATTN_POINTS = {"q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"}
_MLP_POINTS = {"pre", "post", "mid", "pre_linear"}
_POINT_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                  "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}


def get_act_name(name, layer=None, layer_type=None):
    """TransformerLens's utils.get_act_name: ("pattern", 3) -> "blocks.3.attn.hook_pattern", ("resid_pre", 0) ->
    "blocks.0.hook_resid_pre", "embed" -> "hook_embed", ("normalized", 1, "ln2") -> "blocks.1.ln2.hook_normalized",
    "normalized" -> "ln_final.hook_normalized", "z2" -> "blocks.2.attn.hook_z"; a full name is itself."""
    if layer is None and layer_type is None and ("." in name or name.startswith("hook_")):
        return name
    short = _re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)  # "pattern3", "normalized1ln1"
    if short and layer is None:
        name, layer, layer_type = short[1], int(short[2]), short[3] or None
    name = _POINT_ALIASES.get(name, name)
    if name in _ATTN_POINTS:
        layer_type = "attn"
    elif name in _MLP_POINTS:
        layer_type = "mlp"
    else:
        layer_type = _TYPE_ALIASES.get(layer_type, layer_type)
    full = (f"blocks.{layer}." if layer is not None else "") + (f"{layer_type}." if layer_type else "") + "hook_" + name
    return "ln_final." + full if name in ("normalized", "scale") and layer is None else full


def _position(pos_slice, who):
    if pos_slice is not None and not isinstance(pos_slice, (int, _np.integer)):
        raise Error(f"{who}: pos_slice is one position (an int, negative from the end) or None, not {pos_slice!r}")
    return None if pos_slice is None else int(pos_slice)


def _layer(layer):
    return -1 if layer is None else int(layer)


class ActivationCache(dict):
    """What run_with_cache returns: a dict of hook name -> array that also takes TransformerLens's keys
    (cache["pattern", 0], cache["z", 1], cache["resid_pre", 0], cache["embed"], cache["normalized", 0, "ln1"]) and
    has its helpers, computed by headlab from the cached activations (analysis/residual.h). Stacks are
    (components, batch, pos, d_model), or (components, batch, d_model) with pos_slice=int."""

    def __init__(self, activations, model):
        super().__init__(activations)
        self.model = model

    def _name(self, key):
        if isinstance(key, tuple):
            return get_act_name(*key)
        return key if dict.__contains__(self, key) else get_act_name(key)

    def __getitem__(self, key):
        name = self._name(key)
        if not dict.__contains__(self, name):
            raise KeyError(f"ActivationCache: no '{name}'" + (f" (for {key!r})" if name != key else "") +
                           " in the cache; run_with_cache keeps every hook point unless names= leaves it out")
        return dict.__getitem__(self, name)

    def __contains__(self, key):
        return dict.__contains__(self, self._name(key))

    def get(self, key, default=None):
        return self[key] if key in self else default

    def _stack(self, view, return_labels, layer=None, apply_ln=False, pos_slice=None, mlp_input=False,
               incl_mid=False, incl_embeds=True, mode="all", incl_remainder=False, who=""):
        stack, labels = _headlab._residual(self.model, view, self, _layer(layer), apply_ln, _position(pos_slice, who),
                                           mlp_input, incl_mid, incl_embeds, mode, incl_remainder)
        return (stack, labels) if return_labels else stack

    def accumulated_resid(self, layer=None, incl_mid=False, apply_ln=False, pos_slice=None, mlp_input=False,
                          return_labels=False):
        """The stream entering each layer ("0_pre", ...) and the final one ("final_post"); layer=l: up to the
        input of layer l. apply_ln: at the end, every stream through ln_final with its own scale, weight and bias
        (the logit lens); for another layer, that layer's norm frozen at its input (apply_ln_to_stack)."""
        return self._stack("accumulated", return_labels, layer, apply_ln, pos_slice, mlp_input, incl_mid=incl_mid,
                           who="accumulated_resid")

    def decompose_resid(self, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                        incl_embeds=True, return_labels=False):
        """The outputs that sum to the stream entering `layer`: "embed", "pos_embed" (learned positions), each
        "l_attn_out" and "l_mlp_out"; mode "attn" or "mlp" keeps those. apply_ln: through the frozen norm."""
        return self._stack("decomposed", return_labels, layer, apply_ln, pos_slice, mlp_input, incl_embeds=incl_embeds,
                           mode=mode, who="decompose_resid")

    def stack_head_results(self, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None, apply_ln=False):
        """Every head's hook_result ("L0H0", ...) before `layer`, out_proj's bias excluded; incl_remainder adds the
        stream less their sum. apply_ln: through the final norm frozen at the final stream, its weight applied."""
        return self._stack("heads", return_labels, layer, apply_ln, pos_slice, incl_remainder=incl_remainder,
                           who="stack_head_results")

    def apply_ln_to_stack(self, residual_stack, layer=None, mlp_input=False, pos_slice=None):
        """A stack as it comes out of the norm that reads the stream entering `layer` (ln_final by default), that
        norm's scale frozen at that stream's: centred (LayerNorm), divided by the scale, times the norm's weight
        (headlab does not fold it into W_U), no bias. So stack @ model.W_U is each component's logits."""
        return _headlab._apply_ln_to_stack(self.model, self, _np.ascontiguousarray(residual_stack), _layer(layer),
                                           mlp_input, _position(pos_slice, "apply_ln_to_stack"))

    def logit_attrs(self, residual_stack, tokens, incorrect_tokens=None, pos_slice=None):
        """Each component's direct logit attribution: the stack through the frozen final norm (apply_ln_to_stack)
        along W_U[:, tokens] (less W_U[:, incorrect_tokens]). tokens: a text of one token, an id, (batch) ids (one
        per row, over every position) or (batch, pos) ids."""
        scaled = self.apply_ln_to_stack(residual_stack, pos_slice=pos_slice)
        direction = self._direction(tokens, scaled.ndim)
        if incorrect_tokens is not None:
            direction = direction - self._direction(incorrect_tokens, scaled.ndim)
        return (scaled * direction).sum(-1)

    def _direction(self, tokens, ndim):
        ids = _np.asarray(self.model.to_single_token(tokens) if isinstance(tokens, str) else tokens)
        d = _np.moveaxis(self.model.W_U[:, ids], 0, -1)  # (*ids.shape, d_model)
        return d[:, None, :] if ids.ndim == 1 and ndim == 4 else d


def _run_with_cache(self, input, names=None, backward=None, backward_names=None, prepend_bos=None,
                    attention_mask=None):
    """(logits, cache) keeping only `names` (default: every hook point); cache is an ActivationCache. With
    backward=metric: (logits, cache, grads), grads holding d metric / d activation at backward_names (default:
    names), TransformerLens's backward hooks. metric: a callable of the logits as a torch tensor returning a scalar
    (its backward gives d metric / d logits), or that (B, T, vocab) array itself. attention_mask: token ids' right
    padding, (B, T) ones then zeros, which an encoder's attention hides (not with backward yet)."""
    if backward is None:
        logits, cache = self._run_with_cache(input, names, prepend_bos, attention_mask)
        return logits, ActivationCache(cache, self)
    if attention_mask is not None:
        raise ValueError("headlab: run_with_cache(backward=...) takes no attention_mask yet")
    logits, cache, grads = self._run_with_backward(input, names, backward_names, _dlogits(backward), prepend_bos)
    return logits, ActivationCache(cache, self), ActivationCache(grads, self)


def _dlogits(metric):
    """d metric / d logits as a function of the logits."""
    if not callable(metric):
        given = _np.asarray(metric)
        return lambda logits: given
    try:
        import torch
    except ImportError:
        raise Error("run_with_cache(backward=...): a callable metric needs torch; give d metric / d logits as a "
                    "(B, T, vocab) array instead") from None

    def dlogits(logits):
        t = torch.from_dlpack(logits).requires_grad_(True)
        value = metric(t)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise Error("run_with_cache(backward=...): the metric must return one number as a torch tensor, got "
                        f"{type(value).__name__}" + (f" of shape {tuple(value.shape)}"
                                                     if isinstance(value, torch.Tensor) else ""))
        value.sum().backward()
        return t.grad.numpy()
    return dlogits


def _to_single_token(self, text):
    """The id of a text that is one token (as to_tokens(text, prepend_bos=False) gives it)."""
    ids = self.to_tokens(text, prepend_bos=False)[0]
    if len(ids) != 1:
        raise Error(f"to_single_token: {text!r} is {len(ids)} tokens {self.to_str_tokens(ids)}, not one")
    return int(ids[0])


Model.run_with_cache = _run_with_cache
Model.to_single_token = _to_single_token


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


def _flags(options):
    """Keywords as a command's flags: lr=3e-3 is --lr 3e-3, a True flag is given bare, False and None are left
    out, a list or tuple repeats its flag."""
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is True:
                args.append(flag)
            elif v is not False and v is not None:
                args += [flag, str(v)]
    return args


def _run_command(args, on_line):
    """Runs `headlab ARGS` as its own process, each stdout line to on_line; a failed run raises headlab.Error
    with the command's message."""
    process = _subprocess.Popen([_command()] + args, stdout=_subprocess.PIPE, stderr=_subprocess.PIPE, text=True)
    for line in process.stdout:
        on_line(line.rstrip("\n"))
    error = process.stderr.read()
    if process.wait() != 0:
        raise Error(error.strip() or f"headlab {args[0]} exited {process.returncode}")


def train(callback=None, **options):
    """`headlab train` with the command's options as keywords (lr=3e-3 is --lr 3e-3; a True flag is given
    bare, False and None are left out), run as its own process so that Ctrl-C, divergence and checkpoints
    behave as they do on the command line. callback(event) is called for every progress line, event a dict:
    {"step", "steps", "loss", "line"} for a training step, {"step", "val_loss", "line"} for an evaluation,
    {"line"} otherwise. Returns the path of the last checkpoint; a failed run raises headlab.Error with the
    command's message."""
    checkpoint = None

    def on_line(line):
        nonlocal checkpoint
        step, evaluation = _STEP.match(line), _EVAL.match(line)
        wrote = _WROTE.match(line)
        if wrote:
            checkpoint = wrote[1]
        if callback is None:
            return
        if step:
            callback({"step": int(step[1]), "steps": int(step[2]), "loss": float(step[3]), "line": line})
        elif evaluation:
            callback({"step": int(evaluation[1]), "val_loss": float(evaluation[2]), "line": line})
        else:
            callback({"line": line})

    _run_command(["train"] + _flags(options), on_line)
    return checkpoint


# ---- sparse autoencoders spliced into the forward, as SAELens's HookedSAETransformer ----

def _sae_hooks(saes, cache=None):
    """Each SAE's hook replaces its activation with the reconstruction; a transcoder's, the activation at its
    hook_name_out with its reconstruction from what hook_name held. cache (a dict) gets hook_sae_acts_post and
    hook_sae_recons under the name replaced."""
    hooks, taken = {}, {}  # taken: what a transcoder reads, by hook name, as the forward passed it
    for sae in saes:
        reads = sae.cfg["hook_name"]
        name = sae.cfg["hook_name_out"] or reads
        if not reads:
            raise Error("run_with_saes: an SAE without a hook_name in its cfg.json cannot be spliced in")
        for point in {reads, name}:
            if point in hooks:
                raise Error(f"run_with_saes: two SAEs on {point}")
        if name != reads:
            hooks[reads] = lambda act, _name, reads=reads: taken.__setitem__(reads, act.copy())

        def hook(act, _name, sae=sae, name=name, reads=reads):
            if name != reads and reads not in taken:
                raise Error(f"run_with_saes: a transcoder reads {reads}, which the forward reaches after {name}")
            x = act if name == reads else taken[reads]
            feats = sae.encode(x.reshape(-1, sae.cfg["d_in"]))
            recons = sae.decode(feats)
            if cache is not None:
                cache[f"{name}.hook_sae_acts_post"] = feats.reshape(act.shape[:2] + (-1,))
                cache[f"{name}.hook_sae_recons"] = recons.reshape(act.shape)
            return recons.reshape(act.shape).astype(act.dtype, copy=False)
        hooks[name] = hook
    return hooks


def _run_with_saes(self, input, saes=()):
    """The logits with each SAE's reconstruction in place of its hook point's activation (SAELens's run_with_saes)."""
    return self.run_with_hooks(input, _sae_hooks(saes))


def _run_with_cache_with_saes(self, input, saes=()):
    """run_with_saes, and a dict of each SAE's features ("<hook>.hook_sae_acts_post") and reconstruction
    ("<hook>.hook_sae_recons")."""
    cache = {}
    logits = self.run_with_hooks(input, _sae_hooks(saes, cache))
    return logits, cache


Model.run_with_saes = _run_with_saes
Model.run_with_cache_with_saes = _run_with_cache_with_saes
