//! Devices: how many there are, whether one is usable (and why not), and its primary context.
#![allow(unsafe_code)]

use crate::{Arch, Error, Library};
use cudarc::driver::{CudaContext, DriverError, result, sys};
use std::sync::Arc;

/// Initialises the driver (once per process; later calls return at once).
fn init() -> Result<(), InitFailure> {
    Library::Driver.require().map_err(InitFailure::Setup)?;
    result::init().map_err(InitFailure::Driver)
}

enum InitFailure {
    Setup(Error),
    Driver(DriverError),
}

/// Number of CUDA devices. [`Error::Missing`] without a driver, [`Error::Init`] when the driver cannot
/// initialise; a driver that reports no device at all (`CUDA_ERROR_NO_DEVICE`) is 0 devices.
pub fn device_count() -> Result<usize, Error> {
    match init() {
        Ok(()) => {}
        Err(InitFailure::Setup(e)) => return Err(e),
        Err(InitFailure::Driver(e)) if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => {
            return Ok(0);
        }
        Err(InitFailure::Driver(e)) => {
            return Err(Error::Init {
                message: crate::describe(&e),
            });
        }
    }
    let n = result::device::get_count().map_err(|e| Error::driver("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// [`Error::NoDevice`] unless device `ordinal` exists.
fn check_ordinal(ordinal: usize) -> Result<(), Error> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoDevice { ordinal, count });
    }
    Ok(())
}

/// The primary context of device `ordinal` (retained: the one PyTorch, JAX and CuPy use, so memory and
/// events are shared with them). Fails with the reason: no driver, driver initialisation, no such device,
/// or the driver's refusal to create the context.
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    check_ordinal(ordinal)?;
    CudaContext::new(ordinal).map_err(|e| Error::driver("cuCtxCreate", e))
}

/// A usable GPU, as [`probe`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub ordinal: usize,
    /// The driver's name for it (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    pub arch: Arch,
    /// Bytes of device memory.
    pub memory: u64,
}

/// `cuda:0 (NVIDIA H100 80GB HBM3, compute 9.0, 79.1 GiB)`.
impl std::fmt::Display for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda:{} ({}, compute {}, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.arch,
            self.memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// Whether GPU `ordinal` can run the toolkit's kernels: the driver loads and initialises, the device
/// exists, and NVRTC loads. `Err` is the first reason it cannot, in that order. Creates no context, so it
/// is cheap and leaves no memory behind; a context that still fails to open is [`open`]'s error.
pub fn probe(ordinal: usize) -> Result<Gpu, Error> {
    check_ordinal(ordinal)?;
    let attr = |dev, a, what| {
        // SAFETY: `dev` is a valid device handle (from cuDeviceGet below); a plain attribute query.
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| Error::driver(what, e))
    };
    let dev = result::device::get(ordinal as i32).map_err(|e| Error::driver("cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| Error::driver("cuDeviceGetName", e))?;
    use sys::CUdevice_attribute_enum as A;
    let major = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "cuDeviceGetAttribute",
    )?;
    let minor = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "cuDeviceGetAttribute",
    )?;
    // SAFETY: a valid device handle.
    let memory = unsafe { result::device::total_mem(dev) }
        .map_err(|e| Error::driver("cuDeviceTotalMem", e))?;
    Library::Nvrtc.require()?;
    Ok(Gpu {
        ordinal,
        name,
        arch: Arch::new(major.max(0) as u32, minor.max(0) as u32),
        memory: memory as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver every entry point is the same typed reason, never a panic.
    #[test]
    fn no_driver_is_a_typed_reason() {
        if Library::Driver.is_present() {
            eprintln!("skipping: libcuda is present here");
            return;
        }
        let missing = Error::Missing(Library::Driver);
        assert_eq!(device_count(), Err(missing.clone()));
        assert_eq!(open(0).err(), Some(missing.clone()));
        assert_eq!(probe(0), Err(missing));
    }

    /// A device that cannot exist is `NoDevice` wherever the driver loads.
    #[test]
    fn no_such_device_is_a_typed_reason() {
        match probe(9999) {
            Err(Error::Missing(Library::Driver)) | Err(Error::Init { .. }) => {}
            Err(Error::NoDevice { ordinal: 9999, .. }) => {}
            other => panic!("device 9999: {other:?}"),
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn probe_and_open_device_0() {
        let gpu = probe(0).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{gpu}");
        assert!(gpu.memory > 0 && gpu.arch >= Arch::new(3, 0));
        let ctx = open(0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Arch::of(&ctx).unwrap(), gpu.arch);
        assert!(device_count().unwrap() >= 1);
    }
}
