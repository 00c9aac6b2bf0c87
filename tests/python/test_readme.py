"""README's Python quick start, run as written: what a new user types after ./scripts/demo.sh must work."""
import os
import re
import subprocess
import sys

import pytest

from conftest import PRELOAD, STORIES

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_readme_python_block_runs_as_written(python_env):
    if PRELOAD:
        pytest.skip("the sanitizer pass: the README's analyses run in the Release pass")
    if not os.path.exists(os.path.join(STORIES, "stories260K.bin")):
        pytest.skip(f"{STORIES} is absent (../shared/models)")
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README has a ```python block"
    env = dict(python_env)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "build", "python"))  # ctest's: its build's module
    r = subprocess.run([sys.executable, "-c", blocks[0]], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Once upon a time" in r.stdout
