"""One inference options model for every surface: ``l3toolkit.infer``'s keywords (and ``Model``'s
``padding``) are ``l3 infer``'s and ``l3 stylize``'s flags, with the same defaults; a good value runs, a
bad one raises ``OptionsError`` in the model's words, naming the keyword, and the command line prints the
same words for it. ``StyleModel`` is ``Model`` under its deprecated name.

The command-line half runs the ``l3`` binary that ``cargo test --workspace`` builds (``L3_BIN`` names
another); without one it cannot run (skipped, or failed under ``CI=true``).
"""

import inspect
import math
import re
import subprocess

import numpy as np
import pytest

import l3toolkit as l3
from conftest import REPO, cannot_run, models_dir
from test_options import l3_bin

MODEL = models_dir() / "candy_nc8.safetensors"

# Keywords of `infer` that are not options of a run: what it runs on and where the result goes.
# `group` is who shares the run (the ranks of a process group), not an option of the run itself: `l3 infer`
# has none, `python -m l3toolkit.infer` sets it under torchrun.
NOT_OPTIONS = {"image", "model", "output", "group"}

# Every option: a good value, a bad value (None: any value of the type is good), and the text the bad
# one's error starts with.
WALK = {
    "tile": (16, 0, 'tile "0": expected'),
    "mode": ("sampled:2", "fast", 'mode "fast": expected exact, sampled'),
    "device": ("cpu", "gpu", 'device "gpu": expected cpu, cuda or cuda:N'),
    "precision": ("f32", "f64", 'precision "f64": expected f32, tf32 or f16'),
    "gpu_memory": (None, "lots", 'gpu_memory "lots": expected bytes'),
    "threads": (1, 0, 'threads "0": expected 1 to'),
    "padding": ("circular", "mirror", 'padding "mirror": expected reflect, circular, zero or replicate'),
    "ram_budget_mib": (16, -1, 'ram_budget_mib "-1": expected a whole number'),
    "spill_dir": (".", 3, 'spill_dir "3": expected a path'),
    "full": (False, "yes", "full \"'yes'\": expected True or False"),
    "in_scale": (0.5, math.nan, 'in_scale "NaN": expected a finite number'),
    "out_scale": (2.0, math.inf, 'out_scale "inf": expected a finite number'),
    "out_dtype": ("float32", "int8", 'out_dtype "int8": expected uint8 or float32'),
    "page": (0, "first", "page \"'first'\": expected a whole number"),
    "level": (0, -2, 'level "-2": expected a whole number'),
}


def shown(default):
    """A Python default as the options model writes it."""
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


@pytest.fixture(scope="module")
def tiff(tmp_path_factory):
    """A 42×30 RGB TIFF: sides that are not multiples of 4, so the network's whole output (44×32) and the
    cropped one differ."""
    tifffile = pytest.importorskip("tifffile")
    p = tmp_path_factory.mktemp("infer-options") / "in.tif"
    rng = np.random.default_rng(3)
    tifffile.imwrite(p, rng.integers(0, 256, (30, 42, 3), dtype=np.uint8), photometric="rgb")
    return p


def test_python_keywords_are_the_models_names_with_its_defaults():
    model = l3.infer_options()
    params = inspect.signature(l3.infer).parameters
    assert [n for n in params if n not in NOT_OPTIONS] == [n for n, _ in model]
    for name, default in model:
        assert shown(params[name].default) == default, name
    assert list(WALK) == [n for n, _ in model], "the walk covers every option"


def test_the_command_lines_take_the_same_options_as_python():
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    python = {n.replace("_", "-") for n, _ in l3.infer_options()}
    # crop-to-input: infer's other spelling of --full=false (Python's crop_to_input=True).
    for command, own in (("infer", {"model", "list-pages", "crop-to-input"}), ("stylize", {"model"})):
        text = subprocess.run([b, command, "--help"], capture_output=True, text=True, check=True).stdout
        flags = set(re.findall(r"^\s+--([a-z0-9-]+)", text, re.M)) - {"help"}
        assert flags - own == python, command


