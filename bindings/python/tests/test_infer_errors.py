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
