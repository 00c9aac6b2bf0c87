"""TransformerLens's habits on headlab (issue 68): the cache's keys and helpers against numbers computed by hand
from the cached activations, text and batches of text into the model, its loss, generation against the command,
gradients at hook points against central differences and attribution patching against real patching, tokens
that do not depend on the tokenizer's file, and the tour's numbers against headlab's own."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import headlab
from conftest import BINARY, LLAMA2_TOKENIZER, TOUR, stories_path


@pytest.fixture(scope="module")
def model(checkpoint):
    return headlab.load(checkpoint)


@pytest.fixture(scope="module")
def stories():
    return headlab.load(stories_path(), tokenizer=stories_path("tok512.bin"))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def norm_by_hand(x, at, weight, bias=None, eps=1e-5, centre=True):
    """The norm's formula: x centred (LayerNorm) over `at`'s scale (x itself, or the stream a frozen norm saw)."""
    c = (lambda t: t - t.mean(-1, keepdims=True)) if centre else (lambda t: t)
    y = c(x) / np.sqrt((c(at) ** 2).mean(-1, keepdims=True) + eps) * weight
    return y if bias is None else y + bias


# ---- the cache ----

def test_get_act_name_follows_transformer_lens():
    cases = {("pattern", 3): "blocks.3.attn.hook_pattern", ("attn", 3): "blocks.3.attn.hook_pattern",
             ("z", 1): "blocks.1.attn.hook_z", ("q", 0): "blocks.0.attn.hook_q",
             ("result", 2): "blocks.2.attn.hook_result",
             ("resid_pre", 0): "blocks.0.hook_resid_pre", ("resid_post", 4): "blocks.4.hook_resid_post",
             ("attn_out", 1): "blocks.1.hook_attn_out", ("mlp_out", 1): "blocks.1.hook_mlp_out",
             ("pre", 0): "blocks.0.mlp.hook_pre", ("post", 2): "blocks.2.mlp.hook_post",
             ("normalized", 1, "ln2"): "blocks.1.ln2.hook_normalized", ("normalized",): "ln_final.hook_normalized",
             ("embed",): "hook_embed", ("pos_embed",): "hook_pos_embed", ("z2",): "blocks.2.attn.hook_z",
             ("blocks.0.hook_resid_pre",): "blocks.0.hook_resid_pre"}
    for args, name in cases.items():
        assert headlab.get_act_name(*args) == name, args


def test_the_cache_is_a_dict_with_transformer_lens_keys(model):
    logits, cache = model.run_with_cache("the cat sat")
    assert isinstance(cache, dict) and isinstance(cache, headlab.ActivationCache)
    assert sorted(cache) == sorted(model.hook_names())
    for key, name in ((("pattern", 1), "blocks.1.attn.hook_pattern"), (("z", 0), "blocks.0.attn.hook_z"),
                      (("resid_pre", 1), "blocks.1.hook_resid_pre"), ("embed", "hook_embed"),
                      (("normalized", 0, "ln1"), "blocks.0.ln1.hook_normalized"),
                      ("normalized", "ln_final.hook_normalized"),
                      (("post", 1), "blocks.1.mlp.hook_post")):
        assert cache[key] is cache[name], key
        assert key in cache
    assert ("pattern", 7) not in cache and cache.get(("pattern", 7)) is None
    with pytest.raises(KeyError, match="no 'blocks.7.attn.hook_pattern' \\(for \\('pattern', 7\\)\\)"):
        cache["pattern", 7]
    _, some = model.run_with_cache("the cat", names=["blocks.1.hook_resid_pre"])
    with pytest.raises(headlab.Error, match="accumulated_resid: the cache has no 'blocks.0.hook_resid_pre'"):
        some.accumulated_resid()


def test_the_residual_helpers_are_the_cache_by_hand(model):
    sd = model.state_dict()
    w, b = sd["final_norm.scale"], sd["final_norm.shift"]
    logits, cache = model.run_with_cache(["the cat sat", "a dog"])
    final = cache["resid_post", 1]
    acc, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    np.testing.assert_array_equal(acc[1], cache["resid_pre", 1])
    np.testing.assert_array_equal(acc[2], final)
    # The logit lens: each stream through the final LayerNorm with its own scale, weight and bias.
    lens = cache.accumulated_resid(apply_ln=True)
    np.testing.assert_allclose(lens, norm_by_hand(acc, acc, w, b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lens[-1] @ sd["out_head.weight"].T, logits, rtol=1e-4, atol=1e-4)
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    np.testing.assert_allclose(parts.sum(0), final, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cache.decompose_resid(layer=1, mlp_input=True).sum(0), cache["resid_mid", 1],
                               rtol=1e-5, atol=1e-5)
    attn_only = ["embed", "pos_embed", "0_attn_out", "1_attn_out"]
    assert cache.decompose_resid(mode="attn", return_labels=True)[1] == attn_only
    heads, labels = cache.stack_head_results(return_labels=True)
    assert labels == ["L0H0", "L0H1", "L1H0", "L1H1"] and heads.shape == (4, 2, 11, 16)
    for l in range(2):
        np.testing.assert_allclose(heads[2 * l:2 * l + 2].sum(0) + sd[f"trf_blocks.{l}.att.out_proj.bias"],
                                   cache["attn_out", l], rtol=1e-5, atol=1e-5)
    rest, labels = cache.stack_head_results(layer=1, incl_remainder=True, pos_slice=-1, return_labels=True)
    assert labels == ["L0H0", "L0H1", "remainder"]
    np.testing.assert_allclose(rest.sum(0), cache["resid_pre", 1][:, -1], rtol=1e-5, atol=1e-5)
    # apply_ln: through the final norm frozen at the final stream, its weight and no bias.
    scaled = cache.stack_head_results(apply_ln=True)
    np.testing.assert_allclose(scaled, norm_by_hand(heads, final, w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cache.apply_ln_to_stack(heads), scaled, rtol=1e-6, atol=1e-7)
    at_last = cache.stack_head_results(pos_slice=-1)
    np.testing.assert_allclose(cache.apply_ln_to_stack(at_last, pos_slice=-1), scaled[:, :, -1], rtol=1e-6, atol=1e-7)
    # Layer 1's ln1 frozen at its input.
    ln1 = cache.accumulated_resid(layer=1, apply_ln=True)
    np.testing.assert_allclose(ln1, norm_by_hand(acc[:2], cache["resid_pre", 1], sd["trf_blocks.1.norm1.scale"]),
                               rtol=1e-4, atol=1e-5)
    # Direct logit attribution: the frozen norm's output along W_U[:, a] - W_U[:, b]; the pieces and the final
    # norm's bias make the logit difference itself.
    a, wrong = model.to_single_token("o"), model.to_single_token("a")
    W_U = model.W_U
    attrs = cache.logit_attrs(at_last, a, wrong, pos_slice=-1)  # (components, batch)
    np.testing.assert_allclose(attrs, (scaled[:, :, -1] * (W_U[:, a] - W_U[:, wrong])).sum(-1), rtol=1e-4, atol=1e-6)
    whole = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), "o", "a", pos_slice=-1).sum(0)
    np.testing.assert_allclose(whole + b @ (W_U[:, a] - W_U[:, wrong]), logits[:, -1, a] - logits[:, -1, wrong],
                               rtol=1e-4, atol=1e-4)
    per_row = cache.logit_attrs(heads, np.array([a, wrong]))  # one token a row, every position
    np.testing.assert_allclose(per_row[:, 1], (scaled[:, 1] * W_U[:, wrong]).sum(-1), rtol=1e-4, atol=1e-6)
    with pytest.raises(headlab.Error, match="pos_slice is one position"):
        cache.accumulated_resid(pos_slice=slice(0, 2))
    with pytest.raises(headlab.Error, match="apply_ln_to_stack: expected a stack"):
        cache.apply_ln_to_stack(at_last)


def test_an_rms_norm_model_and_the_logit_lens(stories):
    """stories260K (RMSNorm, no position embedding): the norms by their formula, and headlab.logit_lens (the C++
    run) equal to the cache's accumulated_resid through W_U."""
    sd = stories.state_dict()
    w = sd["final_norm.weight"]
    prompt = "Once upon a time there was a girl"
    logits, cache = stories.run_with_cache(prompt)
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[:3] == ["embed", "0_attn_out", "0_mlp_out"] and len(labels) == 11
    final = cache["resid_post", 4]
    np.testing.assert_allclose(parts.sum(0), final, rtol=1e-4, atol=1e-4)
    acc = cache.accumulated_resid()
    lens = cache.accumulated_resid(apply_ln=True)
    np.testing.assert_allclose(lens, norm_by_hand(acc, acc, w, centre=False), rtol=1e-4, atol=1e-4)
    heads = cache.stack_head_results(pos_slice=-1, apply_ln=True)
    np.testing.assert_allclose(heads, norm_by_hand(cache.stack_head_results(pos_slice=-1), final[:, -1], w,
                                                   centre=False), rtol=1e-4, atol=1e-5)
    r = headlab.logit_lens(stories, prompt)
    tokens = stories.to_tokens(prompt)[0]
    assert r["rows"] == ["0_pre", "1_pre", "2_pre", "3_pre", "4_pre", "final_post"]
    assert r["tokens"] == stories.to_str_tokens(prompt) and r["prob"].shape == (6, len(tokens) - 1)
    readout = lens[:, 0, :-1] @ stories.W_U  # (rows, T - 1, vocab)
    nxt = tokens[1:]
    p = softmax(readout)[:, np.arange(len(nxt)), nxt]
    np.testing.assert_allclose(r["prob"], p, rtol=1e-3, atol=1e-6)
    ranks = (readout > readout[:, np.arange(len(nxt)), nxt][..., None]).sum(-1)
    assert np.abs(r["rank"] - ranks).max() <= 1  # float32 near-ties at most
    np.testing.assert_allclose(r["prob"][-1], softmax(logits[0, :-1])[np.arange(len(nxt)), nxt], rtol=1e-4)
    with pytest.raises(headlab.Error, match="logit_lens: needs at least 2 tokens"):
        headlab.logit_lens(stories, np.array([[1]]))


