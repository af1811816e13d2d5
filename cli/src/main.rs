//! `l3`: the toolkit's command-line tool. A thin shell: each subcommand group lives in its own module
//! and calls into the library crates.

mod bench;
mod codec;
mod convert;
mod demo;
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
    Stream(stream::StreamArgs),
    /// Convert a folder of images to another format.
    Convert(convert::ConvertArgs),
    /// Stylise an image of any size with BSP tiling.
    Stylize(stylize::StylizeArgs),
    /// The main job: build a default dataset, convert it to every format, stream each.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Encode(a) => codec::encode(a),
        Command::Decode(a) => codec::decode(a),
        Command::Info(a) => codec::info(a),
        Command::Bench(c) => bench::run(c),
        Command::Pcr(c) => pcr::run(c),
        Command::Liquid(c) => liquid::run(c),
        Command::Stream(a) => stream::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Stylize(a) => stylize::run(a),
        Command::Demo(a) => demo::run(a),
    };
    if let Err(e) = result {
        // One line, naming the file: every error chain is built with the path in its context.
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("l3: error: {msg}");
        std::process::exit(1);
    }
}
