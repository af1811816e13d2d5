"""l3toolkit: keep accelerators fed when training on high-resolution images.

- :class:`Loader`: batches of fixed-size samples from an image folder, an L3 folder, a Liquid or a PCR
  dataset, decoded by background threads into pooled buffers; ``batch.images`` exports DLPack, so
  ``torch.from_dlpack``, ``numpy.from_dlpack`` and ``jax.dlpack.from_dlpack`` take it without a copy.
- :func:`encode`, :func:`decode`, :func:`decode_region`, :func:`info`: the L3 lossless codec on NumPy
  arrays; :func:`read_image` reads any image file.
- :func:`decode_batch`: a list of L3 buffers (or paths) from any pipeline — WebDataset, DALI, your own
  ``Dataset`` — into one DLPack tensor on the CPU or a CUDA device, windows optional.
- Pillow reads and writes ``.l3`` once this package is imported (:mod:`l3toolkit.pillow`):
  ``Image.open``, torchvision's ``ImageFolder`` and Hugging Face ``datasets`` read L3 datasets unchanged.
- :func:`convert`: dataset folders into L3, raw, PNG, JPEG, PCR or Liquid datasets.
- :func:`infer` / :class:`Model`: any CNN (ONNX, the tileable subset, or a TransformerNet in safetensors) on
  images of any size, exact; :func:`infer_options` lists its keywords, the flags of ``l3 infer``.
- :func:`stylize`: style transfer on images of any size with BSP tiling, with a :class:`Model` holding a
  TransformerNet (:class:`StyleModel` is its deprecated name).

Errors are :class:`Error` subclasses: :class:`FormatError`, :class:`IOError` (an ``OSError``),
:class:`OptionsError`, :class:`GpuError`; a damaged L3 file read through Pillow raises
:class:`ImageFileError` (a ``FormatError`` and an ``OSError``).
"""

import warnings

from ._errors import Error, FormatError, GpuError, ImageFileError, IOError, OptionsError  # noqa: A004
from ._l3toolkit import (
    Batch,
    Loader,
    Masks,
    Model,
    Tensor,
    __version__,
    convert,
    decode,
    decode_batch,
    decode_region,
    encode,
    infer,
    infer_options,
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
    "ImageFileError",
    "Loader",
    "Masks",
    "Model",
    "OptionsError",
    "StyleModel",
    "Tensor",
    "__version__",
    "convert",
    "decode",
    "decode_batch",
    "decode_region",
    "encode",
    "infer",
    "infer_options",
    "info",
    "loader_options",
    "read_image",
    "shuffle_report",
    "stylize",
]

try:
    from . import pillow  # noqa: F401  (registers the L3 plugin with Pillow)
except ModuleNotFoundError as e:
    if e.name != "PIL":  # only a missing Pillow means there is nothing to register with
        raise


class StyleModel(Model):
    """Deprecated: :class:`Model` loads the same networks with the same keywords (``StyleModel(path)`` is
    ``Model(path)``, with a ``DeprecationWarning``)."""

    __slots__ = ()

    def __new__(cls, path, *, padding=None):
        warnings.warn(
            "l3toolkit.StyleModel is deprecated: use l3toolkit.Model (the same networks and keywords)",
            DeprecationWarning,
            stacklevel=2,
        )
        return super().__new__(cls, path, padding=padding)
