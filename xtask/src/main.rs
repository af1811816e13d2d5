//! `cargo xtask bench [NAME]`: reproduces the papers' tables and figures on real images.
//!
//! Each section lives in `bench/<name>.rs` and writes Markdown (and SVG plots) to `target/bench/`;
//! `target/bench/REPORT.md` is rebuilt from every section file present after each run.

mod bench;
mod report;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench::main(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask bench [NAME]\nsections: {}",
                bench::names().join(", ")
            );
            ExitCode::from(2)
        }
    }
}
