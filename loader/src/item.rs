//! One item's way through the pipeline: what the I/O stage reads ([`Stored`]) and the one decode path
//! from stored bytes to a sample in its batch slot ([`decode_sample`]), whatever the format and however
//! much of the item was read.

use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::{self, Image};
use crate::sample::{DecodeScope, ItemKey, SampleSpec, SampleWrite, Window};
use crate::transform::resample::{Buffers, Source};
use l3_format::{Fragments, L3Index, PixelLayout, Rect};
use std::path::Path;
use std::sync::Arc;
use vocab::Geometry;
use vocab::Resampling;

/// What the I/O stage hands the decode stage for one item.
#[derive(Debug, Clone)]
pub enum Stored {
    /// The item's whole stored bytes.
    Whole(Vec<u8>),
    /// An L3 item of which only the header, the offset table and the patches under the sample's window
    /// were read.
    L3Region {
        index: Arc<L3Index>,
        fragments: Fragments,
    },
}

/// What the pipeline asks of one item: the sample it becomes.
#[derive(Clone, Copy, Debug)]
pub struct SampleRequest<'a> {
    pub spec: &'a SampleSpec,
    pub key: ItemKey,
    pub scope: DecodeScope,
    /// Decode an image cut short instead of failing it ([`crate::DecodeOptions::partial_images`]).
    pub partial_images: bool,
}

impl SampleRequest<'_> {
    /// The window of a `w`×`h` image for this item (the plain-crop recipe's; see
    /// [`geometry`](Self::geometry) for every recipe).
    pub fn window(&self, w: u32, h: u32) -> Window {
        self.spec.window(w, h, &self.key)
    }

    /// The geometry of a `w`×`h` image for this item.
    pub fn geometry(&self, w: u32, h: u32) -> Geometry {
        self.spec.geometry(w, h, &self.key)
    }

    /// What the sample of a `w`×`h` image is made from: a plain window, or a resampling plan.
    pub(crate) fn shape(&self, w: u32, h: u32) -> Shape {
        let g = self.geometry(w, h);
        match g.as_window() {
            Some(win) => Shape::Copy(win),
            None => Shape::Resample(g, Resampling::new(&g, self.spec.interpolation)),
        }
    }

    /// The source rectangle the sample of a `w`×`h` image reads: its window, plus the resampling
    /// filter's margin where it resamples. A region read decodes exactly this.
    pub fn source_rect(&self, w: u32, h: u32) -> Rect {
        match self.shape(w, h) {
            Shape::Copy(win) => win.src,
            Shape::Resample(_, plan) => plan.source(),
        }
    }
}

/// How one sample is made from its source pixels.
pub(crate) enum Shape {
    /// A window copied as it is (crop, pad, flip).
    Copy(Window),
    /// A geometry that resamples, with its tables.
    Resample(Geometry, Resampling),
}

impl Shape {
    pub(crate) fn geometry(&self) -> Geometry {
        match self {
            Shape::Copy(win) => Geometry::from_window(win),
            Shape::Resample(g, _) => *g,
        }
    }
}

/// A decode thread's reusable memory.
#[derive(Default, Debug)]
pub struct Scratch {
    pub(crate) image: Image,
    region: Vec<u8>,
    resampled: Vec<u8>,
    buffers: Buffers,
    /// The sample of a whole image (no crop), whose size is known only once the image's is: written
    /// here instead of into a batch slot, and moved into the batch by the assembler.
    pub(crate) sample: Vec<u8>,
}

/// The spec and the memory one sample is written with: the batch's `slot`, or — for whole images —
/// `own`, sized now for the sample of geometry `g` (this spec at the sample's own size).
fn target<'a>(
    spec: &SampleSpec,
    g: &Geometry,
    path: &Path,
    slot: &'a mut [u8],
    own: &'a mut Vec<u8>,
) -> Result<(SampleSpec, &'a mut [u8])> {
    if !spec.recipe.is_whole() {
        return Ok((*spec, slot));
    }
    let (width, height) = g.size();
    let sized = SampleSpec {
        width,
        height,
        ..*spec
    };
    if width.max(height) > vocab::MAX_SAMPLE_SIDE {
        return Err(Error::decode(
            path,
            "sample",
            format!(
                "a whole-image sample of {width}x{height} (sides of at most {}; set max_size)",
                vocab::MAX_SAMPLE_SIDE
            ),
        ));
    }
    let bytes = sized.sample_bytes();
    stdx::mem::check(
        bytes as u64,
        format!("the {width}x{height} sample of {}", path.display()),
    )
    .map_err(|e| Error::decode(path, "sample", e))?;
    own.clear();
    own.resize(bytes, 0);
    Ok((sized, own.as_mut_slice()))
}

