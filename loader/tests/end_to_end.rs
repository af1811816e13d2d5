//! End-to-end tests of the loader on the real corpus (../shared/corpus): every image once per epoch,
//! pixels equal to a reference decode, exact resume, rank partitions, bad files named, prompt shutdown.

mod common;

use common::{center_crop, corpus, fixture, reference_rgb};
use loader::{
    Batch, Crop, DType, Dataset, DecodeScope, Error, ImageFolder, Layout, LiquidShards, Loader,
    LoaderOptions, LoaderState, Normalize, PcrRecords, SampleSpec, ShardPolicy,
};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

fn opts(batch: usize, size: u32) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        decode_threads: 2,
        io_threads: 2,
        prefetch: 2,
        seed: 7,
        sample: SampleSpec {
            height: size,
            width: size,
            layout: Layout::Nhwc,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn collect(loader: Loader) -> Vec<Batch> {
    loader.map(|b| b.expect("batch")).collect()
}

fn sample(b: &Batch, i: usize) -> &[u8] {
    &b.pixels.as_u8().unwrap()[i * b.sample_len()..][..b.sample_len()]
}

fn folder(p: &Path) -> Arc<dyn Dataset> {
    Arc::new(ImageFolder::open(p).expect("open folder"))
}

/// Checks that each epoch of `batches` delivers every index of a `len`-item dataset exactly once.
fn assert_each_once(batches: &[Batch], epochs: usize, len: usize) {
    for e in 0..epochs {
        let mut ids: Vec<usize> = batches
            .iter()
            .filter(|b| b.epoch == e)
            .flat_map(|b| b.ids.clone())
            .collect();
        ids.sort();
        assert_eq!(ids, (0..len).collect::<Vec<_>>(), "epoch {e}");
    }
}

#[test]
fn every_image_exactly_once_per_epoch_in_every_format() {
    let f = fixture();
    for dir in [&f.mixed, &f.l3, &f.raw] {
        let ds = folder(dir);
        assert_eq!(ds.len(), 18);
        let mut o = opts(5, 64);
        o.epochs = Some(2);
        let batches = collect(Loader::new(ds.clone(), o).unwrap());
        assert_eq!(batches.len(), 2 * 4, "{}", dir.display());
        assert_each_once(&batches, 2, 18);
        // Epochs are shuffled differently; labels travel with their items.
        let order = |e| {
            batches
                .iter()
                .filter(|b| b.epoch == e)
                .flat_map(|b| b.ids.clone())
                .collect::<Vec<_>>()
        };
        assert_ne!(order(0), order(1));
        for b in &batches {
            assert_eq!(b.shape(), [b.len(), 64, 64, 3]);
            for (i, &id) in b.ids.iter().enumerate() {
                assert_eq!(b.labels[i], ds.label(id));
            }
        }
    }
}

#[test]
fn pixels_equal_a_reference_decode_in_every_format() {
    let f = fixture();
    let size = 300; // larger than the smallest images' height (262): exercises padding too.
    let sources = ImageFolder::open(&f.mixed).unwrap();
    // L3 twice: decoding whole images, and only the patches under the crop (the default).
    for (dir, window) in [
        (&f.mixed, true),
        (&f.l3, true),
        (&f.l3, false),
        (&f.raw, true),
    ] {
        let ds = Arc::new(ImageFolder::open(dir).unwrap());
        let o = LoaderOptions {
            decode: if window {
                DecodeScope::Region
            } else {
                DecodeScope::Whole
            },
            ..opts(4, size)
        };
        let batches = collect(Loader::new(ds.clone(), o).unwrap());
        for b in &batches {
            let px = b.pixels.as_u8().unwrap();
            for (i, &id) in b.ids.iter().enumerate() {
                // L3 and raw are lossless copies of the decoded source: compare with the source's decode.
                let want = center_crop(&reference_rgb(sources.path(id)), size, size);
                let got = &px[i * b.sample_len()..(i + 1) * b.sample_len()];
                assert!(
                    got == &want[..],
                    "{} differs from the reference decode",
                    ds.path(id).display()
                );
            }
        }
    }
}

#[test]
fn l3_window_decode_gives_the_same_random_crops_as_whole_image_decode() {
    let f = fixture();
    let ds = folder(&f.l3);
    for size in [37, 200, 400] {
        let o = LoaderOptions {
            epochs: Some(2),
            sample: SampleSpec {
                crop: Crop::Random,
                hflip: true,
                ..opts(5, size).sample
            },
            ..opts(5, size)
        };
        let window = collect(Loader::new(ds.clone(), o.clone()).unwrap());
        let whole = collect(
            Loader::new(
                ds.clone(),
                LoaderOptions {
                    decode: DecodeScope::Whole,
                    ..o
                },
            )
            .unwrap(),
        );
        for (a, b) in window.iter().zip(&whole) {
            assert_eq!(a.ids, b.ids);
            assert!(a.pixels == b.pixels, "size {size}");
        }
    }
}

#[test]
fn nchw_and_normalised_batches_hold_the_same_pixels() {
    let f = fixture();
    let ds = folder(&f.l3);
    let base = opts(6, 48);
    let nhwc = collect(Loader::new(ds.clone(), base.clone()).unwrap());
    let nchw = collect(
        Loader::new(
            ds.clone(),
            LoaderOptions {
                sample: SampleSpec {
                    layout: Layout::Nchw,
                    ..base.sample
                },
                ..base.clone()
            },
        )
        .unwrap(),
    );
    let norm = collect(
        Loader::new(
            ds,
            LoaderOptions {
                sample: SampleSpec {
                    layout: Layout::Nchw,
                    dtype: DType::F32,
                    normalize: Some(Normalize::IMAGENET),
                    ..base.sample
                },
                ..base
            },
        )
        .unwrap(),
    );
    for ((a, b), c) in nhwc.iter().zip(&nchw).zip(&norm) {
        assert_eq!(a.ids, b.ids);
        assert_eq!(b.shape(), [a.len(), 3, 48, 48]);
        let (a, b, c) = (
            a.pixels.as_u8().unwrap(),
            b.pixels.as_u8().unwrap(),
            c.pixels.as_f32().unwrap(),
        );
        let plane = 48 * 48;
        for n in 0..a.len() / (plane * 3) {
            for p in 0..plane {
                for ch in 0..3 {
                    let v = a[n * plane * 3 + p * 3 + ch];
                    let j = n * plane * 3 + ch * plane + p;
                    assert_eq!(b[j], v);
                    let want = (v as f32 / 255.0 - Normalize::IMAGENET.mean[ch])
                        / Normalize::IMAGENET.std[ch];
                    assert!((c[j] - want).abs() < 1e-5);
                }
            }
        }
    }
}

#[test]
fn resume_after_n_batches_equals_an_uninterrupted_run() {
    let f = fixture();
    let ds = folder(&f.mixed);
    let o = LoaderOptions {
        epochs: Some(3),
        sample: SampleSpec {
            crop: Crop::Random,
            hflip: true,
            ..opts(4, 96).sample
        },
        ..opts(4, 96)
    };
    let full = collect(Loader::new(ds.clone(), o.clone()).unwrap());
    assert_eq!(full.len(), 3 * 5);
    for stop_after in [2, 5, 7] {
        let mut first = Loader::new(ds.clone(), o.clone()).unwrap();
        let mut got: Vec<Batch> = first
            .by_ref()
            .take(stop_after)
            .map(|b| b.unwrap())
            .collect();
        // The state survives a round trip through text (what a checkpoint would store).
        let state: LoaderState = first.state().to_string().parse().unwrap();
        drop(first);
        got.extend(collect(
            Loader::resume(ds.clone(), o.clone(), state).unwrap(),
        ));
        assert_eq!(got.len(), full.len());
        for (a, b) in got.iter().zip(&full) {
            assert_eq!(
                (a.epoch, a.index, &a.ids),
                (b.epoch, b.index, &b.ids),
                "stop after {stop_after}"
            );
            assert!(
                a.pixels == b.pixels,
                "random crops/flips differ after resuming at {stop_after}"
            );
        }
    }
    // A state from another configuration is refused.
    let mut other = Loader::new(ds.clone(), o.clone()).unwrap();
    other.next();
    let st = other.state();
    assert!(
        Loader::resume(
            ds.clone(),
            LoaderOptions {
                seed: 8,
                ..o.clone()
            },
            st.clone()
        )
        .is_err()
    );
    // Options that decide a batch's contents are refused by name; the machinery may change.
    let refused = |o: LoaderOptions| match Loader::resume(ds.clone(), o, st.clone()) {
        Err(Error::Resume(why)) => why,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("resumed with other contents"),
    };
    let mut bigger = o.clone();
    bigger.sample.height += 8;
    assert!(refused(bigger).contains("crop"));
    assert!(
        refused(LoaderOptions {
            shuffle: !o.shuffle,
            ..o.clone()
        })
        .contains("shuffle")
    );
    let mut flipped = o.clone();
    flipped.sample.hflip = !o.sample.hflip;
    assert!(refused(flipped).contains("flip"));
    let more_threads = LoaderOptions {
        decode_threads: o.decode_threads + 1,
        io_threads: o.io_threads + 1,
        prefetch: o.prefetch + 1,
        ..o.clone()
    };
    assert!(Loader::resume(ds.clone(), more_threads, st.clone()).is_ok());
    // A state written before the order and the resize recipes were recorded still loads (it implies
    // their defaults); one missing an option recorded from the start is refused by name.
    let contents = st.contents.clone().unwrap();
    let older: Vec<&str> = contents
        .split(';')
        .filter(|p| {
            ![
                "order",
                "scale",
                "resize",
                "jitter",
                "interpolation",
                "fill",
            ]
            .iter()
            .any(|k| p.starts_with(&format!("{k}:")))
        })
        .collect();
    let older = LoaderState {
        contents: Some(older.join(";")),
        ..st.clone()
    };
    assert!(Loader::resume(ds.clone(), o.clone(), older.clone()).is_ok());
    let no_crop = LoaderState {
        contents: older.contents.as_ref().map(|c| {
            c.split(';')
                .filter(|p| !p.starts_with("crop:"))
                .collect::<Vec<_>>()
                .join(";")
        }),
        ..older
    };
    assert!(refused_state(&ds, &o, no_crop).contains("crop"));
}

fn refused_state(ds: &Arc<dyn Dataset>, o: &LoaderOptions, st: LoaderState) -> String {
    match Loader::resume(ds.clone(), o.clone(), st) {
        Err(Error::Resume(why)) => why,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("resumed a state missing an option"),
    }
}

#[test]
fn sharded_ranks_partition_the_data() {
    let f = fixture();
    let ds = folder(&f.raw);
    // 18 items over 3 ranks: an exact partition.
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for rank in 0..3 {
        let o = LoaderOptions {
            rank,
            world_size: 3,
            ..opts(4, 32)
        };
        let ids: Vec<usize> = collect(Loader::new(ds.clone(), o).unwrap())
            .iter()
            .flat_map(|b| b.ids.clone())
            .collect();
        assert_eq!(ids.len(), 6);
        total += ids.len();
        seen.extend(ids);
    }
    assert_eq!((total, seen.len()), (18, 18));
    // 18 items over 4 ranks: padded to 5 each (two items twice), or dropped to 4 each.
    for (tail, per) in [(ShardPolicy::Pad, 5), (ShardPolicy::DropTail, 4)] {
        let mut all = Vec::new();
        for rank in 0..4 {
            let o = LoaderOptions {
                rank,
                world_size: 4,
                shard_tail: tail,
                ..opts(4, 32)
            };
            let ids: Vec<usize> = collect(Loader::new(ds.clone(), o).unwrap())
                .iter()
                .flat_map(|b| b.ids.clone())
                .collect();
            assert_eq!(ids.len(), per);
            all.extend(ids);
        }
        let distinct: BTreeSet<_> = all.iter().collect();
        match tail {
            ShardPolicy::Pad => assert_eq!(distinct.len(), 18),
            ShardPolicy::DropTail => assert_eq!(distinct.len(), 16),
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for (rel, _) in loader::image_files(from).unwrap().files {
        std::fs::create_dir_all(to.join(&rel).parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), to.join(&rel)).unwrap();
    }
}

#[test]
fn a_truncated_file_is_reported_with_its_path_or_skipped_and_counted() {
    let f = fixture();
    for src in [&f.mixed, &f.l3, &f.raw] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(src, tmp.path());
        let ds = Arc::new(ImageFolder::open(tmp.path()).unwrap());
        let victim = 3;
        let path = ds.path(victim).to_path_buf();
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len / 2)
            .unwrap();

        let err = Loader::new(ds.clone(), opts(4, 32))
            .unwrap()
            .find_map(|b| b.err())
            .expect("the truncated file must fail the run");
        let msg = format!("{err}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("item {victim}")), "{msg}");

        let mut l = Loader::new(
            ds.clone(),
            LoaderOptions {
                skip_errors: true,
                ..opts(4, 32)
            },
        )
        .unwrap();
        let batches: Vec<Batch> = l.by_ref().map(|b| b.unwrap()).collect();
        let ids: BTreeSet<usize> = batches.iter().flat_map(|b| b.ids.clone()).collect();
        assert_eq!(ids.len(), 17);
        assert!(!ids.contains(&victim));
        let skipped: Vec<_> = batches.iter().flat_map(|b| b.skipped.clone()).collect();
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].0, victim);
        assert_eq!(l.stats().items_skipped, 1);
    }
}