# ---- text in, loss, generation ----

def test_the_model_takes_text_and_batches_and_gives_its_loss(model):
    np.testing.assert_array_equal(model("the cat"), model(model.to_tokens("the cat")))
    batch = model.to_tokens(["the cat", "a"])
    assert batch.shape == (2, 7) and (batch[1, 1:] == 0).all()  # padded on the right with 0 (no EOS)
    logits = model(["the cat", "a"])
    np.testing.assert_allclose(logits[1, :1], model("a")[0], rtol=1e-5, atol=1e-6)  # causal: padding unseen
    tokens = model.to_tokens("the cat sat")
    lp = np.log(softmax(model(tokens)[0].astype(np.float64)))
    by_hand = -lp[np.arange(10), tokens[0, 1:]].mean()
    assert model(tokens, return_type="loss") == pytest.approx(by_hand, rel=1e-5)
    both_logits, loss = model(["the cat sat", "a dog"], return_type="both")
    first = -np.log(softmax(both_logits[0].astype(np.float64)))[np.arange(10), tokens[0, 1:]]
    dog = model.to_tokens("a dog")[0]
    second = -np.log(softmax(both_logits[1, :4].astype(np.float64)))[np.arange(4), dog[1:]]
    assert loss == pytest.approx(np.concatenate([first, second]).mean(), rel=1e-5)  # padding left out
    assert model("the cat", return_type=None) is None
    with pytest.raises(headlab.Error, match="return_type is 'logits', 'loss', 'both' or None, not 'probs'"):
        model("the cat", return_type="probs")
    with pytest.raises(headlab.Error, match="the loss needs at least 2 tokens"):
        model("t", return_type="loss")
    with pytest.raises(headlab.Error, match="a list of inputs must hold texts, got int"):
        model(["the", 3])


