//! Version-2 patches on the device (l3-format/SPEC.md, part 2), shared by whole-image and sample batches:
//! the descriptor of one patch (one warp decodes every plane of it, `l3v2_decode_*` in kernel.cu), each
//! ANS image's context table as the kernel reads it, and the device memory the launch needs beside its
//! input: the scratch where the warp leaves the chunk's residual codes between its entropy decoding and
//! its reconstruction, and the bucket words the launch builds from each table before decoding.

use crate::error::Error;
use l3_format::{AnsTables, Profile};

/// One v2 patch: the kernel's unit of work, laid out exactly as `struct V2Desc` in kernel.cu (its bytes
/// are the table [`V2Batch::descriptor_bytes`] hands the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct V2Desc {
    /// BP: plane p's entry in the device input; ANS: `off[0]` is the patch's chunk.
    pub off: [u64; 4],
    /// Output element of patch pixel (col0, skip) in output channel 0.
    pub out_offset: u64,
    /// ANS: this chunk's symbol store in the scratch memory.
    pub scratch_offset: u64,
    pub len: [u32; 4],
    /// ANS: the image's context table in the tables section (bytes).
    pub table_offset: u32,
    pub row_stride: i32,
    /// Negative when the sample is mirrored.
    pub col_stride: i32,
    pub chan_stride: u32,
    pub pw: u16,
    pub ph: u16,
    pub rows: u16,
    pub skip: u16,
    pub col0: u16,
    pub col1: u16,
    pub planes: u8,
    /// Planes BP decodes (the file's, or 3 when alpha is not written); ANS decodes every plane.
    pub decoded: u8,
    /// [`Profile::byte`]: 0 BP, 1 ANS.
    pub profile: u8,
    pub out_channels: u8,
    /// BP: 1 when the rows reach the patch's last row, so each entry must be used exactly.
    pub exact: u8,
    pub pad: [u8; 3],
    /// ANS: the image's bucket words in the launch's bucket memory (u32 index; [`BUCKETS`] a context).
    pub buckets: u32,
}

pub(crate) const V2_DESC_BYTES: usize = std::mem::size_of::<V2Desc>();
const _: () = assert!(V2_DESC_BYTES == 104);

impl V2Desc {
    /// Entries of the offset table this descriptor reads: the chunk (ANS) or the decoded planes (BP).
    pub fn entries(&self) -> usize {
        if self.is_ans() {
            1
        } else {
            self.decoded as usize
        }
    }

    pub fn is_ans(&self) -> bool {
        self.profile == Profile::Ans.byte()
    }

    /// Output elements this descriptor writes, as (lowest, highest) element index.
    pub fn out_span(&self) -> (i128, i128) {
        let rows = i128::from(self.rows) - i128::from(self.skip) - 1;
        let cols = i128::from(self.col1) - i128::from(self.col0) - 1;
        let span_rows = rows * i128::from(self.row_stride);
        let span_cols = cols * i128::from(self.col_stride);
        let span_ch = (i128::from(self.out_channels) - 1) * i128::from(self.chan_stride);
        let base = i128::from(self.out_offset);
        (
            base + span_cols.min(0),
            base + span_rows + span_cols.max(0) + span_ch,
        )
    }

    /// Bytes of scratch an ANS chunk of this shape needs: every plane's codes and selectors.
    pub fn scratch_len(planes: u8, pw: u16, ph: u16) -> u64 {
        u64::from(planes) * u64::from(ph) * (u64::from(pw) + 8)
    }
}

/// Bucket words a context: the launch builds them on the device from each table (`l3v2_buckets` in
/// kernel.cu), so they cost neither host time nor bus bytes. Word b covers the 16 slots from 16 b:
/// when one symbol s holds all of them (f ≥ 16) it is `s | cum_s << 8 | (f − 1) << 20`, everything a
/// rANS step needs from one load; otherwise `lo | hi << 8` (f − 1 = 0 marks it), the symbols of its
/// first and last slot, between which the kernel searches the cumulative frequencies. A warp's step
/// waits for its slowest lane: modelled over the corpus' contexts (32 lanes on one context, slots
/// uniform), a step waits on 6.9 loads beyond the essential ones with a plain binary search, 4.2 with
/// 64-slot buckets, 2.3 with 16-slot ones (1 KiB a context) and 1.4 with 8-slot ones (2 KiB).
pub(crate) const BUCKETS: u64 = 256;

