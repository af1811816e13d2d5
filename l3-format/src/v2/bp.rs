//! Profile BP (SPEC.md §2.6): each (plane, patch) is a sequence of byte-aligned rows
//! `[selectors][nbit codes][escapes][deltas]`, with no tables and no serial parse beyond a row.

use super::bits::{BitWriter, window};
use super::front::{bitlen, runs};
use crate::error::{Error, PatchId};

/// Pixels per nbit group.
pub(crate) const GROUP: usize = 8;
/// Most groups in a row (224 / 8).
pub(crate) const MAX_GROUPS: usize = 28;

/// A row's group widths as the decoder keeps them: room for 32 so that a vector register holds them all
/// (entries from `groups(pw)` on are ignored).
pub(crate) type Widths = [u8; 32];

/// Groups in a row of `pw` pixels.
#[inline(always)]
pub(crate) fn groups(pw: usize) -> usize {
    pw.div_ceil(GROUP)
}

/// Smallest byte length of row `r` of a `pw`-wide patch (every group coded "same", no deltas).
pub(crate) fn min_row_len(pw: usize, r: usize) -> usize {
    let bits = if r == 0 {
        4 * groups(pw)
    } else {
        2 * runs(pw) + 2 * groups(pw)
    };
    bits.div_ceil(8)
}

/// Appends one packed row: `z` its residual codes, `sels` its selectors (rows ≥ 1), `nbit` the previous
/// row's group widths on entry and this row's on return.
pub(crate) fn pack_row(
    z: &[u8],
    sels: &[u8],
    first: bool,
    nbit: &mut [u8; MAX_GROUPS],
    out: &mut Vec<u8>,
) {
    let pw = z.len();
    let ng = groups(pw);
    let mut w = BitWriter::new(out);
    let mut cur = [0u8; MAX_GROUPS];
    for (g, c) in cur[..ng].iter_mut().enumerate() {
        let hi = z[g * GROUP..(g * GROUP + GROUP).min(pw)]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        *c = bitlen(hi);
    }
    if first {
        for &nb in &cur[..ng] {
            w.put(u32::from(nb), 4);
        }
    } else {
        for &s in sels {
            w.put(u32::from(s), 2);
        }
        let code = |now: u8, before: u8| match i32::from(now) - i32::from(before) {
            0 => 0,
            1 => 1,
            -1 => 2,
            _ => 3,
        };
        for (&now, &before) in cur[..ng].iter().zip(nbit.iter()) {
            w.put(code(now, before), 2);
        }
        for (&now, &before) in cur[..ng].iter().zip(nbit.iter()) {
            if code(now, before) == 3 {
                w.put(u32::from(now), 4);
            }
        }
    }
    for (g, &nb) in cur[..ng].iter().enumerate() {
        for &v in &z[g * GROUP..(g * GROUP + GROUP).min(pw)] {
            w.put(u32::from(v), u32::from(nb));
        }
    }
    w.align();
    *nbit = cur;
}

/// nbit change of each 2-bit code (3 = escape, handled apart).
const CODE_DELTA: [i32; 4] = [0, 1, -1, 0];

/// The widths of the `ng` groups of a row r ≥ 1 from their 2-bit `codes` and the row above's widths
/// `prev`, into `out`; returns the escaped groups and the groups whose width leaves 0..=8, as bit masks.
/// (The AVX2 copy of the decoder uses `crate::simd::v2::widths_avx2`, escapes included.)
pub(crate) fn widths_from_codes(
    codes: u64,
    prev: &Widths,
    ng: usize,
    out: &mut Widths,
) -> (u32, u32) {
    let (mut escaped, mut bad) = (0u32, 0u32);
    for (g, nb) in out[..ng].iter_mut().enumerate() {
        let code = ((codes >> (2 * g)) & 3) as usize;
        let esc = code == 3;
        let v = i32::from(prev[g]) + CODE_DELTA[code];
        escaped |= u32::from(esc) << g;
        bad |= u32::from(!esc && !(0..=8).contains(&v)) << g;
        *nb = v as u8;
    }
    (escaped, bad)
}

