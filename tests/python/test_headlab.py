"""The Python module (python/module.cpp): loading, tokens, parameters without copies, the forward with
hook points, DLPack, errors; and a hook that ablates a head against the batched engine of `headlab heads`.
Run by ctest (label python) with PYTHONPATH=build/python and HEADLAB_BINARY=build/headlab."""
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import headlab

from conftest import BINARY, STORIES, TEXT, TOUR


@pytest.fixture(scope="module")
def model(checkpoint):
    return headlab.load(checkpoint)


def pointer(a):
    return a.__array_interface__["data"][0]


def test_config_tokens_and_errors(model, checkpoint):
    assert model.config["n_layers"] == 2 and model.config["n_heads"] == 2
    assert model.task == "chars" and model.path == checkpoint
    tokens = model.to_tokens("the cat")
    assert tokens.dtype == np.int64 and tokens.shape == (1, 7)
    assert model.to_string(tokens) == "the cat"
    assert model.to_str_tokens("the cat") == list("the cat")
    with pytest.raises(headlab.Error, match="missing.h5"):
        headlab.load(os.path.join(os.path.dirname(checkpoint), "missing.h5"))
    with pytest.raises(headlab.Error, match="tokens must be integers, got float64"):
        model(np.zeros((1, 3)))
    with pytest.raises(headlab.Error, match="no hook point 'blocks.7.hook_resid_pre'"):
        model.run_with_cache(tokens, names=["blocks.7.hook_resid_pre"])
    with pytest.raises(headlab.Error, match="returned"):
        model.run_with_hooks(tokens, {"hook_embed": lambda x, name: x[:, :2]})


def test_cache_holds_what_was_asked_and_the_logits_follow_from_it(model):
    tokens = model.to_tokens("the cat sat on")
    names = model.hook_names()
    assert names[0] == "hook_embed" and names[-1] == "ln_final.hook_normalized"
    assert "blocks.1.attn.hook_pattern" in names and "blocks.0.hook_mlp_out" in names
    logits, cache = model.run_with_cache(tokens, names=["blocks.1.attn.hook_pattern", "ln_final.hook_normalized"])
    assert sorted(cache) == ["blocks.1.attn.hook_pattern", "ln_final.hook_normalized"]
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.shape == (1, 2, 14, 14)
    np.testing.assert_allclose(pattern.sum(-1), 1, rtol=1e-5)
    assert np.all(np.triu(pattern[0, 0], 1) == 0)  # causal
    np.testing.assert_allclose(logits, model(tokens), rtol=1e-6, atol=1e-6)
    # The logits are the unembedding of the final norm's output, by the state_dict's own names.
    sd = model.state_dict()
    head = cache["ln_final.hook_normalized"] @ sd["out_head.weight"].T
    np.testing.assert_allclose(head, logits, rtol=1e-4, atol=1e-5)
    _, everything = model.run_with_cache(tokens)
    assert sorted(everything) == sorted(names)


def test_arrays_cross_without_copies(model):
    sd = model.state_dict()
    w = sd["out_head.weight"]
    assert sd["out_head.weight"].__array_interface__["data"][0] == pointer(w)  # the model's own memory
    tokens = model.to_tokens("the cat")
    before = model(tokens)
    saved = w.copy()
    w[...] = 0  # writing into the array changes the model
    assert np.abs(model(tokens)).max() < 1e-6
    w[...] = saved
    np.testing.assert_array_equal(model(tokens), before)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert pointer(headlab._roundtrip(a)) == pointer(a)  # a NumPy array into a tensor and back
    strided = a[:, ::2]  # not contiguous: the one case that copies
    b = headlab._roundtrip(strided)
    assert pointer(b) != pointer(a)
    np.testing.assert_array_equal(b, strided)


def test_dlpack_round_trip_with_torch(model):
    torch = pytest.importorskip("torch")
    logits = model(model.to_tokens("the cat"))
    t = torch.from_dlpack(logits)  # headlab's array into PyTorch, same memory
    assert t.data_ptr() == pointer(logits)
    back = headlab.as_array(t)  # and back
    assert pointer(back) == t.data_ptr()
    assert pointer(headlab._roundtrip(back)) == pointer(logits)


