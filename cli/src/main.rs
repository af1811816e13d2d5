//! `l3`: the toolkit's command-line tool. A thin shell: each subcommand group lives in its own module
//! and calls into the library crates; errors are printed as one line naming the file.
#![deny(unsafe_code)]

mod bench;
mod codec;
mod convert;
mod demo;
mod infer_cmd;
mod liquid;
mod pcr;
mod stream;
mod stylize;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "l3",
    version,
    about = "Keep accelerators fed: L3, PCR, Liquid and BSP tiling from the command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Encode an image (PNG, JPEG, PPM/PGM, ...) into an L3 file.
    Encode(codec::EncodeArgs),
    /// Decode an L3 file to PNG or PPM/PGM (picked by OUT's extension).
    Decode(codec::DecodeArgs),
    /// Print an L3 file's header: dimensions, channels, patches, ratio.
    Info(codec::InfoArgs),
    /// Decode throughput benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Progressive Compressed Records.
    #[command(subcommand)]
    Pcr(pcr::PcrCommand),
    /// Liquid multi-format datasets.
    #[command(subcommand)]
    Liquid(liquid::LiquidCommand),
    /// Stream a dataset like a training loop.
    Stream(Box<stream::StreamArgs>),
    /// How far a dataset's order is from a uniform shuffle (the order alone: no image is read).
    ShuffleReport(Box<stream::ShuffleReportArgs>),
    /// Convert a folder of images to another format.
    Convert(convert::ConvertArgs),
    /// Stylise an image of any size with BSP tiling (read by region, written as tiles complete).
    Stylize(stylize::StylizeArgs),
    /// Run a CNN (ONNX, or a TransformerNet) over an image of any size with BSP tiling.
    Infer(Box<infer_cmd::InferArgs>),
    /// The main job: build a default dataset, convert it to every format, stream each.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A value the options model refuses: its words, in the tool's one error format (what Python
        // raises for the same value).
        Err(e) if e.kind() == clap::error::ErrorKind::ValueValidation => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            eprintln!("l3: error: {}", first.trim_start_matches("error: "));
            std::process::exit(1);
        }
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Encode(a) => codec::encode(a),
        Command::Decode(a) => codec::decode(a),
        Command::Info(a) => codec::info(a),
        Command::Bench(c) => bench::run(c),
        Command::Pcr(c) => pcr::run(c),
        Command::Liquid(c) => liquid::run(c),
        Command::Stream(a) => stream::run(*a),
        Command::ShuffleReport(a) => stream::shuffle_report(*a),
        Command::Convert(a) => convert::run(a),
        Command::Stylize(a) => stylize::run(a),
        Command::Infer(a) => infer_cmd::run(*a),
        Command::Demo(a) => demo::run(a),
    };
    if let Err(e) = result {
        eprintln!("l3: error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error chain as one line, each cause once: library errors already name their file and include their
/// cause's text, so a cause whose text the line already holds is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if line.contains(&text) {
            continue;
        }
        if text.contains(&line) && !line.is_empty() {
            line = text;
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn causes_are_printed_once() {
        let inner = std::io::Error::other("No space left on device");
        let e = anyhow::Error::new(inner)
            .context("out.png: No space left on device")
            .context("writing out.png");
        assert_eq!(
            super::one_line(&e),
            "writing out.png: out.png: No space left on device"
        );
        let e = anyhow::anyhow!("a: b").context("a: b");
        assert_eq!(super::one_line(&e), "a: b");
    }
}
