"""PyTorch files from Python (headlab.load of a torch.save file, io/torch_layouts.h): nanoGPT's ckpt.pt gives the
GPT-2 twin's logits (tests/fixtures/gpt2_folders/reference.json) and its weights equal torch's own reading of the
file; a hostile pickle is refused naming its global; Nanda et al.'s grokking checkpoint is right on every pair."""
import json
import os

import numpy as np
import pytest

import headlab

HERE = os.path.dirname(__file__)
FIXTURES = os.path.join(HERE, "..", "fixtures")
GROKKING = os.path.join(HERE, "..", "..", "..", "shared", "models", "grokking")


def test_nanogpt_checkpoint_loads_with_its_logits():
    model = headlab.load(os.path.join(FIXTURES, "torch_files", "nanogpt", "ckpt.pt"))
    ref = json.load(open(os.path.join(FIXTURES, "gpt2_folders", "reference.json")))
    logits = np.asarray(model(np.array(ref["ids"], dtype=np.int64)))
    assert np.abs(logits - np.array(ref["logits_tied"], dtype=np.float32)).max() < 1e-5
    assert model.to_string(np.array([5, 17])) == "5 17"  # no tokenizer in the file: tokens are their ids


def test_weights_equal_torchs_reading_of_the_file():
    torch = pytest.importorskip("torch")
    path = os.path.join(FIXTURES, "torch_files", "nanogpt", "ckpt.pt")
    sd = torch.load(path, map_location="cpu")["model"]
    state = headlab.load(path).state_dict()
    wte = sd["_orig_mod.transformer.wte.weight"].numpy()
    assert np.array_equal(np.asarray(state["tok_emb.weight"]), wte)
    c_attn = sd["_orig_mod.transformer.h.0.attn.c_attn.weight"].numpy()  # nn.Linear (3C, C): q | k | v rows
    assert np.array_equal(np.asarray(state["trf_blocks.0.att.W_key.weight"]), c_attn[32:64])


def test_a_hostile_pickle_is_refused_by_name():
    with pytest.raises(Exception, match="posix.system, which headlab does not build"):
        headlab.load(os.path.join(FIXTURES, "torch_files", "evil_os_system.pt"))
    assert not os.path.exists("/tmp/headlab_pwned")


def test_the_grokked_model_from_python():
    path = os.path.join(GROKKING, "wd_10-1_mod_addition_loss_curve.pth")
    if not os.path.exists(path):
        pytest.skip(f"{GROKKING} is absent (../shared/models)")
    model = headlab.load(path)
    assert model.config["arch"] == "hooked" and model.config["norm"] == "none"
    tokens = model.to_tokens("100 50 =")
    assert list(np.asarray(tokens).ravel()) == [100, 50, 113]
    logits = np.asarray(model(tokens))
    assert int(logits[0, -1].argmax()) == (100 + 50) % 113