def test_a_hook_zeroing_a_head_is_the_batched_engines_zero_ablation(model, checkpoint, tmp_path):
    # Prompt pairs of equal length; the command's heads analysis ablates every head in its batched engine.
    rows = [("the cat sat", "a dog ran t", "o", "a"),
            ("and then he", "but so we w", " ", "o"),
            ("it was the ", "we had a bi", "b", "n")]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"clean": c, "corrupt": x, "answer": a, "wrong": w}) + "\n"
                             for c, x, a, w in rows))
    subprocess.run([BINARY, "heads", checkpoint, "--pairs", str(pairs), "--threads", "1", "--out", str(tmp_path / "h")],
                   check=True, capture_output=True)
    with open(tmp_path / "h" / "heads.csv") as f:
        engine = {r["head"]: float(r["zero_ablation"]) for r in csv.DictReader(f)}

    def logit_difference(prompts, hooks=None):
        out = []
        for (c, x, a, w), prompt in zip(rows, prompts):
            tokens = model.to_tokens(prompt)
            logits = model.run_with_hooks(tokens, hooks) if hooks else model(tokens)
            ids = model.to_tokens(a + w)[0]
            out.append(logits[0, -1, ids[0]] - logits[0, -1, ids[1]])
        return float(np.mean(out))

    clean, corrupt = logit_difference([r[0] for r in rows]), logit_difference([r[1] for r in rows])
    for layer in range(2):
        for head in range(2):
            def zero(z, name, head=head):
                z[:, :, head, :] = 0  # in place, on the forward's own tensor
            ablated = logit_difference([r[0] for r in rows], {f"blocks.{layer}.attn.hook_z": zero})
            ours = (ablated - corrupt) / (clean - corrupt) - 1
            assert ours == pytest.approx(engine[f"L{layer}H{head}"], abs=1e-5), (layer, head)


def test_the_example_runs(checkpoint, python_env):
    r = subprocess.run([sys.executable, TOUR,
                        checkpoint, "the cat sat", "o", "a"], capture_output=True, text=True,
                       env=python_env)
    assert r.returncode == 0, r.stderr
    for line in ("11 tokens:", "logit difference 'o' - 'a':", "zero-ablating L1H1:", "direct logit attribution",
                 "largest: L"):
        assert line in r.stdout, r.stdout


def test_heads_and_circuit_give_the_commands_figures(model, checkpoint, tmp_path):
    out = tmp_path / "h"
    # The command with the module's thread count (every core), so that their sums run in one order.
    subprocess.run([BINARY, "heads", checkpoint, "--task", "induction", "--rows", "8", "--by-position", "--out", str(out)],
                   check=True, capture_output=True)
    with open(out / "heads.csv") as f:
        rows = list(csv.DictReader(f))
    r = headlab.heads(model, task="induction", rows=8, by_position=True)
    assert r["heads"] == [row["head"] for row in rows]
    for column in ("zero_ablation", "mean_ablation", "resample_ablation", "denoising", "dla_logits"):
        np.testing.assert_allclose(r[column], [float(row[column]) for row in rows], rtol=1e-5, atol=1e-5,
                                   err_msg=column)
    T = r["denoising_by_position"].shape[1]
    assert r["noising_by_position"].shape == (len(rows), T) and T == 15  # 8 tokens, then all but the last
    with pytest.raises(headlab.Error, match="--task is induction, ioi or greater-than, not 'sort'"):
        headlab.heads(model, task="sort")

    subprocess.run([BINARY, "circuit", checkpoint, "--task", "induction", "--rows", "8", "--check-edges", "0",
                    "--out", str(tmp_path / "c")], check=True, capture_output=True)
    with open(tmp_path / "c" / "circuit.json") as f:
        cli = json.load(f)
    c = headlab.circuit(model, task="induction", rows=8)
    kept = {(e["sender"], e["receiver"]) for e in c["edges"] if e["kept"]}
    named = {(e["sender"], e["receiver"] + ("." + e["input"] if e["input"] in ("q", "k", "v") else ""))
             for e in cli["edges"]}  # circuit.json names the receiving node and its input apart
    assert kept and kept == named
    assert c["metric"] == pytest.approx(cli["metric"]["circuit"], abs=1e-6)


