//! The packed device input of a batch's launches: the patch bytes first, then the descriptor tables, the
//! version-2 ANS context tables, the scale/bias pairs and a resampled batch's passes, each at an aligned
//! offset ([`InputOffsets`]).
//! Host code only (the host stage of a batch, [`SamplePlan::stage_into`], [`BatchPlan::stage_into`]):
//! the decoder fills pinned staging with it, a benchmark ordinary memory, the CPU simulation a file.

use crate::error::Error;
use crate::plan::BatchPlan;
use crate::sample::{SamplePlan, SampleSource};

/// Zero bytes between the patch data and the descriptors. The v1 kernel reads a row's bits in 12-byte
/// aligned windows that may reach up to 11 bytes past a patch's last byte (20 with 16 columns a lane),
/// so that it needs neither a bounds check nor a byte-by-byte path near the end; the bits it reads there
/// only ever reach columns past the patch, which it never stores.
pub(crate) const WINDOW_SLACK: usize = 32;

/// Where the descriptor table, the padding table, the scale/bias table and the end lie in the packed
/// device input (patch data first, from offset 0).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputOffsets {
    pub(crate) data_len: usize,
    pub(crate) descs: usize,
    /// Version-2 descriptors.
    pub(crate) v2: usize,
    pub(crate) fills: usize,
    /// Version-2 ANS context tables (4-byte aligned).
    pub(crate) tables: usize,
    pub(crate) scale_bias: usize,
    /// A resampled batch's passes ([`ResampleStage::bytes`](crate::resample::ResampleStage::bytes); 8-aligned).
    pub(crate) resample: usize,
    pub(crate) total: usize,
}

impl InputOffsets {
    fn new(
        data_len: usize,
        desc_bytes: usize,
        v2_bytes: usize,
        fill_bytes: usize,
        table_bytes: usize,
        resample_bytes: usize,
    ) -> Self {
        // Every section is a whole number of 8-byte descriptors, so each starts 8-aligned.
        let descs = (data_len + WINDOW_SLACK).next_multiple_of(16);
        let v2 = descs + desc_bytes;
        let fills = v2 + v2_bytes;
        let tables = fills + fill_bytes;
        let scale_bias = (tables + table_bytes).next_multiple_of(4);
        let resample = (scale_bias + 8 * 4).next_multiple_of(8);
        InputOffsets {
            data_len,
            descs,
            v2,
            fills,
            tables,
            scale_bias,
            resample,
            total: resample + resample_bytes,
        }
    }

    pub(crate) fn of(plan: &BatchPlan) -> Self {
        Self::new(
            plan.data_len,
            plan.descs.len() * crate::plan::DESC_BYTES,
            plan.v2.descs.len() * crate::v2::V2_DESC_BYTES,
            0,
            plan.v2.tables.len(),
            0,
        )
    }

    pub(crate) fn of_samples(plan: &SamplePlan) -> Self {
        Self::new(
            plan.data_len,
            plan.descs.len() * crate::sample::SAMPLE_DESC_BYTES,
            plan.v2.descs.len() * crate::v2::V2_DESC_BYTES,
            plan.fills.len() * crate::sample::FILL_DESC_BYTES,
            plan.v2.tables.len(),
            plan.resample.as_ref().map_or(0, |r| r.byte_len()),
        )
    }
}

/// Everything after the patch data, serialised: the descriptor tables, the ANS context tables and the
/// scale/bias pairs.
pub(crate) struct Tables<'a> {
    descs: &'a [u8],
    v2: &'a [u8],
    fills: &'a [u8],
    ans: &'a [u8],
    scale_bias: &'a [f32; 8],
    resample: Vec<u8>,
}

impl<'a> Tables<'a> {
    pub(crate) fn of(plan: &'a BatchPlan) -> Self {
        Tables {
            descs: plan.descriptor_bytes(),
            v2: plan.v2.descriptor_bytes(),
            fills: &[],
            ans: &plan.v2.tables,
            scale_bias: &plan.scale_bias,
            resample: Vec::new(),
        }
    }

    pub(crate) fn of_samples(plan: &'a SamplePlan) -> Self {
        Tables {
            descs: plan.descriptor_bytes(),
            v2: plan.v2.descriptor_bytes(),
            fills: plan.fill_bytes(),
            ans: &plan.v2.tables,
            scale_bias: &plan.scale_bias,
            resample: plan.resample.as_ref().map_or(Vec::new(), |r| r.bytes()),
        }
    }
}

impl BatchPlan {
    /// Bytes of the launch's device input: the packed patch data and the tables after it (what
    /// [`stage_into`](Self::stage_into) writes).
    pub fn staged_len(&self) -> usize {
        InputOffsets::of(self).total
    }

    /// The host stage of the batch, with no GPU: writes its whole device input (every image's patch data
    /// and the tables the kernel reads) into `dst`, the first [`staged_len`](Self::staged_len) bytes, on
    /// `threads` threads (0: every core); the bytes do not depend on `threads`. What a submit copies into
    /// pinned staging; [`Error::PlanMismatch`] if `images` are not the ones the plan was built from,
    /// [`Error::StagingTooSmall`] if `dst` is short.
    pub fn stage_into(
        &self,
        images: &[&[u8]],
        dst: &mut [u8],
        threads: usize,
    ) -> Result<(), Error> {
        if !self.built_from(images) {
            return Err(Error::PlanMismatch);
        }
        let runs: Vec<(&[u8], usize)> = self
            .sources
            .iter()
            .zip(images)
            .map(|((src, at), bytes)| (&bytes[src.clone()], *at))
            .collect();
        write_input(
            &runs,
            &Tables::of(self),
            InputOffsets::of(self),
            dst,
            threads,
        )
    }
}

