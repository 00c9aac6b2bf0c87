"""Sparse autoencoders from Python with SAELens's names: SAE.load_from_disk, encode and decode against NumPy from
the saved weights (every architecture, both of SAELens's layouts), and Model.run_with_saes /
run_with_cache_with_saes on stories260K with an SAE `headlab sae train` wrote."""
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
    if cfg["architecture"] == "topk":
        keep = np.argsort(-pre, axis=-1, kind="stable")[:, :cfg["k"]]
        f = np.zeros_like(pre)
        np.put_along_axis(f, keep, np.take_along_axis(pre, keep, -1), -1)
        return np.maximum(f, 0)
    if cfg["architecture"] == "jumprelu":
        return np.where(pre > sae.threshold, np.maximum(pre, 0), 0)
    return np.maximum(pre, 0)


@pytest.mark.parametrize("name", ["relu_v5", "relu_v6", "topk_v5", "topk_v6", "jumprelu_v5", "jumprelu_v6"])
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
