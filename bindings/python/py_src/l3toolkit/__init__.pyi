"""Type stubs of l3toolkit (the native module re-exported by ``l3toolkit/__init__.py``)."""

import os
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Path = Union[str, "os.PathLike[str]"]
_Data = Union[bytes, bytearray, memoryview, _Path]

class Error(Exception):
    """Base class of every error raised by l3toolkit."""

class FormatError(Error, ValueError):
    """Bytes that are not a valid image, dataset or model of the kind they claim to be."""

class IOError(Error, OSError):  # noqa: A001
    """A file or folder could not be read or written (``errno`` and ``filename`` are set)."""

class OptionsError(Error, ValueError):
    """Arguments that cannot work together, or a resume state of another configuration."""

class GpuError(Error, RuntimeError):
    """The GPU was asked for and cannot do the work."""

class ImageFileError(FormatError, OSError):
    """A damaged L3 file read through Pillow: a FormatError that is also an OSError, naming the file."""

def encode(
    array: npt.NDArray[np.uint8],
    patch: Optional[int] = None,
    *,
    format: Union[Literal["v1", "v2", 1, 2], None] = None,
    profile: Optional[Literal["ans", "bp"]] = None,
    threads: Optional[int] = None,
) -> bytes:
    """Encodes a uint8 (H, W) or (H, W, C) array (C = 1, 3, 4) into an L3 file (lossless).

    format: "v1" or "v2" (default: version 2 with profile "ans", the toolkit's default format);
    profile: version 2's coding, "ans" (smallest; the default) or "bp" (bit-packed, faster); a profile
    alone means version 2."""

def decode(data: _Data, *, threads: Optional[int] = None) -> npt.NDArray[np.uint8]:
    """Decodes L3 bytes (or a file) into (H, W) for gray, (H, W, C) otherwise."""

def decode_region(data: _Data, x: int, y: int, w: int, h: int) -> npt.NDArray[np.uint8]:
    """Decodes only the w×h rectangle at (x, y), touching only the patches under it."""

def decode_batch(
    buffers: Sequence[Union[_Data, npt.NDArray[np.uint8]]],
    *,
    device: Any = None,
    windows: Optional[Sequence[Optional[Tuple[int, int, int, int]]]] = None,
    layout: Literal["NCHW", "NHWC"] = "NCHW",
    dtype: Literal["uint8", "float16", "float32"] = "uint8",
    channels: Optional[Literal[1, 3, 4]] = None,
    threads: Optional[int] = None,
) -> Union["Tensor", List["Tensor"]]:
    """Decodes a list of L3 files (bytes, bytes-like objects or paths) into one DLPack Tensor, or a
    list of one-sample Tensors when the samples differ in shape; windows are (top, left, height, width)
    or None, and only the patches under each are decoded. device "cuda" decodes with l3-cuda (GpuError
    without a usable GPU, never a CPU fallback)."""

def info(data: _Data) -> Dict[str, Any]:
    """Header of an L3 file: width, height, channels, patch_size, patches_x, patches_y, version,
    profile ("ans"/"bp" for version 2, None for version 1), file_bytes, patch_data_bytes, raw_bytes,
    ratio."""

def shuffle_report(source: _Path, batch_size: int, epochs: int = 8, **kwargs: Any) -> Dict[str, Any]:
    """How far the order a Loader with these options would follow is from a uniform shuffle."""
    ...

def read_image(path: _Path, *, to_8bit: bool = False) -> npt.NDArray[np.uint8]:
    """Reads any image file the toolkit reads (PNG, JPEG, PPM, L3, ...) with its import rules."""

def convert(
    src: _Path,
    dst: _Path,
    to: Literal["l3", "raw", "png", "jpeg", "pcr", "liquid"] = "l3",
    progress: bool = True,
    *,
    quality: Optional[int] = None,
    threads: Optional[int] = None,
    to_8bit: bool = False,
    format: Union[Literal["v1", "v2", 1, 2], None] = None,
    profile: Optional[Literal["ans", "bp"]] = None,
) -> Dict[str, Any]:
    """Converts every image under src into dst in format ``to``; returns a summary. ``format`` and
    ``profile`` choose the L3 format for to="l3", as in ``encode``."""

def stylize(
    image: npt.NDArray[np.uint8],
    model: Union[Model, _Path],
    *,
    tile: Optional[int] = None,
    mode: str = "exact",
    threads: Optional[int] = None,
    padding: Optional[str] = None,
    ram_budget_mib: int = 2048,
    spill_dir: Optional[_Path] = None,
    full: bool = False,
    device: Any = None,
    precision: Literal["f32", "tf32", "f16"] = "f32",
    gpu_memory: Optional[int] = None,
) -> npt.NDArray[np.uint8]:
    """Style transfer on a uint8 (H, W, 3) image of any size with BSP tiling, on the CPU or a CUDA GPU
    (``device="cuda"``; ``GpuError`` without a usable one)."""

