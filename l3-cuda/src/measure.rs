//! Measurements the benchmarks compare the decode against, on the decoder's own streams: device-to-device
//! and host-to-device bandwidth, and device time of queued work.
#![allow(unsafe_code)]

use crate::decoder::BatchDecoder;
use crate::error::Error;
use cudarc::driver::{CudaStream, sys};
use std::sync::Arc;

impl BatchDecoder {
    /// Device-to-device memcpy bandwidth in bytes/s (read + written bytes per second, as a roofline for the
    /// decode's own bytes read + written), measured with `bytes`-sized copies.
    pub fn measure_d2d_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64, Error> {
        let s = &self.decode_stream;
        let err = |e| Error::driver("cuMemcpyDtoDAsync", e);
        let src = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        let mut dst = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        s.memcpy_dtod(&src, &mut dst).map_err(err)?; // warm-up
        let secs = self.time_on(s, || {
            for _ in 0..iters {
                s.memcpy_dtod(&src, &mut dst).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(2.0 * bytes as f64 * iters as f64 / secs)
    }

    /// Host-to-device bandwidth from pinned memory in bytes/s.
    pub fn measure_h2d_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64, Error> {
        let s = &self.copy_stream;
        let err = |e| Error::driver("cuMemcpyHtoDAsync", e);
        // SAFETY: zero-filled below before use.
        let mut pinned = unsafe { self.ctx.alloc_pinned::<u8>(bytes) }.map_err(err)?;
        pinned.as_mut_slice().map_err(err)?.fill(0);
        let mut dst = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        s.memcpy_htod(&pinned, &mut dst).map_err(err)?;
        let secs = self.time_on(s, || {
            for _ in 0..iters {
                s.memcpy_htod(&pinned, &mut dst).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(bytes as f64 * iters as f64 / secs)
    }

    /// Seconds the work `f` queues on `s` takes on the device (timing events around it).
    pub fn time_on(
        &self,
        s: &Arc<CudaStream>,
        f: impl FnOnce() -> Result<(), Error>,
    ) -> Result<f64, Error> {
        let err = |e| Error::driver("cuEvent", e);
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(err)?;
        let end = self.ctx.new_event(flags).map_err(err)?;
        start.record(s).map_err(err)?;
        f()?;
        end.record(s).map_err(err)?;
        end.synchronize().map_err(err)?;
        Ok(start.elapsed_ms(&end).map_err(err)? as f64 / 1e3)
    }
}
