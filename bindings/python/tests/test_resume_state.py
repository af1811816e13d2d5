"""``state_dict()`` / ``load_state_dict()`` against the dataset and the fields they are handed: the dataset
a state names, fields checked by name, and one ``for`` loop per epoch after an elastic resume."""

import json
import shutil
import warnings

import pytest

import l3toolkit as l3

OPTS = dict(crop=16, seed=3)


def stopped_after(source, batch, n, **kw):
    loader = l3.Loader(source, batch, **OPTS, **kw)
    for _ in range(n):
        next(loader)
    return json.loads(json.dumps(loader.state_dict()))


def test_a_state_of_another_dataset_of_the_same_length_is_refused(small, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(small.l3, a)
    shutil.copytree(small.l3, b)
    victim = sorted(p for p in b.rglob("*.l3"))[0]
    victim.rename(victim.with_name("zz-" + victim.name))
    state = stopped_after(a, 2, 1, rank=0, world_size=1)
    assert len(state["fingerprint"]) == 32
    other = l3.Loader(b, 2, **OPTS, rank=0, world_size=1)
    assert other.dataset_len == state["dataset_len"]
    with pytest.raises(l3.OptionsError, match="another dataset"):
        other.load_state_dict(state)
    # The same dataset copied elsewhere, or opened through another spelling of its path, resumes.
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    for source in (copy, str(a) + "/", a / "." , tmp_path / "b" / ".." / "a"):
        l3.Loader(source, 2, **OPTS, rank=0, world_size=1).load_state_dict(state)


def test_a_state_without_a_fingerprint_resumes_with_a_warning(small):
    state = stopped_after(small.l3, 2, 1, rank=0, world_size=1)
    del state["fingerprint"]
    state["version"] = 2
    loader = l3.Loader(small.l3, 2, **OPTS, rank=0, world_size=1)
    with pytest.warns(UserWarning, match="names no dataset"):
        loader.load_state_dict(state)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (0, 1)
    assert len(loader.state_dict()["fingerprint"]) == 32


@pytest.mark.parametrize(
    "field, value",
    [("rank", "x"), ("rank", None), ("rank", [1]), ("rank", 5), ("remaining", 7), ("remaining", [1]),
     ("epoch", 2**64 - 1), ("epoch", 2**64), ("epoch", -1), ("batch", 1.5), ("fingerprint", "xyz"),
     ("world_size", "x" * 100_000)],
)
def test_a_mistyped_or_impossible_field_is_refused_by_name(small, field, value):
    state = stopped_after(small.l3, 2, 1, rank=0, world_size=1)
    state[field] = value
    loader = l3.Loader(small.l3, 2, **OPTS, rank=0, world_size=1)
    with pytest.raises(l3.OptionsError) as e:
        loader.load_state_dict(state)
    message = str(e.value)
    assert field in message, message
    assert message.count("cannot resume") == 1, message
    assert len(message) < 1000, message


@pytest.mark.parametrize("world, world2, batch2", [(2, 3, 2), (3, 1, 4)])
def test_after_a_resume_at_another_world_size_one_loop_is_the_rest_of_the_epoch(small, world, world2, batch2):
    state = stopped_after(small.l3, 1, 2, rank=0, world_size=world)
    for rank in range(world2):
        loader = l3.Loader(small.l3, batch2, **OPTS, rank=rank, world_size=world2)
        loader.load_state_dict(state)
        rest = [(b.epoch, b.indices.tolist()) for b in loader]
        bounded = l3.Loader(small.l3, batch2, **OPTS, rank=rank, world_size=world2, epochs=1)
        bounded.load_state_dict(state)
        assert rest == [(b.epoch, b.indices.tolist()) for b in bounded]
        assert {e for e, _ in rest} == {0}
        assert [b.epoch for b in loader] == [1] * len(loader)


def test_set_epoch_past_the_last_epoch_is_refused(small):
    loader = l3.Loader(small.l3, 2, **OPTS, rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(l3.OptionsError, match="last epoch"):
            loader.set_epoch(2**64 - 1)
