//! Builds that must not step on each other or leave half a dataset: one build per folder, kill -9 at any
//! point (re-running gives exactly the uninterrupted dataset; no reader ever accepts a partial one), a
//! failed build removes what it created, image names stay distinct (or the build refuses, naming both
//! inputs), and corrupt JPEG data is refused unless allowed.

mod common;

use jpeg_encoder::ColorType;
use pcr::{BuildOptions, Dataset, Decoder, Error, Input};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::Instant;

fn options(per_record: usize) -> BuildOptions {
    BuildOptions {
        images_per_record: per_record,
        threads: 2,
        ..BuildOptions::default()
    }
}

fn corpus(names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| common::corpus_dir().join(n)).collect()
}

/// The files a reader sees: every visible file's bytes. Panics on temporaries.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            stdx::fs::is_temp_name(&name).is_none() && !name.ends_with(".tmp"),
            "temporary {name} left in {}",
            dir.display()
        );
        if name == stdx::fs::LOCK_NAME {
            continue;
        }
        out.insert(name, std::fs::read(e.path()).unwrap());
    }
    out
}

fn assert_one_line(e: &Error) {
    let msg = e.to_string();
    assert!(!msg.contains('\n') && !msg.contains("Error {"), "{msg}");
}

// ---------------------------------------------------------------------------------------------------
// One build per folder.

