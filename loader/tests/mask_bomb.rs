//! A deflate-bomb mask — a small PNG whose header claims 20000x20000 values, with as much data as
//! deflate needs to reach that size — beside a small image: refused from its header, under
//! `skip_errors` in every epoch, without allocating for its values. This binary counts the bytes the
//! process holds at its peak (its own global allocator), so it holds this one test only.

use loader::targets::TargetOptions;
use loader::{Crop, DType, ImageFolder, Layout, Loader, LoaderOptions, SampleSpec};
use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counters are kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(held, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// CRC-32 (IEEE) of a PNG chunk's type and data.
fn crc(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// An 8-bit gray PNG header claiming `side`x`side`, then one IDAT of the least data deflate could
/// inflate to that size (1/1032 of it: the header alone cannot tell it from an honest file), and IEND.
fn bomb(side: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        png.extend((data.len() as u32).to_be_bytes());
        let body = [kind, data].concat();
        png.extend(&body);
        png.extend(crc(&body).to_be_bytes());
    };
    let mut ihdr = [side.to_be_bytes(), side.to_be_bytes()].concat();
    ihdr.extend([8, 0, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    let len = (u64::from(side) * u64::from(side + 1)).div_ceil(1032) as usize + 64;
    chunk(b"IDAT", &vec![0u8; len]);
    chunk(b"IEND", &[]);
    png
}

#[test]
fn a_deflate_bomb_mask_is_refused_from_its_header_in_every_epoch_without_its_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = (tmp.path().join("images"), tmp.path().join("masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    for name in ["a", "b", "c"] {
        image::RgbImage::from_pixel(64, 48, image::Rgb([9, 9, 9]))
            .save(images.join(format!("{name}.png")))
            .unwrap();
        image::GrayImage::from_pixel(64, 48, image::Luma([3]))
            .save(masks.join(format!("{name}.png")))
            .unwrap();
    }
    // The first mask (the one whose header decides the batch type) is the bomb.
    let bomb = bomb(20000);
    assert!(bomb.len() < 400_000, "{}", bomb.len());
    std::fs::write(masks.join("a.png"), &bomb).unwrap();
    let ds = Arc::new(ImageFolder::open(&images).unwrap());
    let opts = LoaderOptions {
        batch_size: 1,
        sample: SampleSpec {
            height: 48,
            width: 64,
            crop: Crop::Center,
            layout: Layout::Nhwc,
            dtype: DType::U8,
            ..SampleSpec::default()
        },
        shuffle: false,
        decode_threads: 2,
        io_threads: 1,
        epochs: Some(2),
        skip_errors: true,
        targets: TargetOptions {
            masks: Some(masks.clone()),
            ..TargetOptions::default()
        },
        ..LoaderOptions::default()
    };
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut skipped = Vec::new();
    let mut delivered = 0;
    for b in Loader::new(ds.clone(), opts.clone()).unwrap() {
        let b = b.unwrap();
        delivered += b.len();
        assert!(
            b.masks
                .as_ref()
                .unwrap()
                .as_u8()
                .unwrap()
                .iter()
                .all(|&v| v == 3)
        );
        skipped.extend(b.skipped);
    }
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(delivered, 4, "b and c in each of 2 epochs");
    assert_eq!(skipped.len(), 2, "a in each epoch: {skipped:?}");
    for (_, why) in &skipped {
        assert!(
            why.contains("a.png") && why.contains("20000x20000") && why.contains("64x48"),
            "{why}"
        );
    }
    // The old decode allocated the 400 MB of values (and a copy of them) before comparing sizes.
    assert!(peak < 64 << 20, "peak {} MB", peak >> 20);

    // Without skip_errors the run ends at that item, with the same message, as quickly.
    let strict = LoaderOptions {
        skip_errors: false,
        ..opts
    };
    let e = Loader::new(ds, strict)
        .unwrap()
        .find_map(|b| b.err())
        .expect("the bomb is an error");
    assert!(e.to_string().contains("20000x20000"), "{e}");
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(peak < 64 << 20, "peak {} MB", peak >> 20);
}
