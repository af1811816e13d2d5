"""Elastic resume across processes, started as ``torchrun`` starts them: W processes with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in their environment stop mid-epoch,
rank 0's ``state_dict()`` is saved as JSON, and W' != W processes resume from it. From every process's
delivered indices: the epoch is delivered exactly once (padding repeats aside). Each process also
initialises ``torch.distributed`` (gloo) and the indices are gathered with ``all_gather_object``, as a
training job would check them, and with ``jax.distributed`` (CPU, gloo collectives) and
``process_allgather`` (both frameworks are in the test environment; a machine without one says so)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import l3toolkit as l3
from conftest import cannot_run

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import l3toolkit as l3
    source, batch, stop_after, state_in, out, sampler = sys.argv[1:]
    kw = dict(crop=16, seed=3, epochs=1)
    if sampler == "liquid":
        kw.update(sampler="liquid", budget=64 << 20)
    loader = l3.Loader(source, int(batch), **kw)  # rank and world size from the environment
    if state_in != "-":
        with open(state_in) as f:
            try:
                loader.load_state_dict(json.load(f))
            except l3.Error as e:
                json.dump({"refused": str(e)}, open(out, "w"))
                sys.exit(0)
    got = []
    for i, b in enumerate(loader):
        got += b.indices.tolist()
        if int(stop_after) and i + 1 == int(stop_after):
            break
    gathered = None
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None:
        dist.init_process_group("gloo")
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, got)
        gathered = [i for part in everyone for i in part]
        dist.destroy_process_group()
    jax_gathered = None
    try:
        import jax
        import numpy as np
        from jax.experimental import multihost_utils
    except ImportError:
        jax = None
    if jax is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address="127.0.0.1:" + os.environ["JAX_PORT"],
                                   num_processes=int(os.environ["WORLD_SIZE"]),
                                   process_id=int(os.environ["RANK"]))
        longest = int(np.max(multihost_utils.process_allgather(np.array([len(got)]))))
        mine = np.full(longest, -1, dtype=np.int64)
        mine[:len(got)] = got
        everyone = np.asarray(multihost_utils.process_allgather(mine))
        jax_gathered = [int(i) for i in everyone.ravel() if i >= 0]
        jax.distributed.shutdown()
    json.dump({"indices": got, "state": loader.state_dict(), "gathered": gathered,
               "jax_gathered": jax_gathered}, open(out, "w"))
    """
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, tag, source, world, batch, stop_after, state, sampler="uniform"):
    """Runs `world` rank processes at once, as torchrun does; returns each one's report."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port, jax_port = str(free_port()), str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, JAX_PORT=jax_port)
        out = tmp_path / f"{tag}-{rank}.json"
        args = [sys.executable, str(script), str(source), str(batch), str(stop_after), str(state or "-"), str(out),
                sampler]
        procs.append((subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True), out))
    reports = []
    for p, out in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out.read_text()))
    return reports


@pytest.fixture(scope="module")
def sources(small, tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    pcr, liquid = root / "pcr", root / "liquid"
    l3.convert(small.jpeg, pcr, to="pcr", progress=False)
    l3.convert(small.l3, liquid, to="liquid", progress=False)
    return {"uniform": small.l3, "pcr": pcr, "liquid": liquid}


@pytest.mark.parametrize("kind", ["uniform", "pcr", "liquid"])
@pytest.mark.parametrize("world, world2", [(4, 3), (2, 5)])
def test_processes_stopped_mid_epoch_resume_on_another_number_of_ranks(sources, tmp_path, kind, world, world2):
    source = sources[kind]
    n = l3.Loader(source, 1, rank=0, world_size=1).dataset_len
    sampler = "liquid" if kind == "liquid" else "uniform"
    first = launch(tmp_path, "first", source, world, 1, 2, None, sampler)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    assert first[0]["state"]["batch"] == 2
    second = launch(tmp_path, "second", source, world2, 2, 0, state, sampler)
    seen = [i for r in first + second for i in r["indices"]]
    assert set(seen) == set(range(n)), f"{kind}: items missing"
    assert len(seen) - n <= world2 - 1, f"{kind}: only padding repeats an item"
    for framework in ("gathered", "jax_gathered"):
        if first[0][framework] is not None:
            assert sorted(first[0][framework]) == sorted(i for r in first for i in r["indices"])
            assert sorted(second[0][framework]) == sorted(i for r in second for i in r["indices"])
    # Both frameworks are in the test environment: a gather that did not run is a test that did not run.
    for framework, module in (("gathered", "torch"), ("jax_gathered", "jax")):
        if first[0][framework] is None or second[0][framework] is None:
            cannot_run(f"{module} is not installed: the ranks' indices were not gathered with it")


def test_the_shuffle_report_measures_an_order_against_a_uniform_shuffle(sources, small):
    shuffled = l3.shuffle_report(small.l3, 2, epochs=4)
    stats = shuffled["stats"]
    assert set(stats) == {"order_correlation", "position_spread", "neighbours_same_batch", "batch_span",
                          "label_entropy_bits"}
    assert all(s["order"] == s["uniform"] for s in stats.values()), "the uniform order is the baseline"
    in_order = l3.shuffle_report(small.l3, 2, epochs=4, shuffle=False)["stats"]
    assert in_order["order_correlation"]["order"] == pytest.approx(1.0)
    assert in_order["neighbours_same_batch"]["order"] > stats["neighbours_same_batch"]["uniform"]
    pcr = l3.shuffle_report(sources["pcr"], 2, epochs=4)
    assert pcr["window"] == 4 and pcr["items"] == l3.Loader(sources["pcr"], 1, rank=0, world_size=1).dataset_len
    liquid = l3.shuffle_report(sources["liquid"], 2, sampler="liquid", budget=1 << 26, epochs=4)
    assert liquid["items"] == l3.Loader(sources["liquid"], 1, rank=0, world_size=1).dataset_len
    assert liquid["window"] is None
    assert set(liquid["stats"]) == set(stats)
    assert -1 <= liquid["stats"]["order_correlation"]["order"] <= 1
