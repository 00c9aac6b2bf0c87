"""Sparse autoencoders from Python with SAELens's names: SAE.load_from_disk, encode and decode against NumPy from
the saved weights (every architecture, both of SAELens's layouts, transcoders), Model.run_with_saes /
run_with_cache_with_saes on stories260K with an SAE `headlab sae train` wrote, headlab.sae.train (an SAE and a
transcoder from one run) and headlab.sae.features (pre-activations split over heads)."""
import os
import subprocess

import numpy as np
import pytest

import headlab
from conftest import BINARY, HERE, STORIES, TEXT, stories_path

FIXTURES = os.path.join(HERE, "..", "fixtures", "sae")


def numpy_encode(sae, x):
    """SAELens's maths, from the weights as the SAE holds them."""
    cfg = sae.cfg
    pre = (x - sae.b_dec if cfg["apply_b_dec_to_input"] else x) @ sae.W_enc + sae.b_enc
    if cfg["architecture"].startswith("topk"):
        keep = np.argsort(-pre, axis=-1, kind="stable")[:, :cfg["k"]]
        f = np.zeros_like(pre)
        np.put_along_axis(f, keep, np.take_along_axis(pre, keep, -1), -1)
        return np.maximum(f, 0)
    if cfg["architecture"].startswith("jumprelu"):
        return np.where(pre > sae.threshold, np.maximum(pre, 0), 0)
    return np.maximum(pre, 0)


@pytest.mark.parametrize("name", ["relu_v5", "relu_v6", "topk_v5", "topk_v6", "jumprelu_v5", "jumprelu_v6",
                                  "transcoder_v6", "jumprelu_transcoder_v6"])
def test_encode_decode_match_numpy_from_the_saved_weights(name):
    sae = headlab.SAE.load_from_disk(os.path.join(FIXTURES, name))
    x = np.random.default_rng(0).normal(size=(7, sae.cfg["d_in"])).astype(np.float32)
    f = sae.encode(x)
    np.testing.assert_allclose(f, numpy_encode(sae, x), atol=1e-5)
    np.testing.assert_allclose(sae.decode(f), f @ sae.W_dec + sae.b_dec, atol=1e-5)
    np.testing.assert_allclose(sae(x), sae.decode(f), atol=1e-6)
    assert sae.cfg["hook_name"].startswith("blocks.")


def test_a_damaged_folder_is_refused_by_name(tmp_path):
    with pytest.raises(headlab.Error, match="does not exist"):
        headlab.SAE.load_from_disk(str(tmp_path / "absent"))


def test_run_with_saes_splices_the_reconstruction(tmp_path):
    model_file = stories_path()
    out = tmp_path / "saes"
    subprocess.run([BINARY, "sae", "train", model_file, "--tokenizer", os.path.join(STORIES, "tok512.model"),
                    "--text", TEXT, "--hook", "blocks.1.hook_resid_post", "--arch", "topk", "--k", "8",
                    "--expansion", "2", "--training-tokens", "2048", "--batch-size", "256", "--buffer-rows", "1024",
                    "--tokens", "32", "--threads", "1", "--out", str(out)], check=True, capture_output=True)
    sae = headlab.SAE.load_from_disk(str(out / "blocks.1.hook_resid_post"))
    model = headlab.load(model_file, tokenizer=os.path.join(STORIES, "tok512.bin"))
    tokens = model.to_tokens("Once upon a time, there was a little girl named Lily.")
    _, clean = model.run_with_cache(tokens, names=["blocks.1.hook_resid_post"])
    resid = clean["blocks.1.hook_resid_post"]
    logits, cache = model.run_with_cache_with_saes(tokens, saes=[sae])
    feats = cache["blocks.1.hook_resid_post.hook_sae_acts_post"]
    assert feats.shape == resid.shape[:2] + (sae.cfg["d_sae"],)
    np.testing.assert_allclose(feats.reshape(-1, sae.cfg["d_sae"]), sae.encode(resid.reshape(-1, 64)), atol=1e-5)
    assert ((feats > 0).sum(-1) <= 8).all()
    by_hand = model.run_with_hooks(tokens, {"blocks.1.hook_resid_post": lambda a, n: sae(a.reshape(-1, 64)).reshape(a.shape)})
    np.testing.assert_allclose(model.run_with_saes(tokens, saes=[sae]), by_hand, atol=1e-5)
    np.testing.assert_allclose(logits, by_hand, atol=1e-5)
    assert np.abs(logits - model(tokens)).max() > 0  # the splice changes the logits


