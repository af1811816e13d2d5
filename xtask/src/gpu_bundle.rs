//! `cargo xtask gpu-bundle [CARGO FLAGS]`: everything a GPU machine without cargo or network needs, built
//! here into `gpu-bin/` (git-ignored, under the 64 MiB one device call carries), then rehearsed.
//!
//! The work is two shell scripts, because the runner must itself run where no Rust is:
//! `gpu-check/bundle.sh` builds the bundle (test binaries with their GPU tests, the `l3-bench` and
//! `fig7a` programs, the abi3 wheel, the corpus and models, a manifest), and `gpu-bin/run.sh --dry-run all`
//! checks that every step's programs, scripts, data and named tests are there. On the device:
//! `bash gpu-bin/run.sh run1` (correctness), then `bash gpu-bin/run.sh run2` (the figures).

use std::process::{Command, ExitCode};
use xtask::{run, workspace_root};

pub fn main(args: &[String]) -> ExitCode {
    let root = workspace_root();
    let built = run(Command::new("bash")
        .arg(root.join("gpu-check/bundle.sh"))
        .args(args)
        .current_dir(&root));
    let rehearsed = built.and_then(|()| {
        run(Command::new("bash")
            .arg(root.join("gpu-bin/run.sh"))
            .args(["--dry-run", "all"])
            .current_dir(&root))
    });
    match rehearsed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-bundle: {e:#}");
            ExitCode::FAILURE
        }
    }
}
