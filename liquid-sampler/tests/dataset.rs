//! The sampler on real files: contents, determinism across I/O thread counts, sharding, bad input, the
//! page cache, and the profiler end to end with a small run-length codec standing in for PNG.

use liquid_sampler::direct::{DirectFile, cached_pages, drop_page_cache};
use liquid_sampler::profile::{self, ProbeSet};
use liquid_sampler::shard::shard;
use liquid_sampler::*;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

mod common;
use common::{pixels, rle_decode, rle_file, scratch};

/// A two-format dataset of `n` items written directly: item `id` is raw when `id % 3 == 0`.
fn build(dir: &Path, n: u64) -> Manifest {
    let formats = vec![
        FormatSpec {
            tag: "rle".into(),
            kind: FormatKind::Compressed,
        },
        FormatSpec {
            tag: "raw".into(),
            kind: FormatKind::Raw,
        },
    ];
    let mut w = DatasetWriter::create(
        dir,
        5,
        Ratio {
            compressed: 2,
            raw: 1,
        },
        formats,
    )
    .unwrap()
    .max_file_bytes(64 * 1024);
    for id in 0..n {
        let (wd, ht) = (32 + (id % 5) as u32 * 8, 24);
        let dims = Dims {
            width: wd,
            height: ht,
            channels: 3,
        };
        if id % 3 == 0 {
            w.add(id, (id % 4) as u32, 1, &pixels(id, wd, ht), dims)
                .unwrap();
        } else {
            w.add(id, (id % 4) as u32, 0, &rle_file(id, wd, ht), dims)
                .unwrap();
        }
    }
    w.finish().unwrap()
}

fn stream(dir: &Path, cfg: &SamplerConfig, epochs: usize) -> Vec<(usize, u64, bool, usize)> {
    let mut s = LiquidSampler::new(Dataset::open(dir).unwrap(), cfg).unwrap();
    let mut out = Vec::new();
    let mut pix = Vec::new();
    for _ in 0..epochs * s.batches_per_epoch() {
        let b = s.next_batch().unwrap();
        for d in &b.items {
            // The bytes are the item's: decode and compare with what was written.
            let dims = d.dims();
            if d.item.format == 1 {
                profile::decode_raw(&d.bytes, dims, &mut pix).unwrap();
            } else {
                rle_decode(&d.bytes, &mut pix).unwrap();
            }
            assert_eq!(
                pix,
                pixels(d.item.id, dims.width, dims.height),
                "item {}",
                d.item.id
            );
            out.push((b.epoch, d.item.id, d.cached, b.disk_items));
        }
    }
    out
}

#[test]
fn streams_every_item_once_per_epoch_with_the_right_bytes() {
    let dir = scratch("stream");
    let m = build(&dir, 90);
    assert!(m.files.len() > 2, "data files roll over: {}", m.files.len());
    let ds = Dataset::open(&dir).unwrap();
    let total: u64 = m
        .items
        .iter()
        .map(|i| i.location.length.div_ceil(4096) * 4096)
        .sum();
    let mut cfg = SamplerConfig::new(total * 3 / 10, 7);
    cfg.seed = 11;
    let s = LiquidSampler::new(ds, &cfg).unwrap();
    assert!(s.buffers().buffer_bytes() <= cfg.budget);
    drop(s);
    let a = stream(&dir, &cfg, 3);
    for e in 0..3 {
        let ids: HashSet<u64> = a.iter().filter(|x| x.0 == e).map(|x| x.1).collect();
        assert_eq!(ids.len(), 90);
        let hits = a.iter().filter(|x| x.0 == e && x.2).count();
        if e > 0 {
            assert!(
                (hits as f64 / 90.0 - 0.3).abs() < 0.1,
                "hit ratio {hits}/90"
            );
        }
    }
    // Same seed, other I/O thread count: the same sequence.
    cfg.io_threads = 5;
    assert_eq!(stream(&dir, &cfg, 3), a);
}