impl SamplePlan {
    /// Bytes of the launch's device input: the patch bytes under the windows and the tables after them
    /// (what [`stage_into`](Self::stage_into) writes).
    pub fn staged_len(&self) -> usize {
        InputOffsets::of_samples(self).total
    }

    /// The host stage of the batch, with no GPU: writes its whole device input (the patch bytes under
    /// every window and the tables the kernel reads) into `dst`, the first
    /// [`staged_len`](Self::staged_len) bytes, on `threads` threads (0: every core); the bytes do not
    /// depend on `threads`. What a submit copies into pinned staging; [`Error::PlanMismatch`] if `sources`
    /// are not the ones the plan was built from, [`Error::StagingTooSmall`] if `dst` is short.
    pub fn stage_into(
        &self,
        sources: &[SampleSource<'_>],
        dst: &mut [u8],
        threads: usize,
    ) -> Result<(), Error> {
        if !self.built_from(sources) {
            return Err(Error::PlanMismatch);
        }
        let runs = self
            .copies
            .iter()
            .map(|c| {
                let bytes = sources[c.sample].bytes(c.file.clone());
                Ok((bytes.ok_or(Error::PlanMismatch)?, c.at))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let off = InputOffsets::of_samples(self);
        write_input(&runs, &Tables::of_samples(self), off, dst, threads)
    }
}

/// The host stage of a launch: the whole device input, `[0, off.total)`, into `dst` — each run of
/// patch bytes (`(bytes, offset)`, ascending and disjoint, as the plans lay them out) at its offset,
/// then the tables — on `threads` threads (0: every core). The input is cut up front into disjoint
/// pieces of whole runs, each written by one task, so no two threads touch the same bytes and the result
/// does not depend on the thread count. [`Error::StagingTooSmall`] when `dst` is shorter than the input.
pub(crate) fn write_input(
    runs: &[(&[u8], usize)],
    tables: &Tables<'_>,
    off: InputOffsets,
    dst: &mut [u8],
    threads: usize,
) -> Result<(), Error> {
    let Some(dst) = dst.get_mut(..off.total) else {
        return Err(Error::StagingTooSmall {
            len: dst.len(),
            needed: off.total,
        });
    };
    let threads = stdx::parallel::threads(threads);
    let (data, rest) = dst.split_at_mut(off.data_len);
    let mut pieces = vec![Piece::Tables(rest)];
    // Pieces of about a quarter of a thread's share (not under 256 KiB): enough for an even spread,
    // few enough that each is a long copy.
    let target = (off.data_len / (4 * threads)).max(256 << 10);
    let (mut data, mut pos, mut first) = (data, 0usize, 0usize);
    while first < runs.len() {
        let (mut last, mut end) = (first, runs[first].1 + runs[first].0.len());
        while last + 1 < runs.len() && end - runs[first].1 < target {
            last += 1;
            end = runs[last].1 + runs[last].0.len();
        }
        let (gap, tail) = std::mem::take(&mut data).split_at_mut(runs[first].1 - pos);
        gap.fill(0);
        let (piece, tail) = tail.split_at_mut(end - runs[first].1);
        pieces.push(Piece::Data {
            runs: &runs[first..=last],
            at: runs[first].1,
            dst: piece,
        });
        (data, pos, first) = (tail, end, last + 1);
    }
    data.fill(0);
    let threads = threads.min(pieces.len());
    let written: Result<(), std::convert::Infallible> =
        stdx::parallel::for_each(pieces, threads, |piece| {
            match piece {
                Piece::Data { runs, at, dst } => {
                    for (bytes, o) in runs {
                        dst[o - at..o - at + bytes.len()].copy_from_slice(bytes);
                    }
                }
                Piece::Tables(dst) => {
                    dst[..off.descs - off.data_len].fill(0);
                    pack_tables(tables, off, &mut dst[off.descs - off.data_len..]);
                }
            }
            Ok(())
        });
    match written {
        Ok(()) => Ok(()),
        Err(never) => match never {},
    }
}

/// A disjoint piece of the device input and what goes into it.
enum Piece<'r, 'd> {
    /// Runs of patch bytes; `dst` starts at input offset `at`.
    Data {
        runs: &'r [(&'r [u8], usize)],
        at: usize,
        dst: &'d mut [u8],
    },
    /// Everything from the end of the patch bytes on.
    Tables(&'d mut [u8]),
}

/// The tables alone, `[off.descs, off.total)`, into `dst` (which starts at off.descs).
pub(crate) fn pack_tables(t: &Tables<'_>, off: InputOffsets, dst: &mut [u8]) {
    let at = |o: usize| o - off.descs;
    dst[..at(off.v2)].copy_from_slice(t.descs);
    dst[at(off.v2)..at(off.fills)].copy_from_slice(t.v2);
    dst[at(off.fills)..at(off.tables)].copy_from_slice(t.fills);
    dst[at(off.tables)..at(off.tables) + t.ans.len()].copy_from_slice(t.ans);
    dst[at(off.tables) + t.ans.len()..at(off.scale_bias)].fill(0);
    let s = at(off.scale_bias);
    for (i, v) in t.scale_bias.iter().enumerate() {
        dst[s + 4 * i..s + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    dst[s + 32..at(off.resample)].fill(0);
    dst[at(off.resample)..at(off.total)].copy_from_slice(&t.resample);
}
