//! Version-1 decoding: one patch row by row ([`RowDecoder`]), one patch into a strided buffer
//! ([`decode_patch`]), and whole images ([`V1::whole`]) into HWC or CHW buffers, a band of patch rows at a
//! time, on one or many threads.

use super::container::V1;
use super::kernel::{PAD, SCRATCH, decode_row, window};
use super::row::{MAX_W, read_header, row_len};
use crate::error::{Error, PatchId};
use crate::interleave::{copy_row, interleave3, interleave4};

/// Decodes the rows of one patch in order, keeping only the previous row (on the stack: no allocation).
pub(crate) struct RowDecoder<'a> {
    data: &'a [u8],
    pos: usize,
    w: usize,
    row: usize,
    at: Option<PatchId>,
    /// Two padded row buffers used alternately: `rows[cur]` holds the row decoded last.
    rows: [[u8; PAD]; 2],
    cur: usize,
    /// Zero-padded copy of a row near the end of the patch, where the kernel's loads would run past it.
    scratch: [u8; SCRATCH],
}

impl<'a> RowDecoder<'a> {
    /// `w` must be 1..=255 (checked by callers).
    pub(crate) fn new(data: &'a [u8], w: usize, at: Option<PatchId>) -> Self {
        debug_assert!((1..=MAX_W).contains(&w));
        RowDecoder {
            data,
            pos: 0,
            w,
            row: 0,
            at,
            rows: [[0; PAD]; 2],
            cur: 0,
            scratch: [0; SCRATCH],
        }
    }

    /// Decodes the next row and returns its `w` pixels.
    #[inline(always)]
    pub(crate) fn next_row(&mut self) -> Result<&[u8], Error> {
        self.next_row_with::<false>()
    }

    /// [`next_row`](Self::next_row) with the kernel chosen at compile time: `AVX2` may be true only in code
    /// reached from a `#[target_feature(enable = "avx2")]` function, i.e. after the run-time check.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub(crate) fn next_row_with<const AVX2: bool>(&mut self) -> Result<&[u8], Error> {
        let w = self.w;
        let rest = &self.data[self.pos..];
        if rest.len() < 2 {
            return Err(self.past_end(2));
        }
        let (nbit, base) = read_header(rest);
        if nbit > 8 {
            return Err(Error::NbitTooLarge {
                patch: self.at,
                row: self.row,
                nbit,
            });
        }
        let len = row_len(w, nbit as usize);
        if rest.len() < len {
            return Err(self.past_end(len));
        }
        // Read straight from the file when the kernel's loads stay inside it, else from a zero-padded copy.
        let src = if rest.len() >= window(w, nbit as usize) {
            rest
        } else {
            self.scratch[..len].copy_from_slice(&rest[..len]);
            &self.scratch[..]
        };
        let [r0, r1] = &mut self.rows;
        let (prev, cur) = if self.cur == 0 {
            (&*r0, r1)
        } else {
            (&*r1, r0)
        };
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: `AVX2` is true only after the run-time AVX2 check (see above). Row 0 needs no
            // special case there: `prev` is still the all-zero buffer, which predicts 0 everywhere.
            unsafe { crate::simd::v1::decode_row_avx2(src, nbit, base, w, prev, cur) };
        } else {
            decode_row(src, nbit, base, w, self.row == 0, prev, cur);
        }
        #[cfg(not(target_arch = "x86_64"))]
        decode_row(src, nbit, base, w, self.row == 0, prev, cur);
        self.pos += len;
        self.cur ^= 1;
        self.row += 1;
        Ok(&self.rows[self.cur][1..w + 1])
    }

    fn past_end(&self, needed: usize) -> Error {
        Error::RowPastPatchEnd {
            patch: self.at,
            row: self.row,
            offset: self.pos,
            needed,
            len: self.data.len(),
        }
    }

    /// After the last row: every byte of the patch must have been used.
    pub(crate) fn finish(&self) -> Result<(), Error> {
        if self.pos == self.data.len() {
            Ok(())
        } else {
            Err(Error::TrailingPatchBytes {
                patch: self.at,
                unused: self.data.len() - self.pos,
            })
        }
    }
}

/// Walks the row headers of the first `rows` rows of a `width`-wide version-1 patch at the start of
/// `bytes` exactly as the row decoder reads them — each row's nbit at most 8, each row inside `bytes` —
/// and returns the bytes those rows take, touching 2 bytes a row: for a reader that hands the patch to
/// another decoder (a GPU's, which stops at the first bad row without saying which) and wants the same
/// errors as a decode here. Errors name `patch` where given.
pub fn patch_rows_len(
    bytes: &[u8],
    width: usize,
    rows: usize,
    patch: Option<PatchId>,
) -> Result<usize, Error> {
    let mut pos = 0usize;
    for row in 0..rows {
        let past_end = |needed| Error::RowPastPatchEnd {
            patch,
            row,
            offset: pos,
            needed,
            len: bytes.len(),
        };
        let rest = &bytes[pos..];
        if rest.len() < 2 {
            return Err(past_end(2));
        }
        let (nbit, _) = read_header(rest);
        if nbit > 8 {
            return Err(Error::NbitTooLarge { patch, row, nbit });
        }
        let len = row_len(width, nbit as usize);
        if rest.len() < len {
            return Err(past_end(len));
        }
        pos += len;
    }
    Ok(pos)
}

/// Decodes ONE version-1 patch of ONE channel from its bytes alone into `out`: row `r` lands at
/// `out[r*stride .. r*stride + w]`. Patches are independent, so this is all a GPU decoder's output needs
/// to be compared with. (A version-2 patch decodes with
/// [`L3File::decode_region`](crate::L3File::decode_region) over its rectangle.)
pub fn decode_patch(
    data: &[u8],
    w: usize,
    h: usize,
    out: &mut [u8],
    stride: usize,
) -> Result<(), Error> {
    if !(1..=MAX_W).contains(&w) || !(1..=MAX_W).contains(&h) || stride < w {
        return Err(Error::BadPatchGeometry { w, h, stride });
    }
    let needed = (h - 1) * stride + w;
    if out.len() < needed {
        return Err(Error::BufferSize {
            expected: needed,
            got: out.len(),
        });
    }
    decode_patch_into(data, w, h, out, stride, None)
}

fn decode_patch_into(
    data: &[u8],
    w: usize,
    h: usize,
    out: &mut [u8],
    stride: usize,
    at: Option<PatchId>,
) -> Result<(), Error> {
    let mut dec = RowDecoder::new(data, w, at);
    for r in 0..h {
        let row = dec.next_row()?;
        copy_row(&mut out[r * stride..r * stride + w], row);
    }
    dec.finish()
}

impl<'a> V1<'a> {
    /// Decodes the whole image into `out` (exactly width × height × channels bytes), HWC (`planar = false`)
    /// or CHW, with bands of patch rows spread over `threads` threads (1 = this thread only, 0 = every
    /// core).
    pub(crate) fn whole(&self, out: &mut [u8], planar: bool, threads: usize) -> Result<(), Error> {
        let g = &self.g;
        if !planar {
            let band = self.band_len_hwc();
            if threads == 1 {
                for (py, chunk) in out.chunks_mut(band).enumerate() {
                    self.decode_band_hwc(py, chunk)?;
                }
                return Ok(());
            }
            let tasks = out.chunks_mut(band).enumerate();
            return stdx::parallel::for_each(tasks, threads, |(py, chunk)| {
                self.decode_band_hwc(py, chunk)
            });
        }
        let plane = g.width as usize * g.height as usize;
        let band = self.band_len_plane();
        if threads == 1 {
            for (ch, p) in out.chunks_mut(plane).enumerate() {
                for (py, chunk) in p.chunks_mut(band).enumerate() {
                    self.decode_band_plane(ch, py, chunk)?;
                }
            }
            return Ok(());
        }
        let tasks = out.chunks_mut(plane).enumerate().flat_map(|(ch, p)| {
            p.chunks_mut(band)
                .enumerate()
                .map(move |(py, c)| (ch, py, c))
        });
        stdx::parallel::for_each(tasks, threads, |(ch, py, chunk)| {
            self.decode_band_plane(ch, py, chunk)
        })
    }

