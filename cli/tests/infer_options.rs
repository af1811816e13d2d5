//! The inference options model on the command line: every `InferSettings` option is a flag of both
//! `l3 infer` and `l3 stylize` with the model's default in `--help`; a good value runs (a real
//! TransformerNet over a real TIFF), a bad one stops before anything is written with exactly the words
//! the model gives (what Python raises), naming the option.

use bsp_tiling::{Mode, PaddingMode, Precision};
use infer_io::tiff::OutDType;
use infer_io::{INFER_SETTING_NAMES, InferSettings};
use loader::{Bytes, parse_setting};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vocab::{Device, Invalid};

const COMMANDS: [&str; 2] = ["infer", "stylize"];

fn flag(name: &str) -> String {
    format!("--{}", name.replace('_', "-"))
}

fn l3(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(args)
        .output()
        .unwrap()
}

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/candy_nc8.safetensors")
}

/// A 42×30 crop of a corpus photo as an 8-bit RGB TIFF: its sides are not multiples of 4, so the
/// network's whole output (44×32) and the cropped one differ.
fn input(dir: &Path) -> PathBuf {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    let img = image::open(shared.join("corpus/Dune.jpg"))
        .unwrap()
        .to_rgb8();
    let small = image::imageops::resize(&img, 168, 120, image::imageops::FilterType::Triangle);
    let p = dir.join("in.tif");
    if p.exists() {
        return p;
    }
    image::imageops::crop_imm(&small, 40, 40, 42, 30)
        .to_image()
        .save(&p)
        .unwrap();
    p
}

fn run(command: &str, dir: &Path, extra: &[&str], output: &Path) -> Output {
    let (m, i) = (model(), input(dir));
    let mut a: Vec<&std::ffi::OsStr> = vec![command.as_ref(), "--model".as_ref(), m.as_os_str()];
    a.extend(extra.iter().map(std::ffi::OsStr::new));
    if !extra.contains(&"--threads") {
        a.extend(["--threads", "2"].map(std::ffi::OsStr::new));
    }
    a.push(i.as_os_str());
    a.push(output.as_os_str());
    l3(&a)
}

/// A value the model refuses, by the model's own parser: the words every surface prints.
fn refused<T: std::str::FromStr<Err = Invalid> + std::fmt::Debug>(
    option: &'static str,
    v: &str,
) -> String {
    parse_setting::<T>(option, v).unwrap_err().to_string()
}

/// A value that parses but that the settings refuse when checked.
fn checked(s: InferSettings) -> String {
    s.request(PathBuf::new(), PathBuf::new())
        .unwrap_err()
        .to_string()
}

#[test]
fn every_option_is_a_flag_of_both_commands_with_the_models_default() {
    for command in COMMANDS {
        let o = l3(&[command.as_ref(), "--help".as_ref()]);
        assert!(o.status.success());
        let text = String::from_utf8(o.stdout).unwrap();
        for (name, default) in InferSettings::defaults() {
            let f = flag(name);
            // The option's block: its flag line, then its help up to the next flag line.
            let mut lines = text.lines().skip_while(|l| {
                let l = l.trim_start();
                !(l.starts_with(&format!("{f} ")) || l.starts_with(&format!("{f}[")) || l == f)
            });
            let first = lines.next();
            assert!(
                first.is_some(),
                "{f} missing from l3 {command} --help:\n{text}"
            );
            let rest = lines.take_while(|l| !l.trim_start().starts_with('-'));
            let block = first.into_iter().chain(rest).collect::<Vec<_>>().join(" ");
            let shown = block
                .split("[default: ")
                .nth(1)
                .map(|d| d.split(']').next().unwrap());
            if default == "none" || default == "false" {
                assert_eq!(shown, None, "l3 {command} {f}");
            } else {
                assert_eq!(shown, Some(default.as_str()), "l3 {command} {f}");
            }
        }
    }
    assert_eq!(INFER_SETTING_NAMES.len(), InferSettings::defaults().len());
}

