//! Row-wise base-delta bit packing.
//!
//! A row of stored bytes (pixel values in row 0, residuals after) is read as `i8`; base = min, nbit = bits
//! of (max − min). The row is written LSB-first: bits 0..4 nbit, bits 4..12 base (its two's-complement
//! byte), then delta i (= value − base, 0..=255) in bits 12 + i·nbit .. 12 + (i+1)·nbit, padded with zero
//! bits to a whole byte. Bit k of a row lives in bit k % 8 (1 = least significant) of byte k / 8.

/// Largest row width (the patch size is a u8).
pub(crate) const MAX_W: usize = 255;

/// Bytes a row of `w` deltas of `nbit` bits occupies.
#[inline(always)]
pub(crate) const fn row_len(w: usize, nbit: usize) -> usize {
    (12 + w * nbit).div_ceil(8)
}

/// Base byte and nbit of a row of stored bytes read as i8.
#[inline]
pub(crate) fn base_and_nbit(vals: &[u8]) -> (u8, u8) {
    // Flipping the sign bit maps i8 order onto u8 order, so plain u8 min/max (vectorised) do the work.
    let (mut lo, mut hi) = (u8::MAX, 0u8);
    for &v in vals {
        let u = v ^ 0x80;
        lo = lo.min(u);
        hi = hi.max(u);
    }
    let range = hi.wrapping_sub(lo);
    let nbit = (u8::BITS - range.leading_zeros()) as u8;
    (lo ^ 0x80, nbit)
}

/// Appends one packed row of stored bytes `vals` (1..=255 long) to `out`.
#[inline]
pub(crate) fn pack_row(vals: &[u8], out: &mut Vec<u8>) {
    let (base, nbit) = base_and_nbit(vals);
    let w = vals.len();
    let len = row_len(w, nbit as usize);
    let start = out.len();
    out.resize(start + len, 0);
    let dst = &mut out[start..];
    dst[0] = nbit | (base << 4);
    dst[1] = base >> 4;
    match nbit {
        0 => {}
        1 => pack_fixed::<1>(vals, base, dst),
        2 => pack_fixed::<2>(vals, base, dst),
        3 => pack_fixed::<3>(vals, base, dst),
        4 => pack_fixed::<4>(vals, base, dst),
        5 => pack_fixed::<5>(vals, base, dst),
        6 => pack_fixed::<6>(vals, base, dst),
        7 => pack_fixed::<7>(vals, base, dst),
        _ => pack_fixed::<8>(vals, base, dst),
    }
}

/// Packs deltas eight at a time: eight NB-bit deltas are exactly NB bytes, starting at bit 4 of byte
/// 1 + g·NB for group g.
#[inline(always)]
fn pack_fixed<const NB: usize>(vals: &[u8], base: u8, dst: &mut [u8]) {
    let bases = u64::from_ne_bytes([base; 8]);
    let mut chunks = vals.chunks_exact(8);
    let mut byte = 1;
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        put_bits(dst, byte, gather::<NB>(sub_bytes(v, bases)));
        byte += NB;
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut last = [base; 8];
        last[..rem.len()].copy_from_slice(rem);
        let v = u64::from_le_bytes(last);
        put_bits(dst, byte, gather::<NB>(sub_bytes(v, bases)));
    }
}

/// Byte-wise wrapping a − b of eight bytes packed in a u64 (SWAR).
#[inline(always)]
fn sub_bytes(a: u64, b: u64) -> u64 {
    const H: u64 = 0x8080_8080_8080_8080;
    ((a | H) - (b & !H)) ^ ((a ^ !b) & H)
}

/// Eight bytes, each < 2^NB, to eight NB-bit fields packed from bit 0 (the inverse of [`spread`]).
#[inline(always)]
fn gather<const NB: usize>(x: u64) -> u64 {
    if NB == 8 {
        return x;
    }
    let m1 = ((1u64 << NB) - 1) * 0x0001_0001_0001_0001;
    let x = (x & m1) | ((x >> 8) & m1) << NB;
    let m2 = ((1u64 << (2 * NB)) - 1) * 0x0000_0001_0000_0001;
    let x = (x & m2) | ((x >> 16) & m2) << (2 * NB);
    let m4 = (1u64 << (4 * NB)) - 1;
    (x & m4) | ((x >> 32) & m4) << (4 * NB)
}

