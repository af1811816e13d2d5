"""``python -m l3toolkit.infer --model M IN OUT [any other flag of l3 infer]``: ``l3 infer`` from Python,
for runs shared among processes.

Started alone it is ``l3 infer``. Started by ``torchrun --nproc-per-node P`` (``WORLD_SIZE`` > 1 in the
environment) it initialises ``torch.distributed`` — gloo on the CPU, NCCL with ``--device cuda`` (each rank
on the GPU ``LOCAL_RANK`` names, unless ``--device cuda:N`` says) — and the P ranks share the run: each
computes a share of the tiles, the normalisation statistics are merged in tile order across them, and rank
0 writes ``OUT`` with exactly the bytes ``l3 infer --model M IN OUT`` writes. ``--group jax`` uses JAX's
multi-process runtime instead (``jax.distributed.initialize()``, configured from its environment). A rank
that fails stops every other one with an error naming it, and no output is left behind.

The flags are ``l3 infer``'s (:func:`l3toolkit.infer_options`), with the same words for a bad value.
"""

import argparse
import os
import sys
import time

import l3toolkit as _l3

# Settings whose values are numbers on the Python side (`infer`'s keywords); the others are text.
_WHOLE = {"tile", "threads", "ram_budget_mib", "page", "level"}
_REAL = {"in_scale", "out_scale"}


def _value(name, text):
    """A flag's text as ``infer``'s keyword takes it; text that is not a number is passed on as it is, so
    the error names the option in the settings' own words."""
    try:
        if name in _WHOLE:
            return int(text)
        if name in _REAL:
            return float(text)
    except ValueError:
        return text
    if name == "full":
        return {"true": True, "false": False}.get(text.lower(), text)
    return text


def parser():
    p = argparse.ArgumentParser(
        prog="python -m l3toolkit.infer",
        description="l3 infer, shared among the ranks torchrun (or JAX) starts",
    )
    p.add_argument("--model", required=True, help="an ONNX model or a TransformerNet in safetensors")
    p.add_argument("input", help="the image (read by region where its format allows)")
    p.add_argument("output", help="the output file, written by rank 0")
    for name, default in _l3.infer_options():
        flag = "--" + name.replace("_", "-")
        if name == "full":
            p.add_argument(flag, nargs="?", const="true", default=None, metavar="true|false")
        else:
            p.add_argument(flag, default=None, help=f"default: {default}")
    p.add_argument("--crop-to-input", action="store_true", help="--full=false")
    p.add_argument(
        "--group",
        choices=("auto", "torch", "jax", "none"),
        default="auto",
        help="the ranks' runtime: torch.distributed when WORLD_SIZE > 1 (auto), JAX, or none (one process)",
    )
    return p


def _torch_group(device):
    import torch
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    if cuda and device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if cuda:
        torch.cuda.set_device(int(device.split(":")[1]))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return dist.group.WORLD, device, dist.destroy_process_group


def _jax_group():
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize()
    return "jax", jax.distributed.shutdown


def main(argv=None):
    args = parser().parse_args(argv)
    kwargs = {}
    for name, _ in _l3.infer_options():
        text = getattr(args, name)
        if text is not None:
            kwargs[name] = _value(name, text)
    if args.crop_to_input:
        kwargs["crop_to_input"] = True
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    which = args.group
    if which == "auto":
        which = "torch" if world > 1 else "none"
    done = None
    if which == "torch":
        group, device, done = _torch_group(str(kwargs.get("device", "cpu")))
        if "device" in kwargs:
            kwargs["device"] = device
        kwargs["group"] = group
    elif which == "jax":
        kwargs["group"], done = _jax_group()
    rank = 0
    if which == "torch":
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
    elif which == "jax":
        import jax

        rank, world = jax.process_index(), jax.process_count()
    else:
        world = 1
    t0 = time.perf_counter()
    try:
        _l3.infer(args.input, args.model, output=args.output, **kwargs)
        if rank == 0:
            secs = time.perf_counter() - t0
            print(f"infer: {args.output} written in {secs:.2f} s on {world} rank(s)", file=sys.stderr)
    except _l3.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if done is not None:
            done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
else:
    # Imported as `l3toolkit.infer` (not run with -m), this module replaces the function of that name as
    # the package's attribute: calling it calls the function still.
    import types

    _function = _l3.infer

    class _CallsInfer(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return _function(*args, **kwargs)

    sys.modules[__name__].__class__ = _CallsInfer
