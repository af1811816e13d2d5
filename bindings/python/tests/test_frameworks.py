"""Zero-copy hand-over to PyTorch and JAX (run where they are installed: CI tests through NumPy, since a CPU
machine cannot install torch without gigabytes of CUDA wheels; the GPU machine has both)."""

import numpy as np
import pytest

import l3toolkit as l3


@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32"])
def test_torch_from_dlpack_views_the_batch(small, dtype):
    torch = pytest.importorskip("torch")
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
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    b = next(l3.Loader(small.l3, 4, crop=32, rank=0, world_size=1))
    on_gpu = torch.from_dlpack(b.images).cuda(non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.cpu(), torch.from_numpy(np.from_dlpack(b.images)))


def test_jax_from_dlpack_views_the_batch(small):
    jax = pytest.importorskip("jax")
    b = next(l3.Loader(small.l3, 4, crop=32, layout="NHWC", dtype="float32", rank=0, world_size=1))
    x = jax.dlpack.from_dlpack(b.images)
    assert x.shape == (4, 32, 32, 3)
    assert np.array_equal(np.asarray(x), np.from_dlpack(b.images))
    if next(iter(x.devices())).platform == "cpu":
        assert x.unsafe_buffer_pointer() == b.images.data_ptr