#[test]
fn shards_are_disjoint_equal_and_cover_the_dataset() {
    for (n, w) in [(10, 3), (9, 3), (2, 5), (101, 4)] {
        let shards: Vec<Vec<u32>> = (0..w)
            .map(|r| shard(n, r, w, 9, ShardPolicy::Pad).unwrap())
            .collect();
        let all: HashSet<u32> = shards.iter().flatten().copied().collect();
        assert_eq!(all.len(), n, "union is the dataset");
        assert!(
            shards.iter().all(|s| s.len() == n.div_ceil(w)),
            "equal sizes"
        );
        assert_eq!(
            shards.iter().map(Vec::len).sum::<usize>() - n,
            n.div_ceil(w) * w - n,
            "padding only"
        );
        // Every rank computes the same split.
        assert_eq!(shard(n, 0, w, 9, ShardPolicy::Pad).unwrap(), shards[0]);
        if n >= w {
            let d: Vec<Vec<u32>> = (0..w)
                .map(|r| shard(n, r, w, 9, ShardPolicy::DropTail).unwrap())
                .collect();
            let all: HashSet<u32> = d.iter().flatten().copied().collect();
            assert_eq!(
                all.len(),
                d.iter().map(Vec::len).sum::<usize>(),
                "drop: disjoint"
            );
            assert_eq!(all.len(), n / w * w);
        }
    }
    assert!(shard(10, 3, 3, 0, ShardPolicy::Pad).is_err());
    assert!(matches!(
        shard(0, 0, 1, 0, ShardPolicy::Pad),
        Err(Error::EmptyDataset)
    ));
}

#[test]
fn ranks_stream_their_own_shards() {
    let dir = scratch("ranks");
    build(&dir, 40);
    let mut seen = HashSet::new();
    for rank in 0..3 {
        let mut cfg = SamplerConfig::new(1 << 20, 4);
        cfg.rank = rank;
        cfg.world_size = 3;
        let a = stream(&dir, &cfg, 2);
        let e0: Vec<u64> = a.iter().filter(|x| x.0 == 0).map(|x| x.1).collect();
        assert_eq!(e0.len(), 14);
        seen.extend(e0);
    }
    assert_eq!(seen.len(), 40);
}

