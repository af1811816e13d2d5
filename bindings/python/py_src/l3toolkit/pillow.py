"""L3 in Pillow: importing ``l3toolkit`` (or this module) registers an L3 plugin, so code written for
Pillow reads and writes ``.l3`` files unchanged — ``Image.open``, ``torchvision.datasets.ImageFolder``'s
default loader, Hugging Face ``datasets``' ``imagefolder``.

What is lazy:

- ``Image.open(path)`` reads the file's prefix only (header and offset table, checked): ``mode`` (``L``,
  ``RGB`` or ``RGBA``: the channels L3 stores, 8 bits each) and ``size`` are known without decoding.
- ``im.crop(box)`` on an image not yet loaded reads the file and decodes only the patches under the box
  (pixels outside the image are zero, as Pillow's crop makes them). Everything else (``load``,
  ``convert``, ``resize``, ``np.asarray``) decodes the whole image once, on every core.
- ``draft`` does nothing: L3 stores no reduced resolution, so a smaller image costs a full decode.

``im.save("x.l3")`` (or ``format="L3"``) encodes ``L``, ``RGB`` and ``RGBA`` images losslessly, with the
encoder's options as keywords: ``version`` (``"v1"`` / ``"v2"``, the L3 version: Pillow's own ``format=``
is taken), ``profile`` (``"ans"`` / ``"bp"``), ``patch`` (or ``patch_size``), ``threads``; other modes
are refused (convert first). A file whose first bytes are not L3's is Pillow's
``UnidentifiedImageError``; a damaged L3 file raises :class:`l3toolkit.ImageFileError` (a
``FormatError`` that is also the ``OSError`` Pillow's callers catch) naming the file.

``datasets`` keeps its own list of image extensions, read when it is imported: this module adds ``.l3``
to it whether ``datasets`` is imported before or after ``l3toolkit``.
"""

import importlib.abc
import importlib.util
import os
import sys

import numpy as np
from PIL import Image, ImageFile

from . import _l3toolkit
from ._errors import FormatError, ImageFileError

FORMAT = "L3"
EXTENSION = ".l3"
MIME = "image/x-l3"
MAGIC = b"L3IM"
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _accept(prefix: bytes) -> bool:
    return prefix[: len(MAGIC)] == MAGIC


def _name(fp, filename) -> str:
    if filename:
        return os.fsdecode(filename)
    return str(getattr(fp, "name", "") or "<L3 stream>")


class L3ImageFile(ImageFile.ImageFile):
    """An L3 file opened through Pillow: the header is read at open, the pixels when first needed."""

    format = FORMAT
    format_description = "L3 lossless image (l3toolkit)"

    def _open(self):
        name = _name(self.fp, self.filename)
        self.fp.seek(0, os.SEEK_END)
        file_len = self.fp.tell()
        self.fp.seek(0)
        have = self.fp.read(min(20, file_len))
        if not _accept(have):
            raise SyntaxError("not an L3 file")
        while True:
            try:
                needed, header = _l3toolkit._read_header(have, file_len, name)
            except FormatError as e:
                raise ImageFileError(str(e)) from e
            if header is not None:
                break
            more = self.fp.read(min(needed, file_len) - len(have))
            if not more:
                raise ImageFileError(f"{name}: the file ends inside its L3 header")
            have += more
        self._l3_name = name
        self._l3_file_len = file_len
        self._mode = _MODES[header["channels"]]
        if not isinstance(getattr(type(self), "mode", None), property):
            self.mode = self._mode  # Pillow before 10.1: a plain attribute
        self._size = (header["width"], header["height"])
        self.info["l3_version"] = header["version"]
        self.info["l3_profile"] = header["profile"]
        self.info["l3_patch_size"] = header["patch_size"]
        tile = getattr(ImageFile, "_Tile", lambda *parts: parts)  # a named tuple since Pillow 11
        self.tile = [tile("l3", (0, 0) + self.size, 0, (name,))]

    def _l3_bytes(self) -> bytes:
        self.fp.seek(0)
        data = self.fp.read(self._l3_file_len)
        if len(data) != self._l3_file_len:
            raise ImageFileError(f"{self._l3_name}: the file shrank to {len(data)} bytes while open")
        return data

    def crop(self, box=None):
        """Pillow's crop; on an image not yet loaded only the patches under ``box`` are decoded."""
        loaded = self.__dict__.get("_im", self.__dict__.get("im"))  # `_im` since Pillow 11, `im` before
        if box is None or loaded is not None or not self.tile:
            return super().crop(box)
        if box[2] < box[0]:
            raise ValueError("Coordinate 'right' is less than 'left'")
        if box[3] < box[1]:
            raise ValueError("Coordinate 'lower' is less than 'upper'")
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        Image._decompression_bomb_check((x1 - x0, y1 - y0))
        w, h = self.size
        out = Image.new(self.mode, (x1 - x0, y1 - y0), 0)
        ix0, iy0, ix1, iy1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
        if ix1 > ix0 and iy1 > iy0:
            window = (iy0, ix0, iy1 - iy0, ix1 - ix0)
            try:  # decode_batch's region path: only the patches under the window are read and checked
                t = _l3toolkit.decode_batch([self._l3_bytes()], windows=[window], layout="NHWC", threads=1)
            except FormatError as e:
                raise ImageFileError(str(e).replace("buffers[0]", self._l3_name, 1)) from e
            px = np.from_dlpack(t)[0]
            px = px[..., 0] if px.shape[-1] == 1 else px
            out.paste(Image.fromarray(px, self.mode), (ix0 - x0, iy0 - y0))
        out.info = self.info.copy()
        return out


