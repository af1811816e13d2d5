//! `cargo xtask test`: the whole test suite — the workspace's Rust tests (`cargo test --workspace`), then
//! the Python package's: `pip install ./bindings/python` (maturin builds the release abi3 wheel) into a
//! virtual environment under `target/python/`, and pytest on `bindings/python/tests`.
//!
//! `cargo xtask test rust` or `cargo xtask test python` runs one half; arguments after `--` go to pytest.
//! `PYTHON` picks the interpreter that creates the environment (default `python3`).

use crate::report::workspace_root;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// What the test environment needs: the build backend, the test tools, and NumPy (the package's one
/// dependency, listed here because the package itself goes in with `--no-deps`).
/// `moto[server]` is the S3-compatible server the object-storage tests start on loopback.
const REQUIREMENTS: &[&str] = &[
    "maturin>=1.9.4,<2",
    "pytest>=7",
    "pillow>=9",
    "numpy>=1.22",
    "moto[server]>=5,<6",
];

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
    if rust {
        eprintln!("== cargo test --workspace");
        if let Err(e) = rust_tests() {
            eprintln!("Rust tests failed: {e:#}");
            failed.push("Rust");
        }
    }
    if python {
        eprintln!("== Python: pip install ./bindings/python, pytest");
        if let Err(e) = python_tests(pytest_args) {
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

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} exited with {status}");
    }
    Ok(())
}

fn rust_tests() -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .args(["test", "--workspace"])
        .current_dir(workspace_root()))
}

/// The test environment's interpreter, creating the environment and installing the tools when needed.
pub fn venv_python(dir: &Path) -> anyhow::Result<PathBuf> {
    let python = dir.join("bin").join("python");
    if !python.exists() {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&base).args(["-m", "venv"]).arg(dir)).with_context(|| {
            format!(
                "creating a virtual environment with {base} (Debian/Ubuntu: apt-get install python3-venv)"
            )
        })?;
    }
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(REQUIREMENTS))
    .context("installing the test tools into the virtual environment")?;
    Ok(python)
}

/// Installs the package into the environment of `python` the way its README tells users to,
/// `pip install ./bindings/python` (pip runs maturin, the build backend `pyproject.toml` names, which
/// builds the release abi3 wheel), so that the tests exercise what users install. The environment
/// already holds maturin, so pip builds without an isolated build environment; `--force-reinstall`
/// rebuilds even when the version has not changed. maturin's build hook runs the `maturin` program from
/// `PATH`, so the environment's `bin/` goes first there, as activating it would do.
pub fn install_package(python: &Path) -> anyhow::Result<()> {
    let root = workspace_root();
    let bin = python
        .parent()
        .with_context(|| format!("{} has no folder", python.display()))?;
    let mut path = vec![bin.to_path_buf()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).context("PATH with the environment's bin/")?;
    run(Command::new(python)
        .env("PATH", path)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(root.join("bindings").join("python"))
        .current_dir(&root))
    .context("pip install ./bindings/python")
}

fn python_tests(pytest_args: &[String]) -> anyhow::Result<()> {
    let root = workspace_root();
    let python = venv_python(&root.join("target").join("python").join("venv"))?;
    install_package(&python)?;
    run(Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(pytest_args)
        .current_dir(root.join("bindings").join("python")))
}
