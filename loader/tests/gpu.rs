//! The loader on a CUDA device: batches stay in device memory and equal the CPU loader's byte for byte
//! (region reads, random crops, flips, every layout and element type, normalisation, a skipped corrupt
//! item). Without a usable GPU each test checks that the loader refuses with the reason — it never
//! decodes on the CPU instead — and says it skipped the rest. Built with the `gpu` feature only (a build
//! without it has no device batches; `end_to_end.rs` checks its refusal).
#![cfg(feature = "gpu")]

mod common;

use loader::{
    Batch, Crop, DType, Dataset, Device, Error, ImageFolder, Layout, Loader, LoaderOptions,
    Normalize, SampleSpec,
};
use std::sync::Arc;

fn options(device: Device, layout: Layout, dtype: DType) -> LoaderOptions {
    LoaderOptions {
        batch_size: 5,
        decode_threads: 2,
        seed: 4,
        epochs: Some(2),
        device,
        sample: SampleSpec {
            height: 160,
            width: 224,
            crop: Crop::Random,
            hflip: true,
            layout,
            dtype,
            normalize: dtype.is_float().then_some(Normalize::IMAGENET),
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

/// The batches of a run on `device`, or `None` (after checking the refusal names the device and a
/// reason) when this machine has no usable GPU.
fn run(ds: Arc<dyn Dataset>, o: LoaderOptions) -> Option<Vec<Batch>> {
    let device = o.device;
    match Loader::new(ds, o) {
        Ok(l) => Some(l.map(|b| b.unwrap()).collect()),
        Err(Error::Gpu { at, reason }) if device != Device::Cpu => {
            assert_eq!(at.as_deref(), Some("device 0"), "{reason}");
            assert!(!reason.is_empty());
            eprintln!("skipping the GPU comparison: {reason}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn same_batches(gpu: &[Batch], cpu: &[Batch], tag: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{tag}");
    for (g, c) in gpu.iter().zip(cpu) {
        assert_eq!(
            (g.epoch, g.index, &g.ids),
            (c.epoch, c.index, &c.ids),
            "{tag}"
        );
        assert_eq!((&g.labels, &g.skipped), (&c.labels, &c.skipped), "{tag}");
        assert_eq!(g.geometry, c.geometry, "{tag}");
        assert_eq!(g.pixels.device(), Device::Cuda(0), "{tag}");
        assert!(g.pixels.bytes().is_none() && g.pixels.cuda().is_some());
        assert_eq!(g.shape(), c.shape(), "{tag}");
        let host = g.pixels.to_host().unwrap();
        assert!(
            c.pixels.bytes() == Some(&host[..]),
            "{tag}: epoch {} batch {}",
            g.epoch,
            g.index
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_batches_equal_cpu_batches() {
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&common::fixture().l3).unwrap());
    for (layout, dtype) in [
        (Layout::Nhwc, DType::U8),
        (Layout::Nchw, DType::F16),
        (Layout::Nchw, DType::F32),
    ] {
        let Some(gpu) = run(ds.clone(), options(Device::Cuda(0), layout, dtype)) else {
            panic!("needs a CUDA GPU: the loader refused device 0 (the reason is printed above)");
        };
        let cpu = run(ds.clone(), options(Device::Cpu, layout, dtype)).unwrap();
        same_batches(&gpu, &cpu, &format!("{layout:?} {dtype:?}"));
    }
}

/// Resampled batches on the device — random-resized crops, shorter-side resizes then random crops,
/// scale jitter with padding in a `fill` value; bilinear and nearest; every layout and element type —
/// equal the CPU loader's byte for byte (the kernels apply the CPU's integer tables), from region
/// reads and whole files.
#[test]
#[ignore = "needs a CUDA GPU"]
fn resampled_device_batches_equal_cpu_batches() {
    use loader::{DecodeScope, Interpolation, Recipe};
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&common::fixture().l3).unwrap());
    let cases = [
        (
            Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: loader::DEFAULT_RATIO,
            },
            Interpolation::Bilinear,
            Layout::Nchw,
            DType::F16,
            0,
        ),
        (
            Recipe::Resize { shorter: 200 },
            Interpolation::Nearest,
            Layout::Nhwc,
            DType::U8,
            0,
        ),
        (
            Recipe::Jitter { range: [0.5, 2.0] },
            Interpolation::Bilinear,
            Layout::Nhwc,
            DType::F32,
            114,
        ),
        (
            Recipe::Jitter { range: [0.3, 1.5] },
            Interpolation::Nearest,
            Layout::Nchw,
            DType::U8,
            255,
        ),
    ];
    for (recipe, interpolation, layout, dtype, fill) in cases {
        for scope in [DecodeScope::Region, DecodeScope::Whole] {
            let with = |device| {
                let mut o = options(device, layout, dtype);
                o.sample.recipe = recipe;
                o.sample.interpolation = interpolation;
                o.sample.fill = fill;
                o.decode = scope;
                o
            };
            let tag = format!("{recipe:?} {interpolation:?} {layout:?} {dtype:?} {scope:?}");
            let Some(gpu) = run(ds.clone(), with(Device::Cuda(0))) else {
                panic!(
                    "needs a CUDA GPU: the loader refused device 0 (the reason is printed above)"
                );
            };
            let cpu = run(ds.clone(), with(Device::Cpu)).unwrap();
            same_batches(&gpu, &cpu, &tag);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_corrupt_item_is_skipped_on_the_device_as_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let src = &common::fixture().l3;
    let files = loader::image_files(src).unwrap().files;
    for (i, (rel, _)) in files.iter().take(7).enumerate() {
        let mut bytes = std::fs::read(src.join(rel)).unwrap();
        if i == 3 {
            // Rows of the first patches broken: every window reads them on the CPU and the device.
            let start = l3_format::L3File::parse(&bytes).unwrap().data_offset();
            for b in &mut bytes[start..] {
                *b = 0xff;
            }
        }
        std::fs::write(tmp.path().join(format!("{i}.l3")), bytes).unwrap();
    }
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(tmp.path()).unwrap());
    let o = |device| LoaderOptions {
        skip_errors: true,
        epochs: Some(1),
        ..options(device, Layout::Nchw, DType::U8)
    };
    let Some(gpu) = run(ds.clone(), o(Device::Cuda(0))) else {
        panic!("needs a CUDA GPU: the loader refused device 0 (the reason is printed above)");
    };
    let cpu = run(ds, o(Device::Cpu)).unwrap();
    assert_eq!(cpu.iter().map(|b| b.skipped.len()).sum::<usize>(), 1);
    same_batches(&gpu, &cpu, "skip");
}

/// `pin_memory`: host batches in page-locked memory, byte for byte the pageable run's, over more batches
/// than the pool holds (so buffers are recycled through their fences) and with every batch released early.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_batches_equal_pageable_ones_through_recycling() {
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&common::fixture().l3).unwrap());
    let o = |pin_memory| LoaderOptions {
        pin_memory,
        batch_size: 2,
        prefetch: 1,
        epochs: Some(6),
        ..options(Device::Cpu, Layout::Nchw, DType::F32)
    };
    let pinned =
        Loader::new(ds.clone(), o(true)).unwrap_or_else(|e| panic!("needs a CUDA GPU: {e}"));
    let pageable: Vec<Batch> = Loader::new(ds, o(false))
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let mut n = 0;
    for (p, q) in pinned.zip(&pageable) {
        let p = p.unwrap();
        assert!(p.pixels.is_pinned() && !q.pixels.is_pinned());
        assert_eq!((p.epoch, p.index, &p.ids), (q.epoch, q.index, &q.ids));
        assert!(p.pixels.bytes() == q.pixels.bytes(), "batch {n} differs");
        n += 1;
    }
    assert_eq!(n, pageable.len());
}

/// Luma (`channels` 1) and RGBA (`channels` 4) batches on the device — plain crops (a window is a
/// resampling that copies), scale jitter with `fill`, random-resized crops; every layout and element
/// type — equal the CPU loader's byte for byte: luma taken before resampling as Pillow's `L`, alpha 255
/// for images without it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn luma_and_rgba_device_batches_equal_cpu_batches() {
    use loader::{DecodeScope, Interpolation, Recipe};
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&common::fixture().l3).unwrap());
    let recipes = [
        (Recipe::Crop, Interpolation::Bilinear, 0),
        (
            Recipe::Jitter { range: [0.5, 2.0] },
            Interpolation::Bilinear,
            114,
        ),
        (
            Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: loader::DEFAULT_RATIO,
            },
            Interpolation::Nearest,
            0,
        ),
    ];
    for channels in [1u8, 4] {
        for (k, (layout, dtype)) in [
            (Layout::Nhwc, DType::U8),
            (Layout::Nchw, DType::F16),
            (Layout::Nchw, DType::F32),
        ]
        .into_iter()
        .enumerate()
        {
            let (recipe, interpolation, fill) = recipes[k];
            let scope = [DecodeScope::Region, DecodeScope::Whole][k % 2];
            let with = |device| {
                let mut o = options(device, layout, dtype);
                o.sample.channels = channels;
                o.sample.recipe = recipe;
                o.sample.interpolation = interpolation;
                o.sample.fill = fill;
                // A luma sample is normalised by one mean and std.
                if channels == 1 {
                    o.sample.normalize = o.sample.normalize.map(|_| Normalize {
                        mean: [0.45; 3],
                        std: [0.225; 3],
                    });
                }
                o.decode = scope;
                o
            };
            let tag = format!("channels {channels} {recipe:?} {layout:?} {dtype:?} {scope:?}");
            let Some(gpu) = run(ds.clone(), with(Device::Cuda(0))) else {
                panic!(
                    "needs a CUDA GPU: the loader refused device 0 (the reason is printed above)"
                );
            };
            let cpu = run(ds.clone(), with(Device::Cpu)).unwrap();
            assert_eq!(
                gpu[0].shape()[if layout == Layout::Nchw { 1 } else { 3 }],
                channels as usize
            );
            same_batches(&gpu, &cpu, &tag);
        }
    }
}
