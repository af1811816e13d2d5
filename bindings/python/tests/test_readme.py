"""The README examples: every Python block compiles, the DDP loop is the same in both READMEs, and the JAX
example trains on real batches where JAX is installed."""

import re

import numpy as np
import pytest
from conftest import REPO, require_module

READMES = [REPO / "README.md", REPO / "bindings" / "python" / "README.md"]


def blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_python_blocks_compile(path):
    found = blocks(path)
    assert found, f"{path} has no Python example"
    for i, code in enumerate(found):
        compile(code, f"{path}:block{i}", "exec")


def test_both_readmes_carry_the_same_examples():
    def loops(path):
        return [b for b in blocks(path) if "Loader(" in b and ("torch" in b or "jax" in b)]

    root, package = (loops(p) for p in READMES)
    assert len(root) == 2 and root == package
    torch_loop = next(b for b in root if "DistributedDataParallel" in b)
    assert len(torch_loop.strip().splitlines()) <= 35


def test_jax_example_trains(small):
    require_module("jax")
    (code,) = [b for b in blocks(READMES[1]) if "jax" in b]
    code = code.replace('"data/train"', repr(str(small.l3))).replace("epochs=10", "epochs=2")
    assert str(small.l3) in code
    scope = {}
    exec(compile(code, "README JAX example", "exec"), scope)
    w = np.asarray(scope["params"]["w"])
    assert np.isfinite(w).all() and np.abs(w).sum() > 0, "the step never updated the weights"
    assert np.isfinite(float(scope["l"]))
