//! The front end both v2 profiles share (SPEC.md §2.3–2.5): colour transform, per-run predictor selectors,
//! zigzag residuals, and the reconstruction of a row as a scan `x_c = a_c·x_{c−1} + b_c`.

/// Selector values: the predictor of one 32-column run of a row r ≥ 1 (3 = AVG3, the remaining value).
pub(crate) const GRAD: u8 = 0;
pub(crate) const LEFT: u8 = 1;
pub(crate) const TOP: u8 = 2;

/// Columns per selector run.
pub(crate) const RUN: usize = 32;

/// Length of a padded row buffer: index 0 holds the left replica, 1..=pw the row, pw+1 the right replica,
/// and there is room for 32-byte loads at any run start.
pub(crate) const ROW: usize = 288;

/// Selector runs in a row of `pw` pixels.
#[inline(always)]
pub(crate) fn runs(pw: usize) -> usize {
    pw.div_ceil(RUN)
}

/// 2v for v ≥ 0, −2v−1 for v < 0, of the residual read as `i8`.
#[inline(always)]
pub(crate) fn zigzag(res: u8) -> u8 {
    let v = res as i8;
    ((v << 1) ^ (v >> 7)) as u8
}

/// The inverse of [`zigzag`], as a residual byte.
#[inline(always)]
pub(crate) fn unzigzag(z: u8) -> u8 {
    (z >> 1) ^ 0u8.wrapping_sub(z & 1)
}

/// Bits needed for `v` (0 for 0).
#[inline(always)]
pub(crate) fn bitlen(v: u8) -> u8 {
    (8 - v.leading_zeros()) as u8
}

/// AVG3 of the design: (TL + 2T + TR + 2) >> 2.
#[inline(always)]
pub(crate) fn avg3(tl: u8, t: u8, tr: u8) -> u8 {
    ((u16::from(tl) + 2 * u16::from(t) + u16::from(tr) + 2) >> 2) as u8
}

/// The textbook prediction of column `c` of a row r ≥ 1 with selector `s` (`prev` is row r−1, `cur` row r,
/// both `pw` long), straight from the spec; the reference the fast paths are tested against.
#[cfg(test)]
pub(crate) fn predict(s: u8, prev: &[u8], cur: &[u8], c: usize) -> u8 {
    let pw = prev.len();
    let t = prev[c];
    let tl = if c == 0 { t } else { prev[c - 1] };
    let tr = if c + 1 == pw { t } else { prev[c + 1] };
    match s {
        GRAD if c == 0 => t,
        GRAD => cur[c - 1].wrapping_add(t).wrapping_sub(tl),
        LEFT if c == 0 => t,
        LEFT => cur[c - 1],
        TOP => t,
        _ => avg3(tl, t, tr),
    }
}

/// How the encoder scores a selector candidate on one run (the design's non-normative choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cost {
    /// BP: Σ over the run's groups of (pixels in the group)·nbit: the delta bits (8·nbit for a full group).
    Bp,
    /// ANS: Σ bitlen(z).
    Ans,
}

/// Residual rows of every candidate selector for row `cur` below `prev` (both `pw` long): `z[s][c]`.
#[inline]
pub(crate) fn candidates(prev: &[u8], cur: &[u8], z: &mut [[u8; 256]; 4]) {
    let pw = cur.len();
    debug_assert!(prev.len() == pw && (1..=256).contains(&pw));
    // Padded copies make every column's TL, T, TR, L a fixed offset away (edges replicated, L of column 0 = T).
    let mut p = [0u8; 258];
    let mut l = [0u8; 256];
    p[1..pw + 1].copy_from_slice(prev);
    p[0] = prev[0];
    p[pw + 1] = prev[pw - 1];
    l[0] = prev[0];
    l[1..pw].copy_from_slice(&cur[..pw - 1]);
    let [zg, zl, zt, za] = z;
    for c in 0..pw {
        let (tl, t, tr, left, x) = (p[c], p[c + 1], p[c + 2], l[c], cur[c]);
        // GRAD at c = 0 is T: with L = T and TL = T, L + T − TL = T as well.
        zg[c] = zigzag(x.wrapping_sub(left.wrapping_add(t).wrapping_sub(tl)));
        zl[c] = zigzag(x.wrapping_sub(left));
        zt[c] = zigzag(x.wrapping_sub(t));
        za[c] = zigzag(x.wrapping_sub(avg3(tl, t, tr)));
    }
}

/// Cost of residuals `z` (one run) under `cost`.
#[inline]
pub(crate) fn run_cost(z: &[u8], cost: Cost) -> u32 {
    match cost {
        Cost::Ans => z.iter().map(|&v| u32::from(bitlen(v))).sum(),
        Cost::Bp => z
            .chunks(8)
            .map(|g| g.len() as u32 * u32::from(bitlen(g.iter().copied().max().unwrap_or(0))))
            .sum(),
    }
}

