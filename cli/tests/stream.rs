//! The `l3 stream`, `l3 convert` and `l3 demo` commands, run as a user would.

#[path = "../../loader/tests/common/mod.rs"]
mod common;

use common::fixture;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn l3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(args)
        .output()
        .expect("run l3")
}

fn ok(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "l3 failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn csv(path: &Path) -> (String, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_string();
    (
        header,
        lines
            .map(|l| l.split(',').map(String::from).collect())
            .collect(),
    )
}

#[test]
fn stream_writes_auditable_traces_for_a_folder() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let (trace, log) = (tmp.path().join("trace.csv"), tmp.path().join("batches.csv"));
    let text = ok(&l3(&[
        "stream",
        f.l3.to_str().unwrap(),
        "--batch",
        "5",
        "--epochs",
        "2",
        "--threads",
        "2",
        "--size",
        "64",
        "--trace",
        trace.to_str().unwrap(),
        "--batch-log",
        log.to_str().unwrap(),
        "--decode",
        "whole",
    ]));
    for needle in [
        "images/s",
        "MB/s",
        "stage utilisation",
        "consumer wait",
        "state: {\"epoch\":2,\"batch\":0,",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let (h, rows) = csv(&trace);
    assert_eq!(h, "epoch,batch,item,format,cached");
    let mut per_epoch: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in &rows {
        assert_eq!((r[3].as_str(), r[4].as_str()), ("l3", "0"));
        per_epoch
            .entry(r[0].clone())
            .or_default()
            .push(r[2].parse().unwrap());
    }
    assert_eq!(per_epoch.len(), 2);
    for items in per_epoch.values_mut() {
        items.sort();
        assert_eq!(*items, (0..18).collect::<Vec<u64>>());
    }
    let (h, rows) = csv(&log);
    assert_eq!(h, "epoch,batch,disk_items,disk_bytes,wait_ms");
    assert_eq!(rows.len(), 8);
    let items: usize = rows.iter().map(|r| r[2].parse::<usize>().unwrap()).sum();
    let bytes: u64 = rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert_eq!(items, 36);
    let on_disk: u64 = loader::image_files(&f.l3)
        .map(|l| l.files)
        .unwrap()
        .iter()
        .map(|(p, _)| std::fs::metadata(f.l3.join(p)).unwrap().len())
        .sum();
    assert_eq!(bytes, 2 * on_disk);
    // Decoding only the crops' patches (the default) reads a fraction of that: the header and offset table
    // once per file (kept for the second epoch), then only the patches under each 64x64 crop.
    let text = ok(&l3(&[
        "stream",
        f.l3.to_str().unwrap(),
        "--epochs",
        "2",
        "--size",
        "64",
        "--batch-log",
        log.to_str().unwrap(),
    ]));
    let (_, rows) = csv(&log);
    let region: u64 = rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    let spec = loader::SampleSpec {
        height: 64,
        width: 64,
        ..loader::SampleSpec::default()
    };
    let mut want = 0u64;
    for (p, _) in loader::image_files(&f.l3).unwrap().files {
        let bytes = std::fs::read(f.l3.join(&p)).unwrap();
        let len = bytes.len() as u64;
        let index = l3_format::L3Index::read_from(len, |r| {
            let part = bytes[r.start as usize..r.end as usize].to_vec();
            want += part.len() as u64;
            Ok::<_, std::convert::Infallible>(part)
        })
        .unwrap();
        for epoch in 0..2 {
            let key = loader::ItemKey {
                seed: 0,
                epoch,
                index: 0,
            };
            let win = spec.window(index.width(), index.height(), &key);
            let ranges = index.region_ranges(win.src, 0).unwrap();
            want += ranges.iter().map(|r| r.end - r.start).sum::<u64>();
        }
    }
    assert_eq!(region, want);
    assert!(region < on_disk, "region reads {region} of {on_disk} bytes");
    assert!(
        text.contains(&format!("read: {region} bytes for 36 items")),
        "{text}"
    );
}

#[test]
fn stream_stops_and_resumes_from_the_printed_state() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], trace: &Path| {
        let mut args = vec![
            "stream",
            f.raw.to_str().unwrap(),
            "--batch",
            "4",
            "--epochs",
            "2",
            "--size",
            "32",
        ];
        args.extend_from_slice(&["--trace", trace.to_str().unwrap()]);
        args.extend_from_slice(extra);
        ok(&l3(&args))
    };
    let full = tmp.path().join("full.csv");
    run(&[], &full);
    let (a, b) = (tmp.path().join("a.csv"), tmp.path().join("b.csv"));
    let text = run(&["--max-batches", "7"], &a);
    let state = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("state: "))
        .unwrap()
        .to_string();
    run(&["--resume", &state], &b);
    let mut joined = csv(&a).1;
    joined.extend(csv(&b).1);
    assert_eq!(joined, csv(&full).1);
}

