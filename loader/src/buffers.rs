//! Decoding a caller's list of L3 buffers (what `l3toolkit.decode_batch` does for someone else's
//! pipeline: WebDataset, DALI's `external_source`, a custom `Dataset`): each buffer's window, or the
//! whole image, into one tensor when every sample has the same shape, else one tensor each.
//!
//! No decoder of its own: on the CPU each sample goes through [`decode_l3_window`] (the one decode
//! path's region branch: only the patches under the window) on `stdx::parallel` threads; on a CUDA
//! device through the same `l3-cuda` sample plans the loader's GPU stage submits.

use crate::batch::Tensor;
use crate::dataset::regions::LOCAL_GAP;
use crate::error::{Error, Result};
use crate::item::{Scratch, decode_l3_window};
use crate::memory::{HostMemory, Pool};
use l3_format::{Fragments, L3Index};
use std::path::Path;
use vocab::{Crop, DType, Device, Layout, Normalize, Recipe, Rect, SampleSpec, Window};

/// One L3 file of a caller's batch.
#[derive(Clone, Copy, Debug)]
pub struct L3Buffer<'a> {
    /// The whole file.
    pub bytes: &'a [u8],
    /// What errors call it (its path, or its position in the caller's list).
    pub name: &'a Path,
    /// The rectangle to decode; `None` is the whole image.
    pub window: Option<Rect>,
}

/// How a caller's batch is decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BufferOptions {
    pub layout: Layout,
    pub dtype: DType,
    /// For float types only; float samples without it hold `pixel / 255`.
    pub normalize: Option<Normalize>,
    /// Channels of every sample (1, 3 or 4, converted as the loader converts them); `None` keeps each
    /// file's own.
    pub channels: Option<u8>,
    pub device: Device,
    /// CPU decode threads (0 = every core).
    pub threads: usize,
}

impl Default for BufferOptions {
    /// NCHW `u8`, each file's channels, on the CPU with every core.
    fn default() -> Self {
        BufferOptions {
            layout: Layout::Nchw,
            dtype: DType::U8,
            normalize: None,
            channels: None,
            device: Device::Cpu,
            threads: 0,
        }
    }
}

/// A decoded caller's batch.
#[derive(Debug)]
pub enum BufferBatch {
    /// Every sample has the same shape: one `(n, c, h, w)` / `(n, h, w, c)` tensor.
    Stacked(Tensor),
    /// Samples of different sizes or channels: one tensor of one sample each, in the caller's order.
    Each(Vec<Tensor>),
}

/// One sample: its file's header and offset table, the bytes of the patches under its window (what a
/// region read of the file would have read), the window and the spec it is written with.
struct Planned<'a> {
    item: L3Buffer<'a>,
    index: L3Index,
    fragments: Fragments,
    window: Rect,
    spec: SampleSpec,
}