/// Eight NB-bit fields packed from bit 0 to eight bytes (one field per byte): three mask-and-shift steps
/// instead of eight extractions.
#[inline(always)]
pub(crate) fn spread<const NB: usize>(bits: u64) -> u64 {
    if NB == 8 {
        return bits;
    }
    let m4 = (1u64 << (4 * NB)) - 1;
    let x = (bits & m4) | ((bits >> (4 * NB)) & m4) << 32;
    let m2 = ((1u64 << (2 * NB)) - 1) * 0x0000_0001_0000_0001;
    let x = (x & m2) | ((x >> (2 * NB)) & m2) << 16;
    let m1 = ((1u64 << NB) - 1) * 0x0001_0001_0001_0001;
    (x & m1) | ((x >> NB) & m1) << 8
}

/// ORs `bits` (≤ 64 significant bits) into `dst` starting at bit 4 of byte `byte`, ignoring bytes past the end
/// (they only ever receive zero bits).
#[inline(always)]
fn put_bits(dst: &mut [u8], byte: usize, bits: u64) {
    if let Some(d) = dst.get_mut(byte..byte + 9) {
        d[0] |= (bits << 4) as u8;
        let hi = (bits >> 4).to_le_bytes();
        d[1..9].copy_from_slice(&hi);
        return;
    }
    let wide = (bits as u128) << 4;
    let bytes = wide.to_le_bytes();
    let n = (dst.len() - byte).min(9);
    for (d, s) in dst[byte..byte + n].iter_mut().zip(&bytes[..n]) {
        *d |= *s;
    }
}

/// Reads the 12-bit row header at `data[0..2]`: (nbit, base). The caller guarantees two bytes.
#[inline(always)]
pub(crate) fn read_header(data: &[u8]) -> (u8, u8) {
    (data[0] & 0x0f, (data[0] >> 4) | (data[1] << 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::kernel::{PAD, SCRATCH, decode_row};

    #[test]
    fn header_and_bit_order_are_lsb_first() {
        let mut out = Vec::new();
        // Values read as i8: 1, 2, 3 → base 1, range 2 → nbit 2; deltas 0, 1, 2.
        pack_row(&[1, 2, 3], &mut out);
        // bits: nbit=2 (0..4), base=1 (4..12), deltas 0b00, 0b01, 0b10 at 12, 14, 16.
        // byte0 = 0x2 | 0x1<<4 = 0x12; byte1 = 0 | (0<<4)|(1<<6) = 0x40; byte2 = 0b10 = 0x02.
        assert_eq!(out, vec![0x12, 0x40, 0x02]);
    }

    #[test]
    fn i8_reading_decides_nbit() {
        // 127 and 128 are adjacent as u8 but 255 apart as i8 (127 and −128).
        assert_eq!(base_and_nbit(&[127, 128]), (128, 8));
        assert_eq!(base_and_nbit(&[255, 0, 1]), (255, 2)); // −1, 0, 1
        assert_eq!(base_and_nbit(&[9, 9, 9]), (9, 0));
    }

    #[test]
    fn pack_unpack_round_trip_every_width_and_nbit() {
        let mut s = 7u32;
        for w in 1..=MAX_W {
            for nbit in 0..=8u32 {
                let vals: Vec<u8> = (0..w)
                    .map(|_| {
                        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        ((s >> 16) % (1 << nbit)) as u8
                    })
                    .collect();
                let mut out = Vec::new();
                pack_row(&vals, &mut out);
                let (nb, base) = read_header(&out);
                assert_eq!(out.len(), row_len(w, nb as usize));
                let mut src = [0u8; SCRATCH];
                src[..out.len()].copy_from_slice(&out);
                let (prev, mut row) = ([0u8; PAD], [0u8; PAD]);
                decode_row(&src, nb, base, w, true, &prev, &mut row);
                let dec = row[1..w + 1].to_vec();
                assert_eq!(dec, vals);
            }
        }
    }
}
