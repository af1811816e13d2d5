//! Whole L3 files read straight into pinned host memory ([`PinnedBatch`]), decoded from there with no
//! host copy.
#![allow(unsafe_code)]

use crate::error::Error;
use cudarc::driver::{CudaContext, CudaEvent, PinnedHostSlice};
use std::sync::Arc;

/// Whole L3 files back to back in pinned host memory: what a loader reads files into so that they reach
/// the GPU by DMA with no host copy
/// ([`BatchDecoder::submit_pinned`](crate::BatchDecoder::submit_pinned)). Section 4.4's pinned staging.
pub struct PinnedBatch {
    ctx: Arc<CudaContext>,
    buf: PinnedHostSlice<u8>,
    pub(crate) len: usize,
    pub(crate) starts: Vec<usize>,
    /// The last copy out of `buf`: writing waits for it.
    pub(crate) copied: Option<CudaEvent>,
}

impl PinnedBatch {
    pub(crate) fn new(ctx: Arc<CudaContext>, capacity: usize) -> Result<Self, Error> {
        cuda_setup::Library::Driver.require()?;
        // Cached (not write-combined) pinned memory: the host parses the headers it holds.
        // SAFETY: bytes are only read after `push` wrote them.
        let buf = unsafe { ctx.alloc_pinned_with_flags::<u8>(capacity.max(1), 0) }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
        Ok(PinnedBatch {
            ctx,
            buf,
            len: 0,
            starts: Vec::new(),
            copied: None,
        })
    }

    fn wait_copied(&mut self) -> Result<(), Error> {
        if let Some(ev) = self.copied.take() {
            ev.synchronize()
                .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        }
        Ok(())
    }

    pub(crate) fn host(&self) -> Result<&[u8], Error> {
        self.buf
            .as_slice()
            .map_err(|e| Error::driver("cuEventSynchronize", e))
    }

    /// Appends one file's `len` bytes, written by `fill` straight into pinned memory (e.g. `read_exact`).
    pub fn push_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<(), Error> {
        self.wait_copied()?;
        let start = self.len;
        let end = start + len;
        if end > self.buf.len() {
            let cap = end.max(self.buf.len() * 2);
            // SAFETY: the first `start` bytes are copied in right below; the rest only after `fill`.
            let mut bigger = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(cap, 0) }
                .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
            let old = self.host()?;
            bigger
                .as_mut_slice()
                .map_err(|e| Error::driver("cuEventSynchronize", e))?[..start]
                .copy_from_slice(&old[..start]);
            self.buf = bigger;
        }
        let dst = self
            .buf
            .as_mut_slice()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        fill(&mut dst[start..end]).map_err(Error::Io)?;
        self.len = end;
        self.starts.push(start);
        Ok(())
    }

    /// Appends a copy of one file.
    pub fn push(&mut self, file: &[u8]) -> Result<(), Error> {
        self.push_with(file.len(), |d| {
            d.copy_from_slice(file);
            Ok(())
        })
    }

    /// Empties the batch (keeping its memory) once the last copy out of it has finished.
    pub fn clear(&mut self) -> Result<(), Error> {
        self.wait_copied()?;
        self.len = 0;
        self.starts.clear();
        Ok(())
    }

    /// Files in the batch.
    pub fn image_count(&self) -> usize {
        self.starts.len()
    }

    /// Bytes of files in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The files as slices of the pinned buffer.
    pub fn files(&self) -> Result<Vec<&[u8]>, Error> {
        let host = self.host()?;
        let ends = self
            .starts
            .iter()
            .skip(1)
            .copied()
            .chain(std::iter::once(self.len));
        Ok(self
            .starts
            .iter()
            .zip(ends)
            .map(|(&s, e)| &host[s..e])
            .collect())
    }
}