/// `l3 stream` in `dir` over `dataset` (4 per batch, 32 pixels), with `extra` flags.
fn stream_in(dir: &Path, dataset: &str, extra: &[&str]) -> Output {
    let mut args = vec!["stream", dataset, "--batch", "4", "--size", "32"];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .current_dir(dir)
        .args(&args)
        .output()
        .expect("run l3")
}

/// A state names its dataset: another one of the same length is refused, naming it, while the same
/// folder spelled `./a`, `a/` or absolute resumes; a state from before states named their dataset
/// resumes with a warning.
#[test]
fn stream_resumes_only_on_the_dataset_the_state_names() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    common::copy_tree(&f.raw, &a);
    common::copy_tree(&f.raw, &b);
    let first = loader::image_files(&b).unwrap().files[0].0.clone();
    let moved = first.with_file_name(format!(
        "zz-{}",
        first.file_name().unwrap().to_string_lossy()
    ));
    std::fs::rename(b.join(&first), b.join(moved)).unwrap();
    let state = tmp.path().join("state.json");
    let state_arg = state.to_str().unwrap();
    ok(&stream_in(
        tmp.path(),
        "a",
        &["--max-batches", "1", "--state-file", state_arg],
    ));
    let out = stream_in(tmp.path(), "b", &["--resume", state_arg]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("another dataset"), "{err}");
    assert_eq!(err.matches("cannot resume").count(), 1, "{err}");
    for spelling in ["./a", "a/", "b/../a", a.to_str().unwrap()] {
        ok(&stream_in(tmp.path(), spelling, &["--resume", state_arg]));
    }
    let text = std::fs::read_to_string(&state).unwrap();
    let start = text.find(",\"fingerprint\":").unwrap();
    let end = start + text[start..].find("\",\"version\"").unwrap() + 1;
    let older =
        format!("{}{}", &text[..start], &text[end..]).replace("\"version\":3", "\"version\":2");
    let out = stream_in(tmp.path(), "a", &["--resume", older.trim()]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("names no dataset"), "{err}");
}

/// A file that is no state (`/etc/passwd`, a large log) is refused in one bounded line, not printed.
#[test]
fn stream_resume_from_a_file_that_is_no_state_is_refused_in_a_bounded_line() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("log.txt");
    std::fs::write(&big, "root:x:0:0:root:/root:/bin/bash\n".repeat(20_000)).unwrap();
    let mut files = vec![big.to_str().unwrap().to_string()];
    if Path::new("/etc/passwd").is_file() {
        files.push("/etc/passwd".into());
    }
    for file in &files {
        let out = stream_in(tmp.path(), f.raw.to_str().unwrap(), &["--resume", file]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("unreadable state"), "{err}");
        assert!(err.len() < 1000, "{file}: {} bytes: {err}", err.len());
    }
}

#[test]
fn stream_names_a_truncated_file_in_one_line() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("photo").join("Dune.jpg");
    std::fs::create_dir_all(victim.parent().unwrap()).unwrap();
    let bytes = std::fs::read(f.mixed.join("photo").join("Dune.jpg")).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 3]).unwrap();
    std::fs::copy(
        f.mixed.join("photo").join("Wood.jpg"),
        tmp.path().join("photo").join("Wood.jpg"),
    )
    .unwrap();
    let out = l3(&["stream", tmp.path().to_str().unwrap(), "--batch", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(victim.to_str().unwrap()), "{err}");
    // Opting in to skipping completes the epoch and counts it.
    let text = ok(&l3(&[
        "stream",
        tmp.path().to_str().unwrap(),
        "--batch",
        "2",
        "--skip-errors",
    ]));
    assert!(text.contains("1 images (1 skipped)"), "{text}");
}

