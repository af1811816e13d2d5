"""The Loader from Python: contents, zero copy, epochs, resume, ranks, options and errors."""

import json
import math
import os
import shutil
import sys
import types

import numpy as np
import pytest
from conftest import center_crop

import l3toolkit as l3


def batches(loader):
    """(epoch, index, indices, labels, pixel bytes) of each batch of one `for` loop."""
    return [
        (b.epoch, b.index, b.indices.tolist(), b.labels.tolist(), np.from_dlpack(b.images).tobytes())
        for b in loader
    ]


def test_every_item_once_per_epoch_with_its_label(small):
    n = len(small)
    loader = l3.Loader(small.l3, 5, crop=32, seed=11, world_size=1, rank=0)
    assert len(loader) == math.ceil(n / 5)
    assert loader.dataset_len == n
    for epoch in range(2):
        seen = []
        count = 0
        for b in loader:
            assert b.epoch == epoch and b.index == count
            assert b.labels.dtype == np.int64 and b.indices.dtype == np.int64
            assert len(b) == len(b.indices) == b.images.shape[0]
            assert b.labels.tolist() == [small.labels[i] for i in b.indices]
            seen += b.indices.tolist()
            count += 1
        assert count == len(loader)
        assert sorted(seen) == list(range(n)), f"epoch {epoch}"
    stats = loader.stats()
    assert stats["items_delivered"] == 2 * n
    assert stats["batches_delivered"] == 2 * len(loader)
    assert stats["bytes_read"] > 0 and stats["pixels_decoded"] > 0


def test_epochs_argument_runs_them_all_in_one_loop(small):
    loader = l3.Loader(small.l3, 8, crop=16, epochs=3, rank=0, world_size=1)
    got = [(b.epoch, b.index) for b in loader]
    per = len(loader)
    assert got == [(e, i) for e in range(3) for i in range(per)]
    assert list(loader) == []


@pytest.mark.parametrize("folder", ["png", "l3"])
def test_pixels_are_the_centre_crops(small, folder):
    h, w = 96, 128
    loader = l3.Loader(getattr(small, folder), 4, crop=(h, w), shuffle=False, layout="NHWC", rank=0, world_size=1)
    for b in loader:
        x = np.from_dlpack(b.images)
        assert x.shape == (len(b), h, w, 3) and x.dtype == np.uint8
        for j, i in enumerate(b.indices):
            assert np.array_equal(x[j], center_crop(small.reference(i), h, w)), small.items[i]


def test_layouts_types_and_normalisation(small):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    common = dict(crop=(40, 56), shuffle=False, rank=0, world_size=1)
    u8 = next(iter(l3.Loader(small.l3, 6, layout="NHWC", **common)))
    base = np.from_dlpack(u8.images).astype(np.float64)
    nchw = next(iter(l3.Loader(small.l3, 6, **common)))
    assert nchw.images.layout == "NCHW" and nchw.images.shape == (6, 3, 40, 56)
    assert np.array_equal(np.from_dlpack(nchw.images), np.from_dlpack(u8.images).transpose(0, 3, 1, 2))
    f32 = next(iter(l3.Loader(small.l3, 6, layout="NHWC", dtype="float32", mean=mean, std=std, **common)))
    want = (base / 255 - np.array(mean)) / np.array(std)
    got = np.from_dlpack(f32.images)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    f16 = next(iter(l3.Loader(small.l3, 6, layout="NHWC", dtype="float16", **common)))
    got16 = np.from_dlpack(f16.images)
    assert got16.dtype == np.float16
    np.testing.assert_allclose(got16.astype(np.float64), base / 255, atol=1e-3)


def test_zero_copy_and_buffer_lifetime(small):
    loader = l3.Loader(small.l3, 4, crop=32, epochs=1000, rank=0, world_size=1)
    b = next(loader)
    x = np.from_dlpack(b.images)
    assert x.ctypes.data == b.images.data_ptr
    assert np.asarray(b.images).ctypes.data == b.images.data_ptr
    assert b.images.numpy().ctypes.data == b.images.data_ptr
    assert np.asarray(b.images, dtype=np.uint8).ctypes.data == b.images.data_ptr
    assert np.array(b.images, copy=True).ctypes.data != b.images.data_ptr
    assert np.array_equal(np.asarray(b.images, dtype=np.float32), x)
    with pytest.raises(ValueError, match="copy"):
        np.asarray(b.images, dtype=np.float32, copy=False)
    assert b.images.nbytes == x.nbytes
    assert b.images.data_ptr % 64 == 0
    # Two exports are views of one memory.
    y = np.from_dlpack(b.images)
    y[0, 0, 0, 0] = 255 - x[0, 0, 0, 0]
    assert x[0, 0, 0, 0] == y[0, 0, 0, 0]
    # The array keeps the buffer alive after the batch is gone; later batches never reuse it.
    kept = x.copy()
    ptr = b.images.data_ptr
    del b, y
    later = [next(loader) for _ in range(30)]
    assert all(c.images.data_ptr != ptr for c in later)
    assert np.array_equal(x, kept)
    # Once nothing holds a batch, its buffer goes back to the pool and comes round again.
    del x, later
    ptrs = {next(loader).images.data_ptr for _ in range(40)}
    assert len(ptrs) < 20


