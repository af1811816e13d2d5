//! Which architecture NVRTC compiles for: the device's own compute capability as a virtual architecture
//! (`compute_XY`). NVRTC emits PTX for it, which the driver JIT-compiles for the exact device once and
//! caches; PTX of an older virtual architecture would also run, but would give up the device's newer
//! instructions, so the device's own is the choice.

use crate::Error;
use cudarc::driver::CudaContext;

/// A compute capability, `major.minor` (9.0 for Hopper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

/// The architectures from Turing to Blackwell, which CUDA 13's NVRTC compiles for: where the toolkit's
/// kernels must compile (each crate's NVRTC test checks them all).
pub const EVERY_ARCH: [Arch; 7] = [
    Arch::new(7, 5),
    Arch::new(8, 0),
    Arch::new(8, 6),
    Arch::new(8, 9),
    Arch::new(9, 0),
    Arch::new(10, 0),
    Arch::new(12, 0),
];

impl Arch {
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch { major, minor }
    }

    /// The compute capability of the context's device.
    pub fn of(ctx: &CudaContext) -> Result<Arch, Error> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?;
        Ok(Arch::new(major.max(0) as u32, minor.max(0) as u32))
    }

    /// NVRTC's `--gpu-architecture` value: `compute_90`.
    pub fn virtual_arch(self) -> String {
        format!("compute_{}{}", self.major, self.minor)
    }
}

/// `8.6`.
impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(Arch::new(9, 0).virtual_arch(), "compute_90");
        assert_eq!(Arch::new(12, 0).virtual_arch(), "compute_120");
        assert_eq!(Arch::new(8, 6).to_string(), "8.6");
        assert!(Arch::new(8, 9) < Arch::new(9, 0));
    }
}
