//! [`DeviceSim`]: the CPU engine behaving as a device — the CUDA backend's memory accounting and numerics
//! with the CPU backend's arithmetic.
//!
//! Every value, weight and scratch buffer it holds takes a [`Lease`] on a [`Meter`] with the same byte
//! counts the CUDA backend leases ([`crate::device`]), so the promise that device memory never exceeds
//! the budget is checked on any machine by running the real graph engine on it (its [`crate::GraphOps`]
//! implementation is `graph::exec`'s). With [`Precision::F16`] (or `Tf32`) it rounds the convolutions'
//! operands to binary16 (TF32) as the device's GEMM does (f32 accumulation), which predicts the error of
//! that precision on the CPU. With f32 it
//! computes bit for bit what [`crate::CpuBackend`] computes.

use crate::device::{DEVICE_BAND_BYTES, Precision};
use crate::error::Result;
use crate::meter::{Lease, Meter};
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

    /// The buffer with its tensor replaced by `f`'s result, in place (the same lease).
    pub(crate) fn map(self, f: impl FnOnce(Tensor) -> Result<Tensor>) -> Result<SimBuf> {
        Ok(SimBuf {
            t: f(self.t)?,
            _lease: self._lease,
        })
    }
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
    /// Whether stored values stay on the device while its budget allows ([`crate::GraphOps::keeps_values`];
    /// the CUDA backend's way): on by default, off to compare with every value crossing the bus.
    pub keeps: bool,
    /// Whether small-halo units are computed inside their reader's superstep ([`crate::GraphOps::inlines_units`]).
    pub inlines: bool,
}

impl DeviceSim {
    pub fn new(budget: u64, precision: Precision) -> DeviceSim {
        DeviceSim {
            meter: Meter::new(budget),
            precision,
            concurrency: 1,
            band_bytes: DEVICE_BAND_BYTES,
            keeps: true,
            inlines: true,
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

    /// The device memory meter its leases are taken on.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// `t` as a device buffer, leased.
    pub(crate) fn hold(&self, t: Tensor, what: &str) -> Result<SimBuf> {
        let lease = self.meter.lease(Tensor::bytes(t.c, t.h, t.w), what)?;
        Ok(SimBuf { t, _lease: lease })
    }
}
