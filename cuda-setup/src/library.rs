//! The CUDA libraries, opened at run time (cudarc's `dynamic-loading`): the crates build and their tests
//! run on machines without CUDA, and a missing library is [`crate::Error::Missing`] instead of cudarc's panic on
//! its first call.
#![allow(unsafe_code)]

/// A CUDA library the toolkit loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Library {
    /// libcuda, the NVIDIA driver's user-space library: every GPU needs it.
    Driver,
    /// libnvrtc, the CUDA runtime compiler (part of the toolkit, or the `nvidia-cuda-nvrtc` wheel).
    Nvrtc,
    /// libcublas (part of the toolkit, or the `nvidia-cublas` wheel).
    #[cfg(feature = "cublas")]
    Cublas,
    /// libcudnn 9 (the `nvidia-cudnn-cu13` wheel PyTorch brings, or NVIDIA's cuDNN packages).
    #[cfg(feature = "cudnn")]
    Cudnn,
}

impl Library {
    /// The library's file name without version suffix: `libcuda`, `libnvrtc`, `libcublas`.
    pub fn file(self) -> &'static str {
        match self {
            Library::Driver => "libcuda",
            Library::Nvrtc => "libnvrtc",
            #[cfg(feature = "cublas")]
            Library::Cublas => "libcublas",
            #[cfg(feature = "cudnn")]
            Library::Cudnn => "libcudnn",
        }
    }

    /// What to install so that it loads.
    pub fn hint(self) -> &'static str {
        match self {
            Library::Driver => "is an NVIDIA GPU and driver installed?",
            Library::Nvrtc => {
                "install the CUDA toolkit's NVRTC, or the nvidia-cuda-nvrtc wheel with its lib folder on LD_LIBRARY_PATH"
            }
            #[cfg(feature = "cublas")]
            Library::Cublas => {
                "install the CUDA toolkit's cuBLAS, or the nvidia-cublas wheel with its lib folder on LD_LIBRARY_PATH"
            }
            #[cfg(feature = "cudnn")]
            Library::Cudnn => {
                "install cuDNN 9, or the nvidia-cudnn-cu13 wheel (PyTorch's) with its lib folder on LD_LIBRARY_PATH"
            }
        }
    }

    /// The sentence [`crate::Error::Missing`] prints.
    pub(crate) fn missing(self) -> String {
        match self {
            Library::Driver => format!(
                "no CUDA driver: libcuda could not be loaded ({})",
                self.hint()
            ),
            lib => format!("{} could not be loaded ({})", lib.file(), lib.hint()),
        }
    }

    /// Whether the library loads on this machine (it stays loaded once it did).
    pub fn is_present(self) -> bool {
        // SAFETY: each call only tries to dlopen the library; no function of it is called.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                #[cfg(feature = "cublas")]
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                #[cfg(feature = "cudnn")]
                Library::Cudnn => cudarc::cudnn::sys::is_culib_present(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn a_missing_library_says_which_and_what_to_install() {
        for lib in [Library::Driver, Library::Nvrtc] {
            match lib.require() {
                Ok(()) => eprintln!("{} is present here", lib.file()),
                Err(e) => {
                    assert_eq!(e, Error::Missing(lib));
                    let msg = e.to_string();
                    assert!(
                        msg.contains(lib.file()) && msg.contains(lib.hint()),
                        "{msg}"
                    );
                    assert!(!msg.contains('\n'), "{msg}");
                }
            }
        }
        assert_eq!(
            Error::Missing(Library::Driver).to_string(),
            "no CUDA driver: libcuda could not be loaded (is an NVIDIA GPU and driver installed?)"
        );
    }
}