/// What decoding one item did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Pixels actually decoded (the window for region decodes, the whole image otherwise).
    pub pixels: u64,
    /// The sample holds less than the item stores: an image cut short (with `partial_images`), a PCR
    /// image at a lower scan group than asked (with `pcr_partial`). Counted in
    /// [`Stats::items_partial`](crate::Stats::items_partial).
    pub partial: bool,
    /// Where the sample's pixels came from ([`Geometry`]): `batch.windows`, `batch.flipped`,
    /// `batch.sizes`, and what masks and boxes follow.
    pub geometry: Option<Geometry>,
    /// The image's width and height: what its mask must measure.
    pub image: (u32, u32),
}

/// The one decode path: `stored` bytes of an item in `format` → its sample, written into `slot`
/// (`spec.sample_bytes()` bytes). `path` names the item in errors. L3 decodes only the patches under the
/// window unless the request's scope is [`DecodeScope::Whole`]; other formats decode whole images.
pub fn decode_sample(
    format: Format,
    stored: &Stored,
    path: &Path,
    req: &SampleRequest,
    scratch: &mut Scratch,
    slot: &mut [u8],
) -> Result<Decoded> {
    let l3_err = |e: l3_format::Error| Error::decode(path, "l3", e);
    match stored {
        Stored::L3Region { index, fragments } => {
            let dims = (index.width(), index.height(), index.channels());
            let shape = req.shape(dims.0, dims.1);
            write_region(req.spec, &shape, dims, path, scratch, slot, |r, out, l| {
                index.decode_region(fragments, r, out, l).map_err(l3_err)
            })
        }
        Stored::Whole(bytes) if format == Format::L3 && req.scope == DecodeScope::Region => {
            let file = l3_format::L3File::parse(bytes).map_err(l3_err)?;
            let dims = (file.width(), file.height(), file.channels());
            let shape = req.shape(dims.0, dims.1);
            write_region(req.spec, &shape, dims, path, scratch, slot, |r, out, l| {
                file.decode_region(r, out, l).map_err(l3_err)
            })
        }
        Stored::Whole(bytes) if format == Format::Raw => {
            // Raw pixels are already what a window is cut from: no copy of the whole frame first.
            let view = crate::raw::parse(bytes).map_err(|e| Error::decode(path, "raw", e))?;
            let dims = (view.width, view.height, view.channels);
            write_pixels(view.pixels, dims, path, format, req, scratch, slot)
        }
        Stored::Whole(bytes) => {
            let options = image::DecodeOptions {
                partial_images: req.partial_images,
            };
            let partial =
                image::decode_with_options(format, bytes, path, &options, &mut scratch.image)?;
            let img = &scratch.image;
            let dims = (img.width, img.height, img.channels);
            let out = Out {
                buffers: &mut scratch.buffers,
                resampled: &mut scratch.resampled,
                own: &mut scratch.sample,
            };
            let done = write_pixels_with(&img.pixels, dims, path, format, req, slot, out)?;
            Ok(Decoded { partial, ..done })
        }
    }
}

