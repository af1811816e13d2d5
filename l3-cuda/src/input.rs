//! The packed device input of one launch: the patch bytes first, then the descriptor tables, the
//! version-2 ANS context tables, the scale/bias pairs and a resampled batch's passes, each at an aligned
//! offset ([`InputOffsets`]).
//! Host code only: the decoder fills pinned staging with it, the CPU simulation a file.

use crate::error::Error;
use crate::plan::BatchPlan;
use crate::sample::{SamplePlan, SampleSource};

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
        let descs = data_len.next_multiple_of(16);
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
    descs: Vec<u8>,
    v2: Vec<u8>,
    fills: Vec<u8>,
    ans: &'a [u8],
    scale_bias: &'a [f32; 8],
    resample: Vec<u8>,
}

impl<'a> Tables<'a> {
    pub(crate) fn of(plan: &'a BatchPlan) -> Self {
        Tables {
            descs: plan.descriptor_bytes(),
            v2: plan.v2.descriptor_bytes(),
            fills: Vec::new(),
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

/// The whole device input, `[0, off.total)`: packed patch data, then the tables.
pub(crate) fn pack_input(plan: &BatchPlan, images: &[&[u8]], off: InputOffsets, dst: &mut [u8]) {
    plan.pack_into(images, &mut dst[..plan.data_len]);
    dst[plan.data_len..off.descs].fill(0);
    pack_tables(&Tables::of(plan), off, &mut dst[off.descs..]);
}

/// The whole device input of a sample batch.
pub(crate) fn pack_sample_input(
    plan: &SamplePlan,
    sources: &[SampleSource<'_>],
    off: InputOffsets,
    dst: &mut [u8],
) -> Result<(), Error> {
    plan.pack_into(sources, &mut dst[..plan.data_len])?;
    dst[plan.data_len..off.descs].fill(0);
    pack_tables(&Tables::of_samples(plan), off, &mut dst[off.descs..]);
    Ok(())
}

/// The tables alone, `[off.descs, off.total)`, into `dst` (which starts at off.descs).
pub(crate) fn pack_tables(t: &Tables<'_>, off: InputOffsets, dst: &mut [u8]) {
    let at = |o: usize| o - off.descs;
    dst[..at(off.v2)].copy_from_slice(&t.descs);
    dst[at(off.v2)..at(off.fills)].copy_from_slice(&t.v2);
    dst[at(off.fills)..at(off.tables)].copy_from_slice(&t.fills);
    dst[at(off.tables)..at(off.tables) + t.ans.len()].copy_from_slice(t.ans);
    dst[at(off.tables) + t.ans.len()..at(off.scale_bias)].fill(0);
    let s = at(off.scale_bias);
    for (i, v) in t.scale_bias.iter().enumerate() {
        dst[s + 4 * i..s + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    dst[s + 32..at(off.resample)].fill(0);
    dst[at(off.resample)..at(off.total)].copy_from_slice(&t.resample);
}
