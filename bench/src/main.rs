//! `l3-bench`: reproduces the papers' tables and figures on real images. Run through
//! `cargo xtask bench [SECTION]` (which builds it in release); each section lives in
//! `sections/<name>.rs` and writes Markdown (and SVG plots) to `target/bench/`;
//! `target/bench/REPORT.md` is rebuilt from every section file present after each run.
//!
//! `l3-bench s3-serve ROOT ADDR` is the S3 server the `storage` section starts inside a network namespace
//! (this binary re-executed), not a section.
#![deny(unsafe_code)]

mod report;
mod sections;

use std::process::ExitCode;

fn usage() -> String {
    let mut s = String::from(
        "usage: cargo xtask bench [SECTION]   (no SECTION: every section, in this order)\n\
         environment: L3_BENCH_QUICK=1 for a smaller, faster run (sections that support it), \
         L3_CORPUS=DIR for the images (default ../shared/corpus)\n\nsections:\n",
    );
    for (name, about) in sections::list() {
        s.push_str(&format!("  {name:<8} {about}\n"));
    }
    s
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-h" | "--help" | "help") => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Some("s3-serve") => sections::serve_s3(&args[1..]),
        Some(_) if args.len() > 1 => {
            eprint!("one section at most\n\n{}", usage());
            ExitCode::from(2)
        }
        section => sections::main(section),
    }
}