class _L3Decoder(ImageFile.PyDecoder):
    """The whole image, decoded on every core from the file's bytes (Pillow hands the file over)."""

    _pulls_fd = True

    def decode(self, buffer):
        (name,) = self.args
        data = self.fd.read()
        try:
            px = _l3toolkit.decode(data)
        except FormatError as e:
            raise ImageFileError(str(e).replace("L3 data", name, 1)) from e
        self.set_as_raw(np.ascontiguousarray(px).tobytes(), self.mode)
        return -1, 0


def _save(im, fp, filename):
    if im.mode not in _MODES.values():
        raise OSError(
            f"cannot write mode {im.mode} as L3 (L3 stores L, RGB and RGBA at 8 bits: "
            f"convert the image first, e.g. im.convert('RGB'))"
        )
    opts = im.encoderinfo
    patch = opts.get("patch", opts.get("patch_size"))
    data = _l3toolkit.encode(
        np.asarray(im),
        patch,
        format=opts.get("version"),
        profile=opts.get("profile"),
        threads=opts.get("threads"),
    )
    fp.write(data)


def _datasets_knows_l3(packaged) -> None:
    """Adds ``.l3`` to Hugging Face ``datasets``' image extensions (its ``imagefolder`` builder reads
    only files whose extension it lists; the images themselves are opened through Pillow)."""
    folder = packaged.imagefolder.ImageFolder
    for ext in (EXTENSION, EXTENSION.upper()):
        if ext not in folder.EXTENSIONS:
            folder.EXTENSIONS.append(ext)
        packaged._EXTENSION_TO_MODULE.setdefault(ext, ("imagefolder", {}))
        for table in (packaged._MODULE_TO_EXTENSIONS.get("imagefolder"), getattr(packaged, "_ALL_EXTENSIONS", None),
                      getattr(packaged, "_ALL_ALLOWED_EXTENSIONS", None)):
            if table is not None and ext not in table:
                table.append(ext)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_datasets_knows_l3` right after ``datasets.packaged_modules`` is first imported (and
    before ``datasets.load`` copies its tables), then leaves ``sys.meta_path``."""

    TARGET = "datasets.packaged_modules"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _datasets_knows_l3(module)

        spec.loader.exec_module = exec_module
        return spec


def register() -> None:
    """Registers the plugin with Pillow (done on import; calling it again changes nothing)."""
    Image.register_open(FORMAT, L3ImageFile, _accept)
    Image.register_save(FORMAT, _save)
    Image.register_extension(FORMAT, EXTENSION)
    Image.register_mime(FORMAT, MIME)
    Image.register_decoder("l3", _L3Decoder)
    packaged = sys.modules.get(_AfterImport.TARGET)
    if packaged is not None:
        _datasets_knows_l3(packaged)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


register()
