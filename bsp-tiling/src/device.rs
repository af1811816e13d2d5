//! Which device runs the network, and what a device backend allocates.
//!
//! [`Device`] (the toolkit's one, from `vocab`) and [`DeviceOptions`] are what a command line maps `--device cpu|cuda[:N]`,
//! `--gpu-memory BYTES` and `--precision f32|f16` to; [`crate::stylize_on`] opens the backend they name
//! and fails with the reason (no driver, no device, no NVRTC/cuBLAS) rather than fall back to the CPU.
//!
//! The byte counts here are shared by the CUDA backend and its host stand-in [`crate::sim::DeviceSim`]
//! (with `graph::exec`'s), so that the simulation that tests the device budget on the CPU and the real
//! device count the same allocations.

use crate::error::{Error, Result};
use vocab::Invalid;

pub use vocab::Device;

/// A tile side that suits the device: 512 on the CPU (tiles of a few MiB per worker), 2048 on a GPU (few,
/// large launches; the meter keeps the device within its budget either way).
pub fn default_tile(device: Device) -> usize {
    match device {
        Device::Cpu => 512,
        Device::Cuda(_) => 2048,
    }
}

/// The element type of the convolutions' GEMM operands on a device. Activations, normalisation and
/// accumulation stay f32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    /// im2col columns and weights rounded to IEEE binary16 (tensor cores), f32 accumulation and output.
    F16,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" | "fp32" => Some(Precision::F32),
            "f16" | "fp16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
        }
    }

    /// Bytes of one GEMM operand element.
    pub fn elem_bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::F16 => 2,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = Invalid;
    fn from_str(s: &str) -> std::result::Result<Precision, Invalid> {
        Precision::parse(s).ok_or_else(|| Invalid::new("precision", s, "f32 or f16"))
    }
}

/// Device selection and its settings.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DeviceOptions {
    pub device: Device,
    /// Bytes of device memory the run may use (activations, weights, scratch); `None` = what the device
    /// has free when the backend opens, less [`HEADROOM`].
    pub gpu_memory: Option<u64>,
    pub precision: Precision,
}

impl DeviceOptions {
    /// Checks the combination before anything is opened, in the words of the options that name it
    /// (`precision`, `gpu_memory`: the command line's flags are the same with `-` for `_`).
    pub fn check(&self) -> std::result::Result<(), Invalid> {
        if self.device == Device::Cpu {
            if self.precision != Precision::F32 {
                return Err(Invalid::new(
                    "precision",
                    self.precision,
                    "f32 on device cpu (the CPU backend computes in f32; f16 needs device cuda)",
                ));
            }
            if let Some(b) = self.gpu_memory {
                return Err(Invalid::new(
                    "gpu_memory",
                    b,
                    "none on device cpu (it budgets a GPU; the CPU's is ram_budget_mib)",
                ));
            }
        }
        Ok(())
    }

    /// [`DeviceOptions::check`] as this crate's error.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|e| Error::Device(e.to_string()))
    }
}

/// Device memory left to the driver, cuBLAS's own allocations and other processes when no budget is
/// given: the budget is then the free memory less this.
pub const HEADROOM: u64 = 512 << 20;

/// Bytes of im2col columns a device backend builds per GEMM (a band of output rows), unless told otherwise.
pub const DEVICE_BAND_BYTES: usize = 256 << 20;

/// Bytes of a normalisation's per-channel scale and shift.
pub fn norm_scratch_bytes(c: usize) -> u64 {
    (2 * c * 4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_validate() {
        assert_eq!(default_tile(Device::Cpu), 512);
        assert!(default_tile(Device::Cuda(0)) > 512);
        assert_eq!(Precision::parse("f16"), Some(Precision::F16));
        assert_eq!(Precision::parse("f64"), None);
        let cpu_f16 = DeviceOptions {
            precision: Precision::F16,
            ..DeviceOptions::default()
        };
        assert!(cpu_f16.validate().unwrap_err().to_string().contains("f16"));
        let cpu_budget = DeviceOptions {
            gpu_memory: Some(1 << 30),
            ..DeviceOptions::default()
        };
        assert!(
            cpu_budget
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("gpu_memory \"1073741824\": expected none on device cpu")
        );
        assert!(DeviceOptions::default().validate().is_ok());
    }
}