fn err_of(dir: &Path) -> Error {
    match Dataset::open(dir) {
        Ok(ds) => LiquidSampler::new(ds, &SamplerConfig::new(1 << 30, 4))
            .err()
            .expect("bad input must fail"),
        Err(e) => e,
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    // Missing data file.
    let dir = scratch("missing");
    let m = build(&dir, 12);
    std::fs::remove_file(dir.join(&m.files[0].name)).unwrap();
    let e = err_of(&dir);
    assert!(matches!(e, Error::MissingDataFile { .. }), "{e}");
    assert!(e.to_string().contains(&m.files[0].name), "{e}");
    // Truncated data file.
    let dir = scratch("truncated");
    let m = build(&dir, 12);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(&m.files[1].name))
        .unwrap();
    f.set_len(m.files[1].len - 100).unwrap();
    let e = err_of(&dir);
    assert!(matches!(e, Error::TruncatedDataFile { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    // Manifest disagreeing with the files: a file longer than recorded, a raw item of the wrong size.
    let dir = scratch("mismatch");
    let m = build(&dir, 12);
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(&m.files[0].name))
        .unwrap();
    f.set_len(m.files[0].len + 4096).unwrap();
    assert!(matches!(err_of(&dir), Error::ManifestMismatch { .. }));
    let dir = scratch("dims");
    let mut m = build(&dir, 12);
    let raw = m.items.iter_mut().find(|i| i.format == 1).unwrap();
    raw.dims.width += 1;
    m.write(&dir).unwrap();
    let e = err_of(&dir);
    assert!(
        matches!(e, Error::ManifestMismatch { .. }) && e.to_string().contains("raw item"),
        "{e}"
    );
    // Not a manifest at all.
    std::fs::write(dir.join("manifest.cbor"), b"garbage").unwrap();
    assert!(matches!(err_of(&dir), Error::BadManifest { .. }));
    // Zero items.
    let dir = scratch("empty");
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    Manifest::new(
        0,
        Ratio {
            compressed: 0,
            raw: 1,
        },
        formats.clone(),
    )
    .write(&dir)
    .unwrap();
    assert!(matches!(err_of(&dir), Error::EmptyDataset));
    let w = DatasetWriter::create(
        &dir,
        0,
        Ratio {
            compressed: 0,
            raw: 1,
        },
        formats,
    )
    .unwrap();
    assert!(matches!(w.finish(), Err(Error::EmptyDataset)));
    // Budget smaller than one item of each format.
    let dir = scratch("budget");
    build(&dir, 12);
    let e = LiquidSampler::new(Dataset::open(&dir).unwrap(), &SamplerConfig::new(4096, 4))
        .err()
        .unwrap();
    assert!(matches!(e, Error::BudgetTooSmall { .. }), "{e}");
    // Zero batch size.
    let e = LiquidSampler::new(
        Dataset::open(&dir).unwrap(),
        &SamplerConfig::new(1 << 20, 0),
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::BadSetting(_)), "{e}");
}

#[test]
fn truncation_after_open_is_reported_when_read() {
    let dir = scratch("late");
    let m = build(&dir, 30);
    let mut s = LiquidSampler::new(
        Dataset::open(&dir).unwrap(),
        &SamplerConfig::new(1 << 16, 4),
    )
    .unwrap();
    for f in &m.files {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(&f.name))
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    let err = (0..20)
        .find_map(|_| s.next_batch().err())
        .expect("a read must fail");
    assert!(matches!(err, Error::TruncatedDataFile { .. }), "{err}");
}

/// Reading an epoch must not grow the page cache for the data file. Residency is counted with `mincore`
/// on an `mmap` of the file; where that cannot be measured the test says why and returns.
#[test]
fn an_epoch_does_not_fill_the_page_cache() {
    let dir = scratch("pagecache");
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    let mut w = DatasetWriter::create(
        &dir,
        0,
        Ratio {
            compressed: 0,
            raw: 1,
        },
        formats,
    )
    .unwrap();
    let dims = Dims {
        width: 256,
        height: 256,
        channels: 3,
    };
    for id in 0..64u64 {
        w.add(id, 0, 0, &pixels(id, 256, 256), dims).unwrap();
    }
    let m = w.finish().unwrap();
    let file = dir.join(&m.files[0].name);
    drop_page_cache(&file).unwrap();
    let Some((before, pages)) = cached_pages(&file).unwrap() else {
        stdx::testing::skip(
            "mmap/mincore unavailable here, page cache residency cannot be measured",
        );
        return;
    };
    if before * 2 > pages {
        stdx::testing::skip(format_args!(
            "{before}/{pages} pages stay cached after DONTNEED (tmpfs-like file system)"
        ));
        return;
    }
    let ds = Dataset::open(&dir).unwrap();
    let mode = DirectFile::open(&file).unwrap().bypass();
    let mut s = LiquidSampler::new(ds, &SamplerConfig::new(4 * 196_608, 8)).unwrap();
    for _ in 0..2 * s.batches_per_epoch() {
        s.next_batch().unwrap();
    }
    let (after, _) = cached_pages(&file).unwrap().unwrap();
    println!("page cache bypass via {mode:?}: {before} -> {after} of {pages} pages resident");
    assert!(
        after <= before + pages / 50,
        "an epoch grew the page cache: {before} -> {after} of {pages}"
    );
    // The measurement can see a buffered read: the control fills the cache.
    std::fs::read(&file).unwrap();
    let (control, _) = cached_pages(&file).unwrap().unwrap();
    println!("control: a buffered read leaves {control} of {pages} pages resident");
    assert!(
        control > after + pages / 2,
        "mincore did not see a buffered read ({control})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profiler_searches_and_writes_the_dataset() {
    let src = scratch("sources");
    let mut sources = Vec::new();
    for id in 0..24u64 {
        let path = src.join(format!("{id:03}.rle"));
        std::fs::write(&path, rle_file(id, 96, 64)).unwrap();
        sources.push(SourceItem {
            id,
            label: (id % 2) as u32,
            path,
            tag: "rle".into(),
        });
    }
    let dec = rle_decode;
    let decoders: [(&str, &dyn Decoder); 1] = [("rle", &dec)];
    let cfg = ProfileConfig {
        threads: 1,
        io_threads: 1,
        seed: 3,
        probe_items: 16,
        min_time: Duration::from_millis(5),
        scratch: src.clone(),
        bandwidth: None,
    };
    let set = ProbeSet::build(&sources, &decoders, &cfg).unwrap();
    assert_eq!(set.len(), 16);
    let mut seen = Vec::new();
    let p = profile::search(&set, &decoders, &cfg, |p| seen.push(p.ratio)).unwrap();
    assert_eq!(p.probes.len(), seen.len());
    assert_eq!(
        p.probes[0].ratio,
        profile::tenths(5),
        "the search starts at 5:5"
    );
    assert!(
        p.probes.len() <= 6,
        "binary search over 11 ratios: {} probes",
        p.probes.len()
    );
    // Each step moves the way the previous probe said: load-bound -> more compressed.
    for w in p.probes.windows(2).take(p.probes.len().saturating_sub(3)) {
        let more_compressed = w[1].ratio.compressed > w[0].ratio.compressed;
        assert_eq!(
            more_compressed,
            w[0].load_bound(),
            "{:?} -> {:?}",
            w[0],
            w[1]
        );
    }
    let best = p
        .probes
        .iter()
        .map(|q| q.pipeline_ips())
        .fold(0.0, f64::max);
    let chosen = p.probes.iter().find(|q| q.ratio == p.chosen).unwrap();
    assert!(chosen.pipeline_ips() >= best * 0.999 || p.probes.len() > 2);
    assert!(
        p.probes
            .iter()
            .all(|q| q.load_ips > 0.0 && q.decode_ips > 0.0)
    );
    drop(set);
    assert!(!std::fs::read_dir(&src).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("liquid-probe")
    }));
    // Write at 7:3: 30% raw, chosen by the seed and recorded.
    let out = scratch("written");
    let ratio = Ratio {
        compressed: 7,
        raw: 3,
    };
    let m = profile::write_dataset(&sources, &decoders, ratio, 42, &out).unwrap();
    assert_eq!(m.seed, 42);
    assert_eq!(m.ratio, ratio);
    let ds = Dataset::open(&out).unwrap();
    let raw = ds
        .manifest
        .formats
        .iter()
        .position(|f| f.tag == "raw")
        .unwrap() as u16;
    let raw_ids: Vec<u64> = m
        .items
        .iter()
        .filter(|i| i.format == raw)
        .map(|i| i.id)
        .collect();
    assert_eq!(raw_ids.len(), 7, "round(24 * 0.3)");
    let again =
        profile::write_dataset(&sources, &decoders, ratio, 42, &scratch("written2")).unwrap();
    assert_eq!(again.items, m.items, "same seed, same conversion");
    let other =
        profile::write_dataset(&sources, &decoders, ratio, 43, &scratch("written3")).unwrap();
    assert_ne!(other.items, m.items);
    // Raw items hold the decoded pixels.
    let mut s = LiquidSampler::new(ds, &SamplerConfig::new(1 << 22, 5)).unwrap();
    let b = s.next_batch().unwrap();
    let mut pix = Vec::new();
    for d in &b.items {
        if d.item.format == raw {
            profile::decode_raw(&d.bytes, d.dims(), &mut pix).unwrap();
        } else {
            rle_decode(&d.bytes, &mut pix).unwrap();
        }
        assert_eq!(pix, pixels(d.item.id, 96, 64));
    }
}