def test_every_keyword_takes_a_good_value(tiff, tmp_path):
    for name, (good, _, _) in WALK.items():
        if good is None:
            continue
        out = tmp_path / f"{name}.tif"
        assert l3.infer(tiff, MODEL, output=out, **{"threads": 2, name: good}) is None, name
        assert out.is_file(), name
    # gpu_memory budgets a GPU: accepted with device="cuda", where no GPU is the GpuError's reason.
    try:
        l3.infer(tiff, MODEL, device="cuda", gpu_memory="1G")
    except l3.GpuError as e:
        assert str(e).startswith("device cuda") and "--" not in str(e), str(e)


@pytest.mark.parametrize("name", list(WALK))
def test_a_bad_value_is_an_options_error_naming_the_keyword(tiff, tmp_path, name):
    _, bad, words = WALK[name]
    out = tmp_path / "never.tif"
    kwargs = {"threads": 2, name: bad}
    with pytest.raises(l3.OptionsError) as e:
        l3.infer(tiff, MODEL, output=out, **kwargs)
    assert str(e.value).startswith(words), str(e.value)
    assert not out.exists()


# The bad values the command line can spell, and the same words from both surfaces.
SAME_WORDS = ["tile", "mode", "device", "precision", "gpu_memory", "threads", "padding", "out_dtype"]


@pytest.mark.parametrize("name", SAME_WORDS)
def test_the_same_bad_value_gets_the_same_words_on_the_command_line(tiff, tmp_path, name):
    _, bad, _ = WALK[name]
    with pytest.raises(l3.OptionsError) as e:
        l3.infer(tiff, MODEL, **{name: bad})
    b = l3_bin()
    if b is None:
        cannot_run("no l3 binary (build it with cargo build -p l3-cli, or set L3_BIN)")
    for command in ("infer", "stylize"):
        flag = "--" + name.replace("_", "-")
        args = [b, command, "--model", MODEL, flag, str(bad), tiff, tmp_path / "cli.tif"]
        out = subprocess.run(args, capture_output=True, text=True)
        assert out.returncode != 0
        assert out.stderr.strip().splitlines()[-1] == f"l3: error: {e.value}", (command, out.stderr)


def test_model_padding_is_the_same_option(tiff):
    assert l3.Model(MODEL, padding="circular").channels == 3
    with pytest.raises(l3.OptionsError, match=r'^padding "mirror": expected reflect, circular'):
        l3.Model(MODEL, padding="mirror")
    model = l3.Model(MODEL)
    with pytest.raises(l3.OptionsError, match=r'^padding "zero": expected none with a loaded Model'):
        l3.infer(tiff, model, padding="zero")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        l3.infer(tiff, model, tiles=16)


def test_infer_gives_the_whole_output_unless_cropped(tiff):
    """infer's default is the network's output as onnxruntime gives it; full=False and crop_to_input=True
    crop it to the input; stylize (an image filter) crops by default."""
    model = l3.Model(MODEL)
    assert l3.infer(tiff, model).shape == (3, 32, 44)
    assert l3.infer(tiff, model, full=True).shape == (3, 32, 44)
    assert l3.infer(tiff, model, full=False).shape == (3, 30, 42)
    assert l3.infer(tiff, model, crop_to_input=True).shape == (3, 30, 42)
    assert l3.infer(tiff, model, crop_to_input=False).shape == (3, 32, 44)
    with pytest.raises(l3.OptionsError, match="^full"):
        l3.infer(tiff, model, crop_to_input=True, full=True)


def test_style_model_is_a_deprecated_model(tiff):
    with pytest.warns(DeprecationWarning, match="StyleModel is deprecated"):
        old = l3.StyleModel(MODEL, padding="reflect")
    assert isinstance(old, l3.Model)
    picture = np.asarray(np.random.default_rng(1).integers(0, 256, (30, 42, 3)), dtype=np.uint8)
    # The same network either way, for stylize and infer alike.
    assert np.array_equal(l3.stylize(picture, old, tile=16), l3.stylize(picture, l3.Model(MODEL), tile=16))
    assert np.array_equal(l3.infer(tiff, old), l3.infer(tiff, MODEL))
    onnx = l3.Model(REPO / "bsp-tiling" / "tests" / "data" / "onnx" / "unet_gn.onnx")
    with pytest.raises(l3.OptionsError, match="TransformerNet"):
        l3.stylize(picture, onnx)