/// The v2 part of a batch: descriptors, the patches they name, the ANS context tables and the scratch.
#[derive(Debug, Clone, Default)]
pub(crate) struct V2Batch {
    pub descs: Vec<V2Desc>,
    /// Per descriptor: (batch index, patch), to name a patch the kernel rejects.
    pub ids: Vec<(u32, u32)>,
    /// Every ANS image's context table, back to back (4-byte aligned each).
    pub tables: Vec<u8>,
    pub scratch_len: u64,
    /// u32 words of bucket memory the launch builds from the tables ([`BUCKETS`] per context).
    pub bucket_words: u64,
}

impl V2Batch {
    /// Appends an image's context table as the kernel reads it: one `u32` per context, `(index of its
    /// cumulative frequencies in u16 units from the table's start) << 9 | n` (n = 0: unused), then the
    /// cumulative frequencies (n + 1 `u16` each, the last 4096); and reserves its bucket words. Returns
    /// the table's byte offset and the bucket words' index.
    pub fn add_tables(&mut self, t: &AnsTables) -> Result<(u32, u32), Error> {
        let too_large = Error::TooLarge {
            what: "the batch's ANS context tables exceed 4 GiB",
        };
        while !self.tables.len().is_multiple_of(4) {
            self.tables.push(0);
        }
        let at = self.tables.len();
        let k = t.contexts();
        let mut cums: Vec<u16> = Vec::new();
        let mut entries = Vec::with_capacity(k);
        for ctx in 0..k {
            match t.cum(ctx) {
                Some(c) => {
                    // The cum arrays start after the k entries (2 u16 per entry).
                    let index = 2 * k + cums.len();
                    let n = c.len() - 1;
                    entries.push(((index as u32) << 9) | n as u32);
                    cums.extend_from_slice(&c);
                }
                None => entries.push(0),
            }
        }
        for e in entries {
            self.tables.extend_from_slice(&e.to_le_bytes());
        }
        for c in cums {
            self.tables.extend_from_slice(&c.to_le_bytes());
        }
        let buckets = u32::try_from(self.bucket_words).map_err(|_| Error::TooLarge {
            what: "the batch's ANS bucket words exceed 2^32",
        })?;
        self.bucket_words += k as u64 * BUCKETS;
        Ok((u32::try_from(at).map_err(|_| too_large)?, buckets))
    }

    /// Reserves an ANS chunk's scratch; returns its offset.
    pub fn reserve_scratch(&mut self, planes: u8, pw: u16, ph: u16) -> u64 {
        let at = self.scratch_len;
        self.scratch_len += V2Desc::scratch_len(planes, pw, ph);
        at
    }

    /// Whether every descriptor reads inside `data_len` bytes of input, its table and its scratch, and has a
    /// shape the kernel decodes; `out_ok` checks its output span.
    pub fn in_bounds(&self, data_len: usize, out_ok: impl Fn(usize, (i128, i128)) -> bool) -> bool {
        self.descs.len() == self.ids.len()
            && self.descs.iter().enumerate().all(|(i, d)| {
                let shape_ok = (1..=224).contains(&d.pw)
                    && (1..=224).contains(&d.ph)
                    && (1..=d.ph).contains(&d.rows)
                    && d.skip < d.rows
                    && d.col0 < d.col1
                    && d.col1 <= d.pw
                    && matches!(d.planes, 1 | 3 | 4)
                    && (1..=d.planes).contains(&d.decoded)
                    && matches!(d.out_channels, 1 | 3 | 4)
                    && d.out_channels <= d.decoded.max(3)
                    && d.row_stride > 0;
                let reads_ok =
                    (0..d.entries()).all(|p| d.off[p] + u64::from(d.len[p]) <= data_len as u64);
                let ans_ok = !d.is_ans()
                    || (d.scratch_offset + V2Desc::scratch_len(d.planes, d.pw, d.ph)
                        <= self.scratch_len
                        && self.table_in_bounds(d.table_offset as usize, d.planes)
                        && u64::from(d.buckets)
                            + l3_format::v2::contexts(d.planes) as u64 * BUCKETS
                            <= self.bucket_words);
                shape_ok && reads_ok && ans_ok && out_ok(i, d.out_span())
            })
    }

