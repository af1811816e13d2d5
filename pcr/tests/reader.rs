//! The one validated read path, at record granularity: bytes fetched by the caller go through
//! `Dataset::verify_prefix`, which runs every check `read_record` runs; one test per corruption (record
//! magic, header checksum, names, exact length, unsafe or repeated names in the index); every error one
//! clean line.

mod common;

use jpeg_encoder::ColorType;
use pcr::{BuildOptions, Dataset, Decoder, Error, Index, Input};
use std::error::Error as _;
use std::path::{Path, PathBuf};

/// Three small images (colour, grayscale, colour with EXIF orientation 6), labelled, in one record.
fn dataset() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for (name, bytes, label) in [
        (
            "a.jpg",
            common::small_jpeg(40, 24, ColorType::Rgb, None),
            "cat",
        ),
        (
            "g.jpg",
            common::small_jpeg(33, 17, ColorType::Luma, None),
            "dog",
        ),
        (
            "r.jpg",
            common::small_jpeg(24, 16, ColorType::Rgb, Some(6)),
            "cat",
        ),
    ] {
        let mut i = Input::new(common::write(tmp.path(), name, &bytes));
        i.label = Some(label.into());
        inputs.push(i);
    }
    let out = tmp.path().join("ds");
    let options = BuildOptions {
        images_per_record: 8,
        ..BuildOptions::default()
    };
    pcr::build(&out, &inputs, &options, &|_| {}).unwrap();
    (tmp, out)
}

fn record(out: &Path) -> PathBuf {
    out.join(pcr::record_file_name(0))
}

/// Reads the index, lets `edit` change it, writes it back with a valid checksum.
fn rewrite_index(out: &Path, edit: impl FnOnce(&mut Index)) {
    let path = out.join(pcr::INDEX_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mut index: Index = ciborium::from_reader(&bytes[12..]).unwrap();
    edit(&mut index);
    let mut payload = Vec::new();
    ciborium::into_writer(&index, &mut payload).unwrap();
    let mut out_bytes = b"PCRINDX1".to_vec();
    out_bytes.extend(crc32fast::hash(&payload).to_le_bytes());
    out_bytes.extend(payload);
    std::fs::write(&path, out_bytes).unwrap();
}

fn assert_clean(e: &Error) {
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "two lines: {msg}");
    for leak in [
        "Error {",
        "kind:",
        "Io(",
        "Semantic(",
        "Syntax(",
        "Format(",
        "\\\"",
    ] {
        assert!(!msg.contains(leak), "Debug text {leak:?} in: {msg}");
    }
    assert!(e.source().is_none(), "the cause would print twice: {msg}");
}

#[test]
fn prefixes_fetched_elsewhere_verify_like_read_record() {
    let (_tmp, out) = dataset();
    let ds = Dataset::open(&out).unwrap();
    let file = std::fs::read(record(&out)).unwrap();
    for k in 1..=ds.groups() {
        let range = ds.record_range(0, k).unwrap();
        assert_eq!(range.start, 0);
        let bytes = file[..range.end as usize].to_vec();
        let fetched = ds.verify_prefix(0, k, file.len() as u64, bytes).unwrap();
        let read = ds.read_record(0, k).unwrap();
        assert_eq!(fetched.bytes_read(), read.bytes_read());
        for j in 0..read.len() {
            assert_eq!(fetched.jpeg(j).unwrap(), read.jpeg(j).unwrap());
        }
    }
    // Labels and EXIF orientation per image come with the verified prefix.
    let rec = ds.read_record(0, 1).unwrap();
    let seen: Vec<(&str, Option<&str>, u8)> = rec
        .items()
        .iter()
        .map(|i| (i.name.as_str(), i.label.as_deref(), i.orientation))
        .collect();
    assert_eq!(
        seen,
        [
            ("a.jpg", Some("cat"), 1),
            ("g.jpg", Some("dog"), 1),
            ("r.jpg", Some("cat"), 6)
        ]
    );
    let img = rec.decode(2, Decoder::Libjpeg).unwrap().oriented(6);
    assert_eq!((img.width, img.height), (16, 24));
    // An index fetched elsewhere opens with the same checks.
    let index = std::fs::read(out.join(pcr::INDEX_FILE)).unwrap();
    let remote = Dataset::from_index_bytes("s3://bucket/ds", &index).unwrap();
    assert_eq!(remote.index(), ds.index());
    assert_eq!(
        remote.record_path(0).unwrap(),
        Path::new("s3://bucket/ds/record-00000.pcr")
    );
    let e = Dataset::from_index_bytes("s3://bucket/ds", &index[..index.len() - 1]).unwrap_err();
    assert!(matches!(e, Error::CorruptIndex { .. }), "{e}");
    assert!(e.to_string().contains("s3://bucket/ds"), "{e}");
    assert_clean(&e);
}