#[test]
fn a_missing_file_is_reported_with_its_path() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("labels.csv");
    std::fs::write(&csv, "file,label\nphoto/Dune.jpg,1\nphoto/Nowhere.jpg,2\n").unwrap();
    let ds = Arc::new(ImageFolder::with_labels(&f.mixed, &csv).unwrap());
    assert_eq!((ds.len(), ds.label(0), ds.label(1)), (2, 1, 2));
    let o = LoaderOptions {
        shuffle: false,
        ..opts(1, 32)
    };
    let results: Vec<_> = Loader::new(ds, o).unwrap().collect();
    assert!(results[0].is_ok());
    let msg = results[1].as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("Nowhere.jpg") && msg.contains("item 1"),
        "{msg}"
    );
}

#[test]
fn dropping_the_loader_stops_every_thread_promptly() {
    let f = fixture();
    let ds = folder(&f.mixed);
    let o = LoaderOptions {
        epochs: None,
        prefetch: 1,
        ..opts(2, 64)
    };
    let mut l = Loader::new(ds, o).unwrap();
    let monitor = l.thread_monitor();
    assert!(l.next().unwrap().is_ok());
    // Counters are live while it runs.
    let s = l.stats();
    assert!(s.items_decoded >= 2 && s.batches_delivered == 1);
    assert_eq!(monitor.alive(), 2 + 2 + 2); // dispatcher + assembler + 2 I/O + 2 decode
    common::assert_drop_stops_threads(l, &monitor);
}

