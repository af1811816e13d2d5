//! The benchmark sections, one module each, and the runner that writes the report.

mod bsp;
mod child;
#[allow(unsafe_code)]
mod l3;
#[allow(unsafe_code)]
mod liquid;
mod loader;
mod onnx;
mod onnx_device;
mod pcr;
mod python;
mod ranks;
mod resample;
#[allow(unsafe_code)]
mod shards;
#[allow(unsafe_code)]
mod storage;
mod tasks;

pub use storage::serve as serve_s3;

use crate::report::Report;
use std::process::ExitCode;

struct Section {
    name: &'static str,
    about: &'static str,
    run: fn(&mut Report) -> anyhow::Result<()>,
}

/// Every section, in report order.
const SECTIONS: &[Section] = &[
    Section {
        name: "l3",
        about: "L3 codec vs PNG and QOI (l3-eccv22)",
        run: l3::run,
    },
    Section {
        name: "pcr",
        about: "Progressive Compressed Records (pcr-iclr20)",
        run: pcr::run,
    },
    Section {
        name: "liquid",
        about: "Liquid multi-format sampling (liquid-apsys23)",
        run: liquid::run,
    },
    Section {
        name: "bsp",
        about: "BSP tiling for CNN inference (bsp-cnn-cikm17)",
        run: bsp::run,
    },
    Section {
        name: "onnx",
        about: "ONNX CNNs through BSP tiling vs onnxruntime (bsp-cnn-cikm17; also the end of `bsp`)",
        run: onnx::run,
    },
    Section {
        name: "onnx-device",
        about: "ONNX models through the graph engine on a GPU, beside onnxruntime's CUDA provider where installed (bsp-cnn-cikm17)",
        run: onnx_device::run,
    },
    Section {
        name: "ranks",
        about: "One image shared among processes (torchrun) vs one process, outputs compared (bsp-cnn-cikm17; also the end of `bsp`)",
        run: ranks::run,
    },
    Section {
        name: "loader",
        about: "The loader pipeline across formats",
        run: loader::run,
    },
    Section {
        name: "storage",
        about: "Every format against storage bandwidth, Liquid profiled at each (pcr-iclr20, liquid-apsys23)",
        run: storage::run,
    },
    Section {
        name: "shards",
        about: "One object per image vs WebDataset tar shards on S3: objects, requests, bytes, images/s",
        run: shards::run,
    },
    Section {
        name: "python",
        about: "The loader from Python vs a Pillow process pool and SPDL",
        run: python::run,
    },
    Section {
        name: "resample",
        about: "Resampling a sample: the loader's integer resampler vs Pillow's resize",
        run: resample::run,
    },
    Section {
        name: "tasks",
        about: "Segmentation and classification recipes: the loader vs DataLoader + torchvision.transforms.v2",
        run: tasks::run,
    },
];

pub fn names() -> Vec<&'static str> {
    SECTIONS.iter().map(|s| s.name).collect()
}

/// Every section's name and what it measures, in report order.
pub fn list() -> impl Iterator<Item = (&'static str, &'static str)> {
    SECTIONS.iter().map(|s| (s.name, s.about))
}

/// Runs one section (`Some(name)`) or every section (`None`), then rebuilds `REPORT.md`.
pub fn main(section: Option<&str>) -> ExitCode {
    let chosen: Vec<&Section> = match section {
        None => SECTIONS.iter().collect(),
        Some(name) => match SECTIONS.iter().find(|s| s.name == name) {
            Some(s) => vec![s],
            None => {
                eprintln!("unknown section {name:?}; sections: {}", names().join(", "));
                return ExitCode::from(2);
            }
        },
    };
    let mut failed = false;
    for s in chosen {
        eprintln!("== bench {}: {}", s.name, s.about);
        let mut report = Report::new(s.name, s.about);
        if let Err(e) = (s.run)(&mut report) {
            eprintln!("bench {} failed: {e:#}", s.name);
            report.para(&format!("**This section failed:** {e:#}"));
            failed = true;
        }
        match report.finish() {
            Ok(path) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("could not write the {} report: {e:#}", s.name);
                failed = true;
            }
        }
    }
    match crate::report::write_combined(&names()) {
        Ok(path) => eprintln!("wrote {}", path.display()),
        Err(e) => {
            eprintln!("could not write REPORT.md: {e:#}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
