//! GPU decoding of L3 items through `l3-cuda`, a batch at a time.
//!
//! One pipeline thread takes the place of the CPU decode pool: it gathers every item of a batch from the
//! I/O threads, decodes them in ONE kernel launch (`l3_cuda::BatchDecoder`), copies the decoded images
//! back and shapes the samples (crop, flip, layout) on the host. The loader's batches are host buffers;
//! keeping decoded tensors on the device is `l3-cuda`'s own API. A batch the GPU rejects is decoded again
//! on the CPU item by item, so a corrupt file is still reported (or skipped) with its path and index.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::{Format, Image};

/// Checks that GPU decoding can serve `dataset`, with a clear reason when it cannot.
pub(crate) fn check_available(dataset: &dyn Dataset) -> Result<()> {
    if let Some(i) = (0..dataset.len()).find(|&i| dataset.format(i) != Format::L3) {
        return Err(Error::Gpu(format!(
            "GPU decoding reads L3 only, and item {i} ({}) is {}",
            dataset.source(i).display(),
            dataset.format(i)
        )));
    }
    match l3_cuda::device_count() {
        Ok(0) => Err(Error::Gpu("the CUDA driver reports no device".into())),
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Gpu(e.to_string())),
    }
}

/// A CUDA batch decoder, opened lazily on the thread that uses it.
pub(crate) struct GpuDecoder {
    inner: Option<l3_cuda::BatchDecoder>,
}

impl GpuDecoder {
    pub fn new() -> Self {
        GpuDecoder { inner: None }
    }

    /// Decodes whole L3 files into interleaved images, one per file, in order.
    pub fn decode(&mut self, files: &[&[u8]]) -> std::result::Result<Vec<Image>, String> {
        if self.inner.is_none() {
            self.inner = Some(l3_cuda::BatchDecoder::new(0).map_err(|e| e.to_string())?);
        }
        let dec = self.inner.as_mut().expect("opened above");
        let opts = l3_cuda::DecodeOptions {
            layout: l3_cuda::Layout::Nhwc,
            ..Default::default()
        };
        let batch = dec.submit(files, &opts).map_err(|e| e.to_string())?;
        let host = batch.to_host_bytes().map_err(|e| e.to_string())?;
        batch
            .images()
            .iter()
            .map(|s| {
                let px = host
                    .get(s.offset..s.offset + s.len())
                    .ok_or("decoded image outside the output buffer")?;
                Ok(Image {
                    width: s.width,
                    height: s.height,
                    channels: s.channels,
                    pixels: px.to_vec(),
                })
            })
            .collect()
    }
}