#[test]
fn a_second_build_into_the_same_folder_fails_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    let first_inputs: Vec<Input> = corpus(&["Dune.jpg", "Wood.jpg"])
        .into_iter()
        .map(Input::new)
        .collect();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some((started_tx, go_rx)));
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            // Holds the build mid-way (after its first image) until the second build has been refused.
            let progress = |_: &Path| {
                if let Some((started, go)) = gate.lock().unwrap().take() {
                    started.send(()).unwrap();
                    go.recv().unwrap();
                }
            };
            pcr::build(&out, &first_inputs, &options(1), &progress)
        });
        started_rx.recv().unwrap();
        let second = vec![Input::new(common::corpus_dir().join("Storm.jpg"))];
        let e = pcr::build(&out, &second, &options(1), &|_| {}).unwrap_err();
        match &e {
            Error::Io { path, error } => {
                assert_eq!(path, &out);
                assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
            }
            other => panic!("{other}"),
        }
        assert!(
            e.to_string().contains(&*out.to_string_lossy())
                && e.to_string().contains("writing this folder"),
            "{e}"
        );
        assert_one_line(&e);
        go_tx.send(()).unwrap();
        let summary = first.join().unwrap().unwrap();
        assert_eq!(summary.images, 2);
    });
    // The first build's dataset is whole.
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.images(), 2);
    for r in 0..ds.records() {
        ds.read_record(r, ds.groups()).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------------
// kill -9.

const CHILD_OUT: &str = "PCR_CRASH_OUT";

fn crash_inputs(labelled: &str) -> Vec<Input> {
    corpus(&[
        "Dune.jpg",
        "Wood.jpg",
        "ColdRipple.jpg",
        "FallenLeaf.jpg",
        "Storm.jpg",
    ])
    .into_iter()
    .map(|p| {
        let mut i = Input::new(p);
        i.label = Some(labelled.into());
        i
    })
    .collect()
}

/// A reader between the kill and the re-run: an error, or exactly one complete state (its name returned).
fn check_reader(out: &Path, states: &[(&'static str, &BTreeMap<String, Vec<u8>>)]) -> &'static str {
    let ds = match Dataset::open(out) {
        Err(e) => {
            assert_one_line(&e);
            return "error";
        }
        Ok(ds) => ds,
    };
    let index = std::fs::read(out.join(pcr::INDEX_FILE)).unwrap();
    let (name, state) = states
        .iter()
        .find(|s| s.1.get(pcr::INDEX_FILE) == Some(&index))
        .expect("an index no complete build wrote");
    for r in 0..ds.records() {
        let rec = ds.read_record(r, ds.groups()).unwrap();
        let file = &ds.index().records[r].file;
        let bytes = std::fs::read(out.join(file)).unwrap();
        assert!(state.get(file) == Some(&bytes), "{file} is not its build's");
        for j in 0..rec.len() {
            rec.decode(j, Decoder::Libjpeg).unwrap();
        }
    }
    name
}

#[test]
fn kill_nine_during_a_build() {
    if let Some(out) = std::env::var_os(CHILD_OUT) {
        // The child: the whole build, killed by the parent at some point.
        pcr::build(Path::new(&out), &crash_inputs("new"), &options(1), &|_| {}).unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    pcr::build(&reference, &crash_inputs("new"), &options(1), &|_| {}).unwrap();
    let want = snapshot(&reference);
    let out = tmp.path().join("out");
    let restore_previous = || {
        let mut previous = crash_inputs("previous");
        previous.truncate(3);
        pcr::build(&out, &previous, &options(2), &|_| {}).unwrap();
        snapshot(&out)
    };
    let previous = restore_previous();

    let spawn = |dir: &Path| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_nine_during_a_build", "--nocapture"])
            .env(CHILD_OUT, dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // An uninterrupted child builds the same bytes, and says how long the job takes.
    let timing = tmp.path().join("timing");
    let t0 = Instant::now();
    assert!(spawn(&timing).wait().unwrap().success());
    let full = t0.elapsed();
    assert_eq!(snapshot(&timing), want, "builds are reproducible");

    // Kill points spread over start, middle and end (and just past it), from a seeded stream.
    let mut rng = stdx::SplitMix64::new(0x9C12);
    let buckets = [(0.0, 0.1), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.85, 1.05)];
    let mut seen = Vec::new();
    for (lo, hi) in buckets {
        let at = full.mul_f64(lo + (hi - lo) * rng.unit_f64());
        let mut child = spawn(&out);
        std::thread::sleep(at);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        seen.push(check_reader(
            &out,
            &[("previous", &previous), ("new", &want)],
        ));
        // Re-running gives exactly the uninterrupted dataset, temporaries gone.
        pcr::build(&out, &crash_inputs("new"), &options(1), &|_| {}).unwrap();
        assert_eq!(snapshot(&out), want, "after a kill at {at:?}");
        assert_eq!(restore_previous(), previous);
    }
    println!("kill points over {full:?}: readers saw {seen:?}");
}

// ---------------------------------------------------------------------------------------------------
// Failed builds.

#[test]
fn a_failed_build_removes_what_it_created() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path();
    let good = |n: &str| common::write(src, n, &common::small_jpeg(24, 16, ColorType::Rgb, None));
    let png = common::write(
        src,
        "p.jpg",
        &std::fs::read(common::corpus_dir().join("Gulp-rgba.png")).unwrap(),
    );
    // Every input invalid: no output folder.
    let out = src.join("out");
    let e = pcr::build(&out, &[Input::new(&png)], &options(1), &|_| {}).unwrap_err();
    assert!(matches!(e, Error::NotJpeg { .. }), "{e}");
    assert!(!out.exists(), "an empty output folder was left");
    // Records already written when a later input fails: removed, with the folder.
    let inputs: Vec<Input> = [good("a.jpg"), good("b.jpg"), png.clone()]
        .into_iter()
        .map(Input::new)
        .collect();
    let e = pcr::build(&out, &inputs, &options(1), &|_| {}).unwrap_err();
    assert!(matches!(e, Error::NotJpeg { .. }), "{e}");
    assert!(!out.exists(), "records of a failed build were left");
    // A folder that was there stays, with what it held, and without the failed build's records.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    pcr::build(&out, &inputs, &options(1), &|_| {}).unwrap_err();
    let left: Vec<String> = snapshot(&out).into_keys().collect();
    assert_eq!(left, ["notes.txt"]);
    // A missing input fails before the folder is touched.
    let missing = src.join("missing");
    let e = pcr::build(
        &missing,
        &[Input::new(src.join("nope.jpg"))],
        &options(1),
        &|_| {},
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("nope.jpg"),
        "{e}"
    );
    assert!(!missing.exists());
}

// ---------------------------------------------------------------------------------------------------
// Names.

#[test]
fn files_with_one_name_in_two_folders_keep_their_paths_as_names() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for (dir, w) in [("a", 24), ("b", 32)] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
        common::write(
            &src.join(dir),
            "x.jpg",
            &common::small_jpeg(w, 16, ColorType::Rgb, None),
        );
    }
    std::fs::write(src.join("notes.txt"), b"not an image").unwrap();
    let inputs = pcr::find_inputs(&[&src]).unwrap();
    let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["a/x.jpg", "b/x.jpg"]);
    // Labels match by the name in the dataset too.
    let labels = pcr::Labels::parse(Path::new("l.csv"), b"a/x.jpg,cat\nb/x.jpg,dog\n").unwrap();
    let inputs = labels.apply(inputs).unwrap();
    let out = tmp.path().join("ds");
    pcr::build(&out, &inputs, &options(8), &|_| {}).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let rec = ds.read_record(0, ds.groups()).unwrap();
    let got: Vec<(&str, &str, Option<&str>, u32)> = rec
        .items()
        .iter()
        .map(|i| (i.name.as_str(), i.stem(), i.label.as_deref(), i.width))
        .collect();
    assert_eq!(
        got,
        [
            ("a/x.jpg", "a/x", Some("cat"), 24),
            ("b/x.jpg", "b/x", Some("dog"), 32)
        ]
    );
}

#[test]
fn two_inputs_with_one_name_are_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for dir in ["a", "b"] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
        common::write(
            &src.join(dir),
            "x.jpg",
            &common::small_jpeg(16, 16, ColorType::Rgb, None),
        );
    }
    let (a, b) = (src.join("a/x.jpg"), src.join("b/x.jpg"));
    let out = tmp.path().join("ds");
    let refused = |inputs: Vec<Input>, why: &str| {
        let e = pcr::build(&out, &inputs, &options(8), &|_| {}).unwrap_err();
        let Error::DuplicateInput { first, second, .. } = &e else {
            panic!("{e}");
        };
        let msg = e.to_string();
        assert!(
            msg.contains(&*first.to_string_lossy())
                && msg.contains(&*second.to_string_lossy())
                && msg.contains(why),
            "{msg}"
        );
        assert_one_line(&e);
        assert!(!out.exists(), "nothing is written for refused inputs");
    };
    // One file given twice.
    refused(vec![Input::new(&a), Input::new(&a)], "the same file");
    // A folder and a file inside it: distinct names, one file.
    let mut inputs = pcr::find_inputs(&[&src]).unwrap();
    inputs.push(Input::new(&a));
    refused(inputs, "the same file");
    // Two files given directly share their file name.
    refused(
        vec![Input::new(&a), Input::new(&b)],
        "both would be named \"x.jpg\"",
    );
    // A name that would leave a reader's output folder.
    let mut evil = Input::new(&a);
    evil.name = "../x.jpg".into();
    let e = pcr::build(&out, &[evil], &options(8), &|_| {}).unwrap_err();
    assert!(
        matches!(e, Error::Options(_)) && e.to_string().contains("../x.jpg"),
        "{e}"
    );
}