/// Decodes `items` as `opts` asks: only the patches under each window. Errors name the item (a window
/// outside its image, a corrupt file); `Device::Cuda` never falls back to the CPU.
pub fn decode_buffers(items: &[L3Buffer<'_>], opts: &BufferOptions) -> Result<BufferBatch> {
    if items.is_empty() {
        return Err(Error::Invalid(vocab::Invalid::new(
            "buffers",
            "[]",
            "at least one L3 buffer",
        )));
    }
    if opts.normalize.is_some() && opts.dtype == DType::U8 {
        return Err(Error::Invalid(vocab::Invalid::new(
            "mean/std",
            "with dtype uint8",
            "a float dtype (float16 or float32) for normalised samples",
        )));
    }
    if let Some(c) = opts.channels.filter(|c| !matches!(c, 1 | 3 | 4)) {
        return Err(Error::Invalid(vocab::Invalid::new(
            "channels",
            c,
            "1, 3 or 4",
        )));
    }
    let planned = items
        .iter()
        .map(|item| plan(*item, opts))
        .collect::<Result<Vec<_>>>()?;
    let first = planned[0].spec;
    let same = planned.iter().all(|p| {
        (p.spec.width, p.spec.height, p.spec.channels)
            == (first.width, first.height, first.channels)
    });
    match opts.device {
        Device::Cpu if same => on_cpu(&planned, opts.threads).map(BufferBatch::Stacked),
        Device::Cpu => planned
            .iter()
            .map(|p| on_cpu(std::slice::from_ref(p), opts.threads))
            .collect::<Result<Vec<_>>>()
            .map(BufferBatch::Each),
        Device::Cuda(ordinal) => gpu::decode(&planned, ordinal, same),
    }
}

/// Reads an item's header (checking it), gives its sample its window and spec, and takes the bytes of
/// the patches under the window.
fn plan<'a>(item: L3Buffer<'a>, opts: &BufferOptions) -> Result<Planned<'a>> {
    let l3_err = |e: l3_format::Error| Error::decode(item.name, "l3", e);
    let n = L3Index::prefix_len(item.bytes).map_err(l3_err)?;
    let index = L3Index::parse(
        &item.bytes[..n.min(item.bytes.len())],
        item.bytes.len() as u64,
    )
    .map_err(l3_err)?;
    let (w, h) = (index.width(), index.height());
    let window = item.window.unwrap_or(Rect::new(0, 0, w, h));
    if !window.fits(w, h) {
        return Err(Error::Invalid(vocab::Invalid::new(
            "windows",
            format!("{}: {window}", item.name.display()),
            format!("a non-empty window inside the {w}x{h} image"),
        )));
    }
    let spec = SampleSpec {
        height: window.h,
        width: window.w,
        crop: Crop::Center,
        hflip: false,
        layout: opts.layout,
        dtype: opts.dtype,
        normalize: opts.normalize,
        recipe: Recipe::Crop,
        channels: opts.channels.unwrap_or(index.channels()),
        ..SampleSpec::default()
    };
    let fragments = patches_under(item.bytes, &index, window).map_err(l3_err)?;
    Ok(Planned {
        item,
        index,
        fragments,
        window,
        spec,
    })
}

/// Copies of the byte ranges of `bytes`, the file `index` was parsed from, that hold the patches under
/// `rect`: the rest of the file is neither decoded nor checked, as in the loader's region reads.
fn patches_under(
    bytes: &[u8],
    index: &L3Index,
    rect: Rect,
) -> std::result::Result<Fragments, l3_format::Error> {
    let ranges = index.region_ranges(rect, LOCAL_GAP)?;
    let mut fragments = Fragments::new();
    fragments.reset(&ranges);
    for (r, buf) in fragments.slices_mut() {
        let part = usize::try_from(r.start)
            .ok()
            .zip(usize::try_from(r.end).ok())
            .and_then(|(a, b)| bytes.get(a..b))
            .ok_or(l3_format::Error::Truncated {
                what: "patch data",
                needed: usize::try_from(r.end).unwrap_or(usize::MAX),
                len: bytes.len(),
            })?;
        buf.copy_from_slice(part);
    }
    Ok(fragments)
}

