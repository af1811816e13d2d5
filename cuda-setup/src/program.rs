//! CUDA C programs compiled at run time by NVRTC: at most once per process and architecture (a compile
//! takes hundreds of milliseconds, and every decoder or backend a process opens on the same kind of GPU
//! needs the same PTX), then loaded into a context.
#![allow(unsafe_code)]

use crate::{Arch, Error, Library};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A CUDA C source embedded in a crate, its name in NVRTC's messages, its options, and the PTX compiled
/// for it so far. Meant to be a `static`, so that the cache lives as long as the process:
///
/// ```
/// static KERNELS: cuda_setup::Program = cuda_setup::Program::new("my_kernels.cu", "extern \"C\" __global__ void k() {}");
/// ```
pub struct Program {
    name: &'static str,
    source: &'static str,
    fmad: bool,
    cache: Mutex<Vec<(Arch, Ptx)>>,
}

/// Options appended to every compile from `L3_NVRTC_OPTIONS` (split at whitespace), such as `-DNAME`
/// to build a variant of a kernel on the device machine without rebuilding the binary that embeds it:
/// how a hypothesis about the hardware is tested where there is no cargo.
fn extra_options() -> Vec<String> {
    std::env::var("L3_NVRTC_OPTIONS")
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

impl Program {
    pub const fn new(name: &'static str, source: &'static str) -> Program {
        Program {
            name,
            source,
            fmad: true,
            cache: Mutex::new(Vec::new()),
        }
    }

    /// Compiles with `--fmad=false`: no multiply-add contracted into one rounding, as a CPU reference
    /// that rounds `x·a` and `+ b` apart computes.
    pub const fn without_fmad(mut self) -> Program {
        self.fmad = false;
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn source(&self) -> &'static str {
        self.source
    }

    /// Compiles the program for `arch` (no cache): PTX for its virtual architecture. Needs libnvrtc, not
    /// a GPU; [`Error::Missing`] without it, [`Error::Compile`] with NVRTC's log on one line.
    pub fn compile(&self, arch: Arch) -> Result<Ptx, Error> {
        Library::Nvrtc.require()?;
        let arch_name = arch.virtual_arch();
        let opts = CompileOptions {
            fmad: (!self.fmad).then_some(false),
            options: [
                format!("--gpu-architecture={arch_name}"),
                "--std=c++17".into(),
            ]
            .into_iter()
            .chain(extra_options())
            .collect(),
            name: Some(self.name.into()),
            ..Default::default()
        };
        compile_ptx_with_opts(self.source, opts).map_err(|e| Error::Compile {
            program: self.name,
            arch: arch_name,
            log: compile_log(e),
        })
    }

    /// [`compile`](Self::compile), once per process per architecture.
    pub fn ptx(&self, arch: Arch) -> Result<Ptx, Error> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, ptx)) = cache.iter().find(|(a, _)| *a == arch) {
            return Ok(ptx.clone());
        }
        let ptx = self.compile(arch)?;
        cache.push((arch, ptx.clone()));
        Ok(ptx)
    }

    /// Compiles for each of `archs` (e.g. [`EVERY_ARCH`](crate::EVERY_ARCH)) and checks that every one of
    /// `entries` is in each PTX ([`Error::Compile`] naming the first missing one): the check that the
    /// kernels compile for every GPU they may run on, which needs libnvrtc but no GPU. With `ptx_dir`, each
    /// PTX is also written there as `<name>_compute_XY.ptx`, for `ptxas -v`. Returns the PTX texts.
    pub fn compile_every(
        &self,
        archs: &[Arch],
        entries: &[&str],
        ptx_dir: Option<&Path>,
    ) -> Result<Vec<(Arch, String)>, Error> {
        let stem = self.name.split('.').next().unwrap_or(self.name);
        archs
            .iter()
            .map(|&arch| {
                let src = self.compile(arch)?.to_src();
                if let Some(entry) = entries
                    .iter()
                    .find(|e| !src.contains(&format!(".entry {e}(")))
                {
                    return Err(Error::Compile {
                        program: self.name,
                        arch: arch.virtual_arch(),
                        log: format!("the PTX has no entry point {entry}"),
                    });
                }
                if let Some(dir) = ptx_dir {
                    let path = dir.join(format!("{stem}_{}.ptx", arch.virtual_arch()));
                    std::fs::write(&path, &src).map_err(|e| Error::WritePtx {
                        path,
                        message: e.to_string(),
                    })?;
                }
                Ok((arch, src))
            })
            .collect()
    }

    /// The program compiled for the context's device ([`Arch::of`], cached) and loaded into the context.
    pub fn load(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>, Error> {
        let ptx = self.ptx(Arch::of(ctx)?)?;
        ctx.load_module(ptx)
            .map_err(|e| Error::driver("cuModuleLoadData", e))
    }
}

