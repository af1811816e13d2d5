//! The separable resampling passes over interleaved pixels, integer-only, from the tables of
//! [`coeffs`](super::coeffs): horizontal first (only over the source rows the vertical pass reads), then
//! vertical — Pillow's order, so that the intermediate rows, their rounding and clipping, and so the
//! result, are Pillow's. Nearest-neighbour picks by index tables, for 8- and 16-bit values alike.
//!
//! The portable loops are written so that the compiler vectorises what it can (the vertical pass as
//! whole-row multiply-adds into an `i32` accumulator row); on CPUs with AVX2 both passes run the
//! hand-written kernels of [`avx2`](super::avx2) instead, which give the same bytes.

use vocab::Rect;
use vocab::{Coeffs, PRECISION_BITS};

/// Interleaved source pixels: `px` holds `rect` of the image (row `y` of the image at
/// `(y - rect.y) * stride`), `channels` values per pixel.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a, T> {
    pub px: &'a [T],
    pub rect: Rect,
    pub channels: usize,
    pub stride: usize,
}

impl<T> Source<'_, T> {
    /// Whether the tables read only inside this source, and the pixels cover its rectangle.
    fn covers(&self, x: (u32, u32), y: (u32, u32)) -> bool {
        let r = self.rect;
        let inside = |(a, b): (u32, u32), lo: u32, n: u32| a >= lo && b <= lo + n;
        let rows = r.h as usize;
        inside(x, r.x, r.w)
            && inside(y, r.y, r.h)
            && (rows == 0
                || self.px.len() >= (rows - 1) * self.stride + r.w as usize * self.channels)
    }
}

impl Source<'_, u8> {
    /// The pixels of `r` as one-channel luma ([`vocab::Channels`]), rows `r.w` apart: what a luma sample
    /// resamples, converted first as Pillow's `convert("L").resize(...)` does. `None` when `r` is not
    /// inside this source.
    pub fn luma(&self, r: Rect) -> Option<Vec<u8>> {
        if !self.covers((r.x, r.x + r.w), (r.y, r.y + r.h)) {
            return None;
        }
        let convert = vocab::Channels {
            from: self.channels as u8,
            to: 1,
        };
        let mut out = Vec::with_capacity(r.w as usize * r.h as usize);
        for y in r.y..r.y + r.h {
            let row = &self.px[(y - self.rect.y) as usize * self.stride..];
            let row = &row[(r.x - self.rect.x) as usize * self.channels..]
                [..r.w as usize * self.channels];
            out.extend(
                row.chunks_exact(self.channels)
                    .map(|p| convert.convert(p)[0]),
            );
        }
        Some(out)
    }
}

/// Reusable memory of the passes.
#[derive(Debug, Default)]
pub struct Buffers {
    rows: Vec<u8>,
    acc: Vec<i32>,
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

#[inline(always)]
fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The portable horizontal pass over one row, from output pixel `from` on.
#[inline(always)]
fn horizontal<const C: usize>(row: &[u8], x0: u32, cx: &Coeffs, out: &mut [u8], from: usize) {
    for (j, o) in out.chunks_exact_mut(C).enumerate().skip(from) {
        let f = (cx.first[j] - x0) as usize;
        let taps = cx.taps[j] as usize;
        let k = &cx.weights[j * cx.ksize..][..taps];
        let px = &row[f * C..(f + taps) * C];
        let mut acc = [HALF; C];
        for (p, &w) in px.chunks_exact(C).zip(k) {
            for c in 0..C {
                acc[c] += i32::from(p[c]) * w;
            }
        }
        for c in 0..C {
            o[c] = clip8(acc[c]);
        }
    }
}

/// Resamples `src` with the bilinear tables `cx` (columns) and `cy` (rows) into `out`: the kept outputs,
/// `cx.first.len()` × `cy.first.len()` pixels, interleaved and packed. `false` if the tables read outside
/// `src` (a caller's bug, never a panic).
///
/// Where the CPU runs AVX2 (checked at run time) the passes use the hand-written kernels of
/// [`avx2`](super::avx2); integer arithmetic: they give the portable passes' bytes.
pub fn bilinear(
    src: &Source<u8>,
    cx: &Coeffs,
    cy: &Coeffs,
    buf: &mut Buffers,
    out: &mut Vec<u8>,
) -> bool {
    bilinear_dispatch::<true>(src, cx, cy, buf, out)
}

/// [`bilinear`] without the hand-written kernels: the portable passes, compiled for AVX2 where the CPU
/// has it (what the compiler's own vectorisation makes of them). The same bytes; for the benchmark that
/// measures the kernels against it.
pub fn bilinear_portable(
    src: &Source<u8>,
    cx: &Coeffs,
    cy: &Coeffs,
    buf: &mut Buffers,
    out: &mut Vec<u8>,
) -> bool {
    bilinear_dispatch::<false>(src, cx, cy, buf, out)
}

/// The passes built for the CPU found at run time: for AVX2 (with the hand-written kernels where
/// `KERNELS`), else the portable loops.
fn bilinear_dispatch<const KERNELS: bool>(
    src: &Source<u8>,
    cx: &Coeffs,
    cy: &Coeffs,
    buf: &mut Buffers,
    out: &mut Vec<u8>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU runs AVX2 (checked just above); the function is otherwise safe code.
        return unsafe { bilinear_avx2::<KERNELS>(src, cx, cy, buf, out) };
    }
    bilinear_passes::<false>(src, cx, cy, buf, out)
}

