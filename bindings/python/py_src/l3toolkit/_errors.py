"""The exceptions every l3toolkit function raises. Messages name the file or item concerned."""


class Error(Exception):
    """Base class of every error raised by l3toolkit."""


class FormatError(Error, ValueError):
    """Bytes that are not a valid image, dataset or model of the kind they claim to be."""


class IOError(Error, OSError):  # noqa: A001 - deliberately shadows the builtin alias inside this package
    """A file or folder could not be read or written (an ``OSError``: ``errno`` and ``filename`` are set)."""


class OptionsError(Error, ValueError):
    """Arguments that cannot work together, or a resume state that belongs to another configuration."""


class GpuError(Error, RuntimeError):
    """The GPU was asked for and cannot do the work (no driver or device, or a failed batch)."""


class ImageFileError(FormatError, OSError):
    """A damaged L3 file read through Pillow (``Image.open``, ``load``, ``crop``): a :class:`FormatError`
    that is also the ``OSError`` Pillow's callers catch for a broken image file, naming the file."""