/// Σ `nbit[..ng]`.
#[inline(always)]
#[allow(unsafe_code)]
fn sum_widths<const AVX2: bool>(nbit: &Widths, ng: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is true only after the run-time AVX2 check.
        return unsafe { crate::simd::v2::sum_widths(nbit, ng) };
    }
    nbit[..ng].iter().map(|&nb| usize::from(nb)).sum()
}

/// Decodes the rows of one (plane, patch) in order.
pub(crate) struct BpRows<'a> {
    data: &'a [u8],
    /// Byte where the next row starts.
    pos: usize,
    pw: usize,
    row: usize,
    nbit: Widths,
    id: PatchId,
}

/// The parsed head of a row: where its deltas start and each group's width.
pub(crate) struct RowHead {
    pub delta_bit: usize,
    pub nbit: Widths,
    /// Σ nbit over the row's groups.
    pub sum: usize,
}

impl<'a> BpRows<'a> {
    pub(crate) fn new(data: &'a [u8], pw: usize, id: PatchId) -> Self {
        BpRows {
            data,
            pos: 0,
            pw,
            row: 0,
            nbit: [0; 32],
            id,
        }
    }

    fn past_end(&self, needed_bits: usize) -> Error {
        Error::RowPastPatchEnd {
            patch: Some(self.id),
            row: self.row,
            offset: self.pos,
            needed: needed_bits.div_ceil(8),
            len: self.data.len(),
        }
    }

    /// Parses the selectors (into `sels`) and the nbit codes of the next row, checks that the whole row lies
    /// inside the patch, and advances past it. The deltas are then read with [`window`] from `delta_bit`.
    /// `AVX2` may be true only after the run-time AVX2+BMI2 check (see `crate::simd::has_avx2_bmi2`).
    #[inline(always)]
    pub(crate) fn head<const AVX2: bool>(&mut self, sels: &mut [u8]) -> Result<RowHead, Error> {
        let (pw, ng, nsel) = (self.pw, groups(self.pw), runs(self.pw));
        let rest = &self.data[self.pos..];
        let min = min_row_len(pw, self.row);
        if rest.len() < min {
            return Err(self.past_end(8 * min));
        }
        let mut bit = 0usize;
        let mut nbit: Widths = [0; 32];
        let sum;
        if self.row == 0 {
            // 4 bits per group, at most 28 groups: read them from 64-bit windows.
            for (g, nb) in nbit[..ng].iter_mut().enumerate() {
                let v = (window(rest, 4 * g) & 15) as u8;
                if v > 8 {
                    return Err(self.bad_nbit(g, i32::from(v)));
                }
                *nb = v;
            }
            bit = 4 * ng;
            sum = sum_widths::<AVX2>(&nbit, ng);
        } else {
            let s = window(rest, 0);
            for (k, sel) in sels[..nsel].iter_mut().enumerate() {
                *sel = ((s >> (2 * k)) & 3) as u8;
            }
            bit += 2 * nsel;
            // At most 28 two-bit codes: one window holds them all. Branch-free: code → delta by table,
            // escapes collected as a bit mask and read after.
            let codes = window(rest, bit);
            bit += 2 * ng;
            (sum, bit) = self.widths::<AVX2>(codes, ng, rest, bit, &mut nbit)?;
        }
        // Every group but the last has 8 pixels.
        let last = pw - (ng - 1) * GROUP;
        let bits = bit + GROUP * sum - (GROUP - last) * usize::from(nbit[ng - 1]);
        if 8 * rest.len() < bits {
            return Err(self.past_end(bits));
        }
        let head = RowHead {
            delta_bit: 8 * self.pos + bit,
            nbit,
            sum,
        };
        self.pos += bits.div_ceil(8);
        self.row += 1;
        self.nbit = nbit;
        Ok(head)
    }

