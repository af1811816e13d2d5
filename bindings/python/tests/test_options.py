"""One options model for both surfaces: ``l3toolkit.Loader``'s keywords and ``l3 stream``'s flags have the
same names, the same defaults, accept the same values and print the same error text for the same bad value.

The command-line half runs the ``l3`` binary that ``cargo test --workspace`` builds (``L3_BIN`` names
another); without one the comparison with the command line is skipped, saying so.
"""

import inspect
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import l3toolkit as l3
from conftest import cannot_run

ROOT = Path(__file__).resolve().parents[3]

# The two flags whose spelling differs from the keyword, as loader::Settings documents.
FLAG_OF = {"crop": "--size", "shuffle": "--no-shuffle"}


def flag(name):
    return FLAG_OF.get(name, "--" + name.replace("_", "-"))


def l3_bin():
    if os.environ.get("L3_BIN"):
        return Path(os.environ["L3_BIN"])
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "l3"
        if p.is_file():
            return p
    return None


def shown(default):
    """A Python default as the options model writes it."""
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        return "x".join(str(v) for v in default)
    return str(default)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("options")
    for i in range(3):
        (d / f"{i}.l3").write_bytes(l3.encode(np.full((40, 50, 3), i * 40, np.uint8)))
    return d


def test_python_keywords_are_the_models_names_with_its_defaults():
    model = l3.loader_options()
    params = inspect.signature(l3.Loader).parameters
    assert [n for n in params if n != "source"] == [n for n, _ in model]
    for name, default in model:
        p = params[name]
        if name == "batch_size":
            # Required in Python (a positional argument, as the API has always had it).
            assert p.default is inspect.Parameter.empty
            continue
        assert shown(p.default) == default, name


def cli_help():
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    return subprocess.run([b, "stream", "--help"], capture_output=True, text=True, check=True).stdout


def test_cli_flags_are_the_models_names_with_its_defaults():
    text = cli_help()
    # Each option's block: the flag line, then its help up to the next flag.
    blocks = dict(re.findall(r"^\s+(--[a-z0-9-]+)[^\n]*\n(.*?)(?=^\s+--|\Z)", text, re.S | re.M))
    for name, default in l3.loader_options():
        f = flag(name)
        assert f in blocks, f"{f} missing from l3 stream --help"
        m = re.search(r"\[default: ([^\]]+)\]", blocks[f])
        if default in ("none", "false") or name == "shuffle":
            # Unset options and switches show no default.
            assert m is None, (name, m.group(1))
        else:
            assert m is not None and m.group(1) == default, (name, m and m.group(1), default)


BAD = [
    ("layout", "hwc"),
    ("dtype", "int8"),
    ("device", "gpu"),
    ("sampler", "random"),
    ("decode", "some"),
    ("shard_tail", "keep"),
    ("crop", "3x"),
    ("budget", "lots"),
    ("cache_limit", "big"),
    ("mean", "1,2"),
    ("batch_size", "0"),
    ("threads", "0"),
    ("pcr_window", "0"),
]


NUMERIC = {"batch_size", "threads", "pcr_window"}


def python_error(folder, name, value):
    v = int(value) if name in NUMERIC else value
    kwargs = {"threads": 1}
    batch = 2
    if name == "batch_size":
        batch = v
    else:
        kwargs[name] = v
    with pytest.raises(l3.OptionsError) as e:
        l3.Loader(folder, batch, **kwargs)
    return str(e.value)


def cli_args(name, value):
    threads = [] if name == "threads" else ["--threads", "1"]
    return [flag(name), value, *threads]


@pytest.mark.parametrize("name, value", BAD, ids=[n for n, _ in BAD])
def test_the_same_bad_value_gets_the_same_words(folder, name, value):
    py = python_error(folder, name, value)
    assert py.startswith(f'{name} "'), py
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    out = subprocess.run([b, "stream", folder, *cli_args(name, value)], capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == f"l3: error: {py}", (out.stderr, py)


@pytest.mark.parametrize(
    "name, values",
    [
        ("layout", ["NCHW", "NHWC", "nchw", "nhwc"]),
        ("dtype", ["uint8", "float16", "float32", "u8", "f16", "f32"]),
        ("sampler", ["uniform"]),
        ("decode", ["region", "whole"]),
        ("shard_tail", ["pad", "drop"]),
        ("device", ["cpu"]),
        ("crop", ["16", "16x24"]),
    ],
)
def test_every_value_one_surface_accepts_the_other_does(folder, name, values):
    b = l3_bin()
    for v in values:
        with l3.Loader(folder, 2, threads=1, **{name: v}) as loader:
            assert len(next(iter(loader))) == 2
        if b is not None:
            out = subprocess.run(
                [b, "stream", folder, "--batch-size", "2", "--threads", "1", flag(name), v],
                capture_output=True,
                text=True,
            )
            assert out.returncode == 0, out.stderr


def test_the_cli_keeps_its_older_spellings(folder):
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    for args in (
        ["--sampler", "shuffle"],
        ["--batch", "2"],
        ["--crop", "random"],
        ["--normalize"],
        ["--size", "8"],
    ):
        out = subprocess.run([b, "stream", folder, "--threads", "1", *args], capture_output=True, text=True)
        assert out.returncode == 0, (args, out.stderr)


CONVERT_BAD = [
    ({"to": "l3", "quality": 90}, ["--to", "l3", "--quality", "90"]),
    ({"to": "webp"}, ["--to", "webp"]),
    ({"to": "jpeg", "quality": 0}, ["--to", "jpeg", "--quality", "0"]),
    ({"to": "png", "profile": "ans"}, ["--to", "png", "--profile", "ans"]),
]


@pytest.mark.parametrize("kwargs, args", CONVERT_BAD, ids=["l3-quality", "webp", "quality-0", "png-profile"])
def test_convert_refuses_alike(folder, tmp_path, kwargs, args):
    with pytest.raises(l3.OptionsError) as e:
        l3.convert(folder, tmp_path / "py", progress=False, **kwargs)
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    out = subprocess.run([b, "convert", *args, folder, tmp_path / "cli"], capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == f"l3: error: {e.value}", out.stderr
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()