#[test]
fn finding_inputs_never_blocks_on_a_fifo() {
    let tmp = tempfile::tempdir().unwrap();
    common::write(
        tmp.path(),
        "ok.jpg",
        &common::small_jpeg(16, 16, ColorType::Rgb, None),
    );
    let fifo = tmp.path().join("pipe.jpg");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = pcr::find_inputs(&[tmp.path()]).unwrap_err();
    assert!(
        e.to_string().contains("pipe.jpg") && e.to_string().contains("FIFO"),
        "{e}"
    );
    // Given directly, the build refuses it without opening it for a blocking read.
    let out = tmp.path().join("ds");
    let e = pcr::build(&out, &[Input::new(&fifo)], &options(1), &|_| {}).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    let e = pcr::find_inputs(&[tmp.path().join("ds-missing")]).map(|v| v.len());
    assert_eq!(
        e.unwrap(),
        1,
        "a missing path is an input the build reports"
    );
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = pcr::find_inputs(&[&empty]).unwrap_err();
    assert!(e.to_string().contains("no .jpg/.jpeg files"), "{e}");
}

// ---------------------------------------------------------------------------------------------------
// Corrupt inputs.

/// A corpus JPEG with one byte of its entropy-coded data (past the middle of the file) changed to 0xFF
/// where the next byte makes that a restart marker the stream has no place for. (Most single-byte changes
/// inside Huffman data decode to other coefficients without a word from libjpeg; JPEG carries no checksum,
/// so those cannot be caught.)
fn byte_flipped(bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let at = (b.len() / 2..b.len() - 2)
        .find(|&i| b[i] != 0xFF && (0xD0..=0xD7).contains(&b[i + 1]))
        .unwrap();
    b[at] = 0xFF;
    b
}

#[test]
fn corrupt_jpeg_data_is_an_error_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let original = std::fs::read(common::corpus_dir().join("Wood.jpg")).unwrap();
    let truncated = common::write(
        tmp.path(),
        "truncated.jpg",
        &original[..original.len() * 3 / 5],
    );
    let flipped = common::write(tmp.path(), "flipped.jpg", &byte_flipped(&original));
    let good = common::corpus_dir().join("Dune.jpg");
    for (bad, says) in [
        (&truncated, "Premature end"),
        (&flipped, "premature end of data segment"),
    ] {
        let out = tmp.path().join("ds");
        let inputs = [Input::new(&good), Input::new(bad)];
        let e = pcr::build(&out, &inputs, &options(8), &|_| {}).unwrap_err();
        assert!(matches!(e, Error::CorruptJpeg { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&*bad.to_string_lossy()) && msg.contains(says),
            "{msg}"
        );
        assert_one_line(&e);
        assert!(!out.exists());
        // Opted in: converted, with libjpeg's warnings in the summary.
        let allowed = BuildOptions {
            allow_corrupt: true,
            ..options(8)
        };
        let summary = pcr::build(&out, &inputs, &allowed, &|_| {}).unwrap();
        assert_eq!(summary.images, 2);
        assert!(
            summary
                .warnings
                .iter()
                .any(|(p, w)| p == bad && w.contains(says)),
            "{:?}",
            summary.warnings
        );
        let ds = Dataset::open(&out).unwrap();
        ds.read_record(0, ds.groups()).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
    }
}