    /// Row r ≥ 1's widths (into `nbit`) from its codes and the escapes at `bit` in `rest`: Σ widths and
    /// the bit after the escapes.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn widths<const AVX2: bool>(
        &self,
        codes: u64,
        ng: usize,
        rest: &[u8],
        mut bit: usize,
        nbit: &mut Widths,
    ) -> Result<(usize, usize), Error> {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: `AVX2` is true only after the run-time AVX2+BMI2 check.
            return unsafe { crate::simd::v2::widths_avx2(codes, &self.nbit, ng, rest, bit, nbit) }
                .map_err(|(g, v)| self.bad_nbit(g, v));
        }
        let (mut escaped, bad) = widths_from_codes(codes, &self.nbit, ng, nbit);
        if bad != 0 {
            let g = bad.trailing_zeros() as usize;
            let v = i32::from(self.nbit[g]) + CODE_DELTA[((codes >> (2 * g)) & 3) as usize];
            return Err(self.bad_nbit(g, v));
        }
        while escaped != 0 {
            let g = escaped.trailing_zeros() as usize;
            let v = (window(rest, bit) & 15) as u8;
            if v > 8 {
                return Err(self.bad_nbit(g, i32::from(v)));
            }
            nbit[g] = v;
            bit += 4;
            escaped &= escaped - 1;
        }
        Ok((sum_widths::<AVX2>(nbit, ng), bit))
    }

    /// Pixels per row.
    #[inline(always)]
    pub(crate) fn pw(&self) -> usize {
        self.pw
    }

    /// The bytes of this (plane, patch).
    #[inline(always)]
    pub(crate) fn data(&self) -> &'a [u8] {
        self.data
    }

    fn bad_nbit(&self, group: usize, nbit: i32) -> Error {
        Error::BadNbit {
            patch: self.id,
            row: self.row,
            group,
            nbit,
        }
    }

    /// Decodes the next row's residual codes into `z[..pw]` and its selectors into `sels` (portable).
    #[inline(always)]
    pub(crate) fn next_row(&mut self, z: &mut [u8], sels: &mut [u8]) -> Result<(), Error> {
        let h = self.head::<false>(sels)?;
        let mut bit = h.delta_bit;
        for (g, &nb) in h.nbit[..groups(self.pw)].iter().enumerate() {
            let v = window(self.data, bit);
            let len = GROUP.min(self.pw - g * GROUP);
            let mask = (1u64 << nb) - 1;
            for (j, o) in z[g * GROUP..g * GROUP + len].iter_mut().enumerate() {
                *o = ((v >> (j * usize::from(nb))) & mask) as u8;
            }
            bit += len * usize::from(nb);
        }
        Ok(())
    }

    /// After the last row: every byte used.
    pub(crate) fn finish(&self) -> Result<(), Error> {
        if self.pos == self.data.len() {
            Ok(())
        } else {
            Err(Error::TrailingPatchBytes {
                patch: Some(self.id),
                unused: self.data.len() - self.pos,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_with_escapes_and_steps() {
        let pw = 45;
        let rows: Vec<Vec<u8>> = vec![
            (0..pw).map(|c| (c * 5) as u8).collect(),
            (0..pw).map(|c| (c % 3) as u8).collect(),
            (0..pw).map(|c| (c % 7) as u8 * 30).collect(),
            vec![0; pw],
            (0..pw).map(|c| 255 - c as u8).collect(),
        ];
        let sels = [[0u8, 3], [1, 2], [2, 2], [3, 0], [0, 0]];
        let mut out = Vec::new();
        let mut nb = [0u8; MAX_GROUPS];
        for (r, z) in rows.iter().enumerate() {
            pack_row(z, &sels[r], r == 0, &mut nb, &mut out);
        }
        let id = PatchId {
            channel: 0,
            patch: 0,
        };
        let mut d = BpRows::new(&out, pw, id);
        for (r, z) in rows.iter().enumerate() {
            let (mut got, mut s) = ([0u8; 256], [9u8; 8]);
            d.next_row(&mut got, &mut s).unwrap();
            assert_eq!(&got[..pw], &z[..], "row {r}");
            if r > 0 {
                assert_eq!(&s[..2], &sels[r]);
            }
        }
        d.finish().unwrap();
        // Cut anywhere: an error, never a panic.
        for cut in 0..out.len() {
            let mut d = BpRows::new(&out[..cut], pw, id);
            let mut z = [0u8; 256];
            let mut s = [0u8; 8];
            let ok = (0..rows.len())
                .try_for_each(|_| d.next_row(&mut z, &mut s))
                .and_then(|_| d.finish());
            assert!(ok.is_err());
        }
    }
}
