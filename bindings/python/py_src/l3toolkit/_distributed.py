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


class _Torch:
    """A ``torch.distributed`` process group as the ranks of a shared run: ``all_gather_object`` (gloo on
    the CPU; NCCL with the current CUDA device)."""

    def __init__(self, dist, group):
        self._dist, self._group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_gather(self, mine):
        out = [None] * self.size
        self._dist.all_gather_object(out, mine, group=self._group)
        return out


class _Jax:
    """JAX's multi-process runtime (``jax.distributed.initialize``) as the ranks of a shared run:
    ``process_allgather`` of the messages padded to the longest."""

    def __init__(self, jax):
        import numpy as np
        from jax.experimental import multihost_utils

        self._np, self._gather = np, multihost_utils.process_allgather
        self.rank = jax.process_index()
        self.size = jax.process_count()

    def all_gather(self, mine):
        np = self._np
        lengths = np.asarray(self._gather(np.array([len(mine)], dtype=np.int64))).reshape(-1)
        padded = np.zeros(max(int(lengths.max()), 1), dtype=np.uint8)
        padded[: len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        everyone = np.asarray(self._gather(padded)).reshape(self.size, -1)
        return [everyone[r, : int(n)].tobytes() for r, n in enumerate(lengths)]


def collective(group):
    """The ranks ``infer(..., group=...)`` shares a run among: a ``torch.distributed`` process group (or
    ``torch.distributed.group.WORLD``), ``"jax"`` or the ``jax`` module (JAX's multi-process runtime), or any
    object with ``rank``, ``size`` and ``all_gather(bytes) -> list[bytes]`` (taken as it is)."""
    if isinstance(group, str) and group == "jax" or getattr(group, "__name__", None) == "jax":
        import jax

        return _Jax(jax)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and _is_torch_group(dist, group):
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialised (init_process_group first)")
        return _Torch(dist, group)
    if all(hasattr(group, a) for a in ("rank", "size", "all_gather")):
        return group
    raise TypeError(
        f"group: expected a torch.distributed process group, 'jax', or an object with rank, size and "
        f"all_gather; got {type(group).__name__}"
    )


def _is_torch_group(dist, group):
    try:
        return isinstance(group, dist.ProcessGroup) or group is dist.group.WORLD
    except AttributeError:
        return False
