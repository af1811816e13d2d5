//! `cargo xtask test`: the whole test suite — first `cargo xtask tidy` (the invariants; a failure fails the
//! run, after the tests have still run), then the Python test environment (a virtual environment under
//! `target/python/` with the test tools, which the Rust tests use too: `BSP_PYTHON` points them at it),
//! then the workspace's Rust tests (`cargo test --workspace`), then the Python package's:
//! `pip install ./bindings/python` into that environment, and pytest on `bindings/python/tests`.
//!
//! A test that cannot run here (a missing tool or data) says why and returns on a developer's machine;
//! under CI (`CI=true`, exported by `.ci/run`) it fails instead (`stdx::testing::skip`, and
//! `cannot_run` in the Python tests' `conftest.py`).
//!
//! The workspace is built once. `cargo test --workspace` compiles every crate in the `test` profile; the
//! Python package then goes in the way users install it — pip, maturin, a wheel — except that maturin
//! builds the extension from those same units ([`Build::Test`]: the dev profile at the test profile's
//! opt-level, with the features the workspace build unified in), so only PyO3, the extension crate and
//! the few crates whose features differ in a build of the extension alone compile again, rather than the
//! whole dependency tree in release. The trade-off: the tests exercise a wheel built with debug
//! assertions and overflow checks at opt-level 2 (dependencies at 3), not the release wheel `pip install`
//! gives users; what pip installs, the Python half of the package and the wheel's layout are the same.
//! `cargo xtask bench python` installs the release wheel.
//!
//! `cargo xtask test rust` or `cargo xtask test python` runs one half; arguments after `--` go to pytest.
//! `PYTHON` picks the interpreter that creates the environment (default `python3`).

use std::path::Path;
use std::process::{Command, ExitCode};
use xtask::python::{Build, install_package, nvidia_lib_dir, venv_dir, venv_python};
use xtask::{cargo, run, workspace_root};

pub fn main(args: &[String]) -> ExitCode {
    let (ours, pytest_args) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let (rust, python) = match ours.first().map(String::as_str) {
        None => (true, true),
        Some("rust") => (true, false),
        Some("python") => (false, true),
        Some(other) => {
            eprintln!(
                "usage: cargo xtask test [rust|python] [-- PYTEST_ARGS]\nunknown part {other:?}"
            );
            return ExitCode::from(2);
        }
    };
    let mut failed = Vec::new();
    eprintln!("== cargo xtask tidy");
    if let Err(e) = xtask::tidy::main() {
        eprintln!("tidy failed: {e:#}");
        failed.push("tidy");
    }
    // The environment comes first: the Rust tests use it too (bsp-tiling's ONNX tests run onnxruntime in
    // it), so that a fresh CI machine runs them rather than skipping them.
    eprintln!("== Python test environment ({})", venv_dir().display());
    let venv = match venv_python(&venv_dir()) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("cannot prepare the Python test environment: {e:#}");
            failed.push("the Python environment");
            None
        }
    };
    if rust {
        eprintln!("== cargo test --workspace");
        let mut cmd = cargo();
        cmd.args(["test", "--workspace", "--no-fail-fast"])
            .current_dir(workspace_root());
        if let Some(venv) = &venv {
            cmd.env("BSP_PYTHON", venv);
        }
        // The kernels' NVRTC tests and bsp-tiling's cuDNN descriptor test run with the environment's
        // libraries (`cuda_setup::testing`).
        for (var, lib) in [
            ("L3_NVRTC_DIR", "libnvrtc.so"),
            ("L3_CUDNN_DIR", "libcudnn.so"),
        ] {
            if let Some(dir) = nvidia_lib_dir(&venv_dir(), lib) {
                cmd.env(var, dir);
            }
        }
        if let Err(e) = run(&mut cmd) {
            eprintln!("Rust tests failed: {e:#}");
            failed.push("Rust");
        }
    }
    if python && let Some(venv) = &venv {
        eprintln!("== Python: pip install ./bindings/python (test build), pytest");
        if let Err(e) = python_tests(venv, pytest_args) {
            eprintln!("Python tests failed: {e:#}");
            failed.push("Python");
        }
    }
    if failed.is_empty() {
        eprintln!("== all tests passed");
        ExitCode::SUCCESS
    } else {
        eprintln!("== FAILED: {}", failed.join(" and "));
        ExitCode::FAILURE
    }
}

fn python_tests(python: &Path, pytest_args: &[String]) -> anyhow::Result<()> {
    install_package(python, Build::Test)?;
    run(Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(pytest_args)
        .current_dir(workspace_root().join("bindings").join("python")))
}
