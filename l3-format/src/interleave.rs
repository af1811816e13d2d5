//! Writing decoded rows into the caller's buffer, shared by both versions' decoders: [`copy_row`] for one
//! plane, [`interleave3`] / [`interleave4`] for RGB / RGBA pixels (the AVX2 kernels of `simd/interleave.rs`
//! in the AVX2 copies of the decoders, portable loops otherwise).

/// Copies a short row with inline 16-byte moves (the last one overlapping) rather than a `memcpy` call,
/// whose fixed cost dominates at patch widths of 32 to 128.
#[inline(always)]
pub(crate) fn copy_row(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    if n < 16 {
        for (d, s) in dst[..n].iter_mut().zip(&src[..n]) {
            *d = *s;
        }
        return;
    }
    let mut i = 0;
    while i + 16 <= n {
        dst[i..i + 16].copy_from_slice(&src[i..i + 16]);
        i += 16;
    }
    if i < n {
        dst[n - 16..n].copy_from_slice(&src[n - 16..n]);
    }
}

/// Interleaves three planes' rows into RGB triples: the `pshufb` kernel of `simd/interleave.rs` in the AVX2
/// copies (`AVX2` is true only after the run-time check), the portable loop otherwise.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn interleave3<const AVX2: bool>(dst: &mut [u8], r0: &[u8], r1: &[u8], r2: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is true only in code compiled with AVX2 enabled, reached after the run-time check.
        unsafe { crate::simd::interleave::interleave3_avx2(dst, r0, r1, r2) };
        return;
    }
    interleave3_portable(dst, r0, r1, r2);
}

/// Interleaves four planes' rows into RGBA quadruples (see [`interleave3`]).
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn interleave4<const AVX2: bool>(
    dst: &mut [u8],
    r0: &[u8],
    r1: &[u8],
    r2: &[u8],
    r3: &[u8],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `interleave3`.
        unsafe { crate::simd::interleave::interleave4_avx2(dst, r0, r1, r2, r3) };
        return;
    }
    for ((((p, &a), &b), &c), &e) in dst.chunks_exact_mut(4).zip(r0).zip(r1).zip(r2).zip(r3) {
        p[0] = a;
        p[1] = b;
        p[2] = c;
        p[3] = e;
    }
}

/// Interleaves three planes' rows into RGB triples, 16 pixels at a time through a fixed-size block that
/// LLVM turns into byte shuffles.
#[inline(always)]
fn interleave3_portable(dst: &mut [u8], r0: &[u8], r1: &[u8], r2: &[u8]) {
    let w = r0.len().min(r1.len()).min(r2.len()).min(dst.len() / 3);
    let full = w / 16 * 16;
    for k in (0..full).step_by(16) {
        let (a, b, c) = (&r0[k..k + 16], &r1[k..k + 16], &r2[k..k + 16]);
        let mut block = [0u8; 48];
        for i in 0..16 {
            block[3 * i] = a[i];
            block[3 * i + 1] = b[i];
            block[3 * i + 2] = c[i];
        }
        dst[3 * k..3 * k + 48].copy_from_slice(&block);
    }
    for i in full..w {
        dst[3 * i] = r0[i];
        dst[3 * i + 1] = r1[i];
        dst[3 * i + 2] = r2[i];
    }
}