#[test]
fn a_bit_flipped_in_the_patches_a_crop_reads_fails_the_stream_naming_the_file() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("src"), tmp.path().join("l3"));
    std::fs::create_dir_all(src.join("photo")).unwrap();
    for name in ["Dune.jpg", "Wood.jpg"] {
        std::fs::copy(
            f.mixed.join("photo").join(name),
            src.join("photo").join(name),
        )
        .unwrap();
    }
    // The format nothing asked for.
    ok(&l3(&[
        "convert",
        "--to",
        "l3",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
    ]));
    let victim = out.join("photo").join("Dune.l3");
    let mut bytes = std::fs::read(&victim).unwrap();
    let index = l3_format::L3Index::parse(&bytes, bytes.len() as u64).unwrap();
    assert_eq!(
        (index.version(), index.profile()),
        (
            l3_format::DEFAULT_FORMAT.version(),
            l3_format::DEFAULT_FORMAT.profile()
        )
    );
    // One bit of the patch under the image's centre, which every centre crop reads.
    let (w, h) = (index.width(), index.height());
    let ranges = index
        .region_ranges(l3_format::Rect::new(w / 2, h / 2, 1, 1), 0)
        .unwrap();
    assert!(ranges.iter().all(|r| r.start >= index.data_offset()));
    let mut rng = stdx::SplitMix64::new(4);
    let r = &ranges[0];
    let pos = (r.start + rng.below(r.end - r.start)) as usize;
    bytes[pos] ^= 1 << rng.below(8);
    std::fs::write(&victim, &bytes).unwrap();

    for decode in ["region", "whole"] {
        let run = l3(&[
            "stream",
            out.to_str().unwrap(),
            "--batch",
            "2",
            "--size",
            "64",
            "--decode",
            decode,
        ]);
        assert!(
            !run.status.success(),
            "--decode {decode} streamed a damaged file"
        );
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(victim.to_str().unwrap()), "{err}");
    }
    // Opting in to skipping delivers the intact image and counts the damaged one.
    let run = l3(&[
        "stream",
        out.to_str().unwrap(),
        "--batch",
        "2",
        "--size",
        "64",
        "--skip-errors",
    ]);
    let text = ok(&run);
    assert!(text.contains("1 images (1 skipped)"), "{text}");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains(victim.to_str().unwrap()), "{err}");
}

#[test]
fn convert_writes_every_file_and_resumes() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l3");
    let text = ok(&l3(&[
        "convert",
        "--to",
        "l3",
        f.mixed.to_str().unwrap(),
        out.to_str().unwrap(),
    ]));
    assert!(
        text.contains("converted 18 files (0 already done)"),
        "{text}"
    );
    // Same sub-folders, one .l3 per image, each decoding to the source's pixels.
    for (rel, _) in loader::image_files(&f.mixed).unwrap().files {
        let l3 = loader::import(&out.join(&rel).with_extension("l3"), &Default::default()).unwrap();
        let src = loader::import(&f.mixed.join(&rel), &Default::default()).unwrap();
        assert_eq!(l3, src, "{}", rel.display());
    }
    // A lost output is redone, the rest skipped; no temporary file is left behind.
    let gone = out.join("photo").join("Dune.l3");
    std::fs::remove_file(&gone).unwrap();
    let text = ok(&l3(&[
        "convert",
        "--to",
        "l3",
        f.mixed.to_str().unwrap(),
        out.to_str().unwrap(),
    ]));
    assert!(
        text.contains("converted 1 files (17 already done)"),
        "{text}"
    );
    assert!(gone.exists());
    let leftovers = walk(&out)
        .into_iter()
        .filter(|p| {
            Path::new(p)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .contains(".tmp-")
        })
        .count();
    assert_eq!(leftovers, 0);

    let pcr = tmp.path().join("pcr");
    let text = ok(&l3(&[
        "convert",
        "--to",
        "pcr",
        f.mixed.join("photo").to_str().unwrap(),
        pcr.to_str().unwrap(),
    ]));
    assert!(text.contains("PCR dataset"), "{text}");
    let text = ok(&l3(&[
        "stream",
        pcr.to_str().unwrap(),
        "--group",
        "3",
        "--size",
        "32",
        "--batch",
        "4",
    ]));
    assert!(text.contains("scan group 3 of 10"), "{text}");
    assert!(
        !l3(&[
            "convert",
            "--to",
            "webp",
            f.mixed.to_str().unwrap(),
            tmp.path().to_str().unwrap()
        ])
        .status
        .success()
    );
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

