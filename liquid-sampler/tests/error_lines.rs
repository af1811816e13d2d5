//! Every error is one clean line naming what it is about: no `Debug` text, no cause printed twice, and a
//! data file that is not a file is called what it is.

use liquid_sampler::*;
use std::error::Error as _;
use std::path::{Path, PathBuf};

fn assert_clean(e: &Error, names: &str) {
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "two lines: {msg}");
    for leak in [
        "Error {",
        "kind:",
        "Io(",
        "Semantic(",
        "Syntax(",
        "Some(",
        "\\\"",
    ] {
        assert!(!msg.contains(leak), "Debug text {leak:?} in: {msg}");
    }
    assert!(msg.contains(names), "{msg:?} does not name {names:?}");
    assert!(
        e.source().is_none(),
        "the cause is in the message already; a source() would print it twice: {msg}"
    );
}

fn dataset(dir: &Path) -> Manifest {
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    let ratio = Ratio {
        compressed: 0,
        raw: 1,
    };
    let mut w = DatasetWriter::create(dir, 0, ratio, formats).unwrap();
    let dims = Dims {
        width: 8,
        height: 8,
        channels: 3,
    };
    for id in 0..3 {
        w.add(id, 0, 0, &[id as u8; 192], dims).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn a_data_file_that_is_a_folder_is_not_called_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let m = dataset(tmp.path());
    let pack = tmp.path().join(&m.files[0].name);
    std::fs::remove_file(&pack).unwrap();
    std::fs::create_dir(&pack).unwrap();
    let e = Dataset::open(tmp.path()).unwrap_err();
    assert!(matches!(e, Error::NotAFile { .. }), "{e}");
    assert_clean(&e, &m.files[0].name);
    assert!(
        e.to_string().contains("folder") && !e.to_string().contains("truncated"),
        "{e}"
    );
    let e = liquid_sampler::direct::DirectFile::open(&pack)
        .err()
        .unwrap();
    assert!(matches!(e, Error::NotAFile { .. }), "{e}");
}

#[test]
fn broken_manifests_are_described_in_words() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path());
    let path = tmp.path().join("manifest.cbor");
    let bytes = std::fs::read(&path).unwrap();
    // Cut short: ciborium's own text would be `Io(Error { kind: UnexpectedEof, .. })`.
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = Dataset::open(tmp.path()).unwrap_err();
    assert!(matches!(e, Error::BadManifest { .. }), "{e}");
    assert_clean(&e, "manifest.cbor");
    // Not CBOR of the right shape.
    std::fs::write(&path, b"\xa1\x61x\x01").unwrap();
    let e = Dataset::open(tmp.path()).unwrap_err();
    assert_clean(&e, "manifest.cbor");
    // A folder.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let e = Dataset::open(tmp.path()).unwrap_err();
    assert!(e.to_string().contains("folder"), "{e}");
    assert_clean(&e, "manifest.cbor");
    // Missing: says what that means.
    std::fs::remove_dir(&path).unwrap();
    let e = Dataset::open(tmp.path()).unwrap_err();
    assert!(e.to_string().contains("not a Liquid dataset"), "{e}");
    assert_clean(&e, "manifest.cbor");
}

#[test]
fn every_variant_is_one_clean_line() {
    let p = PathBuf::from("/data/set/png-000.pack");
    let io = std::io::Error::from(std::io::ErrorKind::NotFound);
    let cases: Vec<(Error, &str)> = vec![
        (
            Error::Io {
                path: p.clone(),
                error: io,
            },
            "png-000.pack",
        ),
        (Error::MissingDataFile { path: p.clone() }, "png-000.pack"),
        (
            Error::NotAFile {
                path: p.clone(),
                reason: "not a regular file (a folder)".into(),
            },
            "png-000.pack",
        ),
        (
            Error::TruncatedDataFile {
                path: p.clone(),
                needed: 8192,
                actual: 4096,
            },
            "png-000.pack",
        ),
        (
            Error::ManifestMismatch {
                path: p.clone(),
                reason: "items 1 and 2 overlap".into(),
            },
            "png-000.pack",
        ),
        (
            Error::BadManifest {
                path: p.clone(),
                reason: "malformed CBOR at byte 3".into(),
            },
            "png-000.pack",
        ),
        (Error::EmptyDataset, "no items"),
        (
            Error::BudgetTooSmall {
                budget: 10,
                needed: 4096,
            },
            "4096",
        ),
        (
            Error::BadSetting("batch size must be at least 1".into()),
            "batch size",
        ),
        (
            Error::Decode {
                id: 7,
                format: "png".into(),
                reason: "bad header".into(),
            },
            "item 7",
        ),
        (
            Error::Source {
                path: p.clone(),
                reason: "no decoder".into(),
            },
            "png-000.pack",
        ),
        (Error::IoThreadsGone, "I/O threads"),
    ];
    for (e, names) in &cases {
        assert_clean(e, names);
    }
}
