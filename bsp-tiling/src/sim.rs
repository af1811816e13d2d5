//! [`DeviceSim`]: the CPU engine behaving as a device — the CUDA backend's memory accounting and numerics
//! with the CPU backend's arithmetic.
//!
//! Every activation, weight and scratch buffer it holds takes a [`Lease`] on a [`Meter`] with the same
//! byte counts the CUDA backend leases ([`crate::device`]), so the placement planner's promise — device
//! memory never exceeds the budget — is checked on any machine by running the real BSP engine on it.
//! With [`Precision::F16`] it rounds the convolutions' operands to binary16 as the f16 GEMM does (f32
//! accumulation), which predicts the f16 error on the CPU. With f32 it computes bit for bit what
//! [`CpuBackend`] computes.

use crate::backend::{Backend, Conv2d, CpuBackend, Norm, Pad, host};
use crate::device::{self, DEVICE_BAND_BYTES, Precision};
use crate::error::Result;
use crate::meter::{Lease, Meter};
use crate::padding::PaddingMode;
use crate::stats::ChannelStats;
use crate::tensor::Tensor;
use std::sync::Arc;

/// A host tensor standing for a device buffer, with its lease.
#[derive(Debug)]
pub struct SimBuf {
    pub t: Tensor,
    _lease: Lease,
}

impl SimBuf {
    pub(crate) fn with_lease(t: Tensor, lease: Lease) -> SimBuf {
        SimBuf { t, _lease: lease }
    }
}

/// Weights as the device holds them.
#[derive(Debug)]
pub struct SimWeights {
    /// The weights rounded to binary16, for [`Precision::F16`].
    rounded: Option<Conv2d>,
    _lease: Lease,
}

/// A simulated device with a memory budget.
#[derive(Clone, Debug)]
pub struct DeviceSim {
    meter: Arc<Meter>,
    pub precision: Precision,
    /// Tiles at once (a GPU backend: 1).
    pub concurrency: usize,
    /// im2col band bytes (as [`device::DEVICE_BAND_BYTES`] for the CUDA backend).
    pub band_bytes: usize,
}

fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

impl DeviceSim {
    pub fn new(budget: u64, precision: Precision) -> DeviceSim {
        DeviceSim {
            meter: Meter::new(budget),
            precision,
            concurrency: 1,
            band_bytes: DEVICE_BAND_BYTES,
        }
    }

    /// Holds `bytes` of the budget until the lease is dropped: what a real device backend keeps for
    /// itself (the CUDA backend: cuBLAS's workspace).
    pub fn reserve(&self, bytes: u64) -> Result<Lease> {
        self.meter.lease(bytes, "a reservation")
    }

    pub(crate) fn meter_arc(&self) -> &Arc<Meter> {
        &self.meter
    }

    /// `t` as a device buffer, leased.
    pub(crate) fn hold(&self, t: Tensor, what: &str) -> Result<SimBuf> {
        self.buf(t, what)
    }

    fn buf(&self, t: Tensor, what: &str) -> Result<SimBuf> {
        let lease = self.meter.lease(Tensor::bytes(t.c, t.h, t.w), what)?;
        Ok(SimBuf { t, _lease: lease })
    }

    /// Leases first, then allocates: the budget is checked before the memory is taken.
    fn make(&self, c: usize, h: usize, w: usize, what: &str) -> Result<Lease> {
        self.meter.lease(Tensor::bytes(c, h, w), what)
    }
}

impl Backend for DeviceSim {
    type Buf = SimBuf;
    type Weights = SimWeights;

    fn name(&self) -> String {
        format!(
            "device simulation on the cpu ({:?}, budget {} bytes)",
            self.precision,
            self.meter.budget()
        )
    }

    fn concurrency(&self, _threads: usize) -> usize {
        self.concurrency.max(1)
    }

    fn meter(&self) -> Option<&Meter> {
        Some(&self.meter)
    }

    fn weight_bytes(&self, conv: &Conv2d) -> u64 {
        device::weight_bytes(conv, self.precision)
    }
    fn conv_scratch_bytes(&self, conv: &Conv2d, ho: usize, wo: usize) -> u64 {
        device::band(conv, ho, wo, self.band_bytes, self.precision).1
    }
    fn stats_scratch_bytes(&self, c: usize, plane: usize) -> u64 {
        device::stats_scratch_bytes(c, plane)
    }
    fn gather_scratch_bytes(&self, ny: usize, nx: usize) -> u64 {
        device::gather_scratch_bytes(ny, nx)
    }
    fn norm_scratch_bytes(&self, c: usize) -> u64 {
        device::norm_scratch_bytes(c)
    }

