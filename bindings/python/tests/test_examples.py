"""The examples in ``bindings/python/examples/``: a WebDataset pipeline and a DALI ``external_source``
feeding on ``l3toolkit.decode_batch``, run on real shards and files made from the corpus."""

import importlib.util
import sys

import numpy as np
from conftest import REPO, require_module

import l3toolkit as l3

EXAMPLES = REPO / "bindings" / "python" / "examples"


def example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def center(px, crop):
    h, w = px.shape[:2]
    ch, cw = min(crop, h), min(crop, w)
    top, left = (h - ch) // 2, (w - cw) // 2
    return px[top : top + ch, left : left + cw]


def l3_files(small):
    return sorted(small.l3.rglob("*.l3"))


def test_webdataset_pipeline(small, tmp_path):
    require_module("webdataset")
    ex = example("webdataset_pipeline")
    files = l3_files(small)
    samples = [(f"{i:06d}", f.read_bytes(), small.labels[i]) for i, f in enumerate(files)]
    half = len(samples) // 2
    ex.write_shard(tmp_path / "train-000000.tar", samples[:half])
    ex.write_shard(tmp_path / "train-000001.tar", samples[half:])
    urls = str(tmp_path / "train-{000000..000001}.tar")
    seen = []
    for images, labels in ex.batches(urls, 3, crop=48, dtype="float32"):
        assert images.shape[1:] == (3, 48, 48) and images.dtype == "float32"
        got = np.asarray(images)
        for k, label in enumerate(labels):
            i = len(seen)
            want = center(l3.decode(files[i]), 48)[..., :3].transpose(2, 0, 1)
            assert np.array_equal(got[k], want.astype(np.float32) * np.float32(1 / 255)), files[i]
            seen.append(int(label))
    assert seen == small.labels
    # Without a crop the corpus sizes differ: a list of one-image tensors.
    images, _ = next(ex.batches(urls, 2))
    assert isinstance(images, list) and all(t.shape[0] == 1 for t in images)


def test_dali_external_source(small):
    """The callback DALI's ``external_source`` calls is run here as DALI runs it, batch after batch to
    StopIteration; where DALI is installed (it is not in the test environment: a 0.4 GB wheel) the whole
    pipeline runs too."""
    ex = example("dali_external_source")
    files = l3_files(small)
    source = ex.L3Source(files, 4, crop=40)
    got = []
    while True:
        try:
            batch = source()
        except StopIteration:
            break
        assert len(batch) <= 4 and all(isinstance(a, np.ndarray) and a.dtype == np.uint8 for a in batch)
        got.extend(batch)
    assert len(got) == len(files)
    for f, a in zip(files, got):
        assert np.array_equal(a, center(l3.decode(f), 40)[..., :3]), f
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        print("DALI is not installed: its callback was tested, not the pipeline", file=sys.stderr)
        return
    pipe = ex.pipeline(files, 4, crop=40)
    pipe.build()
    (out,) = pipe.run()
    for i in range(4):
        want = center(l3.decode(files[i]), 40)[..., :3].transpose(2, 0, 1) / np.float32(255)
        assert np.allclose(np.asarray(out.at(i)), want, atol=1e-6), files[i]
