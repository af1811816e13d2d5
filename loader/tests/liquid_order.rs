//! The loader with `Order::Liquid`: a multi-format Liquid dataset (written by liquid-sampler's converter
//! from the quarter-scale corpus) streamed in the order, and from the buffers, of liquid-sampler's runtime
//! sampler, then decoded and assembled by the loader's own pipeline.

mod common;

use common::{center_crop, fixture, reference_rgb};
use liquid_sampler::{LiquidSampler, SamplerConfig, ShardPolicy};
use loader::{
    Batch, Dataset, Error, Format, ImageFolder, Layout, LiquidShards, Loader, LoaderOptions,
    LoaderState, Order, SampleSpec,
};
use std::sync::{Arc, OnceLock};

const EPOCHS: usize = 3;
const BATCH: usize = 5;
const SIZE: u32 = 96;

struct Liquid {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    ds: Arc<LiquidShards>,
    /// A budget that keeps part (not all) of the dataset across epochs.
    budget: u64,
}

/// The fixture's L3 images as a Liquid dataset at 2:1 (L3:raw), item ids 100 + position.
fn liquid() -> &'static Liquid {
    static L: OnceLock<Liquid> = OnceLock::new();
    L.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let ratio = liquid_sampler::Ratio {
            compressed: 2,
            raw: 1,
        };
        common::write_liquid_l3(ratio, tmp.path());
        let ds = Arc::new(LiquidShards::open(tmp.path()).unwrap());
        // The buffers reserve each format's largest items, so half the dataset keeps a share of each.
        let budget = ds.stored_bytes() / 2;
        Liquid {
            dir: tmp.path().to_path_buf(),
            _tmp: tmp,
            ds,
            budget,
        }
    })
}