def test_train_runs_the_command_and_reports_progress(tmp_path):
    events = []
    checkpoint = headlab.train(task="chars", text=TEXT, n_layers=1, n_heads=2, emb_dim=16, context_length=16,
                               batch_size=2, steps=4, eval_every=2, eval_batches=1, log_every=1, threads=1,
                               out=str(tmp_path / "run"), callback=events.append)
    assert checkpoint == str(tmp_path / "run" / "checkpoint.h5") and os.path.isfile(checkpoint)
    steps = [e for e in events if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4] and all(e["steps"] == 4 for e in steps)
    assert [e["step"] for e in events if "val_loss" in e] == [2, 4]
    assert headlab.load(checkpoint).config["n_layers"] == 1
    with pytest.raises(headlab.Error, match="--steps"):
        headlab.train(task="chars", text=TEXT, steps=-1, out=str(tmp_path / "bad"))


def test_ablate_and_attention_give_the_commands_figures(model, checkpoint, tmp_path):
    subprocess.run([BINARY, "ablate", checkpoint, "--batches", "1", "--batch-size", "4", "--repeats", "1",
                    "--out", str(tmp_path / "a")], check=True, capture_output=True)
    with open(tmp_path / "a" / "heads.csv") as f:
        rows = list(csv.DictReader(f))
    r = headlab.ablate(model, batches=1, batch_size=4)
    assert r["heads"] == [f"L{row['layer']}H{row['head']}" for row in rows]
    for column in ("zero_delta_loss", "mean_delta_loss", "resample_delta_loss", "importance", "importance_raw"):
        np.testing.assert_allclose(r[column], [float(row[column]) for row in rows], rtol=1e-5, atol=1e-6,
                                   err_msg=column)
    a = headlab.attention(model, "the cat sat")
    assert a["tokens"] == list("the cat sat") and a["layers"] == ["L0", "L1"]
    assert a["weights"].shape == (2, 2, 11, 11)
    _, cache = model.run_with_cache(model.to_tokens("the cat sat"), names=["blocks.1.attn.hook_pattern"])
    np.testing.assert_allclose(a["weights"][1], cache["blocks.1.attn.hook_pattern"][0], rtol=1e-5, atol=1e-6)


def test_a_grouped_query_model_has_transformer_lens_names_and_shapes():
    """stories260K (8 query heads sharing 4 key/value heads, rotary): hook_k and hook_v hold the key/value
    heads, hook_rot_q and hook_rot_k the rotated queries and keys, and the pattern one row per query head."""
    if not os.path.exists(os.path.join(STORIES, "stories260K.bin")):
        pytest.skip(f"{STORIES} is absent (../shared/models)")
    m = headlab.load(os.path.join(STORIES, "stories260K.bin"), tokenizer=os.path.join(STORIES, "tok512.bin"))
    assert m.config["n_kv_heads"] == 4 and m.config["n_heads"] == 8
    tokens = m.to_tokens("Once upon a time")
    names = m.hook_names()
    assert "blocks.0.attn.hook_rot_q" in names and "hook_pos_embed" not in names
    logits, cache = m.run_with_cache(tokens, names=["blocks.2.attn.hook_k", "blocks.2.attn.hook_rot_q",
                                                    "blocks.2.attn.hook_pattern", "blocks.2.attn.hook_v"])
    T = tokens.shape[1]
    assert cache["blocks.2.attn.hook_k"].shape == (1, T, 4, 8)
    assert cache["blocks.2.attn.hook_v"].shape == (1, T, 4, 8)
    assert cache["blocks.2.attn.hook_rot_q"].shape == (1, T, 8, 8)
    assert cache["blocks.2.attn.hook_pattern"].shape == (1, 8, T, T)
    # Asking for the pattern runs the composite attention (the weights materialised) instead of the fused kernel.
    np.testing.assert_allclose(logits, m(tokens), rtol=1e-5, atol=2e-5)
    with pytest.raises(headlab.Error, match="--tokenizer FILE"):
        headlab.load(os.path.join(STORIES, "stories260K.bin"))


