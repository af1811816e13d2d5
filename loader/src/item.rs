//! One item's way through the pipeline: what the I/O stage reads ([`Stored`]) and the one decode path
//! from stored bytes to a sample in its batch slot ([`decode_sample`]), whatever the format and however
//! much of the item was read.

use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::{self, Image};
use crate::sample::{DecodeScope, ItemKey, SampleSpec, SampleWrite, Window};
use l3_format::{Fragments, L3Index, PixelLayout, Rect};
use std::path::Path;
use std::sync::Arc;

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
    /// The window of a `w`×`h` image for this item.
    pub fn window(&self, w: u32, h: u32) -> Window {
        self.spec.window(w, h, &self.key)
    }
}

/// A decode thread's reusable memory.
#[derive(Default, Debug)]
pub struct Scratch {
    pub(crate) image: Image,
    region: Vec<u8>,
    pub(crate) mask: crate::targets::masks::MaskImage,
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
    /// The image's width and height, and the window its sample took: what the item's targets (mask,
    /// boxes) follow.
    pub image: (u32, u32),
    pub window: Option<Window>,
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
            let win = req.window(index.width(), index.height());
            write_region(
                req.spec,
                &win,
                index.channels(),
                scratch,
                slot,
                |r, out, l| index.decode_region(fragments, r, out, l).map_err(l3_err),
            )?;
            Ok(Decoded {
                pixels: win.src.w as u64 * win.src.h as u64,
                partial: false,
                image: (index.width(), index.height()),
                window: Some(win),
            })
        }
        Stored::Whole(bytes) if format == Format::L3 && req.scope == DecodeScope::Region => {
            let file = l3_format::L3File::parse(bytes).map_err(l3_err)?;
            let win = req.window(file.width(), file.height());
            write_region(
                req.spec,
                &win,
                file.channels(),
                scratch,
                slot,
                |r, out, l| file.decode_region(r, out, l).map_err(l3_err),
            )?;
            Ok(Decoded {
                pixels: win.src.w as u64 * win.src.h as u64,
                partial: false,
                image: (file.width(), file.height()),
                window: Some(win),
            })
        }
        Stored::Whole(bytes) if format == Format::Raw => {
            // Raw pixels are already what a window is cut from: no copy of the whole frame first.
            let view = crate::raw::parse(bytes).map_err(|e| Error::decode(path, "raw", e))?;
            let dims = (view.width, view.height, view.channels);
            write_pixels(view.pixels, dims, path, format, req, slot)
        }
        Stored::Whole(bytes) => {
            let options = image::DecodeOptions {
                partial_images: req.partial_images,
            };
            let partial =
                image::decode_with_options(format, bytes, path, &options, &mut scratch.image)?;
            let img = &scratch.image;
            let dims = (img.width, img.height, img.channels);
            let done = write_pixels(&img.pixels, dims, path, format, req, slot)?;
            Ok(Decoded { partial, ..done })
        }
    }
}

/// Writes the sample of a whole decoded image — `px` interleaved, `(width, height, channels)` — into
/// `slot` (for datasets with decoders of their own).
pub fn write_pixels(
    px: &[u8],
    (width, height, channels): (u32, u32, u8),
    path: &Path,
    format: Format,
    req: &SampleRequest,
    slot: &mut [u8],
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
    let win = req.window(width, height);
    req.spec.fill_padding(&win, slot);
    let stride = width as usize * channels as usize;
    let start = win.src.y as usize * stride + win.src.x as usize * channels as usize;
    req.spec
        .write_window(&win, &px[start..], channels, stride, slot);
    Ok(Decoded {
        pixels: width as u64 * height as u64,
        partial: false,
        image: (width, height),
        window: Some(win),
    })
}

/// Decodes a window of an L3 image with `decode(rect, out, layout)`: straight into the slot when the
/// sample's layout allows it (u8 RGB), else into scratch and converted.
fn write_region(
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