def test_dlpack_protocol_details(small):
    b = next(iter(l3.Loader(small.l3, 2, crop=8, rank=0, world_size=1)))
    assert b.images.__dlpack_device__() == (1, 0)
    assert type(b.images.__dlpack__()).__name__ == "PyCapsule"
    assert type(b.images.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
    with pytest.raises(BufferError):
        b.images.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        b.images.__dlpack__(dl_device=(2, 0))


def test_resume_equals_an_uninterrupted_run(small):
    opts = dict(crop=(48, 40), random_crop=True, flip=True, seed=5, rank=0, world_size=1)
    whole = l3.Loader(small.l3, 3, **opts)
    want = batches(whole) + batches(whole)

    first = l3.Loader(small.l3, 3, **opts)
    got = []
    for b in first:
        got += batches([b])
        if len(got) == 4:
            break
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batch"]) == (0, 4)
    del first
    second = l3.Loader(small.l3, 3, **opts)
    second.load_state_dict(state)
    got += batches(second) + batches(second)
    assert got == want


def test_a_state_saved_by_rank_0_resumes_every_rank(small):
    opts = dict(crop=16, seed=3, world_size=2)
    saved = l3.Loader(small.l3, 2, rank=0, **opts)
    for _ in range(3):
        next(saved)
    state = saved.state_dict()
    whole = l3.Loader(small.l3, 2, rank=1, **opts)
    want = batches(whole)[3:]
    resumed = l3.Loader(small.l3, 2, rank=1, **opts)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["rank"] == 1
    assert batches(resumed) == want


@pytest.mark.parametrize("world, world2, batch2", [(4, 3, 2), (2, 5, 3)])
def test_a_state_resumes_at_another_world_size_and_batch_size(small, world, world2, batch2):
    """A job stopped mid-epoch resumes on another number of ranks (and batch size): the items no rank
    delivered are split among the new ranks, each delivered once (padding repeats aside)."""
    opts = dict(crop=16, seed=3, epochs=1)
    seen = []
    for rank in range(world):
        run = l3.Loader(small.l3, 1, rank=rank, world_size=world, **opts)
        for _ in range(2):
            seen += next(run).indices.tolist()
        state = json.loads(json.dumps(run.state_dict()))
        run.close()
    assert state["remaining"] == "all" and state["version"] == 3
    for rank in range(world2):
        resumed = l3.Loader(small.l3, batch2, rank=rank, world_size=world2, **opts)
        resumed.load_state_dict(state)
        if rank == 0:
            assert resumed.state_dict()["remaining"] not in ("all", "none")
        seen += [i for b in resumed for i in b.indices.tolist()]
    n = len(small)
    assert set(seen) == set(range(n))
    assert len(seen) - n <= world2 - 1, "only padding repeats an item"


def test_set_epoch_starts_that_epoch(small):
    opts = dict(crop=24, random_crop=True, seed=9, rank=0, world_size=1)
    a = l3.Loader(small.l3, 4, **opts)
    epochs = [batches(a) for _ in range(3)]
    b = l3.Loader(small.l3, 4, **opts)
    b.set_epoch(2)
    assert batches(b) == epochs[2]
    b.set_epoch(1)
    assert batches(b) == epochs[1]
    # At the start of the epoch already: nothing restarts, the same batches come.
    b.set_epoch(2)
    assert b.state_dict()["epoch"] == 2
    assert batches(b) == epochs[2]
    assert epochs[0] != epochs[1]


def test_mismatched_resume_is_refused(small):
    a = l3.Loader(small.l3, 4, crop=24, seed=1, rank=0, world_size=1)
    state = a.state_dict()
    with pytest.raises(l3.OptionsError, match="seed"):
        l3.Loader(small.l3, 4, crop=24, seed=2, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(l3.OptionsError, match="crop"):
        l3.Loader(small.l3, 4, crop=32, seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(l3.OptionsError, match="epoch"):
        a.load_state_dict({k: v for k, v in state.items() if k != "epoch"})


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_partition_the_data(small, drop_last):
    n, world = len(small), 3
    per_rank = []
    for rank in range(world):
        loader = l3.Loader(small.l3, 2, crop=8, seed=4, rank=rank, world_size=world, drop_last=drop_last)
        ids = [i for b in loader for i in b.indices.tolist()]
        per = math.ceil(n / world)
        assert len(loader) == (per // 2 if drop_last else math.ceil(per / 2))
        assert len(ids) == 2 * len(loader) if drop_last else per
        per_rank.append(ids)
    if drop_last:
        assert set().union(*map(set, per_rank)) <= set(range(n))
    else:
        # Like DistributedSampler: every rank gets ceil(n / world) items, the first ones repeated to pad.
        assert all(len(ids) == math.ceil(n / world) for ids in per_rank)
        assert set().union(*map(set, per_rank)) == set(range(n))
        assert sum(map(len, per_rank)) - n == math.ceil(n / world) * world - n


def test_rank_defaults(small, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = l3.Loader(small.l3, 2, crop=8)
    assert (loader.rank, loader.world_size) == (2, 4)
    assert len(loader) == math.ceil(math.ceil(len(small) / 4) / 2)

    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: True
    dist.get_rank = lambda: 1
    dist.get_world_size = lambda: 2
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    loader = l3.Loader(small.l3, 2, crop=8)
    assert (loader.rank, loader.world_size) == (1, 2)
    assert l3.Loader(small.l3, 2, crop=8, rank=0).rank == 0

    dist.is_initialized = lambda: False
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    loader = l3.Loader(small.l3, 2, crop=8)
    assert (loader.rank, loader.world_size) == (0, 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mean=(0.5, 0.5, 0.5)), "both mean and std"),
        (dict(mean=(0.5,) * 3, std=(0.5,) * 3), "float"),
        (dict(dtype="float32", mean=(0.5,) * 2, std=(0.5,) * 3), "3"),
        (dict(dtype="float32", mean=(0.5,) * 3, std=(0.0, 1, 1)), "std"),
        (dict(layout="CHW"), "layout"),
        (dict(dtype="int8"), "dtype"),
        (dict(sampler="liquid"), "budget"),
        (dict(budget=1 << 20), "budget"),
        (dict(sampler="random"), "sampler"),
        (dict(crop=0), "crop"),
        (dict(crop="big"), "crop"),
        (dict(rank=3, world_size=2), "rank 3 of world size 2"),
        (dict(device="tpu"), "device"),
        (dict(threads=0), "threads"),
    ],
)
def test_options_errors(small, kwargs, match):
    kwargs.setdefault("rank", 0)
    kwargs.setdefault("world_size", 1)
    with pytest.raises(l3.OptionsError, match=match):
        l3.Loader(small.l3, 4, **kwargs)


def test_liquid_order_needs_a_liquid_dataset(small):
    with pytest.raises(l3.OptionsError, match="Liquid"):
        l3.Loader(small.l3, 4, sampler="liquid", budget=1 << 30, rank=0, world_size=1)


def test_gpu_is_never_a_silent_fallback(small):
    # The GPU decoder reads L3 only: a PNG folder is refused on any machine, naming an item.
    with pytest.raises(l3.GpuError, match="L3"):
        l3.Loader(small.png, 4, device="cuda", rank=0, world_size=1)
    try:
        # One epoch, so that the pipeline does not run ahead into the next before the counts are read.
        gpu = l3.Loader(
            small.l3, 4, crop=32, shuffle=False, epochs=1, device="cuda:0", rank=0, world_size=1
        )
    except l3.GpuError as e:
        # No usable GPU here: the reason is given.
        assert "device 0" in str(e)
        if os.environ.get("L3_EXPECT_GPU"):
            raise  # the GPU bundle's run: this machine has a GPU, so a refusal is a failure
        return
    cpu = l3.Loader(small.l3, 4, crop=32, shuffle=False, rank=0, world_size=1)
    on_gpu = list(gpu)
    assert all(b.images.device == "cuda:0" for b in on_gpu)
    with pytest.raises(TypeError, match="cuda:0"):
        on_gpu[0].images.numpy()
    assert [with_bytes(b) for b in on_gpu] == [with_bytes(b) for b in cpu]
    stats = gpu.stats()
    assert (stats["gpu_batches"], stats["gpu_fallback_batches"]) == (len(gpu), 0)


def test_pin_memory_is_page_locked_or_refused_with_the_reason(small):
    kw = dict(crop=32, shuffle=False, epochs=3, prefetch=1, rank=0, world_size=1)
    try:
        pinned = l3.Loader(small.l3, 2, pin_memory=True, **kw)
    except l3.GpuError as e:
        # No driver or device here: refused before any thread starts, never pageable memory instead.
        assert str(e).startswith("pin_memory: cannot page-lock batch memory"), str(e)
        return
    pageable = l3.Loader(small.l3, 2, **kw)
    got = list(pinned)
    assert all(b.images.pinned for b in got)
    assert not any(b.images.pinned for b in pageable)
    assert [with_bytes(b) for b in got] == [with_bytes(b) for b in l3.Loader(small.l3, 2, **kw)]


def with_bytes(b):
    """(epoch, index, indices, labels, pixel bytes) of a batch on any device."""
    return (b.epoch, b.index, b.indices.tolist(), b.labels.tolist(), b.images.tobytes())


def test_tobytes_copies_what_the_view_shows(small):
    b = next(l3.Loader(small.l3, 4, crop=(24, 40), dtype="float16", rank=0, world_size=1))
    assert b.images.device == "cpu" and "device=cpu" in repr(b.images)
    data = b.images.tobytes()
    assert len(data) == b.images.nbytes == 4 * 3 * 24 * 40 * 2
    assert data == np.from_dlpack(b.images).tobytes()


def test_missing_source_is_an_io_error(tmp_path):
    with pytest.raises(l3.IOError) as e:
        l3.Loader(tmp_path / "nowhere", 4, rank=0, world_size=1)
    assert "nowhere" in str(e.value)
    assert isinstance(e.value, OSError) and e.value.errno == 2


def test_bad_items_are_named(small, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(small.l3, bad)
    victim = bad / small.items[3].with_suffix(".l3")
    data = victim.read_bytes()
    victim.write_bytes(data[:20] + bytes(len(data) - 20))
    loader = l3.Loader(bad, 4, crop=32, shuffle=False, rank=0, world_size=1)
    with pytest.raises(l3.FormatError) as e:
        list(loader)
    assert victim.name in str(e.value) and "item 3" in str(e.value)

    skipping = l3.Loader(bad, 4, crop=32, shuffle=False, skip_errors=True, rank=0, world_size=1)
    got = list(skipping)
    skipped = [s for b in got for s in b.skipped]
    assert [i for i, _ in skipped] == [3] and victim.name in skipped[0][1]
    assert sum(len(b) for b in got) == len(small) - 1

    gone = tmp_path / "gone"
    shutil.copytree(small.l3, gone)
    loader = l3.Loader(gone, 4, crop=32, shuffle=False, rank=0, world_size=1)
    removed = gone / small.items[9].with_suffix(".l3")
    removed.unlink()
    # Decoding starts at construction and may have read the file already: a restart reads it again.
    loader.set_epoch(1)
    with pytest.raises(l3.IOError) as e:
        list(loader)
    assert removed.name in str(e.value) and e.value.errno == 2


def test_item_sources_and_repr(small):
    loader = l3.Loader(small.l3, 4, rank=0, world_size=1)
    assert [loader.item_source(i) for i in range(len(small))] == [
        str(small.l3 / p.with_suffix(".l3")) for p in small.items
    ]
    with pytest.raises(IndexError):
        loader.item_source(len(small))
    assert "batch_size=4" in repr(loader)


def test_pcr_and_liquid_sources(small, tmp_path):
    pcr = tmp_path / "pcr"
    with pytest.raises(l3.FormatError, match="quality"):
        l3.convert(small.png, tmp_path / "refused", to="pcr", progress=False)
    l3.convert(small.jpeg, pcr, to="pcr", progress=False)
    n = sum(1 for _ in small.jpeg.rglob("*.jpg"))
    for group in (2, None):
        loader = l3.Loader(pcr, 3, crop=32, group=group, rank=0, world_size=1)
        assert sorted(i for b in loader for i in b.indices.tolist()) == list(range(n))
    with pytest.raises(l3.FormatError, match="not a PCR dataset"):
        l3.Loader(small.l3, 3, group=2, rank=0, world_size=1)

    liquid = tmp_path / "liquid"
    summary = l3.convert(small.l3, liquid, to="liquid", progress=False)
    assert summary["items"] == len(small)
    loader = l3.Loader(liquid, 4, crop=32, sampler="liquid", budget=64 << 20, seed=3, rank=0, world_size=1)
    for _ in range(2):
        assert sorted(i for b in loader for i in b.indices.tolist()) == list(range(len(small)))
