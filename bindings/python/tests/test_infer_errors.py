"""l3toolkit.infer and Model raise by meaning, whichever way a failure is found: damage to an L3 input is
a FormatError whether the whole-file checksum finds it when the file is opened (version 2) or the window
over it finds it while the network runs (version 1, which has no checksum); a padding asked of an ONNX
model is an OptionsError in the keyword's name; a `.npy` whose header numpy would refuse is a
FormatError naming the file."""

from pathlib import Path

import numpy as np
import pytest

import l3toolkit as l3

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "bsp-tiling/tests/data/onnx/norm_first.onnx"


@pytest.fixture(scope="module")
def model():
    return l3.Model(MODEL)


def damaged_l3(path, fmt):
    """A noise image encoded as `fmt`, with 400 bytes of patch data in the middle overwritten."""
    x = np.random.default_rng(3).integers(0, 256, (150, 200, 3), dtype=np.uint8)
    b = bytearray(l3.encode(x, 32, format=fmt))
    mid = len(b) // 2
    b[mid : mid + 400] = b"\xff" * 400
    path.write_bytes(bytes(b))
    return path


@pytest.mark.parametrize("fmt", ["v1", "v2"])
def test_damaged_l3_is_a_format_error_however_it_is_found(model, tmp_path, fmt):
    p = damaged_l3(tmp_path / f"{fmt}.l3", fmt)
    for output in [None, tmp_path / "out.npy"]:
        with pytest.raises(l3.FormatError, match=f"{fmt}.l3") as e:
            l3.infer(p, model, tile=32, output=output)
        assert not isinstance(e.value, OSError), e.value
    assert not (tmp_path / "out.npy").exists()


def test_padding_of_an_onnx_model_is_an_options_error():
    with pytest.raises(l3.OptionsError, match=r"^padding: applies to TransformerNet safetensors only"):
        l3.Model(MODEL, padding="reflect")


def test_a_npy_header_numpy_refuses_is_a_format_error(model, tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((3, 20, 20), np.float32))
    b = good.read_bytes()
    # The dict's closing brace gone: numpy itself refuses the file.
    bad = tmp_path / "brace.npy"
    bad.write_bytes(b.replace(b"}", b" ", 1))
    with pytest.raises(Exception):  # numpy's tokenizer: "EOF in multi-line statement"
        np.load(bad)
    with pytest.raises(l3.FormatError, match="brace.npy.*ends"):
        l3.infer(bad, model, tile=32)
    assert l3.infer(good, model, tile=32).shape[0] == 3


GROW16 = ROOT / "bsp-tiling/tests/data/onnx/grow_x16.onnx"
GROW4096 = ROOT / "bsp-tiling/tests/data/onnx/grow_x4096.onnx"


def test_a_model_past_its_budget_raises_instead_of_killing_the_interpreter(tmp_path):
    """Two Resize x64: even one input pixel per tile needs 384 MiB, past a 64 MiB budget. An OptionsError
    naming the figure and the budget, in memory or to a file, and nothing left in the output's folder."""
    x = np.full((3, 1, 1), 0.5, np.float32)
    for output in [None, tmp_path / "y.npy"]:
        with pytest.raises(l3.OptionsError, match=r"working set .*needs 384\.0 MiB.*RAM budget"):
            l3.infer(x, l3.Model(GROW4096), ram_budget_mib=64, output=output)
    assert list(tmp_path.iterdir()) == []


def test_a_tile_past_its_budget_is_shrunk_with_a_warning():
    """Four Resize x2: the default tile's output alone is past 4 MiB; smaller tiles, said in a
    UserWarning, give the same output."""
    x = (np.arange(3 * 64 * 64) % 251 / 251).astype(np.float32).reshape(3, 64, 64)
    free = l3.infer(x, l3.Model(GROW16))
    with pytest.warns(UserWarning, match="tiles of 512 input pixels would hold"):
        small = l3.infer(x, l3.Model(GROW16), ram_budget_mib=4)
    assert np.array_equal(free, small)