#[test]
fn every_option_takes_a_good_value_and_refuses_a_bad_one_in_the_models_words() {
    let d = InferSettings::default;
    // (option, a good value, a bad value, the words the bad one gets, or a part of them).
    let table: Vec<(&str, Vec<&str>, Vec<&str>, String)> = vec![
        (
            "tile",
            vec!["16"],
            vec!["0"],
            checked(InferSettings {
                tile: Some(0),
                ..d()
            }),
        ),
        (
            "mode",
            vec!["sampled:2"],
            vec!["fast"],
            refused::<Mode>("mode", "fast"),
        ),
        (
            "device",
            vec!["cpu"],
            vec!["gpu"],
            refused::<Device>("device", "gpu"),
        ),
        (
            "precision",
            vec!["f32"],
            vec!["f64"],
            refused::<Precision>("precision", "f64"),
        ),
        (
            "gpu_memory",
            vec!["--device", "cuda", "--gpu-memory", "1G"],
            vec!["lots"],
            refused::<Bytes>("gpu_memory", "lots"),
        ),
        (
            "threads",
            vec!["1"],
            vec!["0"],
            checked(InferSettings {
                threads: Some(0),
                ..d()
            }),
        ),
        (
            "padding",
            vec!["circular"],
            vec!["mirror"],
            refused::<PaddingMode>("padding", "mirror"),
        ),
        (
            "ram_budget_mib",
            vec!["16"],
            vec!["18446744073709551615"],
            checked(InferSettings {
                ram_budget_mib: u64::MAX,
                ..d()
            }),
        ),
        ("spill_dir", vec!["."], vec![], String::new()),
        ("full", vec!["--full"], vec![], String::new()),
        (
            "in_scale",
            vec!["0.5"],
            vec!["NaN"],
            checked(InferSettings {
                in_scale: f32::NAN,
                ..d()
            }),
        ),
        (
            "out_scale",
            vec!["2"],
            vec!["inf"],
            checked(InferSettings {
                out_scale: f32::INFINITY,
                ..d()
            }),
        ),
        (
            "out_dtype",
            vec!["float32"],
            vec!["int8"],
            refused::<OutDType>("out_dtype", "int8"),
        ),
        ("page", vec!["0"], vec!["5"], "no page 5".into()),
        ("level", vec!["0"], vec!["2"], "no level 2".into()),
    ];
    let names: Vec<&str> = table.iter().map(|(n, ..)| *n).collect();
    assert_eq!(names, INFER_SETTING_NAMES, "the table walks every option");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.tif");
    for command in COMMANDS {
        for (name, good, bad, words) in &table {
            let f = flag(name);
            // A switch or a group of flags is given as it is; a value follows its flag.
            let args: Vec<&str> = if good[0].starts_with("--") {
                good.clone()
            } else {
                vec![f.as_str(), good[0]]
            };
            let o = run(command, dir.path(), &args, &out);
            let err = String::from_utf8_lossy(&o.stderr);
            if *name == "gpu_memory" && !o.status.success() {
                // No usable GPU here: the reason, never a refusal of the value.
                assert!(err.contains("device cuda"), "l3 {command} {args:?}: {err}");
            } else {
                assert!(o.status.success(), "l3 {command} {args:?}: {err}");
                std::fs::remove_file(&out).unwrap();
            }
            if let Some(b) = bad.first() {
                let o = run(command, dir.path(), &[f.as_str(), b], &out);
                assert!(!o.status.success(), "l3 {command} {f} {b}");
                let err = String::from_utf8_lossy(&o.stderr);
                let last = err.trim_end().lines().last().unwrap_or_default();
                if words.contains('"') {
                    assert_eq!(last, format!("l3: error: {words}"), "l3 {command} {f} {b}");
                    assert!(last.starts_with(&format!("l3: error: {name} ")), "{last}");
                } else {
                    assert!(last.contains(words.as_str()), "l3 {command} {f} {b}: {err}");
                }
                assert!(!out.exists(), "a refused run leaves no output");
            }
        }
    }
}

#[test]
fn full_is_one_option_whose_default_is_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let size = |args: &[&str], command: &str| {
        let out = dir.path().join(format!("{command}{}.png", args.len()));
        let o = run(command, dir.path(), args, &out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        image::image_dimensions(&out).unwrap()
    };
    for command in COMMANDS {
        assert_eq!(size(&["--full"], command), (44, 32), "{command}");
        assert_eq!(size(&["--full=false"], command), (42, 30), "{command}");
    }
    // The defaults: a model's output as its framework gives it, a filtered picture at its own size.
    assert_eq!(size(&[], "infer"), (44, 32));
    assert_eq!(size(&[], "stylize"), (42, 30));
    assert_eq!(size(&["--crop-to-input"], "infer"), (42, 30));
    // The tile default is the device's: 512 on the CPU (one tile over this image).
    let out = dir.path().join("one.png");
    let o = run("infer", dir.path(), &[], &out);
    assert!(String::from_utf8_lossy(&o.stderr).contains("(1 tiles"));
}
