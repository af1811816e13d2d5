"""Datasets on S3-compatible object storage: a real S3 server (moto's, over HTTP on loopback) holds the
small corpus, and `Loader("s3://bucket/prefix")` must deliver what the same folder on disk delivers."""

import os
from pathlib import Path

import boto3
import numpy as np
import pytest
from moto.server import ThreadedMotoServer

import l3toolkit as l3

KEY, SECRET = "l3-test-key", "l3-test-secret"


@pytest.fixture(scope="module")
def s3(small):
    """A loopback S3 server whose bucket `data` holds the small corpus as `png/…` and `l3/…`; the
    process environment points the toolkit at it (as users configure it: `AWS_*` variables)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="data")
    for folder in (small.png, small.l3):
        for f in sorted(Path(folder).rglob("*")):
            if f.is_file():
                client.upload_file(str(f), "data", f"{folder.name}/{f.relative_to(folder).as_posix()}")
    yield client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def epoch(loader):
    return [
        (b.indices.tolist(), b.labels.tolist(), np.from_dlpack(b.images).tobytes())
        for b in loader
    ]


@pytest.mark.parametrize("folder", ["png", "l3"])
def test_an_s3_prefix_loads_what_the_local_folder_loads(small, s3, folder):
    kw = dict(batch_size=4, crop=64, shuffle=True, seed=3, threads=2)
    local = epoch(l3.Loader(getattr(small, folder), **kw))
    remote_loader = l3.Loader(f"s3://data/{folder}", **kw)
    remote = epoch(remote_loader)
    assert len(remote_loader) == len(local)
    assert remote == local
    assert sum(len(i) for i, _, _ in remote) == len(small)
    assert remote_loader.stats()["bytes_read"] > 0


def test_l3_crops_read_fewer_bytes_than_whole_files(small, s3):
    whole = sum(p.stat().st_size for p in Path(small.l3).rglob("*.l3"))
    loader = l3.Loader("s3://data/l3", batch_size=4, crop=32, shuffle=False, threads=1)
    n = sum(len(b.indices) for b in loader)
    assert n == len(small)
    read = loader.stats()["bytes_read"]
    assert 0 < read < whole


def test_a_bandwidth_cap_and_a_cache_are_options(small, s3, tmp_path):
    cache = tmp_path / "cache"
    kw = dict(batch_size=4, crop=64, shuffle=False, threads=2)
    capped = l3.Loader("s3://data/png", storage_mbps=1000, cache_dir=cache, cache_limit=1 << 30, **kw)
    assert epoch(capped) == epoch(l3.Loader(small.png, **kw))
    assert any(p.is_file() for p in cache.rglob("*")), "the cache holds the objects read"
    first = capped.stats()
    assert first["cache_misses"] > 0 and first["storage_bytes_read"] > 0
    capped.close()
    del capped  # the dataset goes, and with it the cache writes the blocks still queued
    again = l3.Loader("s3://data/png", cache_dir=cache, **kw)
    assert epoch(again) == epoch(l3.Loader(small.png, **kw))
    s = again.stats()
    assert s["cache_hits"] > 0 and s["cache_misses"] == 0 and s["cache_hit_rate"] == 1.0, s
    assert s["storage_bytes_read"] == 0 and s["cache_hit_bytes"] > 0 and s["storage_retries"] == 0, s


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(storage_mbps=0), "storage_mbps"),
        (dict(storage_mbps=float("nan")), "storage_mbps"),
        (dict(cache_limit=1 << 20), "cache_dir"),
    ],
)
def test_storage_option_errors(small, kwargs, match):
    with pytest.raises(l3.OptionsError, match=match):
        l3.Loader(small.png, batch_size=2, **kwargs)


def test_missing_buckets_and_prefixes_are_named(s3):
    with pytest.raises(l3.Error, match="no-such-bucket"):
        l3.Loader("s3://no-such-bucket/x", batch_size=2)
    with pytest.raises(l3.Error, match="absent"):
        l3.Loader("s3://data/absent", batch_size=2)
