"""headlab.sae: sparse autoencoders and transcoders trained on a model's hook points (`headlab sae train`, run
as its own process as headlab.train is) and the features of heads on a prompt (`headlab sae features`).

    saes = headlab.sae.train(model, hooks=["blocks.3.attn.hook_z"], text="corpus.txt", arch="topk", k=32,
                             expansion=16, training_tokens=2_000_000, out="saes", callback=print)
    report = headlab.sae.features(model, saes[0], "When Mary and John went to the store")
    headlab.sae.pages(model, saes[0], text="corpus.txt", out="features.html")   # a page a feature, for a browser
"""
import re as _re

from . import _headlab

_STEP = _re.compile(r"^sae train: step (\d+), (\d+) tokens")
_HELD_OUT = _re.compile(r"^sae train: held-out at step (\d+)")
_WROTE = _re.compile(r"^sae train: wrote (.+?) \(held out: explained variance ([0-9.eE+-]+|nan)")


def _path_of(model):
    return model.path if isinstance(model, _headlab.Model) else str(model)


def train(model, hooks=(), transcoders=(), callback=None, **options):
    """`headlab sae train` on `model` (a headlab.Model or a path the command reads) with the command's options as
    keywords (text="corpus.txt", arch="topk", k=32, expansion=16, training_tokens=..., batch_size=...,
    eval_every=..., lr=..., out="saes", tokenizer=... for a llama2.c file): one SAE a hook of `hooks` and one
    transcoder an (input, output) pair of `transcoders`, all from the same forward passes. callback(event) gets
    every progress line: {"step", "tokens", "line"} for a training step, {"step", "held_out": True, "line"} for a
    held-out evaluation, {"line"} otherwise. Returns the SAEs written, as headlab.SAE (each with its folder as
    .path); a failed run raises headlab.Error with the command's message."""
    options = dict(options)
    options["hook"] = list(hooks)
    options["transcoder"] = [f"{a}:{b}" for a, b in transcoders]
    folders = []

    def on_line(line):
        step, held, wrote = _STEP.match(line), _HELD_OUT.match(line), _WROTE.match(line)
        if wrote:
            folders.append(wrote[1])
        if callback is None:
            return
        if step:
            callback({"step": int(step[1]), "tokens": int(step[2]), "line": line})
        elif held:
            callback({"step": int(held[1]), "held_out": True, "line": line})
        else:
            callback({"line": line})

    from . import _flags, _run_command  # the package's runner, shared with headlab.train
    _run_command(["sae", "train", _path_of(model)] + _flags(options), on_line)
    return [_headlab.SAE.load_from_disk(f) for f in folders]


def features(model, sae, text_or_tokens, features=5, feature=None, position=None, logits=5):
    """`headlab sae features` on one prompt (a text or token ids): the most active `features` (or the ids in
    `feature`), each a dict of its activations at every token, the position it peaks at (or `position`), its
    pre-activation there split over the heads that wrote its input ("parts": {"L1H3": ...}, with "bias": they sum
    to "pre_activation"), its "head_shares" (hook_z SAEs) and the tokens its direction promotes and suppresses
    most ("top_logits", "bottom_logits": (token text, effect) pairs)."""
    chosen = [] if feature is None else ([feature] if isinstance(feature, int) else list(feature))
    return _headlab._sae_features(model, sae, text_or_tokens, features, chosen, position, logits)


def pages(model, sae, out, callback=None, **options):
    """`headlab sae pages` (its options as keywords: text="corpus.txt", batches=8, features=20, contexts=10,
    tokenizer=...): the feature pages of `sae` (a headlab.SAE read from a folder, or a folder's path) over the text's
    held-out windows, written to `out` (an .html file a browser opens without a network). Returns `out`."""
    folder = sae.path if isinstance(sae, _headlab.SAE) else str(sae)
    if not folder:
        raise _headlab.Error("headlab.sae.pages: the SAE was not read from a folder; save_model it first")
    from . import _flags, _run_command
    _run_command(["sae", "pages", _path_of(model), folder, "--out", str(out)] + _flags(options),
                 callback or (lambda line: None))
    return str(out)
