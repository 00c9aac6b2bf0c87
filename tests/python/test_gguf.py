"""GGUF files through the Python module (io/gguf.h): headlab.load("stories260K.gguf") needs no tokenizer (the file
carries it), generates the .bin's tokens and gives its logits. Run by ctest (label python)."""
import numpy as np

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