#[test]
fn record_magic_overwritten_is_refused() {
    let (_tmp, out) = dataset();
    let ds = Dataset::open(&out).unwrap();
    let mut file = std::fs::read(record(&out)).unwrap();
    file[0] = b'X';
    std::fs::write(record(&out), &file).unwrap();
    for k in 1..=ds.groups() {
        let e = ds.read_record(0, k).unwrap_err();
        assert!(
            matches!(e, Error::CorruptRecord { ref reason, .. } if reason.contains("magic")),
            "{e}"
        );
        assert!(e.to_string().contains("record-00000.pcr"), "{e}");
        assert_clean(&e);
        let end = ds.record_range(0, k).unwrap().end as usize;
        let e = ds
            .verify_prefix(0, k, file.len() as u64, file[..end].to_vec())
            .unwrap_err();
        assert!(matches!(e, Error::CorruptRecord { .. }), "{e}");
    }
    assert!(ds.read_items(0).is_err());
}

#[test]
fn record_header_checksum_is_checked() {
    let (_tmp, out) = dataset();
    let ds = Dataset::open(&out).unwrap();
    let original = std::fs::read(record(&out)).unwrap();
    // A byte of the CBOR header, and the stored CRC itself.
    for at in [20, 9] {
        let mut file = original.clone();
        file[at] ^= 0x04;
        std::fs::write(record(&out), &file).unwrap();
        let e = ds.read_record(0, 1).unwrap_err();
        assert!(
            matches!(e, Error::CorruptRecord { ref reason, .. } if reason.contains("checksum")),
            "byte {at}: {e}"
        );
        assert_clean(&e);
        assert!(ds.read_items(0).is_err());
    }
    // The header length field: the header no longer parses where the index says.
    let mut file = original.clone();
    file[4] ^= 0x01;
    std::fs::write(record(&out), &file).unwrap();
    assert!(ds.read_record(0, 1).is_err());
}

#[test]
fn names_must_match_the_index() {
    let (_tmp, out) = dataset();
    rewrite_index(&out, |index| {
        index.records[0].images[1].name = "other.jpg".into()
    });
    let ds = Dataset::open(&out).unwrap();
    let e = ds.read_record(0, 1).unwrap_err();
    assert!(
        matches!(e, Error::IndexMismatch { ref reason, .. } if reason.contains("other.jpg")),
        "{e}"
    );
    assert_clean(&e);
}

#[test]
fn unsafe_or_repeated_names_in_the_index_are_refused_at_open() {
    for bad in [
        "../evil.jpg",
        "/etc/passwd.jpg",
        "a//b.jpg",
        "",
        "a/./b.jpg",
        "x\n.jpg",
    ] {
        let (_tmp, out) = dataset();
        rewrite_index(&out, |index| index.records[0].images[0].name = bad.into());
        let e = Dataset::open(&out).unwrap_err();
        assert!(matches!(e, Error::CorruptIndex { .. }), "{bad:?}: {e}");
        assert_clean(&e);
    }
    let (_tmp, out) = dataset();
    rewrite_index(&out, |index| {
        index.records[0].images[1].name = "a.jpg".into()
    });
    let e = Dataset::open(&out).unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
}

#[test]
fn the_record_file_must_have_exactly_the_indexed_length() {
    let (_tmp, out) = dataset();
    let ds = Dataset::open(&out).unwrap();
    let original = std::fs::read(record(&out)).unwrap();
    let len = original.len() as u64;
    // Longer.
    let mut longer = original.clone();
    longer.push(0);
    std::fs::write(record(&out), &longer).unwrap();
    for k in [1, ds.groups()] {
        let e = ds.read_record(0, k).unwrap_err();
        assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
        assert_clean(&e);
    }
    // Shorter, even past the prefix read.
    std::fs::write(record(&out), &original[..original.len() - 1]).unwrap();
    let e = ds.read_record(0, 1).unwrap_err();
    assert!(matches!(e, Error::TruncatedRecord { .. }), "{e}");
    // The same through verify_prefix: the caller's file length, and the bytes it fetched.
    let end = ds.record_range(0, 2).unwrap().end as usize;
    let prefix = original[..end].to_vec();
    assert!(matches!(
        ds.verify_prefix(0, 2, len + 1, prefix.clone()),
        Err(Error::IndexMismatch { .. })
    ));
    assert!(matches!(
        ds.verify_prefix(0, 2, len - 1, prefix.clone()),
        Err(Error::TruncatedRecord { .. })
    ));
    assert!(matches!(
        ds.verify_prefix(0, 2, len, prefix[..end - 1].to_vec()),
        Err(Error::TruncatedRecord { .. })
    ));
    assert!(matches!(
        ds.verify_prefix(0, 1, len, prefix.clone()),
        Err(Error::TruncatedRecord { .. } | Error::CorruptRecord { .. })
    ));
    assert!(matches!(
        ds.verify_prefix(1, 2, len, prefix.clone()),
        Err(Error::RecordOutOfRange { .. })
    ));
    assert!(matches!(
        ds.verify_prefix(0, 11, len, prefix),
        Err(Error::GroupOutOfRange { .. })
    ));
}

