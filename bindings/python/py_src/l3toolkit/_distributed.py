"""Where a Loader's rank and world size come from when they are not given."""

import os
import sys


def rank_and_world_size():
    """``torch.distributed``'s rank and world size when it is initialised, else the ``RANK`` and
    ``WORLD_SIZE`` environment variables (what ``torchrun`` sets), else ``(0, 1)``.

    ``torch`` is never imported here: a process group can only be initialised by a program that has
    already imported it.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if world is not None:
        try:
            return int(rank or 0), int(world)
        except ValueError:
            raise ValueError(f"RANK={rank!r} WORLD_SIZE={world!r}: expected integers") from None
    return 0, 1