    fn weights(&self, conv: &Conv2d) -> Result<SimWeights> {
        let lease = self
            .meter
            .lease(self.weight_bytes(conv), "convolution weights")?;
        let rounded = (self.precision == Precision::F16).then(|| Conv2d {
            weight: round_f16(&conv.weight),
            ..conv.clone()
        });
        Ok(SimWeights {
            rounded,
            _lease: lease,
        })
    }

    fn dims(&self, x: &SimBuf) -> (usize, usize, usize) {
        (x.t.c, x.t.h, x.t.w)
    }

    fn upload(&self, t: Tensor) -> Result<SimBuf> {
        self.buf(t, "an uploaded tile")
    }

    fn download_into(&self, x: &SimBuf, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&x.t.data);
        Ok(())
    }

    fn zeros(&self, c: usize, h: usize, w: usize) -> Result<SimBuf> {
        let lease = self.make(c, h, w, "a resident layer")?;
        Ok(SimBuf {
            t: Tensor::zeros(c, h, w),
            _lease: lease,
        })
    }

    fn conv2d_valid(
        &self,
        x: &SimBuf,
        conv: &Conv2d,
        w: &SimWeights,
        threads: usize,
    ) -> Result<SimBuf> {
        let (ho, wo) = (
            (x.t.h - conv.k) / conv.stride + 1,
            (x.t.w - conv.k) / conv.stride + 1,
        );
        let out = self.make(conv.cout, ho, wo, "a convolution's output")?;
        let scratch = self
            .meter
            .lease(self.conv_scratch_bytes(conv, ho, wo), "im2col columns")?;
        let y = match &w.rounded {
            Some(c16) => {
                let x16 = Tensor {
                    data: round_f16(&x.t.data),
                    ..x.t.clone()
                };
                host::conv2d_valid(&x16, c16, threads)
            }
            None => host::conv2d_valid(&x.t, conv, threads),
        };
        drop(scratch);
        Ok(SimBuf { t: y, _lease: out })
    }

    fn upsample_nearest2x(&self, x: &SimBuf) -> Result<SimBuf> {
        let lease = self.make(x.t.c, 2 * x.t.h, 2 * x.t.w, "an upsampled activation")?;
        Ok(SimBuf {
            t: host::upsample_nearest2x(&x.t),
            _lease: lease,
        })
    }

    fn pad(&self, x: &SimBuf, pad: Pad, mode: PaddingMode) -> Result<SimBuf> {
        let (h, w) = (x.t.h + pad.top + pad.bottom, x.t.w + pad.left + pad.right);
        let lease = self.make(x.t.c, h, w, "a padded activation")?;
        Ok(SimBuf {
            t: host::pad(&x.t, pad, mode),
            _lease: lease,
        })
    }

    fn gather(&self, x: &SimBuf, ys: &[Option<usize>], xs: &[Option<usize>]) -> Result<SimBuf> {
        let maps = self
            .meter
            .lease(self.gather_scratch_bytes(ys.len(), xs.len()), "index maps")?;
        let lease = self.make(x.t.c, ys.len(), xs.len(), "a gathered window")?;
        drop(maps);
        Ok(SimBuf {
            t: host::gather(&x.t, ys, xs),
            _lease: lease,
        })
    }

    fn paste(&self, dst: &mut SimBuf, y0: usize, x0: usize, src: &SimBuf) -> Result<()> {
        dst.t.paste(y0, x0, &src.t);
        Ok(())
    }

    fn channel_stats(&self, x: &SimBuf) -> Result<Vec<ChannelStats>> {
        let _scratch = self.meter.lease(
            self.stats_scratch_bytes(x.t.c, x.t.h * x.t.w),
            "statistics partials",
        )?;
        CpuBackend.channel_stats(&x.t)
    }

    fn normalize(
        &self,
        x: &mut SimBuf,
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
    ) -> Result<()> {
        let _params = self
            .meter
            .lease(self.norm_scratch_bytes(x.t.c), "scale and shift")?;
        CpuBackend.normalize(&mut x.t, stats, norm, relu)
    }

    fn relu(&self, x: &mut SimBuf) -> Result<()> {
        CpuBackend.relu(&mut x.t)
    }

    fn add(&self, x: &mut SimBuf, y: &SimBuf) -> Result<()> {
        CpuBackend.add(&mut x.t, &y.t)
    }
}