    /// Whether the table at `at` lies inside the tables with every cum array it names.
    fn table_in_bounds(&self, at: usize, planes: u8) -> bool {
        let k = l3_format::v2::contexts(planes);
        let t = &self.tables;
        if !at.is_multiple_of(4) || at + 4 * k > t.len() {
            return false;
        }
        (0..k).all(|ctx| {
            let b = &t[at + 4 * ctx..at + 4 * ctx + 4];
            let e = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
            let (index, n) = (e >> 9, e & 511);
            n == 0 || (2 * index >= 4 * k && at + 2 * (index + n + 1) <= t.len())
        })
    }

    /// The descriptor table as the kernel reads it (`struct V2Desc`).
    pub fn descriptor_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.descs)
    }

    /// The error for v2 descriptor `i` the kernel rejected.
    pub fn kernel_error(&self, i: usize) -> Option<Error> {
        self.ids.get(i).map(|&(index, patch)| Error::CorruptPatch {
            index: index as usize,
            patch: patch as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_bytes_have_the_kernels_layout() {
        let d = V2Desc {
            off: [1, 2, 3, 4],
            out_offset: 5,
            scratch_offset: 6,
            len: [7, 8, 9, 10],
            table_offset: 11,
            row_stride: 12,
            col_stride: -13,
            chan_stride: 14,
            pw: 15,
            ph: 16,
            rows: 17,
            skip: 18,
            col0: 19,
            col1: 20,
            planes: 3,
            decoded: 3,
            profile: Profile::Ans.byte(),
            out_channels: 3,
            exact: 1,
            pad: [0; 3],
            buckets: 21,
        };
        let b = V2Batch {
            descs: vec![d],
            ids: vec![(0, 0)],
            ..V2Batch::default()
        }
        .descriptor_bytes()
        .to_vec();
        assert_eq!(b.len(), V2_DESC_BYTES);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().unwrap());
        // Offsets of kernel.cu's struct V2Desc (the harness static_asserts its size).
        assert_eq!(
            (u64_at(0), u64_at(24), u64_at(32), u64_at(40)),
            (1, 4, 5, 6)
        );
        assert_eq!((u32_at(48), u32_at(60), u32_at(64)), (7, 10, 11));
        assert_eq!((u32_at(68), u32_at(72) as i32, u32_at(76)), (12, -13, 14));
        assert_eq!((u16_at(80), u16_at(82), u16_at(90)), (15, 16, 20));
        assert_eq!(&b[92..97], &[3, 3, 1, 3, 1]);
        assert_eq!(u32_at(100), 21);
    }

    #[test]
    fn context_tables_name_their_cumulative_frequencies() {
        // A tiny ANS file has real tables to lay out.
        let px: Vec<u8> = (0..40 * 33 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let opts = l3_format::EncodeOptions {
            format: l3_format::Format::V2(Profile::Ans),
            patch_size: Some(32),
            ..l3_format::EncodeOptions::default()
        };
        let file = l3_format::encode_with(&px, 40, 33, 3, &opts).unwrap();
        let t = l3_format::L3File::parse(&file)
            .unwrap()
            .ans_tables()
            .unwrap();
        let mut b = V2Batch::default();
        b.tables.push(9); // misaligned on purpose: the table is padded to 4 bytes
        let (at, buckets) = b.add_tables(&t).unwrap();
        let at = at as usize;
        assert_eq!((at, buckets), (4, 0));
        assert_eq!(b.bucket_words, t.contexts() as u64 * BUCKETS);
        assert!(b.table_in_bounds(at, 3));
        for ctx in 0..t.contexts() {
            let e =
                u32::from_le_bytes(b.tables[at + 4 * ctx..at + 4 * ctx + 4].try_into().unwrap());
            match t.cum(ctx) {
                None => assert_eq!(e, 0),
                Some(c) => {
                    let (index, n) = ((e >> 9) as usize, (e & 511) as usize);
                    assert_eq!(n + 1, c.len());
                    let got: Vec<u16> = (0..=n)
                        .map(|k| {
                            let i = at + 2 * (index + k);
                            u16::from_le_bytes([b.tables[i], b.tables[i + 1]])
                        })
                        .collect();
                    assert_eq!(got, c);
                }
            }
        }
        // A table cut short is out of bounds.
        b.tables.truncate(b.tables.len() - 2);
        assert!(!b.table_in_bounds(at, 3));
    }
}
