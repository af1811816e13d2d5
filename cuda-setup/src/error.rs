//! Why a GPU cannot be used, or a setup step failed: one value per reason, never a panic.

use crate::Library;
use cudarc::driver::DriverError;

/// Everything that can go wrong finding, opening or preparing a GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA library could not be loaded on this machine ([`Library::Driver`]: no NVIDIA driver).
    #[error("{}", .0.missing())]
    Missing(Library),
    /// libcuda loaded but `cuInit` failed (a driver older than the CUDA version built for, a broken
    /// installation, no access to the device files).
    #[error("the CUDA driver could not initialise: {message}")]
    Init { message: String },
    /// The driver works but has no device with this ordinal (`count` may be 0).
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    /// NVRTC rejected a program (a toolkit/device mismatch, never bad input); `log` is NVRTC's, on one line.
    #[error("NVRTC could not compile {program} for {arch}: {log}")]
    Compile {
        program: &'static str,
        arch: String,
        log: String,
    },
    /// Writing compiled PTX out for inspection failed.
    #[error("writing {}: {message}", .path.display())]
    WritePtx {
        path: std::path::PathBuf,
        message: String,
    },
}

impl Library {
    /// `Ok` when the library loads, else [`Error::Missing`] naming it.
    pub fn require(self) -> Result<(), Error> {
        if self.is_present() {
            Ok(())
        } else {
            Err(Error::Missing(self))
        }
    }
}

impl Error {
    /// [`Error::Driver`] for `call`, in the driver's own words ([`describe`]).
    pub fn driver(call: &'static str, e: DriverError) -> Error {
        Error::Driver {
            call,
            message: describe(&e),
        }
    }
}

/// A driver error as `CUDA_ERROR_NAME: description`, from the driver's own tables (not the binding's
/// Debug text); the bare code when the driver cannot name it.
pub fn describe(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(name), Ok(text)) => format!("{name}: {text}"),
        (Ok(name), Err(_)) => name,
        _ => format!("CUDA error code {}", e.0 as u32),
    }
}
