//! The `MR × NR` microkernels: one accumulator per output, fed by one fused multiply-add per `k` in
//! increasing order. The portable kernel (`f32::mul_add`) and the AVX2 + FMA kernel compute the same
//! roundings in the same order, so they agree bit for bit.
//!
//! Row `k` of the right matrix is the `NR` values at `b + offs[k]`: a packed panel (`offs[k] = k·NR`)
//! or, for a stride-1 convolution, the input itself (`offs[k]` = where input channel, kernel row and
//! kernel column of `k` put the panel's first pixel), which saves writing im2col's columns at all.

use super::{MR, NR};

/// `c[i·ldc + j] = init[i] + Σ_k a[k·MR + i] · b[offs[k] + j]` (or, without `init`, continues the sums
/// already in `c`), for `k` in `0..kc`, each product fused into the running sum.
///
/// # Safety
/// `a` holds `kc·MR` values, `offs` holds `kc` offsets with `b + offs[k]` valid for `NR` reads, and
/// `c` rows `0..MR` (stride `ldc`) hold `NR` values each.
pub type Kernel = unsafe fn(
    kc: usize,
    a: *const f32,
    b: *const f32,
    offs: *const usize,
    c: *mut f32,
    ldc: usize,
    init: Option<&[f32; MR]>,
);

/// The fastest kernel this CPU runs. Every kernel gives the same bits; only the speed differs.
pub fn best() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return avx2;
    }
    portable
}

/// The reference kernel: plain Rust, `mul_add` (a hardware FMA where the target has one, else libm's
/// correctly rounded `fmaf`).
///
/// # Safety
/// As [`Kernel`].
pub unsafe fn portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    offs: *const usize,
    c: *mut f32,
    ldc: usize,
    init: Option<&[f32; MR]>,
) {
    let mut acc = [[0f32; NR]; MR];
    // SAFETY (whole body): the caller's contract on `a`, `b`, `offs` and `c`.
    unsafe {
        for (i, row) in acc.iter_mut().enumerate() {
            match init {
                Some(v) => row.fill(v[i]),
                None => row.copy_from_slice(std::slice::from_raw_parts(c.add(i * ldc), NR)),
            }
        }
        let (a, offs) = (
            std::slice::from_raw_parts(a, kc * MR),
            std::slice::from_raw_parts(offs, kc),
        );
        for (ak, &off) in a.chunks_exact(MR).zip(offs) {
            let bk = std::slice::from_raw_parts(b.add(off), NR);
            for (row, &av) in acc.iter_mut().zip(ak) {
                for (s, &bv) in row.iter_mut().zip(bk) {
                    *s = av.mul_add(bv, *s);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            std::slice::from_raw_parts_mut(c.add(i * ldc), NR).copy_from_slice(row);
        }
    }
}

/// AVX2 + FMA: 12 accumulators of 8 lanes (6 rows × 2 vectors), two loads of `b` and six broadcasts of
/// `a` per `k`.
///
/// # Safety
/// As [`Kernel`]; the CPU has AVX2 and FMA ([`best`] hands it out only then).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2(
    kc: usize,
    a: *const f32,
    b: *const f32,
    offs: *const usize,
    c: *mut f32,
    ldc: usize,
    init: Option<&[f32; MR]>,
) {
    use std::arch::x86_64::*;
    const _: () = assert!(MR == 6 && NR == 16);
    // SAFETY (whole body): pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            *row = match init {
                Some(v) => [_mm256_set1_ps(v[i]); 2],
                None => [
                    _mm256_loadu_ps(c.add(i * ldc)),
                    _mm256_loadu_ps(c.add(i * ldc + 8)),
                ],
            };
        }
        let mut a = a;
        for k in 0..kc {
            let bk = b.add(*offs.add(k));
            let b0 = _mm256_loadu_ps(bk);
            let b1 = _mm256_loadu_ps(bk.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(i));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            a = a.add(MR);
        }
        for (i, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add(i * ldc), row[0]);
            _mm256_storeu_ps(c.add(i * ldc + 8), row[1]);
        }
    }
}
