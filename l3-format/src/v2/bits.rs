//! LSB-first bit strings (SPEC.md §2.2): bit k of a stream is bit `k mod 8` of byte `k / 8`, and a field of
//! n bits is written least-significant bit first. Exp-Golomb codes in the ANS tables are the one exception:
//! their value bits are written most-significant first (still one bit at a time into the LSB-first stream).

/// Appends bits to a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, n: 0 }
    }

    /// Writes the low `bits` (≤ 32) bits of `v`, least significant first.
    #[inline(always)]
    pub(crate) fn put(&mut self, v: u32, bits: u32) {
        debug_assert!(bits <= 32 && (bits == 32 || v >> bits == 0));
        self.acc |= u64::from(v) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// Exp-Golomb order 0 of `v`: bitlen(v+1)−1 zeros, then v+1 most significant bit first.
    pub(crate) fn put_eg0(&mut self, v: u32) {
        let x = v + 1;
        let len = 32 - x.leading_zeros();
        self.put(0, len - 1);
        for i in (0..len).rev() {
            self.put((x >> i) & 1, 1);
        }
    }

    /// Pads with zero bits to the next byte boundary.
    pub(crate) fn align(&mut self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
            self.acc = 0;
            self.n = 0;
        }
    }
}

/// Reads bits from a byte slice; reading past the end is an error the caller names.
pub(crate) struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Ran past the end of the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfBits;

impl<'a> BitReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        BitReader { bytes, pos: 0 }
    }

    /// Reads `bits` (≤ 25) bits, least significant first.
    #[inline]
    pub(crate) fn get(&mut self, bits: u32) -> Result<u32, OutOfBits> {
        debug_assert!(bits <= 25);
        if bits == 0 {
            return Ok(0);
        }
        let end = self.pos + bits as usize;
        if end > 8 * self.bytes.len() {
            return Err(OutOfBits);
        }
        let at = self.pos / 8;
        let mut w = [0u8; 4];
        let n = (self.bytes.len() - at).min(4);
        w[..n].copy_from_slice(&self.bytes[at..at + n]);
        let v = (u32::from_le_bytes(w) >> (self.pos % 8)) & ((1u32 << bits) - 1);
        self.pos = end;
        Ok(v)
    }

    /// 64 bits from bit `pos` on (zeros past the end).
    #[inline]
    fn peek64(&self) -> u64 {
        let at = self.pos / 8;
        let mut w = [0u8; 16];
        let rest = self.bytes.get(at..).unwrap_or(&[]);
        let n = rest.len().min(16);
        w[..n].copy_from_slice(&rest[..n]);
        (u128::from_le_bytes(w) >> (self.pos % 8)) as u64
    }

    /// Exp-Golomb order 0; `None` inside the `Ok` when the code has more than `max_zeros` leading zeros
    /// (`max_zeros` < 32).
    pub(crate) fn get_eg0(&mut self, max_zeros: u32) -> Result<Option<u32>, OutOfBits> {
        let avail = 8 * self.bytes.len() - self.pos.min(8 * self.bytes.len());
        let w = self.peek64();
        let zeros = w.trailing_zeros();
        if zeros > max_zeros {
            // Enough zeros are there (or the stream ends): either way no valid code.
            return if avail as u32 > max_zeros {
                Ok(None)
            } else {
                Err(OutOfBits)
            };
        }
        let len = 2 * zeros as usize + 1;
        if len > avail {
            return Err(OutOfBits);
        }
        // After the leading 1, `zeros` bits most significant first: reverse them.
        let tail = ((w >> (zeros + 1)) as u32) & ((1u32 << zeros) - 1);
        let bits = if zeros == 0 {
            0
        } else {
            tail.reverse_bits() >> (32 - zeros)
        };
        self.pos += len;
        Ok(Some(((1u32 << zeros) | bits) - 1))
    }

    /// Bytes used so far, the last one possibly partly.
    pub(crate) fn bytes_used(&self) -> usize {
        self.pos.div_ceil(8)
    }
}

/// 64 bits of `data` starting at bit `bit` (zeros past its end).
#[inline(always)]
pub(crate) fn window(data: &[u8], bit: usize) -> u64 {
    let at = bit / 8;
    let sh = (bit % 8) as u32;
    let (lo, hi) = match data.get(at..at + 9) {
        Some(b) => {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[..8]);
            (u64::from_le_bytes(w), b[8])
        }
        None => window_tail(data, at),
    };
    // Two shifts so that sh = 0 does not shift by 64.
    (lo >> sh) | ((u64::from(hi) << 1) << (63 - sh))
}

/// The slow path of [`window`] within 9 bytes of the end.
#[cold]
#[inline(never)]
fn window_tail(data: &[u8], at: usize) -> (u64, u8) {
    let mut b = [0u8; 9];
    let rest = data.get(at..).unwrap_or(&[]);
    let n = rest.len().min(9);
    b[..n].copy_from_slice(&rest[..n]);
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    (u64::from_le_bytes(w), b[8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_lsb_first_and_eg0_is_msb_first() {
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        w.put(1, 1);
        w.put(111, 8);
        w.put_eg0(0); // "1"
        w.put_eg0(4096); // 12 zeros, then 1000000000001
        w.align();
        // bit 0 = 1, bits 1..9 = 111 LSB-first, bit 9 = 1, then 12 zeros, then 4097 MSB-first.
        let mut r = BitReader::new(&out);
        assert_eq!(r.get(1), Ok(1));
        assert_eq!(r.get(8), Ok(111));
        assert_eq!(r.get_eg0(12), Ok(Some(0)));
        assert_eq!(r.get_eg0(12), Ok(Some(4096)));
        assert_eq!(out[0], 0b1101_1111);
        assert_eq!(r.bytes_used(), out.len());
        let mut r = BitReader::new(&out[..2]);
        r.get(9).unwrap();
        assert_eq!(r.get_eg0(12), Ok(Some(0)));
        assert_eq!(r.get_eg0(12), Err(OutOfBits));
        let mut r = BitReader::new(&[0, 0, 0, 1]);
        assert_eq!(r.get_eg0(12), Ok(None));
    }
}