fn opts(seed: u64, budget: u64) -> LoaderOptions {
    LoaderOptions {
        batch_size: BATCH,
        decode_threads: 2,
        io_threads: 2,
        prefetch: 2,
        seed,
        epochs: Some(EPOCHS),
        order: Order::Liquid {
            budget_bytes: budget,
        },
        sample: SampleSpec {
            height: SIZE,
            width: SIZE,
            layout: Layout::Nhwc,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn collect(l: Loader) -> Vec<Batch> {
    l.map(|b| b.expect("batch")).collect()
}

/// What the trace and batch-log CSVs record of a batch.
type Audit = (usize, usize, Vec<(u64, Format, bool)>, usize, u64);

fn audit(ds: &dyn Dataset, b: &Batch) -> Audit {
    let items = b
        .ids
        .iter()
        .zip(&b.formats)
        .zip(&b.cached)
        .map(|((&i, &f), &c)| (ds.id(i), f, c))
        .collect();
    (b.epoch, b.index, items, b.disk_items, b.disk_bytes)
}

#[test]
fn liquid_order_delivers_the_samplers_batches_with_exact_pixels() {
    let l = liquid();
    let ds = l.ds.clone();
    let n = ds.len();
    assert_eq!(n, 18);
    let loader = Loader::new(ds.clone(), opts(7, l.budget)).unwrap();
    let per_epoch = loader.batches_per_epoch();
    assert_eq!(per_epoch, n.div_ceil(BATCH));
    let batches = collect(loader);
    assert_eq!(batches.len(), EPOCHS * per_epoch);

    // Exactly the sampler's mini-batches: items, formats, cached flags and disk traffic.
    let sampler_ds = liquid_sampler::Dataset::open(&l.dir).unwrap();
    let m = sampler_ds.manifest.clone();
    let cfg = SamplerConfig {
        budget: l.budget,
        batch: BATCH,
        seed: 7,
        rank: 0,
        world_size: 1,
        shard_policy: ShardPolicy::Pad,
        io_threads: 1,
        items: None,
    };
    let mut sampler = LiquidSampler::new(sampler_ds, &cfg).unwrap();
    let tag = |f: Format| match f {
        Format::Raw => "raw",
        Format::L3 => "l3",
        other => panic!("unexpected format {other:?}"),
    };
    for b in &batches {
        let s = sampler.next_batch().unwrap();
        let want: Audit = (
            s.epoch,
            s.index,
            s.items
                .iter()
                .map(|d| {
                    let f = match m.formats[d.item.format as usize].tag.as_str() {
                        "raw" => Format::Raw,
                        _ => Format::L3,
                    };
                    (d.item.id, f, d.cached)
                })
                .collect(),
            s.disk_items,
            s.disk_bytes,
        );
        assert_eq!(audit(&*ds, b), want);
    }

    // Every item exactly once per epoch.
    for e in 0..EPOCHS {
        let mut ids: Vec<usize> = batches
            .iter()
            .filter(|b| b.epoch == e)
            .flat_map(|b| b.ids.clone())
            .collect();
        ids.sort();
        assert_eq!(ids, (0..n).collect::<Vec<_>>(), "epoch {e}");
    }

    // Per-batch mix within one item of the dataset's ratio.
    let count = |f: Format| (0..n).filter(|&i| ds.format(i) == f).count();
    let (n_l3, n_raw) = (count(Format::L3), count(Format::Raw));
    assert!(n_l3 > 0 && n_raw > 0 && n_l3 + n_raw == n);
    for b in &batches {
        for (f, nf) in [(Format::L3, n_l3), (Format::Raw, n_raw)] {
            let got = b.formats.iter().filter(|&&x| x == f).count() as f64;
            let want = b.len() as f64 * nf as f64 / n as f64;
            assert!(
                (got - want).abs() <= 1.0,
                "epoch {} batch {}: {} {} items, want {want:.2}",
                b.epoch,
                b.index,
                got,
                tag(f)
            );
        }
    }

    // With a budget, later epochs find items still resident; the first epoch cannot. Cached items were
    // not read again, so the disk traffic of an epoch is the uncached items' bytes.
    for e in 0..EPOCHS {
        let of_epoch = || batches.iter().filter(|b| b.epoch == e);
        let cached = of_epoch()
            .flat_map(|b| b.cached.iter())
            .filter(|&&c| c)
            .count();
        if e == 0 {
            assert_eq!(cached, 0);
        } else {
            assert!(cached > 0 && cached < n, "epoch {e}: {cached} cached");
        }
    }
    let disk_items: usize = batches.iter().map(|b| b.disk_items).sum();
    let uncached = batches
        .iter()
        .flat_map(|b| b.cached.iter())
        .filter(|&&c| !c)
        .count();
    assert_eq!(disk_items, uncached);

    // Pixels equal a reference decode of the image each item was converted from.
    let sources = ImageFolder::open(&fixture().mixed).unwrap();
    for b in &batches {
        let len = b.sample_len();
        let px = b.pixels.as_u8().unwrap();
        for (k, &idx) in b.ids.iter().enumerate() {
            let src = sources.path((ds.id(idx) - 100) as usize);
            let want = center_crop(&reference_rgb(src), SIZE, SIZE);
            assert!(px[k * len..][..len] == want[..], "{}", src.display());
            assert_eq!(b.labels[k], ds.label(idx));
        }
    }
}

#[test]
fn liquid_order_same_seed_same_sequence() {
    let l = liquid();
    let run = |seed: u64| -> Vec<Audit> {
        let o = LoaderOptions {
            epochs: Some(2),
            ..opts(seed, l.budget)
        };
        collect(Loader::new(l.ds.clone(), o).unwrap())
            .iter()
            .map(|b| audit(&*l.ds, b))
            .collect()
    };
    let a = run(11);
    assert_eq!(a, run(11));
    assert_ne!(a, run(12));
}

/// A mid-epoch state resumes the Liquid order exactly: the batches after it are the uninterrupted
/// run's — items, formats, cached flags, pixels, and disk traffic from the second batch on (the first also
/// reads back what the buffers held).
#[test]
fn liquid_order_resumes_mid_epoch_exactly() {
    let l = liquid();
    let o = opts(3, l.budget);
    let all = collect(Loader::new(l.ds.clone(), o.clone()).unwrap());
    let per = all.len() / EPOCHS;
    for stop in [2, per + 1, 2 * per] {
        let mut first = Loader::new(l.ds.clone(), o.clone()).unwrap();
        for _ in 0..stop {
            first.next().unwrap().unwrap();
        }
        let state: LoaderState = first.state().to_string().parse().unwrap();
        drop(first);
        let rest = collect(Loader::resume(l.ds.clone(), o.clone(), state).unwrap());
        assert_eq!(rest.len(), all.len() - stop, "stopped after {stop}");
        for (k, (a, b)) in all[stop..].iter().zip(&rest).enumerate() {
            let (mut x, mut y) = (audit(&*l.ds, a), audit(&*l.ds, b));
            if k == 0 {
                assert!(y.3 > x.3, "the first batch reads the buffers back");
                (x.3, x.4, y.3, y.4) = (0, 0, 0, 0);
            }
            assert_eq!(x, y, "stopped after {stop}, batch {k} after");
            assert!(
                a.pixels.as_u8() == b.pixels.as_u8(),
                "stopped after {stop}: pixels"
            );
        }
    }
}

/// Stopped mid-epoch at one world size and batch size, resumed at others: across the ranks of both runs
/// each item of that epoch is delivered once (a padding repeat aside per new rank), and the next epoch
/// is what a run started at the new shape delivers.
#[test]
fn liquid_order_resumes_at_another_world_size_delivering_the_rest_once() {
    let l = liquid();
    let n = l.ds.len();
    let at = |rank: usize, world: usize, batch: usize| LoaderOptions {
        rank,
        world_size: world,
        batch_size: batch,
        ..opts(4, l.budget)
    };
    for (w, b, stop, w2, b2) in [(2, 3, 1, 3, 2), (1, 5, 2, 2, 4), (3, 2, 2, 1, 3)] {
        let case = format!("{w} ranks x {stop} batches of {b} -> {w2} ranks, batch {b2}");
        let mut seen = vec![0usize; n];
        let mut state = None;
        for rank in 0..w {
            let mut first = Loader::new(l.ds.clone(), at(rank, w, b)).unwrap();
            let per = first.batches_per_epoch();
            for _ in 0..per + stop {
                let batch = first.next().unwrap().unwrap();
                if batch.epoch == 1 {
                    batch.ids.iter().for_each(|&i| seen[i] += 1);
                }
            }
            state = Some(first.state().to_string());
        }
        let state: LoaderState = state.unwrap().parse().unwrap();
        assert_eq!((state.epoch, state.batch), (1, stop), "{case}");
        for rank in 0..w2 {
            let resumed = Loader::resume(l.ds.clone(), at(rank, w2, b2), state.clone()).unwrap();
            let batches = collect(resumed);
            for batch in batches.iter().filter(|x| x.epoch == 1) {
                batch.ids.iter().for_each(|&i| seen[i] += 1);
            }
            // The epoch after: the new shape's own.
            let fresh: Vec<Vec<usize>> =
                collect(Loader::new(l.ds.clone(), at(rank, w2, b2)).unwrap())
                    .into_iter()
                    .filter(|x| x.epoch == 2)
                    .map(|x| x.ids)
                    .collect();
            let after: Vec<Vec<usize>> = batches
                .into_iter()
                .filter(|x| x.epoch == 2)
                .map(|x| x.ids)
                .collect();
            assert_eq!(after, fresh, "{case}: rank {rank}'s next epoch");
        }
        assert!(seen.iter().all(|&c| c >= 1), "{case}: every item: {seen:?}");
        let twice = seen.iter().filter(|&&c| c > 1).count();
        assert!(
            twice <= (w - 1) + (w2 - 1),
            "{case}: {twice} twice: {seen:?}"
        );
    }
}

/// The shuffle report replays the Liquid schedule without reading data: buffers that hold a small
/// share of the dataset fill in storage order, so the visit order follows storage order more than
/// with buffers that hold it all.
#[test]
fn the_shuffle_report_measures_the_liquid_order() {
    let l = liquid();
    let report = |budget: u64| {
        let o = LoaderOptions {
            batch_size: 2,
            ..opts(9, budget)
        };
        loader::shuffle_report(&*l.ds, &o, 40).unwrap()
    };
    let small = report(l.budget);
    let all = report(l.ds.stored_bytes() * 4);
    let corr = |r: &loader::ShuffleReport| r.stat("order_correlation").unwrap().order;
    assert!(
        corr(&small) > corr(&all) + 0.05,
        "{} vs {}",
        corr(&small),
        corr(&all)
    );
    assert!(corr(&all).abs() < 0.1, "{}", corr(&all));
}

#[test]
fn dropping_a_liquid_loader_mid_epoch_stops_every_thread() {
    let l = liquid();
    let o = LoaderOptions {
        epochs: None,
        prefetch: 1,
        ..opts(5, l.budget)
    };
    let mut loader = Loader::new(l.ds.clone(), o).unwrap();
    let monitor = loader.thread_monitor();
    let first = loader.next().unwrap().unwrap();
    assert_eq!((first.epoch, first.index), (0, 0));
    // Order (sampler) thread + assembler + 2 decode threads (the sampler's own I/O threads are joined by the
    // sampler thread before it counts itself out).
    assert_eq!(monitor.alive(), 1 + 1 + 2);
    common::assert_drop_stops_threads(loader, &monitor);
}

#[test]
fn liquid_order_refuses_what_it_cannot_do() {
    let l = liquid();
    let o = opts(7, l.budget);
    let start = Loader::new(l.ds.clone(), o.clone()).unwrap().state();
    // The start of the run resumes like a new loader.
    let a: Vec<Audit> = collect(Loader::resume(l.ds.clone(), o.clone(), start).unwrap())
        .iter()
        .map(|b| audit(&*l.ds, b))
        .collect();
    assert_eq!(a.len(), EPOCHS * 18usize.div_ceil(BATCH));

    let options_error = |o: LoaderOptions, ds: Arc<dyn Dataset>| match Loader::new(ds, o) {
        Err(Error::Options(msg)) => msg,
        Err(Error::Invalid(e)) => e.to_string(),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let msg = options_error(
        LoaderOptions {
            shuffle: false,
            ..o.clone()
        },
        l.ds.clone(),
    );
    assert!(msg.contains("shuffle"), "{msg}");
    let msg = options_error(
        LoaderOptions {
            drop_last: true,
            ..o.clone()
        },
        l.ds.clone(),
    );
    assert!(msg.contains("drop_last"), "{msg}");
    let msg = options_error(opts(7, 1000), l.ds.clone());
    assert!(msg.contains("budget"), "{msg}");
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&fixture().l3).unwrap());
    let msg = options_error(o, folder);
    assert!(msg.contains("Liquid multi-format dataset"), "{msg}");
}

#[test]
fn a_data_file_cut_mid_run_fails_the_run_naming_it() {
    let l = liquid();
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&l.dir).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    // Opened intact (the open checks sizes), then cut: the sampler's reads come up short.
    let ds = Arc::new(LiquidShards::open(tmp.path()).unwrap());
    let pack = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&pack)
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut loader = Loader::new(ds, opts(7, l.budget)).unwrap();
    let monitor = loader.thread_monitor();
    let err = loader
        .by_ref()
        .find_map(|b| b.err())
        .expect("the run fails");
    let msg = err.to_string();
    let name = pack.file_name().unwrap().to_str().unwrap();
    assert!(msg.contains("truncated") && msg.contains(name), "{msg}");
    assert!(loader.next().is_none(), "nothing after the failure");
    assert_eq!(monitor.alive(), 0);
}