#[test]
fn gpu_decoding_without_a_usable_gpu_is_a_clear_error() {
    let f = fixture();
    // PNG/JPEG datasets are never GPU-decodable.
    let out = l3(&["stream", f.mixed.to_str().unwrap(), "--gpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU decoding failed (item 0, "), "{err}");
    assert!(err.contains("reads L3 files only"), "{err}");
    if !matches!(l3_cuda::device_count(), Ok(n) if n > 0) {
        // No silent CPU decoding: the run fails, naming the cause.
        let out = l3(&["stream", f.l3.to_str().unwrap(), "--gpu"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("l3: error: "), "{err}");
        assert!(err.contains("GPU decoding failed (device 0): "), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn demo_runs_end_to_end_on_a_small_generated_set() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let text = ok(&l3(&[
        "demo",
        "--images",
        "4",
        "--work",
        work.to_str().unwrap(),
    ]));
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("format"))
        .take(12)
        .collect();
    assert!(table[0].contains("speed-up vs PNG"), "{text}");
    assert!(table[0].contains("images/s @200MB/s"), "{text}");
    for name in [
        "PNG",
        "L3",
        "L3, crop patches only",
        "raw (PPM)",
        "JPEG q90",
        "Liquid",
        "PCR k=1",
        "PCR k=5",
        "PCR k=10 (full)",
    ] {
        let row = table
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{text}"));
        // A measured row has numbers in every column (no placeholder dashes).
        assert!(!row.contains(" - "), "{row}");
    }
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("PNG") && l.contains(" 1.00x "))
    );
    // Bytes read per epoch (third column): crops of L3 read less than whole L3 files, and PCR's first scan
    // group less than all of them.
    let read = |name: &str| -> u64 {
        let row = table.iter().find(|l| l.starts_with(name)).unwrap();
        let cells: Vec<&str> = row[name.len()..].split_whitespace().collect();
        cells[1].parse().unwrap_or_else(|_| panic!("{row}"))
    };
    assert!(read("L3, crop patches only") < read("L3 "), "{text}");
    assert!(read("PCR k=1") < read("PCR k=10 (full)"), "{text}");
}

