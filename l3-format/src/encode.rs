//! Encoding: pixels to patches to a complete file.

use crate::error::{Error, Limits};
use crate::paeth::predict_row;
use crate::row::{MAX_W, pack_row};
use crate::v2::{self, Format};
use crate::{HEADER_LEN, MAGIC, VERSION};

pub use crate::v2::encode::Choices;

/// What [`encode_with`] writes. `Default` is [`crate::DEFAULT_FORMAT`] at that format's default patch size,
/// the default encoder choices ([`Choices::FastDecode`]), one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncodeOptions {
    pub format: Format,
    /// Patch size N; `None` = [`Format::default_patch_size`] (v1: 32 or 64 by image size; v2: 128).
    /// Version 2 needs a multiple of 32.
    pub patch_size: Option<u8>,
    /// Threads for the patch-parallel stages: 1 = this thread only, 0 = every core. The output does not
    /// depend on it.
    pub threads: usize,
    /// How a v2 encoder makes the choices the format leaves free (ignored by v1).
    pub choices: Choices,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            format: crate::DEFAULT_FORMAT,
            patch_size: None,
            threads: 1,
            choices: Choices::FastDecode,
        }
    }
}

/// Encodes interleaved HWC pixels (`channels` = 1, 3 or 4) as `opts` says.
pub fn encode_with(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    opts: &EncodeOptions,
) -> Result<Vec<u8>, Error> {
    let n = opts
        .patch_size
        .unwrap_or_else(|| opts.format.default_patch_size(width, height));
    match opts.format {
        Format::V1 => encode_parallel(pixels, width, height, channels, n, opts.threads),
        Format::V2(profile) => {
            check_input(pixels, width, height, channels, n)?;
            if !v2::valid_v2_patch_size(n) {
                return Err(Error::BadPatchSize { found: n });
            }
            v2::encode::encode(
                pixels,
                width,
                height,
                channels,
                n,
                profile,
                opts.choices,
                opts.threads,
            )
        }
    }
}

/// The argument checks every encoder makes.
fn check_input(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
) -> Result<(), Error> {
    if width == 0 || height == 0 {
        return Err(Error::ZeroDimension { width, height });
    }
    if !matches!(channels, 1 | 3 | 4) {
        return Err(Error::BadChannels { found: channels });
    }
    if patch_size == 0 {
        return Err(Error::ZeroPatchSize);
    }
    let too_large = Error::TooLarge {
        width,
        height,
        channels,
        limit: Limits::default().max_pixels,
    };
    let samples = (width as u64)
        .checked_mul(height as u64)
        .and_then(|p| p.checked_mul(channels as u64))
        .filter(|&s| s <= Limits::default().max_pixels)
        .and_then(|s| usize::try_from(s).ok())
        .ok_or(too_large)?;
    if pixels.len() != samples {
        return Err(Error::BufferSize {
            expected: samples,
            got: pixels.len(),
        });
    }
    Ok(())
}

/// Encodes one patch of one channel: row `r` is `src[r*stride .. r*stride + w]`. Appends its bytes to `out`.
pub fn encode_patch(
    src: &[u8],
    w: usize,
    h: usize,
    stride: usize,
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    if !(1..=MAX_W).contains(&w) || !(1..=MAX_W).contains(&h) || stride < w {
        return Err(Error::BadPatchGeometry { w, h, stride });
    }
    let needed = (h - 1) * stride + w;
    if src.len() < needed {
        return Err(Error::BufferSize {
            expected: needed,
            got: src.len(),
        });
    }
    encode_patch_strided(src, w, h, stride, 1, out);
    Ok(())
}

