"""The newer families from Python (tests/fixtures/llama_folders/{qwen3,gemma3,olmo2}_*, tests/fixtures/gpt_neo_folders,
tests/fixtures/bert_folders):
Qwen3, Gemma 2 and 3, OLMo-2 and GPT-Neo folders give their float64 twins' logits (tools/fixtures_*_folders.py), their hook
points keep TransformerLens's names (the post norms' ln1_post / ln2_post), and a local layer's pattern is zero
before its window; a BERT encoder's patterns look both ways and its hook points are BertBlock's. Run by ctest (label
python)."""
import json
import os
import shutil

import numpy as np

import headlab

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def with_tokenizer(tmp_path, family, variant, embedding, vocab=1472):
    """The fixture folder (float32 safetensors, a tied head) with a byte-level BPE tokenizer.json beside it: the
    embedding padded with zero rows to the tokenizer's vocabulary, so the first rows' logits are the twin's."""
    folder = tmp_path / variant
    shutil.copytree(os.path.join(FIXTURES, family, variant), folder)
    shutil.copy(os.path.join(FIXTURES, "tokenizer_json", "qwen2.json"), folder / "tokenizer.json")
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    tensors = {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).reshape(
        v["shape"]) for k, v in header.items() if k != "__metadata__"}
    for name in [embedding] if isinstance(embedding, str) else embedding:  # and an untied head
        tensors[name] = np.concatenate([tensors[name], np.zeros((vocab - tensors[name].shape[0],
                                                                 tensors[name].shape[1]), np.float32)])
    head, data, at = {}, b"", 0
    for k, t in tensors.items():
        head[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        data, at = data + t.tobytes(), at + t.nbytes
    text = json.dumps(head).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    config = json.load(open(folder / "config.json"))
    config["vocab_size"] = vocab
    json.dump(config, open(folder / "config.json", "w"))
    return str(folder)


def reference(family, variant):
    return json.load(open(os.path.join(FIXTURES, family, "reference.json")))[variant]


def test_qwen3_folder_gives_its_twins_logits_and_hook_points(tmp_path):
    model = headlab.load(with_tokenizer(tmp_path, "llama_folders", "qwen3_tied", "model.embed_tokens.weight"))
    ref = reference("llama_folders", "qwen3_tied")
    ids = np.array(ref["ids"], dtype=np.int64)
    assert np.abs(np.asarray(model(ids))[..., :80] - np.array(ref["logits"])).max() < 1e-5
    logits, cache = model.run_with_cache(ids)
    q = np.asarray(cache["blocks.0.attn.hook_q"])  # the projection, before the per-head norm: (B, T, H, 16)
    assert q.shape == (2, 16, 4, 16)
    rot_q = np.asarray(cache["blocks.0.attn.hook_rot_q"])  # normalised and rotated: each head's rms is its weight's
    assert rot_q.shape == q.shape and not np.allclose(rot_q, q)


def test_gpt_neo_local_layer_sees_only_its_window(tmp_path):
    model = headlab.load(with_tokenizer(tmp_path, "gpt_neo_folders", "global_local", "transformer.wte.weight"))
    ref = reference("gpt_neo_folders", "global_local")
    ids = np.array(ref["ids"], dtype=np.int64)
    assert np.abs(np.asarray(model(ids))[..., :80] - np.array(ref["logits"])).max() < 1e-5
    _, cache = model.run_with_cache(ids)
    local = np.asarray(cache["blocks.1.attn.hook_pattern"])  # (B, H, T, T); window_size 5
    glob = np.asarray(cache["blocks.0.attn.hook_pattern"])
    assert local[:, :, 10, :6].max() == 0 and local[:, :, 10, 6:11].min() > 0
    assert glob[:, :, 10, :6].min() > 0
    np.testing.assert_allclose(local.sum(-1), 1, atol=1e-5)


def test_gemma_and_olmo2_folders_give_their_twins_logits_and_post_norm_hooks(tmp_path):
    for variant, padded in (("gemma3_pattern", "model.embed_tokens.weight"), ("gemma2_caps", "model.embed_tokens.weight"),
                            ("olmo2_gqa", ["model.embed_tokens.weight", "lm_head.weight"])):
        model = headlab.load(with_tokenizer(tmp_path, "llama_folders", variant, padded))
        ref = reference("llama_folders", variant)
        ids = np.array(ref["ids"], dtype=np.int64)
        assert np.abs(np.asarray(model(ids))[..., :80] - np.array(ref["logits"])).max() < 1e-5, variant
        _, cache = model.run_with_cache(ids)
        post = np.asarray(cache["blocks.0.ln1_post.hook_normalized"])  # what the stream adds: hook_attn_out
        np.testing.assert_allclose(post, np.asarray(cache["blocks.0.hook_attn_out"]), atol=1e-6)
        assert ("blocks.0.ln1.hook_normalized" in cache) == variant.startswith("gemma")  # OLMo-2: no pre norm
    local = np.asarray(cache_of(tmp_path)["blocks.0.attn.hook_pattern"])  # gemma3_pattern's layer 0: window 5
    assert local[:, :, 10, :6].max() == 0 and local[:, :, 10, 6:11].min() > 0


def cache_of(tmp_path):
    model = headlab.load(str(tmp_path / "gemma3_pattern"))
    return model.run_with_cache(np.array(reference("llama_folders", "gemma3_pattern")["ids"], dtype=np.int64))[1]


def test_bert_folder_gives_its_twins_logits_and_encoder_hooks():
    model = headlab.load(os.path.join(FIXTURES, "bert_folders", "mlm_tied"))  # with its vocab.txt
    ref = reference("bert_folders", "mlm_tied")
    ids = np.array(ref["ids"], dtype=np.int64)
    assert np.abs(np.asarray(model(ids)) - np.array(ref["logits_full"])).max() < 1e-5
    _, cache = model.run_with_cache(ids)
    pattern = np.asarray(cache["blocks.0.attn.hook_pattern"])  # (B, H, T, T): bidirectional
    assert pattern[:, :, 0, 15].min() > 0
    np.testing.assert_allclose(np.asarray(cache["blocks.1.hook_resid_pre"]),
                               np.asarray(cache["blocks.0.ln2.hook_normalized"]), atol=0)  # post-LN: the next block reads the norm
    for name in ("embed.ln.hook_normalized", "blocks.0.hook_resid_mid", "mlm_head.ln.hook_normalized"):
        assert name in cache, name
    assert "ln_final.hook_normalized" not in cache


def test_bert_padding_of_a_list_of_texts_is_hidden_and_the_next_token_loss_refused():
    model = headlab.load(os.path.join(FIXTURES, "bert_folders", "mlm_tied"))
    short, long = "the cat sat.", "the big red dog ran on the mat"
    both = np.asarray(model([short, long]))  # [CLS] ... [SEP], the short row padded
    alone = np.asarray(model(short))
    n = alone.shape[1]
    assert both.shape[1] > n
    np.testing.assert_allclose(both[0, :n], alone[0], atol=1e-5)
    np.testing.assert_allclose(both[1], np.asarray(model(long))[0], atol=1e-5)
    assert model.to_str_tokens(short)[0] == "[CLS]" and model.to_str_tokens(short)[-1] == "[SEP]"
    try:
        model(short, return_type="loss")
        assert False, "an encoder's next-token loss"
    except Exception as e:  # headlab's error, naming what an encoder is scored on
        assert "is an encoder" in str(e)


def test_bert_attention_mask_of_token_ids_hides_the_padding():
    model = headlab.load(os.path.join(FIXTURES, "bert_folders", "mlm_tied"))
    ref = reference("bert_folders", "mlm_tied")
    ids = np.array(ref["ids"], dtype=np.int64)
    mask = (np.arange(ids.shape[1])[None, :] < np.array(ref["valid_lens"])[:, None]).astype(np.int64)
    np.testing.assert_allclose(np.asarray(model(ids, attention_mask=mask)), np.array(ref["logits"]), atol=1e-5)
    _, cache = model.run_with_cache(ids, attention_mask=mask.astype(bool))
    assert np.asarray(cache["blocks.0.attn.hook_pattern"])[1, :, :, 11:].max() == 0  # row 1's padding, never seen
    for bad, message in ((np.ones((2, 5), np.int64), "the tokens' shape"),
                         (np.array([[1] * 8 + [0, 1] + [1] * 6] * 2), "ones then zeros")):
        try:
            model(ids, attention_mask=bad)
            assert False, message
        except Exception as e:
            assert message in str(e), str(e)