class Model:
    """A network loaded once: an ONNX model (the tileable CNN subset) or a TransformerNet in safetensors."""

    def __init__(self, path: _Path, *, padding: Optional[Literal["reflect", "circular", "zero", "replicate"]] = None) -> None: ...
    @property
    def channels(self) -> int: ...
    @property
    def nodes(self) -> int: ...

class StyleModel(Model):
    """Deprecated: :class:`Model` (a ``DeprecationWarning`` says so)."""

    def __init__(self, path: _Path, *, padding: Optional[Literal["reflect", "circular", "zero", "replicate"]] = None) -> None: ...

def infer(
    image: Union[npt.NDArray[np.float32], npt.NDArray[np.uint8], _Path],
    model: Union[Model, _Path],
    *,
    output: Optional[_Path] = None,
    tile: Optional[int] = None,
    mode: str = "exact",
    device: Any = "cpu",
    precision: Literal["f32", "tf32", "f16"] = "f32",
    gpu_memory: Union[int, str, None] = None,
    threads: Optional[int] = None,
    padding: Optional[Literal["reflect", "circular", "zero", "replicate"]] = None,
    ram_budget_mib: int = 2048,
    spill_dir: Optional[_Path] = None,
    full: Optional[bool] = None,
    in_scale: float = 1.0,
    out_scale: float = 1.0,
    out_dtype: Optional[Literal["uint8", "float32"]] = None,
    page: Optional[int] = None,
    level: Optional[int] = None,
    group: Any = None,
) -> Optional[npt.NDArray[np.float32]]:
    """Runs a CNN over an image of any size with exact BSP tiling: a float32 (C, H, W) array back, or the
    output written to ``output`` (.npy float32 tile by tile, .tif/.tiff tiled BigTIFF tile by tile — uint8
    or ``out_dtype="float32"`` —, .png, .ppm and .l3 rows streamed, .jpg encoded whole): the
    network's whole output as onnxruntime gives it (``full=False``: cropped to the input's size times the
    network's scale). The keywords are
    ``l3 infer``'s flags (:func:`infer_options`); a bad value raises ``OptionsError`` naming it. Paths are
    read by region from .l3 and .tif/.tiff (``page``, ``level``: a TIFF's page and that page's level;
    either asked of anything but a TIFF path raises ``OptionsError``); other images are decoded whole (a
    ``UserWarning`` says so). ``device="cuda"`` runs every node on the CUDA backend (f32; a GPU that cannot
    be used raises ``GpuError``). ``group`` shares the run among the processes of a ``torch.distributed``
    process group (gloo, NCCL), of JAX's multi-process runtime (``"jax"``), or of any object with ``rank``,
    ``size`` and ``all_gather(bytes) -> list[bytes]`` (and, optionally, ``exchange(list[bytes]) ->
    list[bytes]``: ``parts[r]`` to rank ``r`` alone, what each rank sent back in rank order; a torch group
    sends the halos point to point this way): each rank computes a share of the tiles, the
    normalisation statistics are merged in tile order across them, and rank 0 alone writes ``output``
    (or returns the array; the other ranks return ``None``), with exactly the bytes of a one-process run.
    Every rank must call it with the same arguments; a rank that fails stops every other one with an
    ``Error`` naming it. ``python -m l3toolkit.infer`` is ``l3 infer`` for ranks started by ``torchrun``."""

def infer_options() -> List[Tuple[str, str]]:
    """Every option of :func:`infer` besides ``image``, ``model`` and ``output``, with its default as
    ``l3 infer --help`` shows it (``"none"`` for an unset one)."""

class Tensor:
    """A batch tensor in loader memory (host, or the GPU of a ``Loader(device="cuda")``), exported through
    DLPack without a copy."""

    @property
    def shape(self) -> Tuple[int, int, int, int]: ...
    @property
    def dtype(self) -> Literal["uint8", "float16", "float32"]: ...
    @property
    def layout(self) -> Literal["NCHW", "NHWC"]: ...
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def pinned(self) -> bool:
        """Whether a host batch is in page-locked memory (``pin_memory=True``)."""
    @property
    def data_ptr(self) -> int:
        """Address of the first element (host or device): the pointer every DLPack export carries."""
    @property
    def nbytes(self) -> int: ...
    def tobytes(self) -> bytes:
        """The raw little-endian elements copied to host memory (for a device batch, after its decode)."""
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def numpy(self) -> np.ndarray:
        """numpy.from_dlpack(self): a view, no copy (host batches; ``TypeError`` on a GPU)."""
    def __array__(self, dtype: Optional[Any] = None, copy: Optional[bool] = None) -> np.ndarray: ...
    def __len__(self) -> int: ...

