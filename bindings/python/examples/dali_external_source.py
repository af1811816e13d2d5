"""L3 images in an NVIDIA DALI pipeline: ``fn.external_source`` is fed by :class:`L3Source`, whose
``__call__`` decodes each batch with ``l3toolkit.decode_batch`` (only the patches under each crop; on
the CPU threads, or on the GPU with l3-cuda) and hands DALI a DLPack-compatible tensor per sample —
DALI's ``external_source`` accepts NumPy arrays on the CPU and any ``__cuda_array_interface__`` / DLPack
object (a torch tensor) on the GPU. The rest of the pipeline is DALI's own operators.

    python dali_external_source.py images_l3/ --batch-size 16 --crop 224
"""

import argparse
from pathlib import Path

import numpy as np

import l3toolkit as l3


class L3Source:
    """A batch callback for ``fn.external_source(source=L3Source(...), batch=True)``: each call returns
    the next ``batch_size`` centre crops, ``(H, W, C)`` ``uint8`` arrays (DALI's "HWC" layout)."""

    def __init__(self, files, batch_size, crop=224, device="cpu"):
        self.files = [Path(f) for f in files]
        self.batch_size = batch_size
        self.crop = crop
        self.device = device
        self.next = 0

    def window(self, path):
        header = l3.info(path)
        h, w = header["height"], header["width"]
        ch, cw = min(self.crop, h), min(self.crop, w)
        return ((h - ch) // 2, (w - cw) // 2, ch, cw)

    def __call__(self, info=None):
        """The next batch (DALI passes a ``BatchInfo`` when ``batch_info=True``; it is not needed)."""
        if self.next >= len(self.files):
            raise StopIteration
        paths = self.files[self.next : self.next + self.batch_size]
        self.next += len(paths)
        out = l3.decode_batch(paths, windows=[self.window(p) for p in paths], layout="NHWC", channels=3,
                              device=self.device)
        tensors = out if isinstance(out, list) else [out]
        if self.device == "cpu":
            return [sample for t in tensors for sample in np.from_dlpack(t)]
        import torch  # DALI's GPU external_source takes CUDA tensors through __cuda_array_interface__

        return [sample for t in tensors for sample in torch.from_dlpack(t)]


def pipeline(files, batch_size, crop=224):
    """A CPU DALI pipeline (``device_id=None``: no GPU needed): the L3 crops as ``float32`` CHW in [0, 1],
    by DALI's ``crop_mirror_normalize``."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def make():
        images = fn.external_source(source=L3Source(files, batch_size, crop), batch=True, layout="HWC",
                                    dtype=types.UINT8)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=[0.0] * 3,
                                        std=[255.0] * 3)

    return make()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="a folder of .l3 files")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--crop", type=int, default=224)
    args = p.parse_args()
    files = sorted(Path(args.folder).rglob("*.l3"))
    pipe = pipeline(files, args.batch_size, args.crop)
    pipe.build()
    for _ in range(len(files) // args.batch_size):
        (images,) = pipe.run()
        print([np.asarray(images.at(i)).shape for i in range(len(images))])


if __name__ == "__main__":
    main()
