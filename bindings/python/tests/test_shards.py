"""WebDataset tar shards: ``webdataset`` reads the shards ``l3 convert --to shards`` writes, unchanged, and
``l3toolkit.Loader`` reads shards ``webdataset.TarWriter`` writes (their index built on first open and kept
beside them) with the samples and order of the folder they came from."""

import subprocess

import numpy as np
from PIL import Image

import l3toolkit as l3
from conftest import l3_binary, require_module

wds = require_module("webdataset", module_level=True)


def epoch(loader):
    return [(b.indices.tolist(), b.labels.tolist(), np.from_dlpack(b.images).tobytes()) for b in loader]


def test_webdataset_reads_the_shards_l3_writes(small, tmp_path):
    out = tmp_path / "shards"
    subprocess.run([str(l3_binary()), "convert", "--to", "shards", str(small.l3), str(out), "--shard-size", "200K",
                    "--shard-prefix", "train"], check=True, capture_output=True)
    shards = sorted(out.glob("train-*.tar"))
    assert len(shards) >= 2
    urls = f"{out}/train-{{000000..{len(shards) - 1:06d}}}.tar"
    got = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}
    assert sorted(got) == [str(p) for p in small.items]
    for i, item in enumerate(small.items):
        sample = got[str(item)]
        assert sample["l3"] == (small.l3 / item.with_suffix(".l3")).read_bytes()
        assert int(sample["cls"]) == small.labels[i]
    # The same pattern through the loader: the folder's samples, in its order.
    kw = dict(batch_size=4, crop=32, shuffle=True, seed=5, threads=2)
    assert epoch(l3.Loader(urls, **kw)) == epoch(l3.Loader(small.l3, **kw))


def test_the_loader_reads_shards_webdataset_wrote(small, tmp_path):
    out = tmp_path / "wds"
    out.mkdir()
    pattern = str(out / "png-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=5, verbose=0) as sink:
        for i, item in enumerate(small.items):
            sink.write({"__key__": str(item), "png": (small.png / item.with_suffix(".png")).read_bytes(),
                        "cls": str(small.labels[i])})
    n = len(list(out.glob("*.tar")))
    assert n >= 2
    kw = dict(batch_size=4, crop=32, shuffle=True, seed=5, threads=2)
    loader = l3.Loader(f"{out}/png-{{000000..{n - 1:06d}}}.tar", **kw)
    assert epoch(loader) == epoch(l3.Loader(small.png, **kw))
    assert len(list(out.glob("*.tar.idx"))) == n, "the built indexes are kept beside the shards"
    # A folder of shards opens too, with the kept indexes.
    assert epoch(l3.Loader(out, **kw)) == epoch(l3.Loader(small.png, **kw))


def test_masks_travel_in_the_shards(small, tmp_path):
    """``--shard-masks`` packs each image's label map as its ``KEY.seg.png`` member; ``masks="@shards"``
    reads it from there: the masks the folder with its mask folder gives, and ``webdataset`` sees them."""
    masks = tmp_path / "masks"
    for item in small.items:
        rgb = np.asarray(Image.open(small.png / item.with_suffix(".png")).convert("L"))
        (masks / item.parent).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgb // 32).save(masks / item.with_suffix(".png"))
    out = tmp_path / "shards"
    subprocess.run([str(l3_binary()), "convert", "--to", "shards", str(small.png), str(out), "--shard-size", "300K",
                    "--shard-masks", str(masks)], check=True, capture_output=True)
    seg = {s["__key__"]: s["seg.png"] for s in wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False)}
    first = str(small.items[0])
    assert seg[first] == (masks / small.items[0].with_suffix(".png")).read_bytes()

    def masks_of(loader):
        return [(b.indices.tolist(), np.from_dlpack(b.masks).tobytes()) for b in loader]

    kw = dict(batch_size=4, crop=32, shuffle=True, seed=5, threads=2)
    assert masks_of(l3.Loader(out, masks="@shards", **kw)) == masks_of(l3.Loader(small.png, masks=masks, **kw))