/// [`decode_sample`]'s region path for a window the caller chose rather than the spec's crop (what
/// `l3toolkit.decode_batch` decodes): `win` of the L3 file whose header and offset table are `index` and
/// of which `fragments` holds (at least) the patches under `win.src`, into `slot`, a sample of `spec`'s
/// size, layout, type and channels. Only those patches are decoded (and, in a file with entry CRCs,
/// checked). `path` names the file in errors.
pub fn decode_l3_window(
    index: &L3Index,
    fragments: &Fragments,
    path: &Path,
    win: Window,
    spec: &SampleSpec,
    scratch: &mut Scratch,
    slot: &mut [u8],
) -> Result<Decoded> {
    let l3_err = |e: l3_format::Error| Error::decode(path, "l3", e);
    let (w, h) = (index.width(), index.height());
    let fits = win.src.fits(w, h)
        && u64::from(win.dx) + u64::from(win.src.w) <= u64::from(spec.width)
        && u64::from(win.dy) + u64::from(win.src.h) <= u64::from(spec.height);
    if !fits || spec.recipe.is_whole() || slot.len() != spec.sample_bytes() {
        return Err(Error::Options(format!(
            "{}: window {win} does not fit the {w}x{h} image or the {}x{} sample",
            path.display(),
            spec.width,
            spec.height
        )));
    }
    let dims = (w, h, index.channels());
    write_region(
        spec,
        &Shape::Copy(win),
        dims,
        path,
        scratch,
        slot,
        |r, out, l| index.decode_region(fragments, r, out, l).map_err(l3_err),
    )
}

/// Writes the sample of a whole decoded image — `px` interleaved, `(width, height, channels)` — into
/// `slot` (for datasets with decoders of their own), with `scratch`'s buffers.
pub fn write_pixels(
    px: &[u8],
    dims: (u32, u32, u8),
    path: &Path,
    format: Format,
    req: &SampleRequest,
    scratch: &mut Scratch,
    slot: &mut [u8],
) -> Result<Decoded> {
    let out = Out {
        buffers: &mut scratch.buffers,
        resampled: &mut scratch.resampled,
        own: &mut scratch.sample,
    };
    write_pixels_with(px, dims, path, format, req, slot, out)
}

/// The scratch memory [`write_pixels_with`] writes through (the decoded image may live in the rest of
/// the [`Scratch`]).
struct Out<'a> {
    buffers: &'a mut Buffers,
    resampled: &'a mut Vec<u8>,
    own: &'a mut Vec<u8>,
}

fn write_pixels_with(
    px: &[u8],
    (width, height, channels): (u32, u32, u8),
    path: &Path,
    format: Format,
    req: &SampleRequest,
    slot: &mut [u8],
    out: Out,
) -> Result<Decoded> {
    let len = width as usize * height as usize * channels as usize;
    if width == 0 || height == 0 || !(1..=4).contains(&channels) || px.len() < len {
        return Err(Error::decode(
            path,
            format.name(),
            format!(
                "unusable image {width}x{height}x{channels} ({} bytes)",
                px.len()
            ),
        ));
    }
    let stride = width as usize * channels as usize;
    let shape = req.shape(width, height);
    let geometry = Some(shape.geometry());
    let (spec, slot) = target(req.spec, &shape.geometry(), path, slot, out.own)?;
    match shape {
        Shape::Copy(win) => {
            spec.fill_padding(&win, slot);
            let start = win.src.y as usize * stride + win.src.x as usize * channels as usize;
            spec.write_window(&win, &px[start..], channels, stride, slot);
        }
        Shape::Resample(g, plan) => {
            let src = Source {
                px,
                rect: Rect::new(0, 0, width, height),
                channels: channels as usize,
                stride,
            };
            write_resampled(
                &spec,
                &g,
                &plan,
                &src,
                path,
                out.buffers,
                out.resampled,
                slot,
            )?;
        }
    }
    Ok(Decoded {
        pixels: width as u64 * height as u64,
        partial: false,
        geometry,
        image: (width, height),
    })
}

