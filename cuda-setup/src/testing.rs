//! For the GPU crates' tests that need NVRTC but no GPU (their kernels compiled for every architecture).
//! NVRTC is a library, not a device: CI has it in the Python test environment (PyTorch's CUDA wheels bring
//! `libnvrtc`), so such a test must run there, not skip. It cannot be put on `LD_LIBRARY_PATH` for the
//! whole test run (other tests check what happens without CUDA libraries), so a test that finds no NVRTC
//! in its process runs itself again, alone, with the folder `$L3_NVRTC_DIR` names on the path.

use crate::Library;
use std::process::Command;

/// Where a test that needs NVRTC stands.
#[derive(Debug)]
pub enum NvrtcTest {
    /// libnvrtc loads in this process: run the test here.
    Here,
    /// The test ran in a child process that found it, and passed (a failure panics instead).
    PassedInChild,
    /// Neither here nor in `$L3_NVRTC_DIR`: the reason, for the caller's skip (which fails under CI).
    Missing(String),
}

/// Decides for test `name` (its path in this test binary, as `cargo test` lists it).
pub fn nvrtc_for_test(name: &str) -> NvrtcTest {
    if Library::Nvrtc.is_present() {
        return NvrtcTest::Here;
    }
    let missing = crate::Error::Missing(Library::Nvrtc).to_string();
    let dir = match std::env::var_os("L3_NVRTC_DIR") {
        Some(dir) if std::env::var_os("L3_NVRTC_CHILD").is_none() => dir,
        _ => return NvrtcTest::Missing(missing),
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
        .env("L3_NVRTC_CHILD", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {} again: {e}", exe.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} with NVRTC from {}:\n{text}",
        std::path::Path::new(&dir).display()
    );
    eprint!("{text}");
    NvrtcTest::PassedInChild
}
