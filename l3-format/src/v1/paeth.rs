//! The custom Paeth predictor: each pixel is predicted from TL, T and TR of the previous row of its patch.
//!
//! No left neighbour is involved, so the prediction of a whole row depends only on the row above: the
//! interior loop below has no loop-carried dependency and LLVM vectorises it (i16 lanes).

/// Interior column: all three neighbours present. p = TL + TR − T; the nearest wins, ties TL, then T, then TR.
/// Written as data-flow selects (no branches) so the row loop vectorises.
#[inline(always)]
pub(crate) fn interior(tl: u8, t: u8, tr: u8) -> u8 {
    let (a, b, c) = (tl as i16, t as i16, tr as i16);
    let da = (c - b).abs(); // |p − TL|
    let db = (a + c - 2 * b).abs(); // |p − T|
    let dc = (a - b).abs(); // |p − TR|
    let t_or_tr = select(db <= dc, b, c);
    select(da <= db && da <= dc, a, t_or_tr) as u8
}

#[inline(always)]
fn select(cond: bool, x: i16, y: i16) -> i16 {
    let m = -(cond as i16); // all ones when cond
    (x & m) | (y & !m)
}

/// Left edge (column 0, width ≥ 2): TL absent, counts 0 in p = TR − T, not a candidate; tie → T.
#[inline(always)]
pub(crate) fn left_edge(t: u8, tr: u8) -> u8 {
    let (b, c) = (t as i16, tr as i16);
    let db = (c - 2 * b).abs(); // |p − T|
    let dc = b; // |p − TR| = |−T|
    if db <= dc { t } else { tr }
}

/// Right edge (last column, width ≥ 2): TR absent, counts 0 in p = TL − T, not a candidate; tie → TL.
#[inline(always)]
pub(crate) fn right_edge(tl: u8, t: u8) -> u8 {
    let (a, b) = (tl as i16, t as i16);
    let da = b; // |p − TL| = |−T|
    let db = (a - 2 * b).abs(); // |p − T|
    if da <= db { tl } else { t }
}

/// Writes the prediction of every pixel of a row from the previous row `prev` (same length, 1..=255).
#[inline]
pub(crate) fn predict_row(prev: &[u8], pred: &mut [u8]) {
    let w = prev.len();
    let pred = &mut pred[..w];
    match w {
        0 => {}
        1 => pred[0] = prev[0],
        _ => {
            pred[0] = left_edge(prev[0], prev[1]);
            pred[w - 1] = right_edge(prev[w - 2], prev[w - 1]);
            // Fixed 16-wide chunks give LLVM straight-line lanes to vectorise; the tail runs the same code.
            let n = w - 2;
            let (tl, t, tr) = (&prev[..n], &prev[1..n + 1], &prev[2..n + 2]);
            let out = &mut pred[1..n + 1];
            let full = n / 16 * 16;
            for k in (0..full).step_by(16) {
                let (a, b, c) = (&tl[k..k + 16], &t[k..k + 16], &tr[k..k + 16]);
                let o = &mut out[k..k + 16];
                for i in 0..16 {
                    o[i] = interior(a[i], b[i], c[i]);
                }
            }
            for i in full..n {
                out[i] = interior(tl[i], t[i], tr[i]);
            }
        }
    }
}

/// The textbook definition, pixel by pixel, kept as the reference the fast row code is tested against.
#[cfg(test)]
pub(crate) fn predict_reference(prev: &[u8], c: usize) -> u8 {
    let w = prev.len();
    let has_tl = c > 0;
    let has_tr = c + 1 < w;
    let tl = if has_tl { prev[c - 1] as i32 } else { 0 };
    let t = prev[c] as i32;
    let tr = if has_tr { prev[c + 1] as i32 } else { 0 };
    let p = tl + tr - t;
    // Candidates in tie order: TL, T, TR; absent ones are skipped; the first strictly nearest wins.
    let mut best: Option<(i32, i32)> = None;
    for (present, v) in [(has_tl, tl), (true, t), (has_tr, tr)] {
        if !present {
            continue;
        }
        let d = (p - v).abs();
        if best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, v));
        }
    }
    best.map(|(_, v)| v as u8).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_predictor_matches_reference_on_all_small_rows() {
        // Every 3-pixel row over a value grid plus random rows of many widths.
        let vals = [0u8, 1, 2, 7, 64, 127, 128, 129, 200, 254, 255];
        for &a in &vals {
            for &b in &vals {
                for &c in &vals {
                    for w in 1..=3 {
                        let prev = &[a, b, c][..w];
                        let mut pred = [0u8; 3];
                        predict_row(prev, &mut pred);
                        for (i, &p) in pred[..w].iter().enumerate() {
                            assert_eq!(p, predict_reference(prev, i), "{prev:?} col {i}");
                        }
                    }
                }
            }
        }
        let mut s = 0x1234_5678_u32;
        for w in 1..=255 {
            let prev: Vec<u8> = (0..w)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    (s >> 24) as u8
                })
                .collect();
            let mut pred = vec![0u8; w];
            predict_row(&prev, &mut pred);
            for (i, &p) in pred.iter().enumerate() {
                assert_eq!(p, predict_reference(&prev, i));
            }
        }
    }

    #[test]
    fn edge_rules_by_position_not_value() {
        // Left edge: p = TR − T = 10 − 5 = 5; |p−T| = 0 → T.
        assert_eq!(left_edge(5, 10), 5);
        // Left edge: T=0 makes |p−TR| = 0 → TR unless |TR−0| = 0 (tie → T).
        assert_eq!(left_edge(0, 9), 9);
        assert_eq!(left_edge(0, 0), 0);
        // Tie between T and TR at the left edge goes to T: T=4, TR=12: p=8, |8−4|=4=|p−TR|=4.
        assert_eq!(left_edge(4, 12), 4);
        // Right edge tie goes to TL: TL=12, T=4: p=8, |p−TL|=4, |p−T|=4.
        assert_eq!(right_edge(12, 4), 12);
        // A zero *value* of TL inside the row is a real candidate: TL=0, T=5, TR=5 → p=0 → TL.
        assert_eq!(interior(0, 5, 5), 0);
        // Interior ties: all equal → TL.
        assert_eq!(interior(7, 7, 7), 7);
    }
}