def test_patching_a_key_value_group_is_patching_its_hook_k_and_hook_v():
    """stories260K on a prompt pair: heads(by='kv-group') patches a group's shared keys and values from the
    corrupted prompt; done by hand with hooks on hook_k and hook_v at that key/value head, the same metric."""
    if not os.path.exists(os.path.join(STORIES, "stories260K.bin")):
        pytest.skip(f"{STORIES} is absent (../shared/models)")
    m = headlab.load(os.path.join(STORIES, "stories260K.bin"), tokenizer=os.path.join(STORIES, "tok512.bin"))
    rows = [("Tim and Lily went to the park. Lily gave the ball to",
             "Tim and Lily went to the park. Tim gave the ball to", " Tim", " Lily"),
            ("Lily and Tim went to the park. Tim gave the ball to",
             "Lily and Tim went to the park. Lily gave the ball to", " Lily", " Tim")]
    with tempfile.TemporaryDirectory() as tmp:
        pairs = os.path.join(tmp, "pairs.jsonl")
        with open(pairs, "w") as f:
            f.write("".join(json.dumps({"clean": c, "corrupt": x, "answer": a, "wrong": w}) + "\n"
                            for c, x, a, w in rows))
        r = headlab.heads(m, pairs=pairs, by="kv-group")
    assert len(r["kv_groups"]) == 5 * 4 and r["kv_groups"][5] == "L1G1"
    # Each row's answer and wrong token: the last token of the clean prompt followed by the name.
    ids = [(m.to_tokens(c + a)[0][-1], m.to_tokens(c + w)[0][-1]) for c, _, a, w in rows]

    def logit_difference(row, prompt, hooks=None):
        tokens = m.to_tokens(prompt)
        logits = m.run_with_hooks(tokens, hooks) if hooks else m(tokens)
        return logits[0, -1, ids[row][0]] - logits[0, -1, ids[row][1]]

    clean = np.mean([logit_difference(i, row[0]) for i, row in enumerate(rows)])
    corrupt = np.mean([logit_difference(i, row[1]) for i, row in enumerate(rows)])
    for g in (5, 17, 18):  # L1G1, L4G1, L4G2
        layer, group = g // 4, g % 4
        names = [f"blocks.{layer}.attn.hook_k", f"blocks.{layer}.attn.hook_v"]
        patched = []
        for i, (c, x, _, _) in enumerate(rows):
            _, cache = m.run_with_cache(m.to_tokens(x), names=names)

            def patch(t, name, cache=cache):
                t[:, :, group, :] = cache[name][:, :, group, :]  # in place: the group's keys or values
            patched.append(logit_difference(i, c, {n: patch for n in names}))
        ours = (np.mean(patched) - corrupt) / (clean - corrupt) - 1
        assert ours == pytest.approx(r["kv_resample"][g], abs=1e-4), r["kv_groups"][g]


def test_a_gpt_neox_model_has_transformer_lens_names(tmp_path):
    """A GPT-NeoX model (--arch neox: the parallel residual, rotary on a quarter of each head): no hook_resid_mid,
    since the MLP reads the block's input; the residual stream after a block is its input plus the attention's and
    the MLP's outputs; the rotated queries are there."""
    subprocess.run([BINARY, "train", "--task", "reverse", "--arch", "neox", "--n-layers", "2", "--n-heads", "2",
                    "--emb-dim", "32", "--batch-size", "4", "--steps", "2", "--eval-every", "2", "--eval-batches", "1",
                    "--threads", "1", "--out", str(tmp_path)], check=True, capture_output=True)
    m = headlab.load(str(tmp_path / "checkpoint.h5"))
    assert m.config["arch"] == "neox" and m.config["parallel_residual"]
    names = m.hook_names()
    assert "blocks.0.hook_resid_mid" not in names and "blocks.0.attn.hook_rot_q" in names
    tokens = np.array([[1, 2, 3, 4, 5]], dtype=np.int64)
    logits, cache = m.run_with_cache(tokens, names=["blocks.1.hook_resid_pre", "blocks.1.hook_attn_out",
                                                    "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"])
    np.testing.assert_allclose(cache["blocks.1.hook_resid_post"],
                               cache["blocks.1.hook_resid_pre"] + cache["blocks.1.hook_attn_out"]
                               + cache["blocks.1.hook_mlp_out"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, m(tokens), rtol=1e-5, atol=2e-5)
