"""Shared fixtures: the real corpus (``../shared/corpus``, or ``$L3_CORPUS``), and a quarter-size copy of
it converted once per session (every test decodes it many times; full size would take minutes in CI)."""

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import l3toolkit as l3

REPO = Path(__file__).resolve().parents[3]



def cannot_run(reason: str, module_level: bool = False):
    """The one rule for a test that cannot run here (a missing test tool, no ``l3`` binary): skip, saying
    why, on a developer's machine; fail with that reason under CI (``CI=true``), where a test that did not
    run must not count as passed. Device skips (no CUDA GPU) are not this rule's business."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"this test cannot run here, and CI=true requires every test to run: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def require_module(name: str, module_level: bool = False):
    """``name`` imported, or :func:`cannot_run` saying it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        cannot_run(f"{name} is not installed ({e})", module_level)

def corpus_dir() -> Path:
    p = Path(os.environ.get("L3_CORPUS", REPO.parent / "shared" / "corpus"))
    assert p.is_dir(), f"the test corpus is missing: {p} (set L3_CORPUS)"
    return p


def corpus_files():
    exts = {".png", ".jpg", ".jpeg"}
    return sorted(p for p in corpus_dir().iterdir() if p.suffix.lower() in exts)


def models_dir() -> Path:
    return corpus_dir().parent / "models"


def pillow_array(path) -> np.ndarray:
    """An independent reference decode: Pillow, as an (H, W, C) uint8 array (C = 3 or 4)."""
    with Image.open(path) as im:
        im = im.convert("RGBA" if im.mode in ("RGBA", "LA", "PA") else "RGB")
        return np.asarray(im)


class Small:
    """The corpus at 1/4 scale as PNG in class folders ``photo/`` (from JPEG) and ``render/`` (from PNG,
    the RGBA one included), the same converted to L3, and the photos as JPEG q90."""

    def __init__(self, root: Path):
        self.root = root
        self.png = root / "png"
        self.l3 = root / "l3"
        self.jpeg = root / "jpeg"
        for src in corpus_files():
            with Image.open(src) as im:
                im = im.convert("RGBA" if im.mode == "RGBA" else "RGB")
                small = im.resize((im.width // 4, im.height // 4), Image.BILINEAR)
            photo = src.suffix.lower() in (".jpg", ".jpeg")
            cls = "photo" if photo else "render"
            (self.png / cls).mkdir(parents=True, exist_ok=True)
            small.save(self.png / cls / (src.stem + ".png"))
            if photo:
                (self.jpeg / cls).mkdir(parents=True, exist_ok=True)
                small.save(self.jpeg / cls / (src.stem + ".jpg"), quality=90)
        l3.convert(self.png, self.l3, to="l3", progress=False)
        # Relative paths in the loader's order (sorted), with their class labels.
        self.items = sorted(p.relative_to(self.png).with_suffix("") for p in self.png.rglob("*.png"))
        self.labels = [0 if str(p).startswith("photo") else 1 for p in self.items]

    def reference(self, i: int) -> np.ndarray:
        """Pillow's decode of item ``i``'s PNG, RGB."""
        return pillow_array(self.png / self.items[i].with_suffix(".png"))[..., :3]

    def __len__(self):
        return len(self.items)


@pytest.fixture(scope="session")
def small(tmp_path_factory) -> Small:
    return Small(tmp_path_factory.mktemp("small"))


def center_crop(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """The zero-padded centre crop the loader makes, NHWC, computed independently."""
    out = np.zeros((h, w, 3), np.uint8)
    ih, iw = img.shape[:2]

    def axis(src, dst):
        # (source start, destination start, length)
        return ((src - dst) // 2, 0, dst) if src >= dst else (0, (dst - src) // 2, src)

    sx, dx, cw = axis(iw, w)
    sy, dy, ch = axis(ih, h)
    out[dy : dy + ch, dx : dx + cw] = img[sy : sy + ch, sx : sx + cw, :3]
    return out


def l3_binary() -> Path:
    """The ``l3`` binary the Rust tests built (or ``$L3_BIN``, or one on the PATH)."""
    candidates = [os.environ.get("L3_BIN"), REPO / "target" / "debug" / "l3", REPO / "target" / "release" / "l3",
                  shutil.which("l3")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    cannot_run("no l3 binary (cargo build -p l3-cli, or set L3_BIN)")


def run_python(code: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (signals and thread counts of its own)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )
