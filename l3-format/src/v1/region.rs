//! Version-1 region decoding: only the patches under a rectangle, straight into the caller's buffer at the
//! caller's strides. Rows above the region inside a patch are decoded (each row predicts from the one above)
//! but not written, rows below it are not decoded at all. A patch decoded to its last row is also checked
//! for trailing bytes, so a region covering the whole image validates exactly what a whole decode does.
//!
//! It asks for each patch's bytes through a closure, so the same core serves a whole file in memory and a
//! file of which only the needed byte ranges were read (`crate::region` passes either).

use super::decode::RowDecoder;
use crate::error::{Error, PatchId};
use crate::geometry::Geometry;
use crate::interleave::{copy_row, interleave3, interleave4};
use crate::pixel_layout::PixelLayout;
use vocab::Rect;

/// Decodes `region` (already checked) with the widest vector unit the CPU has.
#[allow(unsafe_code)]
pub(crate) fn decode<'d>(
    g: &Geometry,
    region: Rect,
    out: &mut [u8],
    layout: PixelLayout,
    patch: impl Fn(usize, usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the AVX2 copy needs nothing but a CPU with AVX2, checked just above.
        return unsafe { decode_avx2(g, region, out, layout, patch) };
    }
    decode_with::<false, _>(g, region, out, layout, patch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn decode_avx2<'d>(
    g: &Geometry,
    region: Rect,
    out: &mut [u8],
    layout: PixelLayout,
    patch: impl Fn(usize, usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    decode_with::<true, _>(g, region, out, layout, patch)
}

/// `AVX2` is true only in the copy compiled inside [`decode_avx2`] (after the run-time check).
#[inline(always)]
fn decode_with<'d, const AVX2: bool, F>(
    g: &Geometry,
    region: Rect,
    out: &mut [u8],
    layout: PixelLayout,
    patch: F,
) -> Result<(), Error>
where
    F: Fn(usize, usize) -> Result<&'d [u8], Error>,
{
    let c_n = g.channels as usize;
    for (first, count) in g.rows_under(region) {
        for p in first..first + count {
            let r = g.patch_rect(p);
            // The overlap of this patch with the region, in image coordinates.
            let (x0, x1) = (r.x.max(region.x), (r.x + r.w).min(region.x + region.w));
            let (y0, y1) = (r.y.max(region.y), (r.y + r.h).min(region.y + region.h));
            let cols = (x0 - r.x) as usize..(x1 - r.x) as usize;
            let (skip, rows) = ((y0 - r.y) as usize, (y1 - r.y) as usize);
            let (ox, oy) = ((x0 - region.x) as usize, (y0 - region.y) as usize);
            let id = |channel| Some(PatchId { channel, patch: p });
            match layout {
                PixelLayout::Planar {
                    row_stride,
                    plane_stride,
                } => {
                    for ch in 0..c_n {
                        let mut d = RowDecoder::new(patch(ch, p)?, r.w as usize, id(ch));
                        for row in 0..rows {
                            let px = d.next_row_with::<AVX2>()?;
                            if row >= skip {
                                let at = ch * plane_stride + (oy + row - skip) * row_stride + ox;
                                copy_row(&mut out[at..at + cols.len()], &px[cols.clone()]);
                            }
                        }
                        if rows == r.h as usize {
                            d.finish()?;
                        }
                    }
                }
                PixelLayout::Interleaved { row_stride } => {
                    let mut decs: [Option<RowDecoder<'d>>; 4] = [None, None, None, None];
                    for (ch, d) in decs.iter_mut().enumerate().take(c_n) {
                        *d = Some(RowDecoder::new(patch(ch, p)?, r.w as usize, id(ch)));
                    }
                    let [d0, d1, d2, d3] = &mut decs;
                    for row in 0..rows {
                        let (r0, r1) = (next_row::<AVX2>(d0)?, next_row::<AVX2>(d1)?);
                        let (r2, r3) = (next_row::<AVX2>(d2)?, next_row::<AVX2>(d3)?);
                        if row < skip {
                            continue;
                        }
                        let at = (oy + row - skip) * row_stride + ox * c_n;
                        let dst = &mut out[at..at + cols.len() * c_n];
                        let c = cols.clone();
                        match c_n {
                            1 => copy_row(dst, &r0[c]),
                            3 => interleave3::<AVX2>(dst, &r0[c.clone()], &r1[c.clone()], &r2[c]),
                            _ => interleave4::<AVX2>(
                                dst,
                                &r0[c.clone()],
                                &r1[c.clone()],
                                &r2[c.clone()],
                                &r3[c],
                            ),
                        }
                    }
                    if rows == r.h as usize {
                        decs.iter().flatten().try_for_each(RowDecoder::finish)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The next row of a channel's decoder, or nothing for a channel the image does not have.
#[inline(always)]
fn next_row<'s, const AVX2: bool>(d: &'s mut Option<RowDecoder<'_>>) -> Result<&'s [u8], Error> {
    match d {
        Some(d) => d.next_row_with::<AVX2>(),
        None => Ok(&[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{L3File, encode};

    /// Random regions of random images, written at padded strides into the middle of a larger buffer: the
    /// region decoder (dispatched, and the portable copy) must write exactly the whole decode's pixels there
    /// and nothing anywhere else.
    #[test]
    fn regions_match_whole_decode_at_any_strides() {
        let mut s = 0x2545_f491u64;
        let mut rnd = |n: u32| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % u64::from(n.max(1))) as u32
        };
        for case in 0..60 {
            let (w, h) = (1 + rnd(300), 1 + rnd(200));
            let c = [1u8, 3, 4][case % 3];
            let n = [1u8, 7, 32, 64, 255][case % 5];
            let px: Vec<u8> = (0..w * h * c as u32)
                .map(|i| ((i % (w * c as u32)) / 3 + i / (w * c as u32)) as u8 ^ rnd(8) as u8)
                .collect();
            let file = encode(&px, w, h, c, n).unwrap();
            let f = L3File::parse(&file).unwrap();
            let rx = rnd(w);
            let ry = rnd(h);
            let region = Rect::new(rx, ry, 1 + rnd(w - rx), 1 + rnd(h - ry));
            for planar in [false, true] {
                let (pad_row, pad_plane, lead) =
                    (rnd(9) as usize, rnd(50) as usize, rnd(20) as usize);
                let (rw, rh, cn) = (region.w as usize, region.h as usize, c as usize);
                let layout = if planar {
                    PixelLayout::Planar {
                        row_stride: rw + pad_row,
                        plane_stride: (rh - 1) * (rw + pad_row) + rw + pad_plane,
                    }
                } else {
                    PixelLayout::Interleaved {
                        row_stride: rw * cn + pad_row,
                    }
                };
                let len = lead + layout.required_len(region.w, region.h, c).unwrap() + 7;
                let mut got = vec![0xA5u8; len];
                f.decode_region(region, &mut got[lead..], layout).unwrap();
                let mut portable = vec![0xA5u8; len];
                let v = f.v1().unwrap();
                decode_with::<false, _>(&v.g, region, &mut portable[lead..], layout, |ch, p| {
                    Ok(v.patch(ch, p))
                })
                .unwrap();
                assert_eq!(got, portable, "case {case}");
                let mut want = vec![0xA5u8; len];
                for y in 0..rh {
                    for x in 0..rw {
                        for ch in 0..cn {
                            let v =
                                px[((region.y as usize + y) * w as usize + region.x as usize + x)
                                    * cn
                                    + ch];
                            let at = match layout {
                                PixelLayout::Interleaved { row_stride } => {
                                    y * row_stride + x * cn + ch
                                }
                                PixelLayout::Planar {
                                    row_stride,
                                    plane_stride,
                                } => ch * plane_stride + y * row_stride + x,
                            };
                            want[lead + at] = v;
                        }
                    }
                }
                assert_eq!(
                    got, want,
                    "case {case}: {w}x{h}x{c} N={n} {region} planar={planar}"
                );
            }
        }
    }
}
