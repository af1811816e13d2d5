"""l3toolkit: keep accelerators fed when training on high-resolution images.

- :class:`Loader`: batches of fixed-size samples from an image folder, an L3 folder, a Liquid or a PCR
  dataset, decoded by background threads into pooled buffers; ``batch.images`` exports DLPack, so
  ``torch.from_dlpack``, ``numpy.from_dlpack`` and ``jax.dlpack.from_dlpack`` take it without a copy.
- :func:`encode`, :func:`decode`, :func:`decode_region`, :func:`info`: the L3 lossless codec on NumPy
  arrays; :func:`read_image` reads any image file.
- :func:`convert`: dataset folders into L3, raw, PNG, JPEG, PCR or Liquid datasets.
- :func:`stylize` / :class:`StyleModel`: style transfer on images of any size with BSP tiling.
- :func:`infer` / :class:`Model`: any CNN (ONNX, the tileable subset) on images of any size, exact.

Errors are :class:`Error` subclasses: :class:`FormatError`, :class:`IOError` (an ``OSError``),
:class:`OptionsError`, :class:`GpuError`.
"""

from ._errors import Error, FormatError, GpuError, IOError, OptionsError  # noqa: A004
from ._l3toolkit import (
    Batch,
    Loader,
    Masks,
    Model,
    StyleModel,
    Tensor,
    __version__,
    convert,
    decode,
    decode_region,
    encode,
    infer,
    info,
    loader_options,
    read_image,
    shuffle_report,
    stylize,
)

__all__ = [
    "Batch",
    "Error",
    "FormatError",
    "GpuError",
    "IOError",
    "Loader",
    "Masks",
    "Model",
    "OptionsError",
    "StyleModel",
    "Tensor",
    "__version__",
    "convert",
    "decode",
    "decode_region",
    "encode",
    "infer",
    "info",
    "loader_options",
    "read_image",
    "shuffle_report",
    "stylize",
]