/// NVRTC's complaint on one line: the log's non-empty lines joined, or the failing step in NVRTC's words.
fn compile_log(e: CompileError) -> String {
    match e {
        CompileError::CompileError { log, .. } => log
            .to_string_lossy()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; "),
        CompileError::CreationError(e) => format!("creating the program: {}", nvrtc_text(e)),
        CompileError::GetLogError(e) => format!("reading the log: {}", nvrtc_text(e)),
        CompileError::GetPtxError(e) => format!("reading the PTX: {}", nvrtc_text(e)),
        CompileError::DestroyError(e) => format!("destroying the program: {}", nvrtc_text(e)),
    }
}

/// An NVRTC status as NVRTC describes it.
fn nvrtc_text(e: cudarc::nvrtc::result::NvrtcError) -> String {
    // SAFETY: a lookup in NVRTC's table (libnvrtc is loaded: the compile got this far); a static string.
    let p = unsafe { cudarc::nvrtc::sys::nvrtcGetErrorString(e.0) };
    if p.is_null() {
        format!("nvrtcResult {}", e.0 as u32)
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static EMPTY: Program = Program::new("empty.cu", "extern \"C\" __global__ void k() {}");
    static BROKEN: Program = Program::new("broken.cu", "this is not CUDA C").without_fmad();

    #[test]
    fn no_nvrtc_is_a_typed_error() {
        if Library::Nvrtc.is_present() {
            eprintln!("skipping: libnvrtc is present here");
            return;
        }
        assert_eq!(
            EMPTY.ptx(Arch::new(9, 0)).unwrap_err(),
            Error::Missing(Library::Nvrtc)
        );
    }

    /// Runs wherever libnvrtc loads, GPU or not (e.g. the nvidia-cuda-nvrtc wheel's lib folder on
    /// LD_LIBRARY_PATH).
    #[test]
    fn compiles_once_and_reports_errors_on_one_line() {
        use crate::testing::{LibraryTest, nvrtc_for_test};
        match nvrtc_for_test("program::tests::compiles_once_and_reports_errors_on_one_line") {
            LibraryTest::Here => {}
            LibraryTest::PassedInChild => return,
            LibraryTest::Missing(reason) => return stdx::testing::skip(reason),
        }
        let a = EMPTY.ptx(Arch::new(8, 0)).unwrap();
        assert!(a.to_src().contains(".entry k("));
        assert_eq!(EMPTY.cache.lock().unwrap().len(), 1);
        EMPTY.ptx(Arch::new(8, 0)).unwrap();
        assert_eq!(EMPTY.cache.lock().unwrap().len(), 1);
        let every = EMPTY
            .compile_every(&crate::EVERY_ARCH, &["k"], None)
            .unwrap();
        assert_eq!(every.len(), crate::EVERY_ARCH.len());
        match EMPTY.compile_every(&[Arch::new(9, 0)], &["k", "absent"], None) {
            Err(Error::Compile { log, .. }) => assert!(log.contains("absent"), "{log}"),
            other => panic!("{other:?}"),
        }
        match BROKEN.compile(Arch::new(8, 0)) {
            Err(Error::Compile { program, arch, log }) => {
                assert_eq!((program, arch.as_str()), ("broken.cu", "compute_80"));
                assert!(!log.is_empty() && !log.contains('\n'), "{log}");
            }
            other => panic!("{other:?}"),
        }
    }
}
