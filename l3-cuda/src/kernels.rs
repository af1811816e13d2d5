//! The decoder's kernels: `kernel.cu`, compiled by NVRTC once per process and architecture
//! ([`cuda_setup::Program`]), and the entry points a decoder loads from it.

use crate::error::Error;
use cudarc::driver::{CudaContext, CudaFunction};
use std::sync::Arc;
use vocab::DType;

/// The CUDA C source of the decoder, embedded in the crate.
pub(crate) const KERNEL_SRC: &str = include_str!("kernel.cu");

/// The kernels as NVRTC compiles them (its name appears in NVRTC's messages).
pub(crate) static PROGRAM: cuda_setup::Program =
    cuda_setup::Program::new("l3_kernel.cu", KERNEL_SRC);

/// Number of CUDA devices: [`Error::NoDriver`] without a driver.
pub fn device_count() -> Result<usize, Error> {
    Ok(cuda_setup::device_count()?)
}

/// The kernels of one element type: whole images, samples, version-2 patches (of either), and a
/// resampled batch's last pass.
pub(crate) struct KernelPair {
    pub(crate) images: CudaFunction,
    pub(crate) samples: CudaFunction,
    pub(crate) v2: CudaFunction,
    pub(crate) resample: CudaFunction,
}
pub(crate) struct Kernels {
    u8: KernelPair,
    f32: KernelPair,
    f16: KernelPair,
    /// A resampled batch's horizontal pass (u8 to u8, whatever the batch's type).
    pub(crate) resample_h: CudaFunction,
    /// The bucket words of a launch's ANS tables, built before its version-2 decode.
    pub(crate) v2_buckets: CudaFunction,
}

impl Kernels {
    pub(crate) fn for_dtype(&self, dtype: DType) -> &KernelPair {
        match dtype {
            DType::U8 => &self.u8,
            DType::F32 => &self.f32,
            DType::F16 => &self.f16,
        }
    }
}

impl Kernels {
    /// Compiles (once per architecture) and loads the kernels into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, Error> {
        let module = PROGRAM.load(ctx)?;
        let load = |name| {
            module
                .load_function(name)
                .map_err(|e| Error::driver("cuModuleGetFunction", e))
        };
        let pair = |images, samples, v2, resample| -> Result<KernelPair, Error> {
            Ok(KernelPair {
                images: load(images)?,
                samples: load(samples)?,
                v2: load(v2)?,
                resample: load(resample)?,
            })
        };
        Ok(Kernels {
            u8: pair(
                "l3_decode_u8",
                "l3_samples_u8",
                "l3v2_decode_u8",
                "l3_resample_u8",
            )?,
            f32: pair(
                "l3_decode_f32",
                "l3_samples_f32",
                "l3v2_decode_f32",
                "l3_resample_f32",
            )?,
            f16: pair(
                "l3_decode_f16",
                "l3_samples_f16",
                "l3v2_decode_f16",
                "l3_resample_f16",
            )?,
            resample_h: load("l3_resample_h")?,
            v2_buckets: load("l3v2_buckets")?,
        })
    }
}

/// The entry points of kernel.cu, as the NVRTC test checks them.
#[cfg(test)]
pub(crate) const KERNEL_NAMES: [&str; 14] = [
    "l3_decode_u8",
    "l3_decode_f32",
    "l3_decode_f16",
    "l3_samples_u8",
    "l3_samples_f32",
    "l3_samples_f16",
    "l3v2_decode_u8",
    "l3v2_decode_f32",
    "l3v2_decode_f16",
    "l3v2_buckets",
    "l3_resample_h",
    "l3_resample_u8",
    "l3_resample_f32",
    "l3_resample_f16",
];

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_setup::Arch;

    fn compile(major: u32, minor: u32) -> Result<cudarc::nvrtc::Ptx, Error> {
        Ok(PROGRAM.compile(Arch::new(major, minor))?)
    }

    /// The real NVRTC compiles kernel.cu for every architecture CUDA 13 supports, with all ten entry
    /// points (runs wherever libnvrtc loads, GPU or not; e.g. with the `nvidia-cuda-nvrtc` wheel's lib
    /// folder on LD_LIBRARY_PATH). `L3_PTX_DIR=dir` writes the PTX there, for `ptxas -v` (registers,
    /// spills, shared memory) where a CUDA toolkit is at hand.
    #[test]
    fn nvrtc_compiles_kernels_for_every_arch() {
        use cuda_setup::testing::{LibraryTest, nvrtc_for_test};
        match nvrtc_for_test("kernels::tests::nvrtc_compiles_kernels_for_every_arch") {
            LibraryTest::Here => {}
            LibraryTest::PassedInChild => return,
            LibraryTest::Missing(reason) => return stdx::testing::skip(reason),
        }
        let dir = std::env::var_os("L3_PTX_DIR").map(std::path::PathBuf::from);
        let every = PROGRAM.compile_every(&cuda_setup::EVERY_ARCH, &KERNEL_NAMES, dir.as_deref());
        for (arch, src) in every.unwrap_or_else(|e| panic!("{e}")) {
            eprintln!("{}: {} bytes of PTX", arch.virtual_arch(), src.len());
        }
    }

    #[test]
    fn no_nvrtc_is_a_typed_error() {
        match compile(9, 0) {
            Ok(_) => eprintln!("skipping: NVRTC present here"),
            Err(Error::NoNvrtc) => {}
            Err(e) => panic!("{e}"),
        }
    }
}