def generate_cli(path, prompt, *args, tokenizer=None):
    extra = ["--tokenizer", tokenizer] if tokenizer else []
    r = subprocess.run([BINARY, "generate", path, "--prompt", prompt, *extra, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1]  # the command's newline


def test_generate_is_the_commands(model, checkpoint):
    text = model.generate("the c", max_new_tokens=12)
    assert text == generate_cli(checkpoint, "the c", "--max-new-tokens", "12") and len(text) == 17
    sampled = model.generate("the c", max_new_tokens=12, temperature=0.8, top_k=5, seed=3)
    assert sampled == generate_cli(checkpoint, "the c", "--max-new-tokens", "12", "--temperature", "0.8",
                                   "--top-k", "5", "--seed", "3")
    tokens = model.generate(model.to_tokens("the c"), max_new_tokens=12)  # tokens in: the prompt's and the new ones
    assert tokens.shape == (1, 17) and model.to_string(tokens) == text
    rows = model.generate(np.concatenate([model.to_tokens("the c"), model.to_tokens("a dog")]), max_new_tokens=3)
    assert model.to_string(rows[0]) == model.generate("the c", max_new_tokens=3)


def test_stories260k_generates_its_published_story_as_the_command_does(stories):
    with open(stories_path("README.md")) as f:
        story = re.search(r"```\n(.*?)\n```", f.read(), re.S)[1]
    text = stories.generate("", max_new_tokens=256)
    assert text == story
    assert text == generate_cli(stories_path(), "", "--max-new-tokens", "256", tokenizer=stories_path("tok512.bin"))
    ids = stories.generate(stories.to_tokens(""), max_new_tokens=256)
    assert ids[0, 0] == 1 and stories.to_string(ids) == story and stories.eos_token_id == 2


def test_generation_stops_at_the_end_token(tmp_path):
    """A reverse-task GPT made to always predict its end token (final norm's scale 0, its shift and that one
    unembedding row the same vector): token ids in, the prompt and the end token out (TransformerLens keeps it);
    stop_at_eos=False runs on."""
    subprocess.run([BINARY, "train", "--task", "reverse", "--n-layers", "1", "--n-heads", "2", "--emb-dim", "16",
                    "--batch-size", "4", "--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--threads", "1",
                    "--out", str(tmp_path)], check=True, capture_output=True)
    m = headlab.load(str(tmp_path / "checkpoint.h5"))
    end, sd = m.eos_token_id, m.state_dict()
    assert end is not None
    sd["final_norm.scale"][...] = 0
    sd["final_norm.shift"][...] = 1
    sd["out_head.weight"][...] = 0
    sd["out_head.weight"][end] = 1  # logit 16 for the end token, 0 for the others
    prompt = m.to_tokens("12345")
    assert (m.generate(prompt, max_new_tokens=5) == np.append(prompt[0], end)).all()
    assert (m.generate(prompt, max_new_tokens=5, stop_at_eos=False)[0, -5:] == end).all()


# ---- gradients ----

@pytest.fixture(scope="module")
def model64(checkpoint):
    return headlab.load(checkpoint).to("float64")


def test_gradients_at_hook_points_are_central_differences(model64):
    torch = pytest.importorskip("torch")
    tokens = model64.to_tokens("the cat sat")
    a, wrong = model64.to_single_token("o"), model64.to_single_token("a")

    def metric(logits):
        return logits[0, -1, a] - logits[0, -1, wrong] + 0.1 * torch.log_softmax(logits, -1)[0, 3:7, a].sum()

    names = ["hook_embed", "hook_pos_embed", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z",
             "blocks.0.hook_resid_mid", "blocks.1.mlp.hook_pre", "blocks.1.hook_resid_post",
             "ln_final.hook_normalized", "blocks.1.hook_q_input"]
    logits, cache, grads = model64.run_with_cache(tokens, names=["blocks.1.attn.hook_z"], backward=metric,
                                                  backward_names=names)
    assert logits.dtype == np.float64 and sorted(grads) == sorted(names)
    assert isinstance(grads, headlab.ActivationCache) and grads["z", 1] is grads["blocks.1.attn.hook_z"]
    value = lambda lg: float(metric(torch.from_dlpack(lg)))  # noqa: E731
    rng = np.random.default_rng(0)
    for name in names:
        u = rng.standard_normal(grads[name].shape)
        eps = 1e-5

        def moved(by, name=name, u=u):
            return value(model64.run_with_hooks(tokens, {name: lambda x, n: x + by * u}))
        numeric = (moved(eps) - moved(-eps)) / (2 * eps)
        assert (grads[name] * u).sum() == pytest.approx(numeric, rel=1e-6, abs=1e-9), name
    # d metric / d logits as an array gives the same gradients.
    t = torch.from_dlpack(logits.copy()).requires_grad_(True)
    metric(t).backward()
    _, _, again = model64.run_with_cache(tokens, names=names[:2], backward=t.grad.numpy())
    np.testing.assert_allclose(again["hook_embed"], grads["hook_embed"], rtol=1e-12, atol=1e-14)
    with pytest.raises(headlab.Error, match="the metric must return one number"):
        model64.run_with_cache(tokens, names=names[:1], backward=lambda lg: lg[0, -1])
    with pytest.raises(headlab.Error, match="d metric / d logits must have the logits' shape"):
        model64.run_with_cache(tokens, names=names[:1], backward=np.zeros(3))


def test_attribution_patching_estimates_patching_each_head(model64):
    """grad . (corrupt - clean) at each head's hook_z, the clean run's gradient of the logit difference, against
    patching that head's z from the corrupted prompt: exact as the patch shrinks, and close at the whole patch on this
    small model (linear enough)."""
    torch = pytest.importorskip("torch")
    clean, corrupt = model64.to_tokens("and the cat s"), model64.to_tokens("and the dog s")
    a, wrong = model64.to_single_token("a"), model64.to_single_token("o")

    def metric(logits):
        return logits[0, -1, a] - logits[0, -1, wrong]
    names = ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    logits, clean_cache, grads = model64.run_with_cache(clean, names=names, backward=metric)
    _, corrupt_cache = model64.run_with_cache(corrupt, names=names)
    base = float(metric(torch.from_dlpack(logits)))
    estimates, actual = [], []
    for layer in range(2):
        for head in range(2):
            delta = corrupt_cache["z", layer][:, :, head] - clean_cache["z", layer][:, :, head]
            estimate = float((grads["z", layer][:, :, head] * delta).sum())

            def patched(alpha, layer=layer, head=head, delta=delta):
                def hook(z, name):
                    z[:, :, head] += alpha * delta
                lg = model64.run_with_hooks(clean, {f"blocks.{layer}.attn.hook_z": hook})
                return float(metric(torch.from_dlpack(lg)))
            alpha = 1e-4
            assert (patched(alpha) - patched(-alpha)) / (2 * alpha) == pytest.approx(estimate, rel=1e-6, abs=1e-9)
            estimates.append(estimate)
            actual.append(patched(1.0) - base)
    np.testing.assert_allclose(estimates, actual, rtol=0.1, atol=1e-3 * np.abs(actual).max())


# ---- tokens that do not depend on the tokenizer's file ----

TEXTS = ["Tim", " Tim", "Once upon a time", "", "  two spaces"]


def cli_tokens(model, tokenizer, text, bos):
    r = subprocess.run([BINARY, "tokenize", model, "--tokenizer", tokenizer, "--prompt", text] +
                       ([] if bos else ["--no-bos"]), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


def test_tokens_are_the_same_whichever_tokenizer_file():
    """tok512.bin (llama2.c's encoder) and tok512.model (SentencePiece, which collapses runs of spaces) give the same
    tokens, in Python and on the command line, through one function (TextTokenizer::encode_prompt); Llama 2's
    vocabulary, whose model keeps runs of spaces, keeps them in both its files."""
    bin_model = headlab.load(stories_path(), tokenizer=stories_path("tok512.bin"))
    sp_model = headlab.load(stories_path(), tokenizer=stories_path("tok512.model"))
    for text in TEXTS:
        for bos in (True, False):
            ours = bin_model.to_tokens(text, prepend_bos=bos)[0].tolist()
            assert sp_model.to_tokens(text, prepend_bos=bos)[0].tolist() == ours, (text, bos)
            for tok in ("tok512.bin", "tok512.model"):
                assert cli_tokens(stories_path(), stories_path(tok), text, bos) == ours, (text, bos, tok)
    assert bin_model.to_str_tokens(bin_model.to_tokens(" Tim", prepend_bos=False)) == [" Tim"]
    assert bin_model.to_single_token(" Tim") == bin_model.to_single_token("Tim") == 326
    assert bin_model.to_tokens("  two spaces")[0].tolist() == bin_model.to_tokens("two spaces")[0].tolist()
    if not os.path.exists(os.path.join(LLAMA2_TOKENIZER, "tokenizer.bin")):
        pytest.skip(f"{LLAMA2_TOKENIZER} is absent (../shared/models)")
    for text in TEXTS + ["a  b "]:
        ids = [cli_tokens(LLAMA2_TOKENIZER, os.path.join(LLAMA2_TOKENIZER, f), text, False)
               for f in ("tokenizer.bin", "tokenizer.model")]
        assert ids[0] == ids[1], text
    assert len(cli_tokens(LLAMA2_TOKENIZER, os.path.join(LLAMA2_TOKENIZER, "tokenizer.bin"), "a  b", False)) == 3


# ---- the tour ----

def test_the_tour_gives_headlabs_own_direct_logit_attribution(stories, python_env, tmp_path):
    """examples/python/tour.py on stories260K (RMSNorm): every head's direct logit attribution equals what
    `headlab heads --pairs` computes for the same prompt (its clean prompt), L4H7 among them."""
    prompt, answer, wrong = "Tim and Lily went to the park. Lily gave the ball to", " Tim", " Lily"
    r = subprocess.run([sys.executable, TOUR, stories_path(), prompt, answer, wrong, stories_path("tok512.bin")],
                       capture_output=True, text=True, env=python_env)
    assert r.returncode == 0, r.stderr
    matrix = r.stdout.split("direct logit attribution (layer x head):\n")[1].split("largest:")[0]
    tour = np.array([float(x) for x in re.findall(r"-?\d+\.\d+", matrix)]).reshape(5, 8)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": prompt, "corrupt": prompt.replace(". Lily", ". Tim"), "answer": answer,
                                 "wrong": wrong}) + "\n")
    own = headlab.heads(stories, pairs=str(pairs))
    assert own["heads"][39] == "L4H7"
    np.testing.assert_allclose(tour.ravel(), own["dla_logits"], atol=6e-4)  # the tour prints 3 decimals
    assert tour[4, 7] == pytest.approx(-0.083, abs=1e-3)