/// Traces and batch logs are written as batches are delivered: a run killed mid-epoch (SIGKILL, nothing
/// to clean up) or stopped by an error keeps a line for every batch it handed out, under the name asked
/// for, with no hidden temporary left beside it.
#[test]
fn traces_survive_a_kill_and_an_error() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let (trace, log) = (tmp.path().join("trace.csv"), tmp.path().join("batches.csv"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_l3"))
        .args([
            "stream",
            f.raw.to_str().unwrap(),
            "--batch",
            "2",
            "--size",
            "32",
            "--epochs",
            "1000",
            "--step-ms",
            "50",
            "--trace",
            trace.to_str().unwrap(),
            "--batch-log",
            log.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until a few batches are logged, then kill without warning.
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 4 {
        assert!(t0.elapsed().as_secs() < 60, "no batches logged");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (h, batches) = csv(&log);
    assert_eq!(h, "epoch,batch,disk_items,disk_bytes,wait_ms");
    assert!(batches.len() >= 3);
    let (h, items) = csv(&trace);
    assert_eq!(h, "epoch,batch,item,format,cached");
    // Every logged batch has its two items traced (a batch's lines go out together).
    assert!(
        items.len() >= 2 * batches.len(),
        "{} items for {} batches",
        items.len(),
        batches.len()
    );
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");

    // An error in the second batch: the first batch's lines stay.
    let bad = tmp.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    let files = loader::image_files(&f.raw).unwrap().files;
    for (i, (rel, _)) in files.iter().take(4).enumerate() {
        let dst = bad.join(format!("{i}.ppm"));
        std::fs::copy(f.raw.join(rel), &dst).unwrap();
        if i == 3 {
            std::fs::write(&dst, b"P6\n99999 99999\n255\n").unwrap();
        }
    }
    let out = l3(&[
        "stream",
        bad.to_str().unwrap(),
        "--batch",
        "2",
        "--size",
        "32",
        "--no-shuffle",
        "--prefetch",
        "1",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let (_, items) = csv(&trace);
    assert_eq!(
        items.iter().map(|r| r[2].as_str()).collect::<Vec<_>>(),
        ["0", "1"],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `convert` takes every image type the loader reads: a folder of WebP, TIFF, BMP and GIF files becomes
/// as many L3 files (lossless ones decode to the same pixels), none passed over.
#[test]
fn convert_takes_webp_tiff_bmp_and_gif() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    std::fs::create_dir(&src).unwrap();
    let rgb = image::RgbImage::from_fn(19, 11, |x, y| {
        image::Rgb([(x * 13) as u8, (y * 17) as u8, 99])
    });
    let img = image::DynamicImage::ImageRgb8(rgb.clone());
    for (name, fmt) in [
        ("a.webp", image::ImageFormat::WebP),
        ("b.tif", image::ImageFormat::Tiff),
        ("c.bmp", image::ImageFormat::Bmp),
        ("d.gif", image::ImageFormat::Gif),
    ] {
        img.save_with_format(src.join(name), fmt).unwrap();
    }
    ok(&l3(&[
        "convert",
        "--to",
        "l3",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
    ]));
    for stem in ["a", "b", "c", "d"] {
        let bytes = std::fs::read(out.join(stem).with_extension("l3")).unwrap();
        let file = l3_format::L3File::parse(&bytes).unwrap();
        assert_eq!((file.width(), file.height()), (19, 11), "{stem}");
        if stem != "d" {
            let mut px = vec![0u8; file.decoded_len()];
            file.decode_hwc(&mut px).unwrap();
            assert!(px == rgb.as_raw().as_slice(), "{stem}: pixels differ");
        }
    }
}

#[test]
fn the_shuffle_report_prints_each_statistic_beside_a_uniform_shuffle() {
    let dir = std::env::var_os("L3_CORPUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus")
        });
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_l3"))
            .arg("shuffle-report")
            .arg(&dir)
            .args(["--batch-size", "4", "--report-epochs", "4"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let value = |text: &str, name: &str, col: usize| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {text}"));
        line.split_whitespace().nth(col).unwrap().parse().unwrap()
    };
    let shuffled = run(&[]);
    for name in [
        "order_correlation",
        "position_spread",
        "neighbours_same_batch",
        "batch_span",
        "label_entropy_bits",
    ] {
        assert_eq!(
            value(&shuffled, name, 1),
            value(&shuffled, name, 2),
            "{name}: {shuffled}"
        );
    }
    let in_order = run(&["--no-shuffle"]);
    assert_eq!(value(&in_order, "order_correlation", 1), 1.0, "{in_order}");
    assert!(
        value(&in_order, "neighbours_same_batch", 1) > value(&in_order, "neighbours_same_batch", 2)
    );
}

#[test]
fn stream_delivers_masks_and_boxes_and_convert_keeps_16_bit_masks_png() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks, l3_masks) = (
        tmp.path().join("img"),
        tmp.path().join("gt"),
        tmp.path().join("gt-l3"),
    );
    std::fs::create_dir_all(images.join("a")).unwrap();
    std::fs::create_dir_all(masks.join("a")).unwrap();
    let mut coco = Vec::new();
    for i in 0..3u32 {
        image::RgbImage::from_fn(20 + i, 12, |x, y| image::Rgb([x as u8, y as u8, 9]))
            .save(images.join(format!("a/{i}_img.png")))
            .unwrap();
        image::GrayImage::from_fn(20 + i, 12, |x, _| image::Luma([(x % 7) as u8]))
            .save(masks.join(format!("a/{i}_gt.png")))
            .unwrap();
        coco.push(format!(r#"{{"id": {i}, "file_name": "a/{i}_img.png"}}"#));
    }
    let json = tmp.path().join("boxes.json");
    std::fs::write(
        &json,
        format!(
            r#"{{"images": [{}], "annotations": [{{"image_id": 1, "bbox": [2, 2, 8, 6], "category_id": 4}}]}}"#,
            coco.join(",")
        ),
    )
    .unwrap();
    let text = ok(&l3(&[
        "convert",
        "--masks",
        "--to",
        "l3",
        masks.to_str().unwrap(),
        l3_masks.to_str().unwrap(),
    ]));
    assert!(text.contains("converted 3 files"), "{text}");
    let text = ok(&l3(&[
        "stream",
        images.to_str().unwrap(),
        "--size",
        "16",
        "--batch",
        "2",
        "--masks",
        l3_masks.to_str().unwrap(),
        "--image-suffix",
        "_img",
        "--mask-suffix",
        "_gt",
        "--boxes",
        json.to_str().unwrap(),
    ]));
    assert!(
        text.contains("targets: 3 masks of 16x16 uint8, 1 boxes"),
        "{text}"
    );
    // A 16-bit mask stays PNG, and the tool says so.
    image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::from_fn(5, 4, |x, _| {
        image::Luma([x as u16 * 999])
    })
    .save(masks.join("wide.png"))
    .unwrap();
    let out = l3(&[
        "convert",
        "--masks",
        "--to",
        "l3",
        masks.to_str().unwrap(),
        tmp.path().join("gt2").to_str().unwrap(),
    ]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 16-bit masks stay PNG"), "{err}");
    assert!(tmp.path().join("gt2/wide.png").is_file());
    // A missing mask stops the stream naming both files.
    std::fs::remove_file(l3_masks.join("a/2_gt.l3")).unwrap();
    let out = l3(&[
        "stream",
        images.to_str().unwrap(),
        "--masks",
        l3_masks.to_str().unwrap(),
        "--image-suffix",
        "_img",
        "--mask-suffix",
        "_gt",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("2_img.png") && err.contains("2_gt"),
        "{err}"
    );
}