/// The passes compiled for AVX2: with the hand-written kernels where `SIMD`, else the portable loops
/// (vectorised by the compiler with AVX2's lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bilinear_avx2<const SIMD: bool>(
    src: &Source<u8>,
    cx: &Coeffs,
    cy: &Coeffs,
    buf: &mut Buffers,
    out: &mut Vec<u8>,
) -> bool {
    bilinear_passes::<SIMD>(src, cx, cy, buf, out)
}

/// One intermediate row of the horizontal pass: the AVX2 kernel where `SIMD` (the outputs it can
/// load for), the portable loop for the rest.
#[inline(always)]
fn horizontal_row<const SIMD: bool>(c_n: usize, row: &[u8], x0: u32, cx: &Coeffs, dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    let done = if SIMD {
        #[allow(unsafe_code)]
        // SAFETY: `SIMD` is set only in `bilinear_avx2::<true>`, which runs after the CPU check.
        unsafe {
            match c_n {
                1 => super::avx2::horizontal_1(row, x0, cx, dst),
                3 => super::avx2::horizontal_34::<3>(row, x0, cx, dst),
                4 => super::avx2::horizontal_34::<4>(row, x0, cx, dst),
                _ => 0,
            }
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    match c_n {
        1 => horizontal::<1>(row, x0, cx, dst, done),
        2 => horizontal::<2>(row, x0, cx, dst, done),
        3 => horizontal::<3>(row, x0, cx, dst, done),
        _ => horizontal::<4>(row, x0, cx, dst, done),
    }
}

/// One output row of the vertical pass from the intermediate `rows` (from the first it reads,
/// `row_len` apart) with weights `k`: the AVX2 kernel where `SIMD`, the portable loop for the rest.
#[inline(always)]
fn vertical_row<const SIMD: bool>(
    rows: &[u8],
    row_len: usize,
    k: &[i32],
    acc: &mut Vec<i32>,
    dst: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    let done = if SIMD {
        #[allow(unsafe_code)]
        // SAFETY: `SIMD` is set only in `bilinear_avx2::<true>`, which runs after the CPU check.
        unsafe {
            super::avx2::vertical(rows, row_len, k, dst)
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    let dst = &mut dst[done..];
    acc.clear();
    acc.resize(dst.len(), HALF);
    for (t, &wt) in k.iter().enumerate() {
        let row = &rows[t * row_len + done..][..dst.len()];
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += i32::from(v) * wt;
        }
    }
    for (d, &a) in dst.iter_mut().zip(acc.iter()) {
        *d = clip8(a);
    }
}

/// The two passes of [`bilinear`], inlined into each of its instruction-set variants; `SIMD` (the
/// AVX2 kernels) only in the AVX2 one.
#[inline(always)]
fn bilinear_passes<const SIMD: bool>(
    src: &Source<u8>,
    cx: &Coeffs,
    cy: &Coeffs,
    buf: &mut Buffers,
    out: &mut Vec<u8>,
) -> bool {
    let (xs, ys) = (cx.span(), cy.span());
    if !src.covers(xs, ys) || !(1..=4).contains(&src.channels) {
        return false;
    }
    let c_n = src.channels;
    let (w, h) = (cx.first.len(), cy.first.len());
    let row_len = w * c_n;
    // Horizontal pass over the rows the vertical pass reads.
    let (y0, y1) = ys;
    buf.rows.resize((y1 - y0) as usize * row_len, 0);
    for (i, dst) in buf.rows.chunks_exact_mut(row_len.max(1)).enumerate() {
        let y = y0 as usize + i;
        let start = (y - src.rect.y as usize) * src.stride;
        let row = &src.px[start..start + src.rect.w as usize * c_n];
        horizontal_row::<SIMD>(c_n, row, src.rect.x, cx, dst);
    }
    // Vertical pass: each output row a weighted sum of whole intermediate rows.
    out.resize(h * row_len, 0);
    for (i, dst) in out.chunks_exact_mut(row_len.max(1)).enumerate() {
        let first = (cy.first[i] - y0) as usize;
        let taps = cy.taps[i] as usize;
        let k = &cy.weights[i * cy.ksize..][..taps];
        vertical_row::<SIMD>(&buf.rows[first * row_len..], row_len, k, &mut buf.acc, dst);
    }
    true
}

/// Picks source pixels by index: output `(j, i)` is source `(ix[j], iy[i])`, for any value type (8-bit
/// images, 8- or 16-bit masks). `false` if an index falls outside `src`.
pub fn nearest<T: Copy + Default>(
    src: &Source<T>,
    ix: &[u32],
    iy: &[u32],
    out: &mut Vec<T>,
) -> bool {
    let span = |v: &[u32]| {
        let lo = v.iter().copied().min().unwrap_or(0);
        (lo, v.iter().copied().max().map_or(lo, |m| m + 1))
    };
    if !src.covers(span(ix), span(iy)) {
        return false;
    }
    let c_n = src.channels;
    let row_len = ix.len() * c_n;
    out.resize(iy.len() * row_len, T::default());
    for (dst, &y) in out.chunks_exact_mut(row_len.max(1)).zip(iy) {
        let row = &src.px[(y - src.rect.y) as usize * src.stride..];
        for (o, &x) in dst.chunks_exact_mut(c_n).zip(ix) {
            let at = (x - src.rect.x) as usize * c_n;
            o.copy_from_slice(&row[at..at + c_n]);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use vocab::Axis;
    use vocab::nearest as nearest_index;

    /// Pillow's bilinear resize of a span, written out plainly in `f64` from its definition — the
    /// triangle filter scaled by the shrink factor, weights normalised — with one rounding per pass at
    /// the end; the integer passes may differ from it by the rounding of their 22-bit weights and of
    /// the intermediate row, never by more than one.
    fn reference(img: &[u8], w: usize, c_n: usize, ax: &Axis, ay: &Axis) -> Vec<u8> {
        let weights = |a: &Axis, j: u32| -> Vec<(usize, f64)> {
            let scale = a.src_len as f64 / a.dst_len as f64;
            let fs = scale.max(1.0);
            let center = (a.offset + j) as f64 + 0.5;
            let center = center * scale;
            let mut v: Vec<(usize, f64)> = (0..a.src_len as usize)
                .map(|x| (x, (1.0 - ((x as f64 + 0.5 - center) / fs).abs()).max(0.0)))
                .filter(|&(_, t)| t > 0.0)
                .collect();
            let s: f64 = v.iter().map(|p| p.1).sum();
            v.iter_mut().for_each(|p| p.1 /= s);
            v.iter().map(|&(x, t)| (a.src as usize + x, t)).collect()
        };
        let rows: Vec<usize> = (0..img.len() / (w * c_n)).collect();
        let hrows: Vec<Vec<f64>> = rows
            .iter()
            .map(|&y| {
                (0..ax.len)
                    .flat_map(|j| {
                        let k = weights(ax, j);
                        (0..c_n).map(move |c| (k.clone(), c))
                    })
                    .map(|(k, c)| {
                        k.iter()
                            .map(|&(x, t)| img[(y * w + x) * c_n + c] as f64 * t)
                            .sum::<f64>()
                    })
                    .map(|v| v.round().clamp(0.0, 255.0))
                    .collect()
            })
            .collect();
        let mut out = Vec::new();
        for i in 0..ay.len {
            let k = weights(ay, i);
            out.extend((0..ax.len as usize * c_n).map(|e| {
                let v: f64 = k.iter().map(|&(y, t)| hrows[y][e] * t).sum();
                v.round().clamp(0.0, 255.0) as u8
            }));
        }
        out
    }

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut r = stdx::SplitMix64::new(seed);
        (0..n).map(|_| r.next_u64() as u8).collect()
    }

    fn run(img: &[u8], w: u32, h: u32, c_n: usize, ax: &Axis, ay: &Axis) -> Vec<u8> {
        let src = Source {
            px: img,
            rect: Rect::new(0, 0, w, h),
            channels: c_n,
            stride: w as usize * c_n,
        };
        let mut out = Vec::new();
        let (cx, cy) = (Coeffs::bilinear(ax), Coeffs::bilinear(ay));
        assert!(bilinear(&src, &cx, &cy, &mut Buffers::default(), &mut out));
        out
    }

    #[test]
    fn the_instruction_set_variants_give_the_same_bytes() {
        for (c_n, seed) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
            let (w, h) = (97u32, 61u32);
            let img = noise(w as usize * h as usize * c_n, seed);
            let src = Source {
                px: &img,
                rect: Rect::new(0, 0, w, h),
                channels: c_n,
                stride: w as usize * c_n,
            };
            for (ax, ay) in [
                (resized(3, 90, 41), resized(0, 61, 150)),
                (resized(0, 97, 200), resized(10, 40, 13)),
            ] {
                let (cx, cy) = (Coeffs::bilinear(&ax), Coeffs::bilinear(&ay));
                let (mut a, mut b) = (Vec::new(), Vec::new());
                assert!(bilinear_passes::<false>(
                    &src,
                    &cx,
                    &cy,
                    &mut Buffers::default(),
                    &mut a
                ));
                assert!(bilinear(&src, &cx, &cy, &mut Buffers::default(), &mut b));
                assert_eq!(a, b, "{c_n} channels");
            }
        }
    }

    /// Random tables of `n` outputs reading inside `0..len`: each output's first tap anywhere its taps
    /// fit, 1 to `ksize` taps, weights of up to 22 bits summing to at most `2^22` (so that no sum leaves
    /// `i32`, as Pillow's normalised weights guarantee).
    fn random_coeffs(rng: &mut stdx::SplitMix64, len: u32, n: usize, ksize: usize) -> Coeffs {
        let mut c = Coeffs {
            ksize,
            first: Vec::new(),
            taps: Vec::new(),
            weights: vec![0; n * ksize],
        };
        for j in 0..n {
            let taps = 1 + (rng.next_u64() % ksize.min(len as usize) as u64) as u32;
            let first = (rng.next_u64() % u64::from(len - taps + 1)) as u32;
            let budget = (1u64 << PRECISION_BITS) / u64::from(taps);
            for t in 0..taps as usize {
                c.weights[j * ksize + t] = (rng.next_u64() % (budget + 1)) as i32;
            }
            c.first.push(first);
            c.taps.push(taps);
        }
        c
    }

    /// The AVX2 kernels against the portable passes, value for value: Pillow's tables of shrinks and
    /// enlargements, and random tables (any first tap, any tap count, any weights), over odd widths,
    /// one to four channels and sources that start inside the image.
    #[test]
    fn the_avx2_passes_give_the_portable_passes_bytes() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::arch::is_x86_feature_detected!("avx2") {
                eprintln!("skipped: this CPU has no AVX2");
                return;
            }
            let mut rng = stdx::SplitMix64::new(25);
            let mut compared = 0usize;
            for case in 0..300 {
                let c_n = [1, 2, 3, 4][case % 4];
                let w = 1 + (rng.next_u64() % 300) as u32;
                let h = 1 + (rng.next_u64() % 40) as u32;
                let (cx, cy) = if case % 3 == 0 {
                    let n = 1 + (rng.next_u64() % 200) as usize;
                    let m = 1 + (rng.next_u64() % 30) as usize;
                    let k = 1 + (rng.next_u64() % 12) as usize;
                    (
                        random_coeffs(&mut rng, w, n, k),
                        random_coeffs(&mut rng, h, m, 1 + k % 5),
                    )
                } else {
                    let axis = |rng: &mut stdx::SplitMix64, len: u32, most: u32| {
                        let src = (rng.next_u64() % u64::from(len)) as u32;
                        let src_len = 1 + (rng.next_u64() % u64::from(len - src)) as u32;
                        let dst_len = 1 + (rng.next_u64() % u64::from(most)) as u32;
                        let offset = (rng.next_u64() % u64::from(dst_len)) as u32;
                        let kept = 1 + (rng.next_u64() % u64::from(dst_len - offset)) as u32;
                        Coeffs::bilinear(&Axis {
                            src,
                            src_len,
                            dst_len,
                            offset,
                            len: kept,
                        })
                    };
                    (axis(&mut rng, w, 3 * w), axis(&mut rng, h, 3 * h))
                };
                // A source holding exactly the span the tables read, inside a wider image.
                let ((x0, x1), (y0, y1)) = (cx.span(), cy.span());
                let stride = (w as usize + 3) * c_n;
                let img = noise(stride * h as usize, case as u64);
                let src = Source {
                    px: &img[y0 as usize * stride + x0 as usize * c_n..],
                    rect: Rect::new(x0, y0, x1 - x0, y1 - y0),
                    channels: c_n,
                    stride,
                };
                let (mut a, mut b) = (Vec::new(), Vec::new());
                assert!(bilinear_passes::<false>(
                    &src,
                    &cx,
                    &cy,
                    &mut Buffers::default(),
                    &mut a
                ));
                #[allow(unsafe_code)]
                // SAFETY: the CPU runs AVX2 (checked above).
                let ok = unsafe {
                    bilinear_avx2::<true>(&src, &cx, &cy, &mut Buffers::default(), &mut b)
                };
                assert!(ok);
                assert_eq!(a.len(), cx.first.len() * cy.first.len() * c_n);
                if let Some(at) = a.iter().zip(&b).position(|(x, y)| x != y) {
                    panic!(
                        "case {case}: {c_n} channels, {w}x{h}, value {at}: portable {} vs AVX2 {}",
                        a[at], b[at]
                    );
                }
                assert_eq!(a, b);
                compared += a.len();
            }
            assert!(compared > 100_000, "{compared} values compared");
        }
    }

    /// The passes compute exactly Pillow's integer arithmetic over the tables, written out plainly
    /// (`(2^21 + Σ v·w) >> 22` clamped, the horizontal pass's rows rounded before the vertical): the
    /// formula `l3-cuda`'s kernel is checked against on its CPU simulation, so the GPU's samples and
    /// these are the same bytes.
    #[test]
    fn bilinear_is_the_plain_integer_formula() {
        let clip = |acc: i32| (acc >> PRECISION_BITS).clamp(0, 255) as u8;
        for (c_n, seed) in [(1, 7), (3, 8), (4, 9)] {
            let (w, h) = (53u32, 37u32);
            let img = noise(w as usize * h as usize * c_n, seed);
            for (ax, ay) in [
                (resized(3, 40, 17), resized(0, 37, 90)),
                (resized(0, 53, 200), resized(10, 20, 7)),
            ] {
                let (cx, cy) = (Coeffs::bilinear(&ax), Coeffs::bilinear(&ay));
                let got = run(&img, w, h, c_n, &ax, &ay);
                let (kw, kh) = (cx.first.len(), cy.first.len());
                for (i, v) in got.iter().enumerate() {
                    let (c, ox, oy) = (i % c_n, (i / c_n) % kw, i / c_n / kw);
                    assert!(oy < kh);
                    let mut acc = HALF;
                    for ty in 0..cy.taps[oy] as usize {
                        let sy = cy.first[oy] as usize + ty;
                        let mut hacc = HALF;
                        for tx in 0..cx.taps[ox] as usize {
                            let sx = cx.first[ox] as usize + tx;
                            let p = img[(sy * w as usize + sx) * c_n + c];
                            hacc += i32::from(p) * cx.weights[ox * cx.ksize + tx];
                        }
                        acc += i32::from(clip(hacc)) * cy.weights[oy * cy.ksize + ty];
                    }
                    assert_eq!(*v, clip(acc), "{c_n} channels, output ({ox}, {oy}, {c})");
                }
            }
        }
    }

    fn resized(src: u32, src_len: u32, out: u32) -> Axis {
        Axis {
            src,
            src_len,
            dst_len: out,
            offset: 0,
            len: out,
        }
    }

    #[test]
    fn bilinear_matches_the_f64_reference_within_one() {
        let cases: &[(u32, u32, Axis, Axis)] = &[
            // shrink a window, enlarge a window, odd sizes, whole-axis resize then crop, a copy
            (
                64,
                48,
                Axis {
                    src: 5,
                    src_len: 50,
                    dst_len: 17,
                    offset: 0,
                    len: 17,
                },
                Axis {
                    src: 3,
                    src_len: 40,
                    dst_len: 9,
                    offset: 0,
                    len: 9,
                },
            ),
            (
                7,
                3,
                Axis {
                    src: 0,
                    src_len: 7,
                    dst_len: 20,
                    offset: 0,
                    len: 20,
                },
                Axis {
                    src: 0,
                    src_len: 3,
                    dst_len: 11,
                    offset: 0,
                    len: 11,
                },
            ),
            (
                1,
                1,
                Axis {
                    src: 0,
                    src_len: 1,
                    dst_len: 5,
                    offset: 0,
                    len: 5,
                },
                Axis {
                    src: 0,
                    src_len: 1,
                    dst_len: 3,
                    offset: 0,
                    len: 3,
                },
            ),
            (
                97,
                61,
                Axis {
                    src: 0,
                    src_len: 97,
                    dst_len: 40,
                    offset: 7,
                    len: 25,
                },
                Axis {
                    src: 0,
                    src_len: 61,
                    dst_len: 150,
                    offset: 30,
                    len: 64,
                },
            ),
            (
                31,
                9,
                Axis::copy(4, 20),
                Axis {
                    src: 1,
                    src_len: 8,
                    dst_len: 3,
                    offset: 0,
                    len: 3,
                },
            ),
        ];
        for (n, (w, h, ax, ay)) in cases.iter().enumerate() {
            for c_n in [1, 3, 4] {
                let img = noise((*w * *h) as usize * c_n, n as u64);
                let got = run(&img, *w, *h, c_n, ax, ay);
                let want = reference(&img, *w as usize, c_n, ax, ay);
                assert_eq!(got.len(), want.len());
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.abs_diff(*r) <= 1,
                        "case {n}, {c_n} channels, value {i}: {g} vs {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_copy_is_exact_and_a_sub_source_gives_the_same_values() {
        let (w, h) = (40u32, 30u32);
        let img = noise((w * h * 3) as usize, 7);
        assert_eq!(
            run(&img, w, h, 3, &Axis::copy(0, w), &Axis::copy(0, h)),
            img
        );
        // The same tables over a source that holds only the rows and columns they read.
        let ax = Axis {
            src: 0,
            src_len: 40,
            dst_len: 13,
            offset: 2,
            len: 6,
        };
        let ay = Axis {
            src: 0,
            src_len: 30,
            dst_len: 50,
            offset: 11,
            len: 20,
        };
        let whole = run(&img, w, h, 3, &ax, &ay);
        let (cx, cy) = (Coeffs::bilinear(&ax), Coeffs::bilinear(&ay));
        let ((x0, x1), (y0, y1)) = (cx.span(), cy.span());
        let stride = (w * 3) as usize;
        let part = Source {
            px: &img[y0 as usize * stride + x0 as usize * 3..],
            rect: Rect::new(x0, y0, x1 - x0, y1 - y0),
            channels: 3,
            stride,
        };
        let mut out = Vec::new();
        assert!(bilinear(&part, &cx, &cy, &mut Buffers::default(), &mut out));
        assert_eq!(out, whole);
        let short = Source {
            rect: Rect::new(x0 + 1, y0, x1 - x0 - 1, y1 - y0),
            ..part
        };
        assert!(
            !bilinear(&short, &cx, &cy, &mut Buffers::default(), &mut out),
            "reads outside"
        );
    }

    #[test]
    fn nearest_picks_by_torchvision_index_for_u16() {
        let img: Vec<u16> = (0..5 * 2).map(|v| v * 1000).collect();
        let src = Source {
            px: &img[..],
            rect: Rect::new(0, 0, 5, 2),
            channels: 1,
            stride: 5,
        };
        let ax = Axis {
            src: 0,
            src_len: 5,
            dst_len: 3,
            offset: 0,
            len: 3,
        };
        let ay = Axis {
            src: 0,
            src_len: 2,
            dst_len: 4,
            offset: 0,
            len: 4,
        };
        let mut out = Vec::new();
        assert!(nearest(
            &src,
            &nearest_index(&ax),
            &nearest_index(&ay),
            &mut out
        ));
        assert_eq!(
            out,
            [
                0, 1000, 3000, 0, 1000, 3000, 5000, 6000, 8000, 5000, 6000, 8000
            ]
        );
    }
}