def test_sae_train_writes_an_sae_and_a_transcoder_and_features_split_over_heads(tmp_path):
    model_file = stories_path()
    model = headlab.load(model_file, tokenizer=os.path.join(STORIES, "tok512.bin"))
    events = []
    saes = headlab.sae.train(model, hooks=["blocks.1.attn.hook_z"],
                             transcoders=[("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out")],
                             tokenizer=os.path.join(STORIES, "tok512.model"), text=TEXT, arch="topk", k=8,
                             expansion=2, training_tokens=4096, batch_size=256, buffer_rows=1024, tokens=32,
                             log_every=8, eval_every=8, eval_tokens=256, threads=1, out=str(tmp_path / "saes"),
                             callback=events.append)
    assert [s.cfg["hook_name"] for s in saes] == ["blocks.1.attn.hook_z", "blocks.1.ln2.hook_normalized"]
    assert saes[1].cfg["hook_name_out"] == "blocks.1.hook_mlp_out" and saes[1].cfg["architecture"] == "topk_transcoder"
    assert saes[0].path.endswith("blocks.1.attn.hook_z")
    assert any(e.get("step") == 8 and e.get("tokens") == 2048 for e in events)
    assert any(e.get("held_out") for e in events)

    # the transcoder spliced in: the MLP's output replaced by its reconstruction from the MLP's input
    tokens = model.to_tokens("Once upon a time, there was a little girl named Lily.")
    _, clean = model.run_with_cache(tokens, names=["blocks.1.ln2.hook_normalized"])
    x = clean["blocks.1.ln2.hook_normalized"]
    by_hand = model.run_with_hooks(
        tokens, {"blocks.1.hook_mlp_out": lambda a, n: saes[1](x.reshape(-1, 64)).reshape(a.shape)})
    np.testing.assert_allclose(model.run_with_saes(tokens, saes=[saes[1]]), by_hand, atol=1e-5)

    report = headlab.sae.features(model, saes[0], "Once upon a time, Lily saw a big dog.", features=3)
    assert report["hook_name"] == "blocks.1.attn.hook_z" and len(report["features"]) == 3
    for f in report["features"]:
        assert sorted(f["parts"]) == [f"L1H{h}" for h in range(8)]
        assert sum(f["parts"].values()) + f["bias"] == pytest.approx(f["pre_activation"], abs=1e-4)
        assert f["activations"][f["position"]] == f["activation"] > 0
        assert len(f["head_shares"]) == 8 and len(f["top_logits"]) == 5
    one = headlab.sae.features(model, saes[0], tokens, feature=report["features"][0]["feature"], position=-1)
    assert [f["feature"] for f in one["features"]] == [report["features"][0]["feature"]]
    assert one["features"][0]["position"] == tokens.shape[1] - 1
    page = headlab.sae.pages(model, saes[0], out=str(tmp_path / "features.html"), text=TEXT, batches=2, tokens=32,
                             features=3, tokenizer=os.path.join(STORIES, "tok512.model"))
    html = open(page).read()
    assert "const D = " in html and "Top activating contexts" in html and "https://" not in html
    with pytest.raises(headlab.Error, match="sae train: --transcoder IN:OUT reads and reconstructs one hook|that is an SAE"):
        headlab.sae.train(model, transcoders=[("hook_embed", "hook_embed")], text=TEXT,
                          tokenizer=os.path.join(STORIES, "tok512.model"), out=str(tmp_path / "x"))
