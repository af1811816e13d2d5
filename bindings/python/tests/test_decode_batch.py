"""``l3toolkit.decode_batch``: a list of L3 buffers from someone else's pipeline into one DLPack tensor
(a list for mixed sizes), equal byte for byte to ``l3.decode`` and to the Loader's own samples, windows
decoding only the patches under them, and typed errors naming the buffer."""

import os

import numpy as np
import pytest

import l3toolkit as l3


def noisy(h, w, c, seed=0):
    rng = np.random.default_rng(seed)
    px = rng.integers(0, 256, size=(h, w, c), dtype=np.uint8)
    px[..., 0] = (np.arange(w)[None, :] + np.arange(h)[:, None]).astype(np.uint8)
    return px[..., 0] if c == 1 else px


def hwc(a):
    return a[..., None] if a.ndim == 2 else a


def test_same_sizes_stack_into_one_tensor_equal_to_decode():
    files = [l3.encode(noisy(48, 40, 3, seed=s)) for s in range(5)]
    want = np.stack([l3.decode(f) for f in files])
    t = l3.decode_batch(files)
    assert isinstance(t, l3.Tensor) and t.shape == (5, 3, 48, 40) and t.dtype == "uint8" and t.device == "cpu"
    assert np.array_equal(np.from_dlpack(t), want.transpose(0, 3, 1, 2))
    nhwc = l3.decode_batch(files, layout="NHWC", threads=2)
    assert nhwc.layout == "NHWC" and np.array_equal(np.asarray(nhwc), want)
    f32 = l3.decode_batch(files, layout="nhwc", dtype="float32")
    assert np.array_equal(np.asarray(f32), want.astype(np.float32) * np.float32(1 / 255))


def _decode_in_child(files):
    return np.asarray(l3.decode_batch(files, layout="NHWC", threads=4)).copy()


def test_a_forked_worker_decodes_on_threads_of_its_own():
    """The toolkit keeps its worker threads parked between calls; a child made by fork after the parent
    used them — a PyTorch DataLoader worker, multiprocessing's default on Linux — has none of them, and
    decodes on threads of its own instead of waiting for the parent's."""
    import multiprocessing as mp

    files = [l3.encode(noisy(48, 40, 3, seed=s)) for s in range(8)]
    want = np.asarray(l3.decode_batch(files, layout="NHWC", threads=4)).copy()
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_decode_in_child, (files,)).get(timeout=60)
    assert np.array_equal(got, want)


def test_every_kind_of_buffer_and_paths(tmp_path):
    px = noisy(33, 21, 4, seed=1)
    data = l3.encode(px, format="v1")
    path = tmp_path / "a.l3"
    path.write_bytes(data)
    given = [data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), str(path), path]
    t = l3.decode_batch(given, layout="NHWC")
    assert t.shape == (6, 33, 21, 4)
    for k in range(6):
        assert np.array_equal(np.asarray(t)[k], px), type(given[k])


def test_mixed_sizes_and_channels_make_a_list_in_order():
    arrays = [noisy(20, 30, 3), noisy(31, 17, 3), noisy(20, 30, 1), noisy(20, 30, 4)]
    out = l3.decode_batch([l3.encode(a) for a in arrays], layout="NHWC")
    assert isinstance(out, list) and len(out) == 4
    for t, a in zip(out, arrays):
        assert t.shape == (1, *hwc(a).shape)
        assert np.array_equal(np.asarray(t)[0], hwc(a))
    # channels= converts them all as the Loader does (gray copied, alpha dropped), so they stack.
    same = [noisy(20, 30, c, seed=c) for c in (1, 3, 4)]
    t = l3.decode_batch([l3.encode(a) for a in same], channels=3, layout="NHWC")
    assert t.shape == (3, 20, 30, 3)
    assert np.array_equal(np.asarray(t)[0], np.repeat(same[0][..., None], 3, axis=-1))
    assert np.array_equal(np.asarray(t)[2], same[2][..., :3])


