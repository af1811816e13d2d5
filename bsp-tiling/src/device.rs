//! Which device runs the network, and what a device backend allocates.
//!
//! [`Device`] (the toolkit's one, from `vocab`) and [`DeviceOptions`] are what a command line maps `--device cpu|cuda[:N]`,
//! `--gpu-memory BYTES` and `--precision f32|tf32|f16` to; [`crate::stylize_on`] opens the backend they name
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

/// The arithmetic of the convolutions on a device: what their operands are rounded to before the
/// products. Activations, normalisation and accumulation stay f32 in every one; `F32` is the default
/// because it is the one whose tiled output keeps the exact bound against the whole image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 operands and FMA arithmetic: no tensor cores, no TF32 (PyTorch with
    /// `torch.backends.cudnn.allow_tf32 = False`).
    #[default]
    F32,
    /// f32 storage, operands rounded to TF32 (8-bit exponent, 10-bit mantissa) on the tensor cores, f32
    /// accumulation: PyTorch's default for convolutions on Ampere and later (`allow_tf32 = True`).
    Tf32,
    /// Window and weights rounded to IEEE binary16 (tensor cores), f32 accumulation and output.
    F16,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" | "fp32" => Some(Precision::F32),
            "tf32" => Some(Precision::Tf32),
            "f16" | "fp16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::F16 => "f16",
        }
    }

    /// Bytes of one GEMM operand element as the device stores it (TF32 operands are f32 in memory).
    pub fn elem_bytes(self) -> usize {
        match self {
            Precision::F32 | Precision::Tf32 => 4,
            Precision::F16 => 2,
        }
    }

    /// `v` as a convolution's operand under this precision: unchanged in f32; TF32 and binary16 to
    /// nearest, ties to even. Binary16 is what `bsp_to_f16` computes bit for bit. For TF32 the
    /// conversion is the libraries' (cuBLAS and cuDNN do not document theirs; the hardware reads the
    /// top 19 bits), so a simulation with this rounding predicts the size of the TF32 error, not its bits.
    pub fn round(self, v: f32) -> f32 {
        match self {
            Precision::F32 => v,
            Precision::Tf32 => round_tf32(v),
            Precision::F16 => half::f16::from_f32(v).to_f32(),
        }
    }
}

/// `v` to the nearest TF32 value (ties to even), the exponent range kept: infinities and NaNs as they
/// are, a value past TF32's largest to infinity as f32 rounding would.
fn round_tf32(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    let b = v.to_bits();
    let lsb = (b >> 13) & 1;
    f32::from_bits(b.wrapping_add(0x0fff + lsb) & !0x1fff)
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = Invalid;
    fn from_str(s: &str) -> std::result::Result<Precision, Invalid> {
        Precision::parse(s).ok_or_else(|| Invalid::new("precision", s, "f32, tf32 or f16"))
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
                    "f32 on device cpu (the CPU backend computes in f32; tf32 and f16 need device cuda)",
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

    #[test]
    fn tf32_rounds_to_nearest_even() {
        let one = 1.0f32;
        let ulp = 2f32.powi(-10);
        let r = |v: f32| Precision::Tf32.round(v);
        assert_eq!(r(one + ulp), one + ulp);
        assert_eq!(r(one + ulp / 2.0), one, "a tie to the even neighbour below");
        assert_eq!(
            r(one + 3.0 * ulp / 2.0),
            one + 2.0 * ulp,
            "a tie to the even neighbour above"
        );
        assert_eq!(r(one + ulp / 2.0 + 2f32.powi(-23)), one + ulp);
        assert_eq!(r(-(one + 3.0 * ulp / 2.0)), -(one + 2.0 * ulp));
        assert_eq!(r(f32::MAX), f32::INFINITY);
        assert_eq!(r(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(r(f32::NAN).is_nan());
        let sub = f32::from_bits;
        assert_eq!(r(sub(0x0001_2fff)), sub(0x0001_2000), "a subnormal, down");
        assert_eq!(r(sub(0x0001_3001)), sub(0x0001_4000), "a subnormal, up");
        let mut x = 0x1234_5678u32;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = f32::from_bits(x & 0x7f7f_ffff) * if x & 1 == 0 { 1.0 } else { -1.0 };
            let t = r(v);
            assert_eq!(t.to_bits() & 0x1fff, 0, "{v:e} → {t:e}");
            let half_ulp = (f32::from_bits((v.abs().to_bits() | 0x1fff) + 1)
                - f32::from_bits(v.abs().to_bits() & !0x1fff))
                / 2.0;
            assert!(
                (t as f64 - v as f64).abs() <= half_ulp as f64 + f64::MIN_POSITIVE,
                "{v:e} → {t:e}"
            );
        }
        assert_eq!(Precision::F32.round(one + ulp / 2.0), one + ulp / 2.0);
        assert_eq!(Precision::F16.round(one + ulp / 2.0), one);
        assert_eq!(Precision::parse("tf32"), Some(Precision::Tf32));
    }
}
