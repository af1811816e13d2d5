//! CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), the
//! checksum that ends every version-2 file. On x86-64 CPUs with SSE4.2 the `crc32` instruction does the
//! work (`crate::simd::crc`, about 8 bytes per 3 cycles); elsewhere slicing-by-8 tables (~1.5 bytes per cycle).

/// `TABLES[k][b]`: the CRC of byte b followed by k zero bytes (slicing-by-8).
const TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// Continues a raw (not yet inverted) CRC register over `bytes`, portably.
pub(crate) fn update_portable(mut crc: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][c[4] as usize]
            ^ TABLES[2][c[5] as usize]
            ^ TABLES[1][c[6] as usize]
            ^ TABLES[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = TABLES[0][((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    c.update(bytes);
    c.finish()
}

/// CRC-32C computed piece by piece, for a file checked while it streams through a small buffer (`l3 info`
/// on a file of any size) rather than read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(!0)
    }

    /// Continues the checksum over the next `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_sse42() {
            // SAFETY: the SSE4.2 `crc32` instruction is all it needs, checked just above.
            #[allow(unsafe_code)]
            {
                self.0 = unsafe { crate::simd::crc::update_sse42(self.0, bytes) };
            }
            return;
        }
        self.0 = update_portable(self.0, bytes);
    }

    /// Continues `self` and `other` over the same `bytes` in one pass (with SSE4.2, at about the cost of one).
    pub(crate) fn update_pair(&mut self, other: &mut Crc32c, bytes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_sse42() {
            // SAFETY: the SSE4.2 `crc32` instruction is all it needs, checked just above.
            #[allow(unsafe_code)]
            {
                (self.0, other.0) =
                    unsafe { crate::simd::crc::update2_sse42(self.0, other.0, bytes) };
            }
            return;
        }
        self.0 = update_portable(self.0, bytes);
        other.0 = update_portable(other.0, bytes);
    }

    /// The checksum of everything passed to [`update`](Self::update).
    pub fn finish(self) -> u32 {
        !self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_values() {
        // The standard check value, and RFC 3720's test vectors (32 bytes of 0x00, of 0xFF, ascending).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(!update_portable(!0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let asc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&asc), 0x46DD_794E);
        assert_eq!(crc32c(&[]), 0);
    }

    #[test]
    fn piecewise_equals_whole_for_every_split() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + i / 5) as u8).collect();
        let whole = crc32c(&data);
        for split in [0, 1, 7, 8, 9, 64, 150, 299, 300] {
            let mut c = Crc32c::new();
            c.update(&data[..split]);
            c.update(&data[split..]);
            assert_eq!(c.finish(), whole, "split at {split}");
        }
        for split in [0, 5, 8, 150, 300] {
            let (mut a, mut b) = (Crc32c::new(), Crc32c::new());
            a.update(&data[..split]);
            a.update_pair(&mut b, &data[split..]);
            assert_eq!(a.finish(), whole, "pair, split at {split}");
            assert_eq!(b.finish(), crc32c(&data[split..]), "pair, split at {split}");
        }
        let mut bytewise = Crc32c::default();
        data.iter()
            .for_each(|b| bytewise.update(std::slice::from_ref(b)));
        assert_eq!(bytewise.finish(), whole);
    }

    #[test]
    fn hardware_and_portable_agree_at_every_length_and_alignment() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..9 {
            for len in (0..300).chain([700, 991]) {
                if start + len > data.len() {
                    continue;
                }
                let b = &data[start..start + len];
                assert_eq!(
                    crc32c(b),
                    !update_portable(!0, b),
                    "start {start} len {len}"
                );
            }
        }
    }
}
