"""What the Python tests share: the command, the data, the shared models, and a small trained checkpoint.

Under the sanitizer pass, ctest preloads the sanitizer runtime into this python (LD_PRELOAD) so that the
instrumented module can load. The headlab commands the tests start link their own runtime and must not get a
second one; another python3 that imports headlab needs it again (python_env)."""
import os
import subprocess

import pytest

PRELOAD = os.environ.pop("LD_PRELOAD", None)

BINARY = os.environ.get("HEADLAB_BINARY", "build/headlab")
HERE = os.path.dirname(__file__)
TEXT = os.path.join(HERE, "..", "..", "data", "tiny.txt")
STORIES = os.path.join(HERE, "..", "..", "..", "shared", "models", "stories260K")
LLAMA2_TOKENIZER = os.path.join(HERE, "..", "..", "..", "shared", "models", "llama2-tokenizer")
TOUR = os.path.join(HERE, "..", "..", "examples", "python", "tour.py")


@pytest.fixture
def python_env():
    """The environment for another python3 that imports headlab."""
    env = dict(os.environ)
    if PRELOAD:
        env["LD_PRELOAD"] = PRELOAD
    return env


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A 2-layer chars GPT (with qkv biases) trained for a few steps by the command."""
    out = tmp_path_factory.mktemp("model")
    subprocess.run([BINARY, "train", "--task", "chars", "--text", TEXT, "--n-layers", "2", "--n-heads", "2",
                    "--emb-dim", "16", "--context-length", "16", "--batch-size", "4", "--steps", "4",
                    "--eval-every", "4", "--eval-batches", "1", "--qkv-bias", "--threads", "1", "--out", str(out)],
                   check=True, capture_output=True)
    return str(out / "checkpoint.h5")


def stories_path(name="stories260K.bin"):
    """A file of ../shared/models/stories260K, or the test skipped with a message where it is absent."""
    path = os.path.join(STORIES, name)
    if not os.path.exists(path):
        pytest.skip(f"{STORIES} is absent (../shared/models)")
    return path
