//! For the GPU crates' tests that need a CUDA library but no GPU: NVRTC (their kernels compiled for every
//! architecture) and cuDNN (its descriptors, which are host objects). Libraries are not devices: CI has
//! them in the Python test environment (PyTorch's CUDA wheels bring `libnvrtc` and `libcudnn`), so such a
//! test must run there, not skip. They cannot be put on `LD_LIBRARY_PATH` for the whole test run (other
//! tests check what happens without CUDA libraries), so a test that finds its library missing in its
//! process runs itself again, alone, with the folder the library's variable names (`$L3_NVRTC_DIR`,
//! `$L3_CUDNN_DIR`) on the path.

use crate::Library;
use std::process::Command;

/// Where a test that needs a library stands.
#[derive(Debug)]
pub enum LibraryTest {
    /// The library loads in this process: run the test here.
    Here,
    /// The test ran in a child process that found it, and passed (a failure panics instead).
    PassedInChild,
    /// Neither here nor in the library's folder variable: the reason, for the caller's skip (which
    /// fails under CI).
    Missing(String),
}

/// The variable naming the folder a test's run again takes `lib` from; `None` for a library no test
/// loads without a GPU.
fn folder_variable(lib: Library) -> Option<&'static str> {
    match lib {
        Library::Nvrtc => Some("L3_NVRTC_DIR"),
        #[cfg(feature = "cudnn")]
        Library::Cudnn => Some("L3_CUDNN_DIR"),
        _ => None,
    }
}

/// Decides for test `name` (its path in this test binary, as `cargo test` lists it), which needs `lib`.
pub fn library_for_test(lib: Library, name: &str) -> LibraryTest {
    if lib.is_present() {
        return LibraryTest::Here;
    }
    let missing = crate::Error::Missing(lib).to_string();
    let Some(var) = folder_variable(lib) else {
        return LibraryTest::Missing(missing);
    };
    let dir = match std::env::var_os(var) {
        Some(dir) if std::env::var_os("L3_LIBRARY_CHILD").is_none() => dir,
        _ => return LibraryTest::Missing(missing),
    };
    let mut path = std::ffi::OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(&exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", path)
        .env("L3_LIBRARY_CHILD", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {} again: {e}", exe.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} with {} from {}:\n{text}",
        lib.file(),
        std::path::Path::new(&dir).display()
    );
    eprint!("{text}");
    LibraryTest::PassedInChild
}

/// [`library_for_test`] for NVRTC.
pub fn nvrtc_for_test(name: &str) -> LibraryTest {
    library_for_test(Library::Nvrtc, name)
}
