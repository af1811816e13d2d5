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

    def exchange(self, parts):
        """``parts[r]`` to rank ``r`` alone (point to point: ``batch_isend_irecv``), after one all-gather of
        the sizes; what each rank sent this one, in rank order."""
        import torch

        dist, group = self._dist, self._group
        device = torch.device("cuda", torch.cuda.current_device()) if _is_nccl(dist, group) else None
        sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64, device=device)
        table = [torch.empty_like(sizes) for _ in range(self.size)]
        dist.all_gather(table, sizes, group=group)
        ops, bufs = [], {}
        for r in range(self.size):
            if r == self.rank:
                continue
            peer = _global_rank(dist, group, r)
            if parts[r]:
                t = torch.frombuffer(bytearray(parts[r]), dtype=torch.uint8)
                ops.append(dist.P2POp(dist.isend, t.to(device) if device else t, peer, group))
            n = int(table[r][self.rank])
            if n:
                bufs[r] = torch.empty(n, dtype=torch.uint8, device=device)
                ops.append(dist.P2POp(dist.irecv, bufs[r], peer, group))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        out = []
        for r in range(self.size):
            if r == self.rank:
                out.append(bytes(parts[r]))
            elif r in bufs:
                out.append(bufs[r].cpu().numpy().tobytes())
            else:
                out.append(b"")
        return out


def _is_nccl(dist, group):
    try:
        return str(dist.get_backend(group)).lower() == "nccl"
    except (RuntimeError, ValueError):
        return False


def _global_rank(dist, group, r):
    """Rank ``r`` of ``group`` as the default group numbers it (what point-to-point ops name)."""
    if group is None or group is dist.group.WORLD:
        return r
    return dist.get_global_rank(group, r)


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
    object with ``rank``, ``size`` and ``all_gather(bytes) -> list[bytes]`` (taken as it is; where it also
    has ``exchange(list[bytes]) -> list[bytes]``, the halos go to their readers alone through it)."""
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