    fn band_len_hwc(&self) -> usize {
        self.g.patch_size as usize * self.g.width as usize * self.g.channels as usize
    }

    fn band_len_plane(&self) -> usize {
        self.g.patch_size as usize * self.g.width as usize
    }

    /// Decoders for patches `gx .. gx + g` of row `py` (slots past `g` hold inert placeholders).
    fn group_decoders(&self, ch: usize, py: usize, gx: usize, g: usize) -> [RowDecoder<'a>; GROUP] {
        let px_n = self.g.patches_x as usize;
        std::array::from_fn(|i| {
            if i < g && ch < self.g.channels as usize {
                let patch = py * px_n + gx + i;
                let w = self.g.patch_rect(patch).w as usize;
                RowDecoder::new(
                    self.patch(ch, patch),
                    w,
                    Some(PatchId { channel: ch, patch }),
                )
            } else {
                RowDecoder::new(&[], 1, None)
            }
        })
    }

    /// One row of patches of one channel into its band of a plane (stride = width).
    /// Decodes one band with the widest vector unit the CPU has (see `crate::simd`).
    #[allow(unsafe_code)]
    fn decode_band_plane(&self, ch: usize, py: usize, band: &mut [u8]) -> Result<(), Error> {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: the AVX2 copy needs nothing but a CPU with AVX2, checked just above.
            return unsafe { self.band_plane_avx2(ch, py, band) };
        }
        self.band_plane::<false>(ch, py, band)
    }

    #[allow(unsafe_code)]
    fn decode_band_hwc(&self, py: usize, band: &mut [u8]) -> Result<(), Error> {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: as above.
            return unsafe { self.band_hwc_avx2(py, band) };
        }
        self.band_hwc::<false>(py, band)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn band_plane_avx2(&self, ch: usize, py: usize, band: &mut [u8]) -> Result<(), Error> {
        self.band_plane::<true>(ch, py, band)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn band_hwc_avx2(&self, py: usize, band: &mut [u8]) -> Result<(), Error> {
        self.band_hwc::<true>(py, band)
    }

    /// `AVX2`: as in [`Self::band_hwc`].
    #[inline(always)]
    fn band_plane<const AVX2: bool>(
        &self,
        ch: usize,
        py: usize,
        band: &mut [u8],
    ) -> Result<(), Error> {
        let width = self.g.width as usize;
        let px_n = self.g.patches_x as usize;
        let n = self.g.patch_size as usize;
        let rows = band.len() / width;
        let mut gx = 0;
        while gx < px_n {
            let g = GROUP.min(px_n - gx);
            let mut decs = self.group_decoders(ch, py, gx, g);
            for line in band.chunks_exact_mut(width).take(rows) {
                for (i, d) in decs[..g].iter_mut().enumerate() {
                    let x = (gx + i) * n;
                    let row = d.next_row_with::<AVX2>()?;
                    copy_row(&mut line[x..x + row.len()], row);
                }
            }
            decs[..g].iter().try_for_each(RowDecoder::finish)?;
            gx += g;
        }
        Ok(())
    }

    /// One row of patches, all channels in lockstep, interleaved into its band of the HWC image. `AVX2` is
    /// true only in the copy compiled inside [`Self::band_hwc_avx2`], which may then use the shuffle
    /// interleavers of `crate::simd`.
    #[inline(always)]
    fn band_hwc<const AVX2: bool>(&self, py: usize, band: &mut [u8]) -> Result<(), Error> {
        let c_n = self.g.channels as usize;
        if c_n == 1 {
            return self.band_plane::<AVX2>(0, py, band);
        }
        let stride = self.g.width as usize * c_n;
        let px_n = self.g.patches_x as usize;
        let n = self.g.patch_size as usize;
        let rows = band.len() / stride;
        let mut gx = 0;
        while gx < px_n {
            let g = GROUP.min(px_n - gx);
            let mut d0 = self.group_decoders(0, py, gx, g);
            let mut d1 = self.group_decoders(1, py, gx, g);
            let mut d2 = self.group_decoders(2, py, gx, g);
            let mut d3 = self.group_decoders(3, py, gx, g);
            for line in band.chunks_exact_mut(stride).take(rows) {
                for i in 0..g {
                    let x = (gx + i) * n;
                    let (r0, r1, r2) = (
                        d0[i].next_row_with::<AVX2>()?,
                        d1[i].next_row_with::<AVX2>()?,
                        d2[i].next_row_with::<AVX2>()?,
                    );
                    let w = r0.len();
                    let dst = &mut line[x * c_n..(x + w) * c_n];
                    if c_n == 3 {
                        interleave3::<AVX2>(dst, r0, r1, r2);
                    } else {
                        let r3 = d3[i].next_row_with::<AVX2>()?;
                        interleave4::<AVX2>(dst, r0, r1, r2, r3);
                    }
                }
            }
            for d in [&d0, &d1, &d2, &d3][..c_n].iter() {
                d[..g].iter().try_for_each(RowDecoder::finish)?;
            }
            gx += g;
        }
        Ok(())
    }
}