#[test]
fn probes_load_through_the_bandwidth_cap() {
    let src = scratch("capped-sources");
    let sources: Vec<SourceItem> = (0..16u64)
        .map(|id| {
            let path = src.join(format!("{id:03}.rle"));
            std::fs::write(&path, rle_file(id, 96, 64)).unwrap();
            SourceItem {
                id,
                label: 0,
                path,
                tag: "rle".into(),
            }
        })
        .collect();
    let dec = rle_decode;
    let decoders: [(&str, &dyn Decoder); 1] = [("rle", &dec)];
    let mut cfg = ProfileConfig {
        threads: 1,
        io_threads: 2,
        seed: 3,
        probe_items: 16,
        min_time: Duration::from_millis(300),
        scratch: src.clone(),
        bandwidth: None,
    };
    let set = ProbeSet::build(&sources, &decoders, &cfg).unwrap();
    let all_raw = profile::tenths(0);
    let free = set.measure(all_raw, &decoders, &cfg).unwrap();
    cfg.bandwidth = Some(2_000_000);
    let capped = set.measure(all_raw, &decoders, &cfg).unwrap();
    // Over at least 0.3 s the bucket passes at most 2 MB/s plus its 0.1 s burst: under 2.7 MB/s.
    assert!(
        capped.load_mbps <= 2.7 && capped.load_mbps >= 1.0,
        "{capped:?}"
    );
    assert!(free.load_mbps > capped.load_mbps, "{free:?} vs {capped:?}");
    // Decoding does not read storage: the cap leaves it alone (same work, within noise).
    assert!(capped.load_bound(), "{capped:?}");
    drop(set);
    let _ = std::fs::remove_dir_all(&src);
}