#[test]
fn liquid_multi_format_shards_stream_every_item_once_with_exact_pixels() {
    let tmp = tempfile::tempdir().unwrap();
    let ratio = liquid_sampler::Ratio {
        compressed: 1,
        raw: 1,
    };
    common::write_liquid_l3(ratio, tmp.path());
    let ds = Arc::new(LiquidShards::open(tmp.path()).unwrap());
    assert_eq!(ds.len(), 18);
    let formats: BTreeSet<_> = (0..18).map(|i| ds.format(i)).collect();
    assert_eq!(formats.len(), 2, "both L3 and raw items");
    let sources_dir = ImageFolder::open(&fixture().mixed).unwrap();
    let batches = collect(Loader::new(ds.clone(), opts(5, 128)).unwrap());
    assert_each_once(&batches, 1, 18);
    for b in &batches {
        for (i, &idx) in b.ids.iter().enumerate() {
            let src = sources_dir.path((ds.id(idx) - 100) as usize);
            let want = center_crop(&reference_rgb(src), 128, 128);
            assert!(sample(b, i) == want.as_slice());
        }
    }
}

#[test]
fn pcr_records_stream_every_image_once_at_any_group() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let build = loader::convert::PcrBuild {
        threads: 2,
        ..Default::default()
    };
    loader::convert::to_pcr(&f.mixed.join("photo"), tmp.path(), &build).unwrap();
    let full = Arc::new(PcrRecords::open(tmp.path(), None).unwrap());
    let n = full.len();
    assert_eq!(
        n,
        loader::image_files(&f.mixed.join("photo"))
            .unwrap()
            .files
            .len()
    );
    let names: Vec<String> = (0..n)
        .map(|i| full.source(i).display().to_string())
        .collect();
    let batches = collect(Loader::new(full.clone(), opts(3, 128)).unwrap());
    assert_each_once(&batches, 1, n);
    // Full fidelity: the rebuilt progressive stream decodes to the original JPEG's pixels (same decoder).
    for b in &batches {
        for (i, &idx) in b.ids.iter().enumerate() {
            let name = names[idx]
                .rsplit_once('(')
                .unwrap()
                .1
                .trim_end_matches(')')
                .to_string();
            let orig = std::fs::read(f.mixed.join("photo").join(&name)).unwrap();
            let img = pcr::Decoder::Libjpeg.decode(&orig).unwrap();
            let rgb = image::RgbImage::from_raw(img.width, img.height, img.pixels).unwrap();
            let want = center_crop(&rgb, 128, 128);
            assert!(sample(b, i) == want.as_slice(), "{name}");
        }
    }
    // Group 2 reads fewer bytes and still delivers every image once.
    let low = Arc::new(PcrRecords::open(tmp.path(), Some(2)).unwrap());
    assert!(low.stored_bytes() < full.stored_bytes());
    let mut l = Loader::new(low, opts(3, 64)).unwrap();
    let batches: Vec<Batch> = l.by_ref().map(|b| b.unwrap()).collect();
    assert_each_once(&batches, 1, n);
    let read: u64 = batches.iter().map(|b| b.disk_bytes).sum();
    assert_eq!(read, l.stats().bytes_read);
    assert!(PcrRecords::open(tmp.path(), Some(99)).is_err());
}