/// Patches decoded side by side in one band: their rows are produced in lockstep so the output is written
/// line after line, GROUP patches wide, instead of one narrow column at a time (a cache miss per row).
const GROUP: usize = 8;

#[cfg(test)]
mod tests {
    use crate::{L3File, encode};

    /// The public decoders take the AVX2 path on CPUs that have it; the portable band decoders must give
    /// the same pixels (both are also checked against the reference elsewhere, this pins them together on
    /// every machine).
    #[test]
    fn portable_and_dispatched_band_decoders_agree() {
        let mut s = 0x2545_f491_u32;
        for (w, h, c, n) in [
            (301u32, 77u32, 3u8, 32u8),
            (130, 65, 4, 64),
            (67, 40, 1, 17),
            (5, 3, 3, 1),
        ] {
            // Smooth ramps plus noise: mixes small and large nbit rows and edge-column ties.
            let px: Vec<u8> = (0..w * h * c as u32)
                .map(|i| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    ((i % (w * c as u32)) / 3 + (i / (w * c as u32))) as u8 ^ (s as u8 & 7)
                })
                .collect();
            let file = encode(&px, w, h, c, n).expect("encode");
            let f = L3File::parse(&file).expect("parse");
            let v = f.v1().expect("version 1");
            let mut hwc = vec![0u8; f.decoded_len()];
            f.decode_hwc(&mut hwc).expect("decode");
            assert_eq!(hwc, px, "{w}x{h}x{c} N={n}");
            let mut portable = vec![0u8; f.decoded_len()];
            let band = v.band_len_hwc();
            for (py, chunk) in portable.chunks_mut(band).enumerate() {
                v.band_hwc::<false>(py, chunk).expect("portable hwc");
            }
            assert_eq!(portable, px, "portable hwc {w}x{h}x{c} N={n}");
            let mut chw = vec![0u8; f.decoded_len()];
            f.decode_chw(&mut chw).expect("decode chw");
            let plane = (w * h) as usize;
            let band = v.band_len_plane();
            for (ch, p) in portable.chunks_mut(plane).enumerate() {
                for (py, chunk) in p.chunks_mut(band).enumerate() {
                    v.band_plane::<false>(ch, py, chunk).expect("portable chw");
                }
            }
            assert_eq!(portable, chw, "portable chw {w}x{h}x{c} N={n}");
        }
    }
}
