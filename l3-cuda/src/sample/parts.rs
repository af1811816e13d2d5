//! A sample batch planned on several threads: each source is planned on its own, as a part whose offsets
//! (patch bytes, ANS tables, scratch) start at 0, and the parts are joined in batch order at the prefix
//! sums of those sizes. The joined plan is the one a single thread builds, byte for byte.

use super::desc::SamplePlan;
use crate::error::Error;
use crate::v2::V2Batch;
use l3_format::Profile;
use vocab::Layout;

/// What every sample of a window batch shares: its size, channels and output strides.
pub(super) struct SampleGeometry {
    pub(super) layout: Layout,
    pub(super) width: u32,
    /// Elements of one channel plane of a sample.
    pub(super) plane: u64,
    pub(super) channels: u32,
    /// Elements of one sample.
    pub(super) sample_len: u64,
    /// (row stride, column step, stride between channel copies) of the output, in elements.
    pub(super) strides: (i32, i32, u32),
    /// Sample rows one padding block writes.
    pub(super) rows_per_fill: u32,
}

impl SampleGeometry {
    /// Element of sample pixel (x, y), output channel c, within the sample.
    pub(super) fn elem(&self, x: u32, y: u32, c: u32) -> u64 {
        let (x, y, c) = (u64::from(x), u64::from(y), u64::from(c));
        match self.layout {
            Layout::Nhwc => (y * u64::from(self.width) + x) * u64::from(self.channels) + c,
            Layout::Nchw => c * self.plane + y * u64::from(self.width) + x,
        }
    }
}

impl SamplePlan {
    /// An empty plan with this one's tensor and normalisation, for one source planned on its own.
    pub(super) fn part(&self) -> SamplePlan {
        SamplePlan {
            tensor: self.tensor,
            descs: Vec::new(),
            ids: Vec::new(),
            fills: Vec::new(),
            copies: Vec::new(),
            file_lens: Vec::new(),
            rects: Vec::new(),
            data_len: 0,
            block_dim: self.block_dim,
            stage_cap: 0,
            scale_bias: self.scale_bias,
            v2: V2Batch::default(),
            resample: None,
        }
    }

    /// Appends `part` (the next source, planned by [`part`](Self::part)'s plan), moving its offsets past
    /// what the batch holds so far: patch bytes, ANS tables (4-aligned, as `V2Batch::add_tables` places
    /// them), scratch and bucket words. [`Error::TooLarge`] when an ANS table lands past 4 GiB, as a single thread
    /// finds.
    pub(super) fn append_part(&mut self, mut part: SamplePlan) -> Result<(), Error> {
        let data_at = self.data_len;
        for d in &mut part.descs {
            d.data_offset += data_at as u64;
        }
        for c in &mut part.copies {
            c.at += data_at;
        }
        if !part.v2.tables.is_empty() {
            self.v2
                .tables
                .resize(self.v2.tables.len().next_multiple_of(4), 0);
        }
        let tables_at = self.v2.tables.len();
        let scratch_at = self.v2.scratch_len;
        let buckets_at = self.v2.bucket_words;
        for d in &mut part.v2.descs {
            let entries = d.entries();
            for off in &mut d.off[..entries] {
                *off += data_at as u64;
            }
            if d.profile == Profile::Ans.byte() {
                d.table_offset =
                    u32::try_from(tables_at + d.table_offset as usize).map_err(|_| {
                        Error::TooLarge {
                            what: "the batch's ANS context tables exceed 4 GiB",
                        }
                    })?;
                d.scratch_offset += scratch_at;
                d.buckets = u32::try_from(buckets_at + u64::from(d.buckets)).map_err(|_| {
                    Error::TooLarge {
                        what: "the batch's ANS bucket words exceed 2^32",
                    }
                })?;
            }
        }
        self.descs.append(&mut part.descs);
        self.ids.append(&mut part.ids);
        self.fills.append(&mut part.fills);
        self.copies.append(&mut part.copies);
        self.data_len += part.data_len;
        self.v2.descs.append(&mut part.v2.descs);
        self.v2.ids.append(&mut part.v2.ids);
        self.v2.tables.append(&mut part.v2.tables);
        self.v2.scratch_len += part.v2.scratch_len;
        self.v2.bucket_words += part.v2.bucket_words;
        Ok(())
    }
}

/// `work` on every item on `threads` threads (stdx's pool), results in order; of several failures, the
/// one of the lowest index (what a single thread, going in order, would have met first).
pub(super) fn in_order<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(usize, &T) -> Result<R, Error> + Sync,
) -> Result<Vec<R>, Error> {
    let all: Result<Vec<Result<R, Error>>, std::convert::Infallible> =
        stdx::parallel::map(items, threads, |i, item| Ok(work(i, item)));
    match all {
        Ok(results) => results.into_iter().collect(),
        Err(never) => match never {},
    }
}
