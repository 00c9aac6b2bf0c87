"""GGUF files through the Python module (io/gguf.h): headlab.load("stories260K.gguf") needs no tokenizer (the file
carries it), generates the .bin's tokens and gives its logits. Run by ctest (label python)."""
import numpy as np
import pytest

import headlab

from conftest import stories_path


def test_gguf_generates_the_same_tokens_and_logits_as_the_llama2c_checkpoint():
    gguf = headlab.load(stories_path("stories260K.gguf"))
    binary = headlab.load(stories_path("stories260K.bin"), tokenizer=stories_path("tok512.bin"))
    assert gguf.generate("Once upon a time", max_new_tokens=24) == binary.generate("Once upon a time", max_new_tokens=24)
    tokens = gguf.to_tokens("Lily and Tim went to the park.")
    np.testing.assert_array_equal(tokens, binary.to_tokens("Lily and Tim went to the park."))
    np.testing.assert_allclose(gguf(tokens), binary(tokens), rtol=0, atol=1e-6)
    for ours, theirs in zip(gguf.generate(tokens[0], max_new_tokens=16), binary.generate(tokens[0], max_new_tokens=16)):
        np.testing.assert_array_equal(ours, theirs)  # the ids, and the new ones


def test_quantized_weights_keep_the_story_close():
    """quantize_weights("q8_0"): the linear layers (and the tied head) as ggml's blocks; the logits stay near."""
    model = headlab.load(stories_path("stories260K.bin"), tokenizer=stories_path("tok512.bin"))
    tokens = model.to_tokens("Lily and Tim went to the park. Lily gave the ball to Tim.")
    before = model(tokens)
    assert model.quantize_weights("q8_0") > 0
    after = model(tokens)
    assert np.abs(after - before).max() < 0.1 * before.std()
    with pytest.raises(Exception, match="q8_0"):
        model.W_U  # the tied table is blocks now: no float array to show
    with pytest.raises(Exception, match="'bfloat16', 'q8_0' or 'q4_k'"):
        model.quantize_weights("int4")
