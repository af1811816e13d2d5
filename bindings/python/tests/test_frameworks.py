"""Zero-copy hand-over to PyTorch and JAX, both in the test environment (on the CPU; the GPU machine runs the
device tests, which skip elsewhere for want of a device)."""

import numpy as np
import pytest

import l3toolkit as l3
from conftest import require_module


@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32"])
def test_torch_from_dlpack_views_the_batch(small, dtype):
    torch = require_module("torch")
    loader = l3.Loader(small.l3, 4, crop=(32, 48), dtype=dtype, rank=0, world_size=1)
    b = next(loader)
    t = torch.from_dlpack(b.images)
    assert t.data_ptr() == b.images.data_ptr
    assert t.device.type == "cpu" and tuple(t.shape) == (4, 3, 32, 48)
    assert str(t.dtype) == f"torch.{dtype}"
    assert np.array_equal(t.numpy(), np.from_dlpack(b.images))
    # The tensor keeps the buffer alive after the batch and the loader are gone.
    want = t.clone()
    del b, loader
    assert torch.equal(t, want)


def test_torch_cuda_consumer_of_a_host_batch(small):
    torch = require_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    b = next(l3.Loader(small.l3, 4, crop=32, rank=0, world_size=1))
    on_gpu = torch.from_dlpack(b.images).cuda(non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.cpu(), torch.from_numpy(np.from_dlpack(b.images)))


def test_pin_memory_agrees_with_torch(small):
    """``pin_memory=True`` is refused, with the reason, only where torch sees no CUDA device either; where it
    is granted, torch views each batch without a copy, and with a device it sees page-locked memory that
    ``.cuda(non_blocking=True)`` copies as it is."""
    torch = require_module("torch")
    kw = dict(crop=32, shuffle=False, epochs=1, rank=0, world_size=1)
    try:
        pinned = l3.Loader(small.l3, 2, pin_memory=True, **kw)
    except l3.GpuError as e:
        assert str(e).startswith("pin_memory: cannot page-lock batch memory"), str(e)
        assert not torch.cuda.is_available(), f"torch has a CUDA device, the loader refused to pin: {e}"
        return
    cpu = list(l3.Loader(small.l3, 2, **kw))
    got = list(pinned)
    assert len(got) == len(cpu) > 0
    for b, c in zip(got, cpu):
        assert b.images.pinned
        t = torch.from_dlpack(b.images)
        assert t.data_ptr() == b.images.data_ptr
        want = torch.from_numpy(np.from_dlpack(c.images))
        if torch.cuda.is_available():
            # torch answers is_pinned() False for every pointer until it has initialised CUDA itself
            # (at::Context::isPinnedPtr); a training step has, by the time it copies a batch.
            torch.cuda.init()
            assert t.is_pinned()
            on_gpu = t.cuda(non_blocking=True)
            torch.cuda.synchronize()
            assert torch.equal(on_gpu.cpu(), want)
        else:
            assert torch.equal(t, want)


def test_jax_from_dlpack_views_the_batch(small):
    jax = require_module("jax")
    b = next(l3.Loader(small.l3, 4, crop=32, layout="NHWC", dtype="float32", rank=0, world_size=1))
    x = jax.dlpack.from_dlpack(b.images)
    assert x.shape == (4, 32, 32, 3)
    assert np.array_equal(np.asarray(x), np.from_dlpack(b.images))
    if next(iter(x.devices())).platform == "cpu":
        assert x.unsafe_buffer_pointer() == b.images.data_ptr


@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_torch_takes_a_device_batch_without_a_copy(small, dtype):
    """A GPU loader's batch stays on the device: torch views it on its current stream (ordered after the
    decode by __dlpack__(stream=...)), it equals the CPU loader's batch, and it outlives the loader."""
    torch = require_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    opts = dict(crop=(40, 56), flip=True, seed=3, dtype=dtype, rank=0, world_size=1)
    if dtype != "uint8":
        opts.update(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    gpu = l3.Loader(small.l3, 4, device="cuda", **opts)
    cpu = l3.Loader(small.l3, 4, **opts)
    side = torch.cuda.Stream()
    for g, c in zip(gpu, cpu):
        assert g.images.device == "cuda:0" and g.images.__dlpack_device__() == (2, 0)
        with torch.cuda.stream(side):
            t = torch.from_dlpack(g.images)
            assert t.device.type == "cuda" and t.data_ptr() == g.images.data_ptr
            doubled = t.to(torch.float32) * 2
        want = torch.from_numpy(np.from_dlpack(c.images)).to(torch.float32)
        side.synchronize()
        assert torch.equal(doubled.cpu(), want * 2)
    last = t
    del g, gpu
    torch.cuda.synchronize()
    assert torch.equal(last.to(torch.float32).cpu(), want)


def test_jax_takes_a_device_batch(small):
    jax = require_module("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("no JAX GPU device")
    opts = dict(crop=32, layout="NHWC", dtype="float32", rank=0, world_size=1)
    g = next(l3.Loader(small.l3, 4, device="cuda", **opts))
    c = next(l3.Loader(small.l3, 4, **opts))
    x = jax.dlpack.from_dlpack(g.images)
    assert next(iter(x.devices())).platform == "gpu"
    assert np.array_equal(np.asarray(x), np.from_dlpack(c.images))