/// Resumed at any batch of any epoch, the sampler delivers what the uninterrupted run delivers from
/// there: the same items with the same bytes, the same cached flags and the same per-batch disk reads;
/// the buffers' contents are read back once, with the first batch.
#[test]
fn resume_mid_epoch_continues_the_uninterrupted_schedule() {
    let dir = scratch("resume");
    let m = build(&dir, 60);
    let total: u64 = m
        .items
        .iter()
        .map(|i| i.location.length.div_ceil(4096) * 4096)
        .sum();
    let mut cfg = SamplerConfig::new(total * 4 / 10, 7);
    cfg.seed = 5;
    type Seen = (usize, usize, Vec<(u64, bool)>, usize, u64);
    let run = |s: &mut LiquidSampler, batches: usize| -> Vec<Seen> {
        (0..batches)
            .map(|_| {
                let b = s.next_batch().unwrap();
                for d in &b.items {
                    let raw = d.item.format == 1;
                    let dims = d.dims();
                    let mut pix = Vec::new();
                    if raw {
                        profile::decode_raw(&d.bytes, dims, &mut pix).unwrap();
                    } else {
                        rle_decode(&d.bytes, &mut pix).unwrap();
                    }
                    assert_eq!(pix, pixels(d.item.id, dims.width, dims.height));
                }
                let ids = b.items.iter().map(|d| (d.item.id, d.cached)).collect();
                (b.epoch, b.index, ids, b.disk_items, b.disk_bytes)
            })
            .collect()
    };
    let mut whole = LiquidSampler::new(Dataset::open(&dir).unwrap(), &cfg).unwrap();
    let per = whole.batches_per_epoch();
    let all = run(&mut whole, 3 * per);
    for (epoch, batch) in [(0, 3), (1, 0), (1, 4), (2, per - 1)] {
        let mut s =
            LiquidSampler::resume(Dataset::open(&dir).unwrap(), &cfg, epoch, batch).unwrap();
        let at = epoch * per + batch;
        let first = {
            let b = s.next_batch().unwrap();
            assert!(b.rebuilt_items > 0, "({epoch}, {batch}): buffers read back");
            assert!(
                b.rebuilt_items <= s.buffers().capacity.iter().sum::<usize>(),
                "no more than the buffers hold"
            );
            let ids: Vec<(u64, bool)> = b.items.iter().map(|d| (d.item.id, d.cached)).collect();
            (b.epoch, b.index, ids, b.disk_items, b.disk_bytes)
        };
        assert_eq!(first, all[at], "({epoch}, {batch}): first batch");
        let rest = run(&mut s, 3 * per - at - 1);
        assert_eq!(rest, all[at + 1..], "({epoch}, {batch}): the batches after");
        assert_eq!(s.next_batch().unwrap().rebuilt_items, 0, "read back once");
    }
    let e = LiquidSampler::resume(Dataset::open(&dir).unwrap(), &cfg, 0, per + 1)
        .err()
        .unwrap();
    assert!(e.to_string().contains("batch"), "{e}");
}

