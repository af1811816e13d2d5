//! `cargo xtask test`: the whole test suite, Rust and Python (see `test.rs`).
//!
//! `cargo xtask bench [SECTION]`: the papers' tables and figures on real images, from the `l3-bench` crate
//! (`bench/`), built in release and run with the arguments given (see `bench.rs`).
//!
//! `cargo xtask tidy`: the invariants of ARCHITECTURE.md that a program can check (see the library's
//! `tidy` module); `cargo xtask test` runs it first.
//!
//! `cargo xtask gpu-bundle`: the GPU bundle, built and rehearsed here, run on a GPU machine (see
//! `gpu_bundle.rs`).
#![deny(unsafe_code)]

mod bench;
mod gpu_bundle;
mod test;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench::main(&args[1..]),
        Some("test") => test::main(&args[1..]),
        Some("gpu-bundle") => gpu_bundle::main(&args[1..]),
        Some("tidy") => match xtask::tidy::main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask test [rust|python] [-- PYTEST_ARGS]\n       cargo xtask tidy\n       cargo xtask bench [SECTION]   (cargo xtask bench --help lists the sections)\n       cargo xtask gpu-bundle [CARGO FLAGS]"
            );
            ExitCode::from(2)
        }
    }
}