/// The lowest-cost selector of the run `c0..c1` (ties to the lowest s).
#[inline]
pub(crate) fn choose(z: &[[u8; 256]; 4], c0: usize, c1: usize, cost: Cost) -> u8 {
    let mut best = (u32::MAX, 0u8);
    for (s, zs) in z.iter().enumerate() {
        let c = run_cost(&zs[c0..c1], cost);
        if c < best.0 {
            best = (c, s as u8);
        }
    }
    best.1
}

/// Reconstructs one row (portable): `prev` and `cur` are padded rows (pixel c at index c + 1, replicas at 0
/// and pw + 1), `z` the row's residual codes, `sels` its selectors (ignored for row 0, which is LEFT over a
/// zero row: pred = L, 0 at c = 0). Writes `cur[1..=pw]` and the replicas.
#[inline]
pub(crate) fn reconstruct_row(
    prev: &[u8; ROW],
    z: &[u8],
    sels: &[u8],
    pw: usize,
    first: bool,
    cur: &mut [u8; ROW],
) {
    // x_{-1} of the scan: T of column 0 (the left replica) for rows ≥ 1, 0 for row 0 (prev is zero).
    let mut left = prev[0];
    for k in 0..runs(pw) {
        let (c0, c1) = (k * RUN, (k * RUN + RUN).min(pw));
        let s = if first {
            LEFT
        } else {
            sels.get(k).copied().unwrap_or(LEFT)
        };
        match s {
            GRAD | LEFT => {
                for c in c0..c1 {
                    let b = if s == GRAD {
                        prev[c + 1].wrapping_sub(prev[c])
                    } else {
                        0
                    };
                    left = left.wrapping_add(b).wrapping_add(unzigzag(z[c]));
                    cur[c + 1] = left;
                }
            }
            TOP => {
                for c in c0..c1 {
                    cur[c + 1] = prev[c + 1].wrapping_add(unzigzag(z[c]));
                }
                left = cur[c1];
            }
            _ => {
                for c in c0..c1 {
                    cur[c + 1] =
                        avg3(prev[c], prev[c + 1], prev[c + 2]).wrapping_add(unzigzag(z[c]));
                }
                left = cur[c1];
            }
        }
    }
    cur[0] = cur[1];
    cur[pw + 1] = cur[pw];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_is_a_bijection_with_the_designs_values() {
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(255), 1); // −1
        assert_eq!(zigzag(128), 255); // −128
        assert_eq!(zigzag(127), 254);
        for v in 0..=255u8 {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn scan_reconstruction_equals_the_textbook_predictor() {
        let mut s = 0x1234_5678u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for pw in [1usize, 2, 31, 32, 33, 64, 100, 224] {
            for trial in 0..20 {
                let prev: Vec<u8> = (0..pw).map(|_| rnd() as u8).collect();
                let cur: Vec<u8> = (0..pw)
                    .map(|c| {
                        if trial % 2 == 0 {
                            rnd() as u8
                        } else {
                            prev[c].wrapping_add(rnd() as u8 % 5)
                        }
                    })
                    .collect();
                let sels: Vec<u8> = (0..runs(pw)).map(|_| rnd() as u8 % 4).collect();
                let z: Vec<u8> = (0..pw)
                    .map(|c| zigzag(cur[c].wrapping_sub(predict(sels[c / RUN], &prev, &cur, c))))
                    .collect();
                let mut pp = [0u8; ROW];
                pp[1..pw + 1].copy_from_slice(&prev);
                pp[0] = prev[0];
                pp[pw + 1] = prev[pw - 1];
                let mut out = [0u8; ROW];
                reconstruct_row(&pp, &z, &sels, pw, false, &mut out);
                assert_eq!(&out[1..pw + 1], &cur[..], "pw {pw} sels {sels:?}");
                // Every candidate residual row matches the textbook predictor.
                let mut zs = [[0u8; 256]; 4];
                candidates(&prev, &cur, &mut zs);
                for s in 0..4u8 {
                    for c in 0..pw {
                        let want = zigzag(cur[c].wrapping_sub(predict(s, &prev, &cur, c)));
                        assert_eq!(zs[s as usize][c], want);
                    }
                }
                // Row 0: pred = L, 0 at column 0.
                let z0: Vec<u8> = (0..pw)
                    .map(|c| zigzag(cur[c].wrapping_sub(if c == 0 { 0 } else { cur[c - 1] })))
                    .collect();
                reconstruct_row(&[0; ROW], &z0, &[], pw, true, &mut out);
                assert_eq!(&out[1..pw + 1], &cur[..]);
            }
        }
    }
}
