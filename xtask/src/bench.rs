//! `cargo xtask bench [SECTION]`: the benchmarks live in their own crate, `bench/` (`l3-bench`), so that
//! xtask itself stays small; this runs `cargo run --release -p l3-bench -- ARGS`, forwarding the arguments
//! and the exit status. `cargo xtask bench --help` lists the sections.

use std::process::ExitCode;
use xtask::{cargo, workspace_root};

pub fn main(args: &[String]) -> ExitCode {
    let status = cargo()
        .args(["run", "--release", "--package", "l3-bench", "--"])
        .args(args)
        .current_dir(workspace_root())
        .status();
    match status {
        Ok(s) => match s.code() {
            Some(0) => ExitCode::SUCCESS,
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => {
                eprintln!("l3-bench ended by {s}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("cannot start cargo: {e}");
            ExitCode::FAILURE
        }
    }
}