/// Pixel (r, c) of the patch is `src[r*stride + c*step]`.
fn encode_patch_strided(
    src: &[u8],
    w: usize,
    h: usize,
    stride: usize,
    step: usize,
    out: &mut Vec<u8>,
) {
    let mut prev = [0u8; 256];
    let mut cur = [0u8; 256];
    let mut pred = [0u8; 256];
    for r in 0..h {
        let row = &src[r * stride..];
        if step == 1 {
            cur[..w].copy_from_slice(&row[..w]);
        } else {
            for (d, s) in cur[..w].iter_mut().zip(row.iter().step_by(step)) {
                *d = *s;
            }
        }
        if r == 0 {
            pack_row(&cur[..w], out);
        } else {
            predict_row(&prev[..w], &mut pred[..w]);
            for (p, &c) in pred[..w].iter_mut().zip(&cur[..w]) {
                *p = c.wrapping_sub(*p);
            }
            pack_row(&pred[..w], out);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
}

/// Encodes interleaved HWC pixels (`channels` = 1, 3 or 4) into a complete **version 1** L3 file with patch
/// size `patch_size` (see [`crate::default_patch_size`]); [`encode_with`] writes either version.
pub fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
) -> Result<Vec<u8>, Error> {
    encode_parallel(pixels, width, height, channels, patch_size, 1)
}

/// [`encode`] (version 1) with rows of patches spread over `threads` threads (0 = every core). Output is
/// identical.
pub fn encode_parallel(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
    threads: usize,
) -> Result<Vec<u8>, Error> {
    check_input(pixels, width, height, channels, patch_size)?;
    let (w_px, c_n, n) = (width as usize, channels as usize, patch_size as usize);
    let (px_n, py_n) = (w_px.div_ceil(n), (height as usize).div_ceil(n));
    let per = px_n * py_n;

    // Each task encodes one row of patches of every channel into its own buffer, with per-patch lengths.
    let mut bands: Vec<(Vec<u8>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); py_n];
    let band_px = n * w_px * c_n;
    let tasks = bands.iter_mut().zip(pixels.chunks(band_px));
    stdx::parallel::for_each(tasks, threads, |((buf, lens), src)| {
        let rows = src.len() / (w_px * c_n);
        buf.reserve(src.len() / 2);
        for ch in 0..c_n {
            for px in 0..px_n {
                let x = px * n;
                let w = n.min(w_px - x);
                let before = buf.len();
                encode_patch_strided(&src[x * c_n + ch..], w, rows, w_px * c_n, c_n, buf);
                lens.push(buf.len() - before);
            }
        }
        Ok(())
    })?;

    let data_len: usize = bands.iter().map(|b| b.0.len()).sum();
    if u32::try_from(data_len).is_err() {
        return Err(Error::EncodedTooLarge { bytes: data_len });
    }
    let table_len = 4 * per * c_n;
    let mut out = Vec::with_capacity(HEADER_LEN + table_len + data_len);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&[channels, 8, patch_size, 0, 0, 0]);
    debug_assert_eq!(out.len(), HEADER_LEN);
    // Offset table: channel-major, patches row-major. Band py holds channel ch's patch px at index
    // ch*px_n + px of its lengths, so the file order is (ch, py, px) and the data is gathered the same way.
    let mut starts: Vec<Vec<usize>> = Vec::with_capacity(py_n);
    for (_, lens) in &bands {
        let mut s = Vec::with_capacity(lens.len() + 1);
        let mut acc = 0;
        s.push(0);
        for l in lens {
            acc += l;
            s.push(acc);
        }
        starts.push(s);
    }
    let mut offset = 0usize;
    for ch in 0..c_n {
        for (_, lens) in &bands {
            for px in 0..px_n {
                out.extend_from_slice(&(offset as u32).to_le_bytes());
                offset += lens[ch * px_n + px];
            }
        }
    }
    for ch in 0..c_n {
        for (py, (buf, _)) in bands.iter().enumerate() {
            let s = &starts[py];
            out.extend_from_slice(&buf[s[ch * px_n]..s[(ch + 1) * px_n]]);
        }
    }
    Ok(out)
}