#[test]
fn folders_where_files_belong_are_named_for_what_they_are() {
    let (_tmp, out) = dataset();
    let ds = Dataset::open(&out).unwrap();
    std::fs::remove_file(record(&out)).unwrap();
    let e = ds.read_record(0, 1).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("record-00000.pcr"),
        "{e}"
    );
    std::fs::create_dir(record(&out)).unwrap();
    let e = ds.read_record(0, 1).unwrap_err();
    assert!(e.to_string().contains("folder"), "{e}");
    assert_clean(&e);
    let index = out.join(pcr::INDEX_FILE);
    std::fs::remove_file(&index).unwrap();
    let e = Dataset::open(&out).unwrap_err();
    assert!(matches!(e, Error::NotADataset { .. }), "{e}");
    assert_clean(&e);
    std::fs::create_dir(&index).unwrap();
    let e = Dataset::open(&out).unwrap_err();
    assert!(e.to_string().contains("folder"), "{e}");
    assert_clean(&e);
}

#[test]
fn every_variant_is_one_clean_line() {
    let p = PathBuf::from("/data/ds/record-00003.pcr");
    let cases = vec![
        Error::Io {
            path: p.clone(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        },
        Error::NotJpeg {
            path: p.clone(),
            reason: "no SOI marker at the start".into(),
        },
        Error::UnsupportedJpeg {
            path: p.clone(),
            reason: "12-bit samples".into(),
        },
        Error::CorruptJpeg {
            path: p.clone(),
            reason: "Premature end of JPEG file".into(),
        },
        Error::Transcode {
            path: p.clone(),
            message: "Bogus marker length".into(),
        },
        Error::DuplicateInput {
            first: p.clone(),
            second: p.clone(),
            reason: "the same file given twice".into(),
        },
        Error::ListInputs("/data/in: no .jpg/.jpeg files in this folder".into()),
        Error::Labels {
            path: p.clone(),
            reason: "line 3: empty file name".into(),
        },
        Error::Options("no input images".into()),
        Error::NotADataset { path: p.clone() },
        Error::CorruptIndex {
            path: p.clone(),
            reason: "checksum mismatch".into(),
        },
        Error::TruncatedRecord {
            path: p.clone(),
            needed: 10,
            actual: 5,
        },
        Error::CorruptRecord {
            path: p.clone(),
            reason: "no PCR record magic".into(),
        },
        Error::IndexMismatch {
            path: p.clone(),
            reason: "piece lengths differ".into(),
        },
        Error::CorruptImage {
            path: p.clone(),
            image: 2,
            name: "a/x.jpg".into(),
            reason: "scan 3: checksum mismatch".into(),
        },
        Error::GroupOutOfRange {
            group: 11,
            groups: 10,
        },
        Error::RecordOutOfRange {
            record: 4,
            records: 3,
        },
        Error::ImageOutOfRange {
            image: 9,
            images: 3,
        },
        Error::Decode {
            name: "/data/ds/record-00003.pcr: a.jpg".into(),
            decoder: "zune-jpeg",
            message: "the data ends too early".into(),
        },
    ];
    for e in &cases {
        assert_clean(e);
        let msg = e.to_string();
        assert!(
            msg.contains("record-00003.pcr")
                || msg.contains("/data/in")
                || msg.contains("out of range")
                || msg.contains("no input images"),
            "{msg}"
        );
    }
    // The libraries' own texts, as they reach our messages.
    let jpeg = std::fs::read(common::corpus_dir().join("Dune.jpg")).unwrap();
    for cut in [&jpeg[..2], &jpeg[..600], &jpeg[..2000]] {
        // zune-jpeg's own text here is `I/O errors Not enough bytes, ...\n`.
        let e = Decoder::Zune.decode(cut).unwrap_err();
        assert!(matches!(e, pcr::JpegError::Zune(_)), "{e:?}");
        let e = e.to_string();
        assert!(!e.contains('\n') && !e.contains('"'), "{e:?}");
    }
    let (_tmp, out) = dataset();
    let index = out.join(pcr::INDEX_FILE);
    let bytes = std::fs::read(&index).unwrap();
    // A payload cut short with a valid checksum: the CBOR parser's own error.
    let cut = &bytes[12..bytes.len() - 5];
    let mut short = b"PCRINDX1".to_vec();
    short.extend(crc32fast::hash(cut).to_le_bytes());
    short.extend(cut);
    std::fs::write(&index, short).unwrap();
    let e = Dataset::open(&out).unwrap_err();
    assert!(matches!(e, Error::CorruptIndex { .. }), "{e}");
    assert_clean(&e);
}
