//! `cargo xtask test`: the whole test suite, Rust and Python (see `test.rs`).
//!
//! `cargo xtask bench [NAME]`: reproduces the papers' tables and figures on real images.
//! Each section lives in `bench/<name>.rs` and writes Markdown (and SVG plots) to `target/bench/`;
//! `target/bench/REPORT.md` is rebuilt from every section file present after each run.

mod bench;
mod report;
mod test;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench::main(&args[1..]),
        Some("test") => test::main(&args[1..]),
        Some("s3-serve") => bench::serve_s3(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask test [rust|python] [-- PYTEST_ARGS]\n       cargo xtask bench [NAME]\nsections: {}",
                bench::names().join(", ")
            );
            ExitCode::from(2)
        }
    }
}