#[test]
fn the_full_size_corpus_streams_once_with_reference_pixels() {
    // The real files at full size (1680x1050 up to 5120x2880, baseline and progressive JPEG, RGBA PNG).
    let ds = Arc::new(ImageFolder::open(corpus()).unwrap());
    assert_eq!(ds.len(), 18);
    let batches = collect(Loader::new(ds.clone(), opts(4, 256)).unwrap());
    assert_each_once(&batches, 1, 18);
    for b in &batches {
        for (i, &id) in b.ids.iter().enumerate() {
            let want = center_crop(&reference_rgb(ds.path(id)), 256, 256);
            assert!(sample(b, i) == want.as_slice());
        }
    }
}

/// Without the `gpu` feature the loader has no GPU stage: asking for a device is refused with the reason,
/// never served by the CPU threads.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_device_without_the_gpu_feature_is_refused_with_the_reason() {
    let f = fixture();
    let ds = folder(&f.l3);
    let o = LoaderOptions {
        device: loader::Device::Cuda(0),
        ..opts(2, 16)
    };
    let e = Loader::new(ds, o).err().expect("refused").to_string();
    assert!(e.contains("without its `gpu` feature"), "{e}");
}

/// `pin_memory` asked for where page-locked memory cannot be had (no driver, no device, or a build without
/// the `gpu` feature) is refused with the reason before any thread starts, never served with pageable
/// memory; where it can, `gpu.rs` checks the pinned batches.
#[test]
fn pin_memory_without_a_gpu_is_refused_with_the_reason() {
    let f = fixture();
    let o = LoaderOptions {
        pin_memory: true,
        ..opts(2, 16)
    };
    match Loader::new(folder(&f.l3), o) {
        Err(Error::PinMemory(why)) => {
            let e = Error::PinMemory(why.clone()).to_string();
            assert!(e.starts_with("pin_memory: cannot page-lock"), "{e}");
            #[cfg(feature = "gpu")]
            assert!(why.contains("libcuda") || why.contains("device"), "{why}");
            #[cfg(not(feature = "gpu"))]
            assert!(why.contains("without its `gpu` feature"), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(mut l) => {
            let b = l.next().expect("a batch").unwrap();
            assert!(b.pixels.is_pinned(), "pin_memory gave pageable memory");
            eprintln!("this machine page-locks memory: the refusal is not checked here");
        }
    }
}

/// WebP, TIFF, BMP and GIF files are items like any other (not passed over in silence), and every item
/// is decoded as what its bytes are, whatever its name says: a PNG named `.jpg` streams.
#[test]
fn every_image_type_the_toolkit_reads_streams_by_its_magic_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (w, h) = (37u32, 23u32);
    let rgb = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 11) as u8, ((x + y) * 5) as u8])
    });
    let img = image::DynamicImage::ImageRgb8(rgb.clone());
    for (name, fmt) in [
        ("a.webp", image::ImageFormat::WebP),
        ("b.tiff", image::ImageFormat::Tiff),
        ("c.bmp", image::ImageFormat::Bmp),
        ("d.gif", image::ImageFormat::Gif),
        ("e.jpg", image::ImageFormat::Png),
    ] {
        img.save_with_format(tmp.path().join(name), fmt).unwrap();
    }
    let ds = folder(tmp.path());
    assert_eq!(ds.len(), 5, "{}", ds.describe());
    let o = LoaderOptions {
        batch_size: 1,
        shuffle: false,
        epochs: Some(1),
        sample: SampleSpec {
            height: h,
            width: w,
            layout: Layout::Nhwc,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    };
    let batches = collect(Loader::new(ds, o).unwrap());
    assert_eq!(batches.len(), 5);
    for b in &batches {
        let got = sample(b, 0);
        let name = format!("item {} ({})", b.ids[0], b.formats[0]);
        if b.formats[0] == loader::Format::Gif {
            // A palette of at most 256 colours: the size and a close likeness, not every pixel.
            let off = got
                .iter()
                .zip(rgb.as_raw())
                .filter(|(a, b)| a.abs_diff(**b) > 24)
                .count();
            assert!(off * 20 < got.len(), "{name}: {off} samples far off");
        } else {
            assert!(got == rgb.as_raw().as_slice(), "{name}: pixels differ");
        }
    }
}

