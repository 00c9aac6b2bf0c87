"""Under the sanitizer pass, ctest preloads the sanitizer runtime into this python (LD_PRELOAD) so that
the instrumented module can load. The headlab commands the tests start link their own runtime and must
not get a second one; another python3 that imports headlab needs it again (python_env)."""
import os

import pytest

PRELOAD = os.environ.pop("LD_PRELOAD", None)


@pytest.fixture
def python_env():
    """The environment for another python3 that imports headlab."""
    env = dict(os.environ)
    if PRELOAD:
        env["LD_PRELOAD"] = PRELOAD
    return env