/// Stopped after `b` batches of an epoch at world size `w`, resumed at `w2`: the items no rank
/// delivered (found by replaying each rank's schedule) are shared out among the new ranks, whose
/// samplers over that part deliver each of them once (padding repeats aside), with the right bytes.
#[test]
fn the_rest_of_an_epoch_shared_out_at_another_world_size_is_delivered_once() {
    let dir = scratch("elastic");
    let m = build(&dir, 70);
    let n = m.items.len();
    for (w, b, w2, batch) in [(4, 2, 3, 4), (2, 3, 5, 3)] {
        let cfg = |rank: usize, world: usize, items: Option<std::sync::Arc<[u32]>>| {
            let mut c = SamplerConfig::new(1 << 18, batch);
            c.seed = 8;
            c.rank = rank;
            c.world_size = world;
            c.items = items;
            c
        };
        let ds = Dataset::open(&dir).unwrap();
        let mut seen = vec![0usize; n];
        for rank in 0..w {
            // What the rank really delivered equals what the replay says it did.
            let mut s =
                LiquidSampler::new(Dataset::open(&dir).unwrap(), &cfg(rank, w, None)).unwrap();
            let mut real = Vec::new();
            for _ in 0..s.batches_per_epoch() + b {
                let bt = s.next_batch().unwrap();
                if bt.epoch == 1 {
                    real.extend(bt.items.iter().map(|d| d.item.id));
                }
            }
            let replayed = delivered(&ds, &cfg(rank, w, None), 1, b).unwrap();
            let ids: Vec<u64> = replayed.iter().map(|&i| m.items[i as usize].id).collect();
            assert_eq!(ids, real, "rank {rank} of {w}");
            for i in replayed {
                seen[i as usize] += 1;
            }
        }
        let left: Vec<u32> = (0..n as u32).filter(|&i| seen[i as usize] == 0).collect();
        assert!(!left.is_empty() && left.len() < n);
        let left: std::sync::Arc<[u32]> = left.into();
        for rank in 0..w2 {
            let c = cfg(rank, w2, Some(left.clone()));
            let mut s = LiquidSampler::new(Dataset::open(&dir).unwrap(), &c).unwrap();
            for _ in 0..s.batches_per_epoch() {
                let bt = s.next_batch().unwrap();
                assert_eq!(bt.epoch, 0);
                for d in &bt.items {
                    let i = m.items.iter().position(|x| x.id == d.item.id).unwrap();
                    assert!(left.contains(&(i as u32)), "item {i} was not left");
                    seen[i] += 1;
                }
            }
        }
        let never = seen.iter().filter(|&&c| c == 0).count();
        let twice = seen.iter().filter(|&&c| c > 1).count();
        assert_eq!(never, 0, "{w}x{b} -> {w2}: every item delivered");
        assert!(
            twice <= (w - 1) + (w2 - 1),
            "{w}x{b} -> {w2}: {twice} items twice (padding only)"
        );
    }
    let bad = SamplerConfig {
        items: Some(vec![3, 2].into()),
        ..SamplerConfig::new(1 << 18, 4)
    };
    let e = LiquidSampler::new(Dataset::open(&dir).unwrap(), &bad)
        .err()
        .unwrap();
    assert!(e.to_string().contains("ascending"), "{e}");
}