/// Resamples `src` by `plan` and writes the result where `g` places it (padding, flip, layout, type).
#[allow(clippy::too_many_arguments)]
fn write_resampled(
    spec: &SampleSpec,
    g: &Geometry,
    plan: &Resampling,
    src: &Source<u8>,
    path: &Path,
    buffers: &mut Buffers,
    out: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<()> {
    // A luma sample from a colour image: converted before resampling, as Pillow's
    // `convert("L").resize(...)` and a torchvision pipeline on an `L` image do.
    let r = plan.source();
    let luma = match (spec.channels, src.channels) {
        (1, 3 | 4) => src.luma(r),
        _ => None,
    };
    let converted;
    let src = match &luma {
        Some(px) => {
            converted = Source {
                px,
                rect: r,
                channels: 1,
                stride: r.w as usize,
            };
            &converted
        }
        None => src,
    };
    if !crate::transform::apply(plan, src, buffers, out) {
        // The source always holds what the plan reads (it was decoded for it): reaching this is a bug,
        // reported as an error on the item rather than a panic.
        return Err(Error::decode(
            path,
            "resample",
            format!("the decoded {} does not hold {}", src.rect, plan.source()),
        ));
    }
    let (w, h) = g.size();
    let win = Window::new(Rect::new(0, 0, w, h), g.dx, g.dy, g.flip);
    spec.fill_padding(&win, slot);
    let c = src.channels;
    spec.write_window(&win, out, c as u8, w as usize * c, slot);
    Ok(())
}

/// Decodes what a sample of an L3 image needs with `decode(rect, out, layout)` and writes the sample:
/// a plain window straight into the slot when the sample's layout allows it (u8 RGB), else into scratch
/// and converted; a resampled one from the window plus the filter's margin. Returns the pixels decoded.
/// The sample of `shape` from an L3 image of `(width, height, channels)` whose region decoder is
/// `decode`: only the source rectangle the shape reads is decoded.
fn write_region(
    spec: &SampleSpec,
    shape: &Shape,
    (width, height, channels): (u32, u32, u8),
    path: &Path,
    scratch: &mut Scratch,
    slot: &mut [u8],
    decode: impl FnOnce(Rect, &mut [u8], PixelLayout) -> Result<()>,
) -> Result<Decoded> {
    // A whole image's sample goes to `scratch.sample`, sized now (see `target`).
    let mut own = std::mem::take(&mut scratch.sample);
    let written = target(spec, &shape.geometry(), path, slot, &mut own).and_then(|(spec, slot)| {
        write_region_into(&spec, shape, channels, path, scratch, slot, decode)
    });
    scratch.sample = own;
    Ok(Decoded {
        pixels: written?,
        partial: false,
        geometry: Some(shape.geometry()),
        image: (width, height),
    })
}

fn write_region_into(
    spec: &SampleSpec,
    shape: &Shape,
    channels: u8,
    path: &Path,
    scratch: &mut Scratch,
    slot: &mut [u8],
    decode: impl FnOnce(Rect, &mut [u8], PixelLayout) -> Result<()>,
) -> Result<u64> {
    let win = match shape {
        Shape::Copy(win) => win,
        Shape::Resample(g, plan) => {
            let r = plan.source();
            let c = channels as usize;
            scratch.region.resize(r.w as usize * r.h as usize * c, 0);
            decode(
                r,
                &mut scratch.region,
                PixelLayout::packed(r.w, r.h, channels, false),
            )?;
            let src = Source {
                px: &scratch.region,
                rect: r,
                channels: c,
                stride: r.w as usize * c,
            };
            write_resampled(
                spec,
                g,
                plan,
                &src,
                path,
                &mut scratch.buffers,
                &mut scratch.resampled,
                slot,
            )?;
            return Ok(u64::from(r.w) * u64::from(r.h));
        }
    };
    write_window_region(spec, win, channels, scratch, slot, decode)?;
    Ok(u64::from(win.src.w) * u64::from(win.src.h))
}

fn write_window_region(
    spec: &SampleSpec,
    win: &Window,
    channels: u8,
    scratch: &mut Scratch,
    slot: &mut [u8],
    decode: impl FnOnce(Rect, &mut [u8], PixelLayout) -> Result<()>,
) -> Result<()> {
    spec.fill_padding(win, slot);
    if let Some((at, layout)) = spec.direct_layout(win, channels) {
        decode(win.src, &mut slot[at..], layout)?;
        if win.flip {
            spec.mirror_window(win, slot);
        }
        return Ok(());
    }
    let (w, h) = (win.src.w, win.src.h);
    let layout = PixelLayout::packed(w, h, channels, false);
    scratch
        .region
        .resize(w as usize * h as usize * channels as usize, 0);
    decode(win.src, &mut scratch.region, layout)?;
    spec.write_window(
        win,
        &scratch.region,
        channels,
        w as usize * channels as usize,
        slot,
    );
    Ok(())
}