/// Decodes samples of one shape into one host tensor, on `threads` threads.
fn on_cpu(planned: &[Planned<'_>], threads: usize) -> Result<Tensor> {
    let spec = planned[0].spec;
    let one = spec.sample_bytes();
    let len = one * planned.len();
    stdx::mem::check(
        len as u64,
        format!("a batch of {} decoded samples", planned.len()),
    )?;
    let pool = Pool::new(0, 0, HostMemory::Pageable);
    let mut buf = pool
        .take(len)
        .map_err(|why| Error::Pipeline(format!("cannot allocate {len} bytes of samples: {why}")))?;
    let slots = planned.iter().zip(buf.as_mut_slice().chunks_mut(one));
    stdx::parallel::for_each(slots, threads, |(p, slot)| {
        let win = Window::new(p.window, 0, 0, false);
        decode_l3_window(
            &p.index,
            &p.fragments,
            p.item.name,
            win,
            &p.spec,
            &mut Scratch::default(),
            slot,
        )
        .map(|_| ())
    })?;
    let (n, h, w, c) = (
        planned.len(),
        spec.height as usize,
        spec.width as usize,
        usize::from(spec.channels),
    );
    let shape = match spec.layout {
        Layout::Nhwc => [n, h, w, c],
        Layout::Nchw => [n, c, h, w],
    };
    Ok(Tensor::new(buf, shape, spec.layout, spec.dtype))
}

#[cfg(feature = "gpu")]
mod gpu {
    //! The CUDA half: one `l3-cuda` sample plan per batch of one shape (the loader's GPU stage's
    //! windows), the decoder opened once per device and process.

    use super::{BufferBatch, Planned};
    use crate::batch::Tensor;
    use crate::error::{Error, Result};
    use l3_cuda::{BatchDecoder, SampleOptions, SamplePlan, SampleSource};
    use std::sync::{Arc, Mutex};
    use vocab::Window;

    /// Decoders by device ordinal: opening one compiles and loads the kernels and sets up streams and
    /// pinned staging, which every later batch reuses.
    static DECODERS: Mutex<Vec<(usize, BatchDecoder)>> = Mutex::new(Vec::new());

    pub(super) fn decode(
        planned: &[Planned<'_>],
        ordinal: usize,
        same: bool,
    ) -> Result<BufferBatch> {
        let mut decoders = DECODERS.lock().unwrap_or_else(|p| p.into_inner());
        let at = decoders.iter().position(|(o, _)| *o == ordinal);
        let at = match at {
            Some(i) => i,
            None => {
                let d = BatchDecoder::new(ordinal)
                    .map_err(|e| Error::gpu(Some(format!("device cuda:{ordinal}")), e))?;
                decoders.push((ordinal, d));
                decoders.len() - 1
            }
        };
        let decoder = &mut decoders[at].1;
        if same {
            return launch(decoder, ordinal, planned).map(BufferBatch::Stacked);
        }
        planned
            .iter()
            .map(|p| launch(decoder, ordinal, std::slice::from_ref(p)))
            .collect::<Result<Vec<_>>>()
            .map(BufferBatch::Each)
    }

    /// One submission of samples of one shape, waited for so that a corrupt file is this call's error.
    fn launch(
        decoder: &mut BatchDecoder,
        ordinal: usize,
        planned: &[Planned<'_>],
    ) -> Result<Tensor> {
        let spec = planned[0].spec;
        let sources: Vec<SampleSource> = planned
            .iter()
            .map(|p| SampleSource::Fragments {
                index: &p.index,
                data: &p.fragments,
            })
            .collect();
        let windows: Vec<Window> = planned
            .iter()
            .map(|p| Window::new(p.window, 0, 0, false))
            .collect();
        let opts = SampleOptions {
            width: spec.width,
            height: spec.height,
            channels: spec.channels,
            layout: spec.layout,
            dtype: spec.dtype,
            normalize: spec.normalize,
            fill: 0,
            check_rows_on_host: true,
        };
        let failed = |e: l3_cuda::Error| match e.image_index().and_then(|i| planned.get(i)) {
            Some(p) => match e {
                l3_cuda::Error::Image { source, .. } => Error::decode(p.item.name, "l3", source),
                other => Error::decode(p.item.name, "l3", other),
            },
            None => Error::gpu(Some(format!("device cuda:{ordinal}")), e),
        };
        let batch = SamplePlan::new(&sources, &windows, &opts)
            .and_then(|plan| decoder.submit_sample_plan(Arc::new(plan), &sources))
            .map_err(failed)?;
        batch.wait().map_err(failed)?;
        Tensor::on_device(Box::new(batch), spec.layout, spec.dtype).ok_or_else(|| {
            Error::gpu(
                Some(format!("device cuda:{ordinal}")),
                "the decoded batch is not the tensor that was asked for",
            )
        })
    }
}

#[cfg(not(feature = "gpu"))]
mod gpu {
    use super::{BufferBatch, Planned};
    use crate::error::{Error, Result};

    pub(super) fn decode(_: &[Planned<'_>], ordinal: usize, _: bool) -> Result<BufferBatch> {
        Err(Error::gpu(
            Some(format!("device cuda:{ordinal}")),
            crate::NO_GPU_FEATURE,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use l3_format::{EncodeOptions, L3File};

    fn file(w: u32, h: u32, c: u8, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut rng = stdx::SplitMix64::new(seed);
        let px: Vec<u8> = (0..w as usize * h as usize * usize::from(c))
            .map(|i| (i / 7) as u8 ^ (rng.next_u64() as u8 & 31))
            .collect();
        let opts = EncodeOptions {
            patch_size: Some(32),
            threads: 1,
            ..EncodeOptions::default()
        };
        (l3_format::encode_with(&px, w, h, c, &opts).unwrap(), px)
    }

    fn item<'a>(bytes: &'a [u8], window: Option<Rect>) -> L3Buffer<'a> {
        L3Buffer {
            bytes,
            name: Path::new("item.l3"),
            window,
        }
    }

    #[test]
    fn same_shapes_stack_and_equal_the_files_own_decode() {
        let files: Vec<_> = (0..3).map(|s| file(40, 24, 3, s)).collect();
        let items: Vec<_> = files.iter().map(|(f, _)| item(f, None)).collect();
        let opts = BufferOptions {
            layout: Layout::Nhwc,
            threads: 2,
            ..BufferOptions::default()
        };
        let BufferBatch::Stacked(t) = decode_buffers(&items, &opts).unwrap() else {
            panic!("one shape: one tensor")
        };
        assert_eq!(t.shape(), [3, 24, 40, 3]);
        let want: Vec<u8> = files.iter().flat_map(|(_, px)| px.clone()).collect();
        assert_eq!(t.as_u8().unwrap(), want.as_slice());
    }

    #[test]
    fn windows_and_mixed_shapes_make_one_tensor_each() {
        let (a, pa) = file(64, 64, 3, 1);
        let (b, _) = file(30, 20, 1, 2);
        let win = Rect::new(10, 33, 20, 7);
        let items = [item(&a, Some(win)), item(&b, None)];
        let BufferBatch::Each(ts) = decode_buffers(&items, &BufferOptions::default()).unwrap()
        else {
            panic!("two shapes: a tensor each")
        };
        assert_eq!(ts[0].shape(), [1, 3, 7, 20]);
        assert_eq!(ts[1].shape(), [1, 1, 20, 30]);
        let got = ts[0].as_u8().unwrap();
        for y in 0..7 {
            for x in 0..20 {
                for c in 0..3 {
                    let src = ((33 + y) * 64 + 10 + x) * 3 + c;
                    assert_eq!(got[c * 140 + y * 20 + x], pa[src]);
                }
            }
        }
        let f = L3File::parse(&b).unwrap();
        let mut whole = vec![0; f.decoded_len()];
        f.decode_hwc_parallel(&mut whole, 1).unwrap();
        assert_eq!(ts[1].as_u8().unwrap(), whole.as_slice());
    }

    /// Damage to the last patch's bytes is never read by a window away from it, and is an error for
    /// a window over it: only the patches under a window are read and checked.
    #[test]
    fn a_window_reads_only_the_patches_under_it() {
        let (mut a, px) = file(128, 96, 3, 4);
        let at = a.len() - 40;
        a[at] ^= 0xff;
        let top_left = Rect::new(0, 0, 40, 30);
        let BufferBatch::Stacked(t) =
            decode_buffers(&[item(&a, Some(top_left))], &BufferOptions::default()).unwrap()
        else {
            panic!("one item: one tensor")
        };
        let got = t.as_u8().unwrap();
        for (y, x, c) in
            (0..30).flat_map(|y| (0..40).flat_map(move |x| (0..3).map(move |c| (y, x, c))))
        {
            assert_eq!(got[c * 1200 + y * 40 + x], px[(y * 128 + x) * 3 + c]);
        }
        let bottom_right = Rect::new(96, 64, 32, 32);
        let e =
            decode_buffers(&[item(&a, Some(bottom_right))], &BufferOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::Decode { .. }) && e.to_string().contains("item.l3"),
            "{e}"
        );
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_item() {
        let (a, _) = file(16, 16, 3, 3);
        let opts = BufferOptions::default();
        let outside = decode_buffers(&[item(&a, Some(Rect::new(8, 8, 9, 1)))], &opts).unwrap_err();
        assert!(matches!(outside, Error::Invalid(_)) && outside.to_string().contains("item.l3"));
        let corrupt = decode_buffers(&[item(b"L3IM and nothing else", None)], &opts).unwrap_err();
        assert!(matches!(corrupt, Error::Decode { .. }), "{corrupt}");
        assert!(decode_buffers(&[], &opts).is_err());
        let u8_normalised = BufferOptions {
            normalize: Some(Normalize::IMAGENET),
            ..opts
        };
        assert!(decode_buffers(&[item(&a, None)], &u8_normalised).is_err());
        // A CUDA device decodes there or says why; it never decodes on the CPU instead.
        let cuda = BufferOptions {
            device: Device::Cuda(0),
            ..opts
        };
        match decode_buffers(&[item(&a, None)], &cuda) {
            Ok(BufferBatch::Stacked(t)) => assert_eq!(t.device(), Device::Cuda(0)),
            Ok(other) => panic!("one item, one tensor: {other:?}"),
            Err(e) => assert!(matches!(e, Error::Gpu { .. }), "{e}"),
        }
    }
}