def test_windows_decode_only_the_patches_under_them():
    px = noisy(256, 256, 3, seed=9)
    data = l3.encode(px, 32)
    windows = [(0, 0, 64, 64), None, (100, 37, 50, 20)]
    out = l3.decode_batch([data] * 3, windows=windows, layout="NHWC")
    assert [t.shape for t in out] == [(1, 64, 64, 3), (1, 256, 256, 3), (1, 50, 20, 3)]
    assert np.array_equal(np.asarray(out[0])[0], px[:64, :64])
    assert np.array_equal(np.asarray(out[1])[0], px)
    assert np.array_equal(np.asarray(out[2])[0], px[100:150, 37:57])
    # Damage to the bottom-right patch is never read by a window at the top left.
    bad = bytearray(data)
    bad[len(bad) - 40] ^= 0xFF
    bad = bytes(bad)
    top_left = l3.decode_batch([bad, data], windows=[(0, 0, 64, 64), (0, 0, 64, 64)], layout="NHWC")
    assert np.array_equal(np.asarray(top_left)[0], px[:64, :64])
    with pytest.raises(l3.FormatError, match=r"buffers\[0\]"):
        l3.decode_batch([bad], windows=[(192, 192, 64, 64)])
    with pytest.raises(l3.FormatError, match=r"buffers\[1\]"):
        l3.decode_batch([data, bad])


def test_equal_to_the_loaders_samples_for_its_own_windows(small):
    """Given the windows a Loader reports, decode_batch makes the Loader's samples byte for byte."""
    for kw in (dict(layout="NHWC"), dict(channels=1, dtype="float32"), dict(channels=4, layout="NHWC")):
        loader = l3.Loader(small.l3, len(small), crop=(64, 80), random_crop=True, seed=3, shuffle=False, **kw)
        batch = next(iter(loader))
        paths = [loader.item_source(int(i)) for i in batch.indices]
        windows = [tuple(int(v) for v in row) for row in batch.windows]
        assert all(w[2:] == (64, 80) for w in windows), "the corpus is larger than the crop"
        t = l3.decode_batch(paths, windows=windows, channels=kw.get("channels", 3),
                            layout=kw.get("layout", "NCHW"), dtype=kw.get("dtype", "uint8"))
        assert t.shape == batch.images.shape and t.dtype == batch.images.dtype
        assert t.tobytes() == batch.images.tobytes(), kw
        loader.close()


def test_wrong_inputs_are_typed_errors(tmp_path):
    data = l3.encode(noisy(16, 16, 3))
    with pytest.raises(l3.OptionsError, match="at least one"):
        l3.decode_batch([])
    with pytest.raises(l3.OptionsError, match=r"buffers\[1\].*int"):
        l3.decode_batch([data, 7])
    with pytest.raises(l3.OptionsError, match="list of L3 buffers"):
        l3.decode_batch(5)
    with pytest.raises(l3.OptionsError, match="2 windows for 1 buffers"):
        l3.decode_batch([data], windows=[None, None])
    with pytest.raises(l3.OptionsError, match=r"windows\[0\]"):
        l3.decode_batch([data], windows=[(0, 0, 4)])
    with pytest.raises(l3.OptionsError, match=r"buffers\[0\].*16x16"):
        l3.decode_batch([data], windows=[(10, 10, 8, 8)])
    with pytest.raises(l3.OptionsError, match="layout"):
        l3.decode_batch([data], layout="CHW")
    with pytest.raises(l3.OptionsError, match="dtype"):
        l3.decode_batch([data], dtype="int8")
    with pytest.raises(l3.OptionsError, match="channels"):
        l3.decode_batch([data], channels=2)
    with pytest.raises(l3.OptionsError, match="device"):
        l3.decode_batch([data], device="tpu")
    with pytest.raises(l3.FormatError, match=r"buffers\[0\]"):
        l3.decode_batch([b"not an L3 file at all"])
    missing = tmp_path / "missing.l3"
    with pytest.raises(l3.IOError) as e:
        l3.decode_batch([missing])
    assert e.value.filename == str(missing)


def test_cuda_decodes_on_the_device_or_says_why_it_cannot():
    files = [l3.encode(noisy(64, 48, 3, seed=s)) for s in range(3)]
    windows = [(0, 0, 32, 32), (8, 4, 32, 32), (32, 16, 32, 32)]
    cpu = l3.decode_batch(files, windows=windows, dtype="float32")
    try:
        gpu = l3.decode_batch(files, windows=windows, dtype="float32", device="cuda")
    except l3.GpuError as e:
        # No usable GPU here: the reason, naming the device; never a silent CPU decode.
        assert "cuda:0" in str(e), str(e)
        if os.environ.get("L3_EXPECT_GPU"):
            raise
        return
    assert gpu.device == "cuda:0" and gpu.shape == cpu.shape
    assert gpu.tobytes() == cpu.tobytes()
    mixed = l3.decode_batch(files + [l3.encode(noisy(20, 10, 3))], device="cuda", layout="NHWC")
    assert [t.device for t in mixed] == ["cuda:0"] * 4
    assert mixed[3].tobytes() == l3.decode_batch([l3.encode(noisy(20, 10, 3))], layout="NHWC").tobytes()
