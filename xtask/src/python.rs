//! The Python test environment: a virtual environment under `target/python/venv` holding the build backend
//! and the test tools, and the package installed into it with pip from `bindings/python`.

use crate::{run, workspace_root};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the test environment needs: the build backend, the test tools, and NumPy (the package's one
/// dependency, listed here because the package itself goes in with `--no-deps`).
/// `moto[server]` is the S3-compatible server the object-storage tests start on loopback.
const REQUIREMENTS: &[&str] = &[
    "maturin>=1.9.4,<2",
    "pytest>=7",
    "pillow>=9",
    "numpy>=1.22",
    "moto[server]>=5,<6",
    // The JAX side of the framework tests (DLPack views, `jax.distributed` in the elastic tests), on the CPU.
    "jax>=0.4.30",
    // bsp-tiling's ONNX tests build their models with the onnx helper API and compare with onnxruntime
    // (the tests skip, saying so, where either is missing).
    "onnx>=1.16",
    "onnxruntime>=1.18",
    // An independent TIFF reader and writer for `l3toolkit.infer`'s TIFF/BigTIFF input and output tests.
    "tifffile>=2023.1",
    // The Pillow plugin's Hugging Face test (`load_dataset("imagefolder")` over L3 files), the WebDataset
    // example's, and the shard tests (webdataset reads the tar shards `l3 convert --to shards` writes, and
    // writes shards for the loader to index): together about 47 s and 0.46 GB of wheels (pyarrow and
    // pandas included).
    "datasets>=2.14",
    "webdataset>=0.2.86",
    // The PyTorch side of the framework tests (DLPack views, `torch.distributed` with gloo in the elastic
    // tests, torchvision's transforms as a reference) and the training examples under `examples/`, on the
    // CPU. torchvision pins the torch it was built against, so pip's resolver keeps the two matched. On
    // Linux x86-64 PyPI's torch brings the CUDA libraries with it (about 5.4 GB installed, 2 to 5 minutes
    // cold on a 2-core machine); where PyTorch's own CPU index is reachable, `PIP_EXTRA_INDEX_URL`
    // pointing at it installs the CPU-only build instead (its `+cpu` version sorts above PyPI's).
    "torch>=2.4",
    "torchvision>=0.19",
    // NVRTC, the CUDA compiler as a library (no GPU needed): the GPU crates' tests compile their kernels
    // with it for every architecture (`cuda_setup::testing`). PyPI's torch brings the same wheel; named
    // here for a CPU-only torch.
    "nvidia-cuda-nvrtc>=13",
    // cuDNN, whose descriptors bsp-tiling's tests check without a GPU (`cuda_setup::testing`); PyPI's
    // torch brings the same wheel, named here for a CPU-only torch.
    "nvidia-cudnn-cu13>=9",
];

/// The folder of the environment's `lib` (a file starting `libnvrtc.so`, `libcudnn.so`) among its
/// NVIDIA wheels' `lib` folders, if it has one.
pub fn nvidia_lib_dir(venv: &Path, lib: &str) -> Option<PathBuf> {
    let libs = std::fs::read_dir(venv.join("lib")).ok()?;
    libs.flatten()
        .map(|py| py.path().join("site-packages").join("nvidia"))
        .filter_map(|nvidia| std::fs::read_dir(nvidia).ok())
        .flat_map(|dirs| dirs.flatten().map(|d| d.path().join("lib")))
        .find(|dir| {
            std::fs::read_dir(dir).is_ok_and(|files| {
                files
                    .flatten()
                    .any(|f| f.file_name().to_string_lossy().starts_with(lib))
            })
        })
}

/// The test environment's folder, `target/python/venv`.
pub fn venv_dir() -> PathBuf {
    workspace_root().join("target").join("python").join("venv")
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

/// Which Rust build goes into the wheel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// What users get: `pip install ./bindings/python` as is, maturin's release build (the benchmarks).
    Release,
    /// The test run's build: the extension compiled in the `dev` profile with the `test` profile's
    /// opt-level, so that it reuses the library units `cargo test --workspace` just built in `target/debug/`
    /// instead of compiling the whole dependency tree again in release (see `test.rs`).
    Test,
}

/// The opt-level of `[profile.test]` in the workspace's Cargo.toml (keep the two equal). maturin builds
/// with `cargo rustc`, where `--profile test` means "compile the test harness", so a wheel cannot be built
/// in the test profile itself; the dev profile with this opt-level is the test profile in every setting
/// (test inherits dev), and cargo shares units between profiles whose settings are equal.
const TEST_OPT_LEVEL: &str = "2";

/// The features `cargo test --workspace` unifies into the extension's workspace dependencies (the `l3`
/// binary turns on `clap` in vocab and loader). A test build that names them shares those crates' units
/// with the Rust tests; without them vocab, and every crate above it, would compile again.
const TEST_FEATURES: &str = "vocab/clap,loader/clap";

/// Installs the package into the environment of `python` with pip from `./bindings/python`, the way its
/// README tells users to (pip runs maturin, the build backend `pyproject.toml` names), so that the tests
/// exercise the wheel pip installs. The environment already holds maturin, so pip builds without an
/// isolated build environment; `--force-reinstall` rebuilds even when the version has not changed.
/// maturin's build hook runs the `maturin` program from `PATH`, so the environment's `bin/` goes first
/// there, as activating it would do. [`Build::Test`] passes maturin its cargo options through
/// `MATURIN_PEP517_ARGS` (the variable maturin's PEP 517 backend reads).
pub fn install_package(python: &Path, build: Build) -> anyhow::Result<()> {
    let root = workspace_root();
    let bin = python
        .parent()
        .with_context(|| format!("{} has no folder", python.display()))?;
    let mut path = vec![bin.to_path_buf()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).context("PATH with the environment's bin/")?;
    let mut cmd = Command::new(python);
    cmd.env("PATH", path)
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
        .current_dir(&root);
    match build {
        Build::Release => {
            cmd.env_remove("MATURIN_PEP517_ARGS");
        }
        Build::Test => {
            cmd.env(
                "MATURIN_PEP517_ARGS",
                format!("--profile dev --features {TEST_FEATURES}"),
            )
            .env("CARGO_PROFILE_DEV_OPT_LEVEL", TEST_OPT_LEVEL);
        }
    }
    run(&mut cmd).with_context(|| format!("pip install ./bindings/python ({build:?} build)"))
}