class Masks:
    """A batch's label maps, ``(N, H, W)`` uint8 (uint16 for 16-bit masks), in loader memory (or, with
    ``device="cuda"``, uint8 in GPU memory), exported through DLPack without a copy; each follows its
    image's geometry (nearest, ``ignore_index`` outside it)."""

    @property
    def shape(self) -> Tuple[int, int, int]: ...
    @property
    def dtype(self) -> Literal["uint8", "uint16"]: ...
    @property
    def device(self) -> str: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def numpy(self) -> np.ndarray: ...
    def __array__(self, dtype: Optional[Any] = None, copy: Optional[bool] = None) -> np.ndarray: ...
    def tobytes(self) -> bytes: ...
    def __len__(self) -> int: ...

class Batch:
    """One batch: images (Tensor), labels and indices (int64 arrays), epoch, index; masks and boxes when
    asked for."""

    @property
    def images(self) -> Tensor: ...
    @property
    def labels(self) -> npt.NDArray[np.int64]: ...
    @property
    def indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int:
        """Position of this batch within its epoch."""
    @property
    def skipped(self) -> List[Tuple[int, str]]: ...
    @property
    def wait(self) -> float:
        """Seconds the consumer waited for this batch."""
    @property
    def windows(self) -> Any:
        """``(N, 4)`` int64: top, left, height, width of each sample's window in source pixels."""
    @property
    def flipped(self) -> Any:
        """``(N,)`` bool: whether each sample is mirrored left-right."""
    @property
    def sizes(self) -> Any:
        """``(N, 2)`` int64: valid height and width of each sample (the rest is padding)."""
    @property
    def masks(self) -> Optional[Masks]:
        """The samples' label maps (``masks=``), else None."""
    @property
    def boxes(self) -> Optional[List[npt.NDArray[np.float32]]]:
        """Per sample, its boxes ``(K, 4)`` x1 y1 x2 y2 in output pixels (``boxes=``), else None."""
    @property
    def box_labels(self) -> Optional[List[npt.NDArray[np.int64]]]:
        """Per sample, each box's category id ``(K,)``, beside ``boxes``."""
    def __len__(self) -> int: ...

def loader_options() -> List[Tuple[str, str]]:
    """Every option ``Loader`` takes besides ``source``, with its default as ``l3 stream --help`` shows it."""

class Loader:
    """Batches of fixed-size samples from a dataset, decoded by background threads."""

    def __init__(
        self,
        source: _Path,
        batch_size: int,
        *,
        crop: Union[int, Tuple[int, int], None] = (224, 224),
        random_crop: bool = False,
        flip: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        epochs: Optional[int] = None,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        threads: Optional[int] = None,
        layout: Literal["NCHW", "NHWC"] = "NCHW",
        dtype: Literal["uint8", "float16", "float32"] = "uint8",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        device: Any = "cpu",
        sampler: Literal["uniform", "liquid"] = "uniform",
        budget: Union[int, str, None] = None,
        group: Optional[int] = None,
        labels: Optional[_Path] = None,
        io_threads: int = 2,
        prefetch: int = 4,
        skip_errors: bool = False,
        partial_images: bool = False,
        storage_mbps: Optional[float] = None,
        retry_secs: float = 60,
        cache_dir: Optional[_Path] = None,
        cache_limit: Union[int, str, None] = None,
        pcr_window: int = 4,
        pcr_partial: bool = False,
        decode: Literal["region", "whole"] = "region",
        gpu_fallback: bool = False,
        pin_memory: bool = False,
        shard_tail: Literal["pad", "drop"] = "pad",
        scale: Union[Tuple[float, float], str, None] = None,
        ratio: Union[Tuple[float, float], str, None] = None,
        resize: Optional[int] = None,
        jitter: Union[Tuple[float, float], str, None] = None,
        max_size: Optional[int] = None,
        interpolation: Literal["bilinear", "nearest"] = "bilinear",
        fill: int = 0,
        channels: Literal[1, 3, 4] = 3,
        masks: Optional[_Path] = None,
        image_suffix: Optional[str] = None,
        mask_suffix: Optional[str] = None,
        ignore_index: int = 255,
        boxes: Optional[_Path] = None,
        min_box_size: float = 1,
    ) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    def __len__(self) -> int:
        """Batches per epoch for this rank."""
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state: Dict[str, Any]) -> None: ...
    def stats(self) -> Dict[str, float]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Loader": ...
    def __exit__(self, *args: Any) -> bool: ...
    @property
    def dataset_len(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def threads_alive(self) -> int: ...
    @property
    def warnings(self) -> List[str]: ...
    def item_source(self, index: int) -> str:
        """Where dataset item ``index`` lives: what error messages name."""
