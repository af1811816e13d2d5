"""The public names, parameters and keyword defaults the package promises (issue text of the API): a
rename or a changed default breaks scripts written against it, so it is checked here."""

import inspect

import pytest

import l3toolkit as l3

P = inspect.Parameter


def params(f):
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


def test_loader_signature():
    kw = P.KEYWORD_ONLY
    want = [
        ("source", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("batch_size", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("crop", kw, (224, 224)),
        ("random_crop", kw, False),
        ("flip", kw, False),
        ("shuffle", kw, True),
        ("seed", kw, 0),
        ("epochs", kw, None),
        ("drop_last", kw, False),
        ("rank", kw, None),
        ("world_size", kw, None),
        ("threads", kw, None),
        ("layout", kw, "NCHW"),
        ("dtype", kw, "uint8"),
        ("mean", kw, None),
        ("std", kw, None),
        ("device", kw, "cpu"),
        ("sampler", kw, "uniform"),
        ("budget", kw, None),
        ("group", kw, None),
    ]
    got = params(l3.Loader)
    assert got[: len(want)] == want
    # Anything added after them is keyword-only with a default.
    assert all(kind == kw and default is not P.empty for _, kind, default in got[len(want) :])


@pytest.mark.parametrize(
    "name, want",
    [
        ("encode", [("array", P.empty), ("patch", None)]),
        ("decode", [("data", P.empty)]),
        ("decode_region", [("data", P.empty), ("x", P.empty), ("y", P.empty), ("w", P.empty), ("h", P.empty)]),
        ("info", [("data", P.empty)]),
        ("convert", [("src", P.empty), ("dst", P.empty), ("to", "l3"), ("progress", True)]),
        ("stylize", [("image", P.empty), ("model", P.empty)]),
        ("decode_batch", [("buffers", P.empty)]),
    ],
)
def test_function_signatures(name, want):
    got = params(getattr(l3, name))
    positional = [(n, d) for n, k, d in got if k == P.POSITIONAL_OR_KEYWORD]
    assert positional == want
    assert all(d is not P.empty for _, k, d in got if k == P.KEYWORD_ONLY)


def test_stylize_exposes_the_device_options():
    got = {n: d for n, _, d in params(l3.stylize)}
    # No device means the CPU (as for `infer`); the signature shows the default the function really has.
    assert got["device"] is None and got["precision"] == "f32" and got["gpu_memory"] is None
    assert got["mode"] == "exact" and got["tile"] is None


def test_exceptions_form_one_family():
    for cls in (l3.FormatError, l3.IOError, l3.OptionsError, l3.GpuError):
        assert issubclass(cls, l3.Error)
    assert issubclass(l3.IOError, OSError)
    assert issubclass(l3.FormatError, ValueError) and issubclass(l3.OptionsError, ValueError)
    # What Pillow's callers catch for a broken image file, and still one of ours.
    assert issubclass(l3.ImageFileError, l3.FormatError) and issubclass(l3.ImageFileError, OSError)


def test_decode_batch_defaults():
    got = {n: d for n, _, d in params(l3.decode_batch)}
    assert got == {"buffers": P.empty, "device": None, "windows": None, "layout": "NCHW", "dtype": "uint8",
                   "channels": None, "threads": None}