/// A job of 2 ranks (batch 2) stopped after a batch resumes as 3 ranks (batch 3): together the two
/// runs deliver every item of the interrupted epoch exactly once, the resumed run's next epoch is what a
/// job started at 3 ranks delivers, and the same holds over PCR's records.
#[test]
fn a_state_resumes_at_another_world_size_and_batch_size_exactly_once() {
    let f = fixture();
    let pcr_dir = tempfile::tempdir().unwrap();
    let build = loader::convert::PcrBuild {
        threads: 2,
        images_per_record: 3,
        ..Default::default()
    };
    loader::convert::to_pcr(&f.mixed.join("photo"), pcr_dir.path(), &build).unwrap();
    let pcr: Arc<dyn Dataset> = Arc::new(PcrRecords::open(pcr_dir.path(), Some(2)).unwrap());
    for ds in [folder(&f.raw), pcr] {
        let n = ds.len();
        let shaped = |rank: usize, world: usize, batch: usize| LoaderOptions {
            rank,
            world_size: world,
            epochs: Some(2),
            ..opts(batch, 24)
        };
        let mut seen = vec![0usize; n];
        let mut state = None;
        for rank in 0..2 {
            let mut l = Loader::new(ds.clone(), shaped(rank, 2, 2)).unwrap();
            for _ in 0..1 {
                for &i in &l.next().unwrap().unwrap().ids {
                    seen[i] += 1;
                }
            }
            state = Some(l.state());
        }
        let state = state.unwrap();
        assert_eq!(
            (state.epoch, state.batch, state.world_size),
            (0, 1, 2),
            "{n} items"
        );
        // The state as text, as a checkpoint holds it.
        let state: LoaderState = state.to_string().parse().unwrap();
        for rank in 0..3 {
            let batches =
                collect(Loader::resume(ds.clone(), shaped(rank, 3, 3), state.clone()).unwrap());
            for b in batches.iter().filter(|b| b.epoch == 0) {
                for &i in &b.ids {
                    seen[i] += 1;
                }
            }
            let next: Vec<Vec<usize>> = batches
                .iter()
                .filter(|b| b.epoch == 1)
                .map(|b| b.ids.clone())
                .collect();
            let fresh = LoaderState {
                epoch: 1,
                batch: 0,
                seed: 7,
                rank,
                world_size: 3,
                batch_size: 3,
                dataset_len: n,
                remaining: None,
                contents: None,
                fingerprint: None,
            };
            let want: Vec<Vec<usize>> =
                collect(Loader::resume(ds.clone(), shaped(rank, 3, 3), fresh).unwrap())
                    .iter()
                    .map(|b| b.ids.clone())
                    .collect();
            assert_eq!(next, want, "{}: rank {rank}'s next epoch", ds.describe());
        }
        // Padding repeats (at most one per rank of each shape) aside, each item once.
        assert!(
            seen.iter().all(|&c| (1..=2).contains(&c)),
            "{}: {seen:?}",
            ds.describe()
        );
        assert!(
            seen.iter().filter(|&&c| c == 2).count() <= 1 + 2,
            "{}: {seen:?}",
            ds.describe()
        );
    }
}
