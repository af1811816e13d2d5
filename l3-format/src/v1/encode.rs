//! Version-1 encoding: each patch row predicted from the row above with the Paeth filter and packed with
//! base-delta bit packing ([`encode_patch`]); whole images a row of patches per task, then the header, the
//! offset table and the data in file order ([`encode`]).

use super::paeth::predict_row;
use super::row::{MAX_W, pack_row};
use crate::error::Error;
use crate::format::{HEADER_LEN, MAGIC, VERSION};

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

/// Encodes one row of patches — `src` holds its rows of interleaved HWC pixels, `w_px` wide — appending
/// every patch of channel 0, then of channel 1, … (the file's channel-major order) to `buf` and each
/// patch's length to `lens`. Patch columns spread over `threads` threads; the bytes do not depend on it.
/// The whole-image encoder and the streaming one ([`crate::L3Writer`]) both encode through here.
pub(crate) fn encode_band(
    src: &[u8],
    w_px: usize,
    c_n: usize,
    n: usize,
    threads: usize,
    buf: &mut Vec<u8>,
    lens: &mut Vec<usize>,
) {
    let rows = src.len() / (w_px * c_n);
    let px_n = w_px.div_ceil(n);
    let patch = |ch: usize, px: usize, out: &mut Vec<u8>| {
        let x = px * n;
        encode_patch_strided(
            &src[x * c_n + ch..],
            n.min(w_px - x),
            rows,
            w_px * c_n,
            c_n,
            out,
        );
    };
    if stdx::parallel::threads(threads) <= 1 {
        buf.reserve(src.len() / 2);
        for ch in 0..c_n {
            for px in 0..px_n {
                let before = buf.len();
                patch(ch, px, buf);
                lens.push(buf.len() - before);
            }
        }
        return;
    }
    let cols: Vec<usize> = (0..px_n).collect();
    let parts = stdx::parallel::map(&cols, threads, |_, &px| {
        let per_ch: Vec<Vec<u8>> = (0..c_n)
            .map(|ch| {
                let mut out = Vec::new();
                patch(ch, px, &mut out);
                out
            })
            .collect();
        Ok::<_, std::convert::Infallible>(per_ch)
    });
    let parts = match parts {
        Ok(p) => p,
        Err(never) => match never {},
    };
    for ch in 0..c_n {
        for p in &parts {
            buf.extend_from_slice(&p[ch]);
            lens.push(p[ch].len());
        }
    }
}

/// The 20-byte version-1 header.
pub(crate) fn header(width: u32, height: u32, channels: u8, patch_size: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&[channels, 8, patch_size, 0, 0, 0]);
    debug_assert_eq!(out.len(), HEADER_LEN);
    out
}

/// Encodes interleaved HWC pixels into a complete version-1 file with rows of patches spread over `threads`
/// threads (0 = every core); the output does not depend on `threads`. The arguments were checked by the
/// caller (`crate::encode`).
pub(crate) fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
    threads: usize,
) -> Result<Vec<u8>, Error> {
    let (w_px, c_n, n) = (width as usize, channels as usize, patch_size as usize);
    let (px_n, py_n) = (w_px.div_ceil(n), (height as usize).div_ceil(n));
    let per = px_n * py_n;

    // Each task encodes one row of patches of every channel into its own buffer, with per-patch lengths.
    let mut bands: Vec<(Vec<u8>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); py_n];
    let band_px = n * w_px * c_n;
    let tasks = bands.iter_mut().zip(pixels.chunks(band_px));
    stdx::parallel::for_each(tasks, threads, |((buf, lens), src)| {
        encode_band(src, w_px, c_n, n, 1, buf, lens);
        Ok::<(), Error>(())
    })?;

    let data_len: usize = bands.iter().map(|b| b.0.len()).sum();
    if u32::try_from(data_len).is_err() {
        return Err(Error::EncodedTooLarge { bytes: data_len });
    }
    let table_len = 4 * per * c_n;
    let mut out = Vec::with_capacity(HEADER_LEN + table_len + data_len);
    out.extend_from_slice(&header(width, height, channels, patch_size));
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
