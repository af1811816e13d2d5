//! Compiling a harness: its sources and the simulator's headers written into a build folder of the
//! process, compiled with `$CXX` (default `c++`) as C++20 with every warning an error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// How a harness is compiled.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Flavour {
    /// `-O2`: the fast one, for comparing outputs.
    Plain,
    /// AddressSanitizer + UBSan, `-O1 -g`: any access outside a buffer, any undefined behaviour.
    Asan,
    /// ThreadSanitizer, `-O1 -g`: any shared-memory access the kernel's barriers do not order.
    Tsan,
}

impl Flavour {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Flavour::Plain => &["-O2"],
            Flavour::Asan => &[
                "-O1",
                "-g",
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all",
            ],
            Flavour::Tsan => &["-O1", "-g", "-fsanitize=thread"],
        }
    }
}

/// Why a harness could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The machine cannot build it: no C++ compiler, no sanitizer runtime, no temporary folder.
    Unavailable(String),
    /// The compiler rejected the harness, the kernels or the simulator's headers: a bug to fix.
    Source(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unavailable(why) => f.write_str(why),
            Error::Source(log) => write!(f, "the simulated kernels failed to compile:\n{log}"),
        }
    }
}

impl std::error::Error for Error {}

/// A crate's harness: its `main` and the sources it includes, built once per flavour per process. Meant
/// to be a `static` of the test crate:
///
/// ```
/// static HARNESS: cuda_sim::Harness = cuda_sim::Harness::new(
///     "my-crate",
///     "int main() { return 0; }",
///     &[("kernels.cu", "")],
///     &[],
/// );
/// ```
pub struct Harness {
    name: &'static str,
    main: &'static str,
    files: &'static [(&'static str, &'static str)],
    flags: &'static [&'static str],
    built: [OnceLock<Result<PathBuf, Error>>; 3],
}

impl Harness {
    /// `main` is written as `harness.cpp`, each of `files` under its name beside it (so `main` includes
    /// them as `#include "kernels.cu"`), with `cuda_sim.h` and `cuda_sim_run.h`. `flags` are extra
    /// compiler flags (e.g. `-ffp-contract=off` for kernels NVRTC compiles with `--fmad=false`).
    pub const fn new(
        name: &'static str,
        main: &'static str,
        files: &'static [(&'static str, &'static str)],
        flags: &'static [&'static str],
    ) -> Harness {
        Harness {
            name,
            main,
            files,
            flags,
            built: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// The harness executable for `flavour`, compiled on first use.
    pub fn get(&self, flavour: Flavour) -> Result<&Path, &Error> {
        self.built[flavour as usize]
            .get_or_init(|| self.build(flavour))
            .as_ref()
            .map(PathBuf::as_path)
    }

    fn build(&self, flavour: Flavour) -> Result<PathBuf, Error> {
        let dir = std::env::temp_dir().join(format!(
            "cuda-sim-{}-{}-{flavour:?}",
            self.name,
            std::process::id()
        ));
        let unavailable = |what: &str, e: std::io::Error| {
            Error::Unavailable(format!("{what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(&dir).map_err(|e| unavailable("creating", e))?;
        let mut ours = vec![
            ("cuda_sim.h", crate::SHIM),
            ("cuda_sim_run.h", crate::RUNTIME),
            ("harness.cpp", self.main),
        ];
        ours.extend_from_slice(self.files);
        for (name, text) in &ours {
            std::fs::write(dir.join(name), text).map_err(|e| unavailable("writing into", e))?;
        }
        let exe = dir.join("harness");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-pthread", "-Wall", "-Wextra", "-Werror"])
            .args(self.flags)
            .args(flavour.flags())
            .arg("-o")
            .arg(&exe)
            .arg(dir.join("harness.cpp"))
            .output()
            .map_err(|e| Error::Unavailable(format!("cannot run C++ compiler `{cxx}`: {e}")))?;
        if out.status.success() {
            return Ok(exe);
        }
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        // A diagnostic in one of our files is a bug; anything else (a sanitizer runtime the toolchain
        // lacks) means this machine cannot build this flavour.
        if ours.iter().any(|(name, _)| log.contains(name)) {
            Err(Error::Source(log))
        } else {
            Err(Error::Unavailable(format!(
                "`{cxx}` cannot build the {flavour:?} harness: {log}"
            )))
        }
    }
}
