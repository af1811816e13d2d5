//! Bad input, each a typed error naming the file: at write time (non-JPEG, CMYK, 12-bit) and at read time
//! (truncated or corrupt record, corrupt index, group out of range, index from another build), plus a
//! mutation test: any byte flipped in a record is caught exactly when it lies inside the prefix read.

mod common;

use jpeg_encoder::ColorType;
use pcr::{BuildOptions, Dataset, Decoder, Error, Input};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn build(dir: &Path, files: &[PathBuf], per_record: usize) -> pcr::Result<pcr::BuildSummary> {
    let inputs: Vec<Input> = files.iter().map(|p| Input::new(p.clone())).collect();
    pcr::build(
        dir,
        &inputs,
        &BuildOptions {
            images_per_record: per_record,
            ..BuildOptions::default()
        },
        &|_| {},
    )
}

/// A dataset of three small images (colour, grayscale, colour with EXIF orientation 6) in one record.
fn small_dataset() -> (tempfile::TempDir, PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let files = vec![
        common::write(
            src.path(),
            "a.jpg",
            &common::small_jpeg(40, 24, ColorType::Rgb, None),
        ),
        common::write(
            src.path(),
            "g.jpg",
            &common::small_jpeg(33, 17, ColorType::Luma, None),
        ),
        common::write(
            src.path(),
            "r.jpg",
            &common::small_jpeg(24, 16, ColorType::Rgb, Some(6)),
        ),
    ];
    let out = src.path().join("ds");
    build(&out, &files, 8).unwrap();
    (src, out)
}

#[test]
fn grayscale_leaves_later_groups_empty_and_orientation_is_kept() {
    let (_src, out) = small_dataset();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.groups(), 10);
    let e = &ds.index().records[0];
    assert_eq!(e.images[0].scans.len(), 10);
    assert_eq!(e.images[1].scans.len(), 6, "grayscale: 6 scans");
    let rec = ds.read_record(0, 10).unwrap();
    let items = rec.items();
    assert_eq!(ds.read_items(0).unwrap(), items);
    assert_eq!(
        (items[1].components, items[1].width, items[1].height),
        (1, 33, 17)
    );
    assert_eq!(items[2].orientation, 6);
    assert_eq!(items[0].orientation, 1);
    // Group 7 is complete for the gray image only.
    let r7 = ds.read_record(0, 7).unwrap();
    assert!(r7.is_complete(1) && !r7.is_complete(0));
    let img = rec.decode(2, Decoder::Libjpeg).unwrap();
    assert_eq!((img.width, img.height), (24, 16));
    let upright = img.oriented(items[2].orientation);
    assert_eq!((upright.width, upright.height), (16, 24));
    // Gray decodes to RGB with equal channels.
    let g = rec.decode(1, Decoder::Zune).unwrap();
    assert!(g.pixels.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
}

#[test]
fn write_time_errors_name_the_file() {
    let src = tempfile::tempdir().unwrap();
    let good = common::write(
        src.path(),
        "ok.jpg",
        &common::small_jpeg(16, 16, ColorType::Rgb, None),
    );
    let png = common::corpus_dir().join("Gulp-rgba.png");
    let cmyk = common::write(
        src.path(),
        "cmyk.jpg",
        &common::small_jpeg(16, 16, ColorType::Cmyk, None),
    );
    // A 12-bit frame header: SOI, SOF1 with precision 12.
    let mut twelve = vec![0xFF, 0xD8, 0xFF, 0xC1, 0, 17, 12, 0, 16, 0, 16, 3];
    twelve.extend([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1, 0xFF, 0xD9]);
    let twelve = common::write(src.path(), "twelve.jpg", &twelve);
    let mut truncated = common::small_jpeg(16, 16, ColorType::Rgb, None);
    truncated.truncate(40);
    let truncated = common::write(src.path(), "cut.jpg", &truncated);
    let missing = src.path().join("missing.jpg");
    let out = src.path().join("out");

    type Expect = fn(&Error) -> bool;
    let cases: [(&PathBuf, Expect); 5] = [
        (&png, |e| matches!(e, Error::NotJpeg { .. })),
        (
            &cmyk,
            |e| matches!(e, Error::UnsupportedJpeg { reason, .. } if reason.contains("CMYK")),
        ),
        (
            &twelve,
            |e| matches!(e, Error::UnsupportedJpeg { reason, .. } if reason.contains("12-bit")),
        ),
        (&truncated, |e| {
            matches!(e, Error::NotJpeg { .. } | Error::Transcode { .. })
        }),
        (&missing, |e| matches!(e, Error::Io { .. })),
    ];
    for (bad, is_expected) in cases {
        let e = build(&out, &[good.clone(), bad.clone()], 4).unwrap_err();
        assert!(is_expected(&e), "{}: {e:?}", bad.display());
        assert!(e.to_string().contains(&*bad.to_string_lossy()), "{e}");
        // Nothing a reader accepts is left behind.
        assert!(Dataset::open(&out).is_err());
    }
    assert!(matches!(build(&out, &[], 4), Err(Error::Options(_))));
    assert!(matches!(build(&out, &[good], 0), Err(Error::Options(_))));
}

#[test]
fn read_time_errors_are_typed() {
    let (_src, out) = small_dataset();
    let ds = Dataset::open(&out).unwrap();
    assert!(matches!(
        ds.read_record(0, 0),
        Err(Error::GroupOutOfRange {
            group: 0,
            groups: 10
        })
    ));
    assert!(matches!(
        ds.read_record(0, 11),
        Err(Error::GroupOutOfRange { group: 11, .. })
    ));
    assert!(matches!(
        ds.read_record(1, 1),
        Err(Error::RecordOutOfRange { .. })
    ));
    assert!(matches!(
        ds.prefix_bytes(11),
        Err(Error::GroupOutOfRange { .. })
    ));
    let rec = ds.read_record(0, 1).unwrap();
    assert!(matches!(rec.jpeg(3), Err(Error::ImageOutOfRange { .. })));

    let record = out.join(pcr::record_file_name(0));
    let original = std::fs::read(&record).unwrap();
    let ends = ds.index().records[0].group_ends.clone();

    // Truncated inside group 3: groups 1..=2 still read, group 3 and up are a truncation error.
    std::fs::write(&record, &original[..ends[2] as usize - 1]).unwrap();
    assert!(
        ds.read_record(0, 2).is_err(),
        "file length disagrees with the index"
    );
    let e = ds.read_record(0, 3).unwrap_err();
    assert!(matches!(e, Error::TruncatedRecord { .. }), "{e:?}");
    assert_eq!(
        ds.read_items(0).unwrap().len(),
        3,
        "metadata is before the cut"
    );
    std::fs::write(&record, &original[..20]).unwrap();
    assert!(matches!(
        ds.read_items(0),
        Err(Error::TruncatedRecord { .. })
    ));
    assert!(e.to_string().contains("record-00000.pcr"), "{e}");

    // A flipped byte in group 2's data is a checksum error at k >= 2 but invisible at k = 1.
    let mut flipped = original.clone();
    flipped[ends[0] as usize + 5] ^= 0x01;
    std::fs::write(&record, &flipped).unwrap();
    assert!(ds.read_record(0, 1).is_ok());
    let e = ds.read_record(0, 2).unwrap_err();
    assert!(
        matches!(e, Error::CorruptRecord { ref reason, .. } if reason.contains("checksum")),
        "{e:?}"
    );

    // Per image, the same byte fails only the image whose scan it is: the others decode, and that
    // image's scans before the bad one still give it at group 1.
    let file_len = original.len() as u64;
    let victim = (0..3)
        .find(|&j| {
            let p = &ds.index().records[0].images[j].scans[1];
            (p.offset..p.offset + u64::from(p.len)).contains(&(ends[0] + 5))
        })
        .expect("the flipped byte lies in a scan 2");
    let rec = ds
        .verify_prefix_per_image(0, 2, file_len, flipped[..ends[1] as usize].to_vec())
        .unwrap();
    assert_eq!(rec.damaged(), 1);
    for j in 0..3 {
        if j == victim {
            let e = rec.jpeg(j).unwrap_err();
            assert!(
                matches!(e, Error::CorruptImage { image, .. } if image == victim),
                "{e:?}"
            );
            let name = &rec.items()[j].name;
            let text = e.to_string();
            assert!(
                text.contains("record-00000.pcr")
                    && text.contains(name.as_str())
                    && text.contains("scan 2: checksum mismatch"),
                "{text}"
            );
            assert!(rec.decode(j, pcr::Decoder::Libjpeg).is_err());
            let (jpeg, scans) = rec.jpeg_verified(j).unwrap();
            assert_eq!((scans, rec.verified_scans(j)), (1, 1));
            assert_eq!(jpeg, ds.read_record(0, 1).unwrap().jpeg(j).unwrap());
        } else {
            assert!(rec.damage(j).is_none());
            assert_eq!(rec.jpeg(j).unwrap(), rec.jpeg_verified(j).unwrap().0);
            rec.decode(j, pcr::Decoder::Libjpeg).unwrap();
        }
    }
    // A whole-record read still refuses the record, naming the image.
    let e = ds.read_record(0, 2).unwrap_err().to_string();
    assert!(e.contains(&format!("image {victim} (")), "{e}");

    // A record from another build of the same files (other labels): another dataset id. (Builds are
    // reproducible: the same inputs would give this very record.)
    std::fs::write(&record, &original).unwrap();
    let other = out.parent().unwrap().join("other");
    let inputs: Vec<Input> = ["a.jpg", "g.jpg", "r.jpg"]
        .iter()
        .map(|n| {
            let mut i = Input::new(out.parent().unwrap().join(n));
            i.label = Some("other".into());
            i
        })
        .collect();
    let options = BuildOptions {
        images_per_record: 8,
        ..BuildOptions::default()
    };
    pcr::build(&other, &inputs, &options, &|_| {}).unwrap();
    std::fs::copy(other.join(pcr::record_file_name(0)), &record).unwrap();
    let e = ds.read_record(0, 10).unwrap_err();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e:?}");
    std::fs::write(&record, &original).unwrap();
    assert!(ds.read_record(0, 10).is_ok());

    // Corrupt and missing index.
    let index = out.join(pcr::INDEX_FILE);
    let bytes = std::fs::read(&index).unwrap();
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    std::fs::write(&index, &bad).unwrap();
    let e = Dataset::open(&out).unwrap_err();
    assert!(
        matches!(e, Error::CorruptIndex { ref reason, .. } if reason.contains("checksum")),
        "{e:?}"
    );
    std::fs::write(&index, &bytes[..bytes.len() - 3]).unwrap();
    assert!(matches!(
        Dataset::open(&out),
        Err(Error::CorruptIndex { .. })
    ));
    std::fs::remove_file(&index).unwrap();
    assert!(matches!(
        Dataset::open(&out),
        Err(Error::NotADataset { .. })
    ));
}

#[test]
fn cut_mid_scan_decodes_silently_in_zune_but_the_reader_never_cuts_there() {
    // The pitfall the index guards against: a stream cut inside a scan still "decodes" in zune-jpeg,
    // while libjpeg warns (which our libjpeg path turns into an error).
    let (_src, out) = small_dataset();
    let ds = Dataset::open(&out).unwrap();
    let rec = ds.read_record(0, 10).unwrap();
    let full = rec.jpeg(0).unwrap();
    let two = ds.read_record(0, 2).unwrap().jpeg(0).unwrap();
    let three = ds.read_record(0, 3).unwrap().jpeg(0).unwrap();
    let cut = (two.len() - 2 + three.len() - 2) / 2; // inside scan 3
    let mut broken = full[..cut].to_vec();
    broken.extend([0xFF, 0xD9]);
    assert!(
        Decoder::Zune.decode(&broken).is_ok(),
        "zune accepts a cut scan"
    );
    assert!(
        Decoder::Libjpeg.decode(&broken).is_err(),
        "libjpeg reports it"
    );
    for k in 1..=10 {
        let r = ds.read_record(0, k).unwrap();
        for j in 0..r.len() {
            r.decode(j, Decoder::Libjpeg).unwrap();
        }
    }
}

#[test]
fn rebuilding_replaces_a_dataset_and_removes_stale_records() {
    let src = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..5)
        .map(|i| {
            common::write(
                src.path(),
                &format!("f{i}.jpg"),
                &common::small_jpeg(16 + i, 16, ColorType::Rgb, None),
            )
        })
        .collect();
    let out = src.path().join("ds");
    build(&out, &files, 1).unwrap();
    assert_eq!(Dataset::open(&out).unwrap().records(), 5);
    std::fs::write(out.join(".record-00009.pcr.tmp"), b"left by a crash").unwrap();
    build(&out, &files[..2], 1).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.records(), 2);
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != stdx::fs::LOCK_NAME)
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["index.cbor", "record-00000.pcr", "record-00001.pcr"]
    );
}

fn flip_test(offset: usize, mask: u8) -> Result<(), TestCaseError> {
    let (_src, out) = SMALL.with(|s| s.clone());
    let ds = Dataset::open(&out).unwrap();
    let record = out.join(pcr::record_file_name(0));
    let original = std::fs::read(&record).unwrap();
    let offset = offset % original.len();
    let mut bytes = original.clone();
    bytes[offset] ^= mask;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(out.join(pcr::INDEX_FILE), dir.path().join(pcr::INDEX_FILE)).unwrap();
    std::fs::write(dir.path().join(pcr::record_file_name(0)), &bytes).unwrap();
    let mutated = Dataset::open(dir.path()).unwrap();
    for (k, &end) in ds.index().records[0].group_ends.iter().enumerate() {
        let r = mutated.read_record(0, k + 1);
        if (offset as u64) < end {
            prop_assert!(
                r.is_err(),
                "flip of byte {offset} accepted at group {}",
                k + 1
            );
        } else {
            prop_assert!(
                r.is_ok(),
                "flip of byte {offset} beyond group {} rejected: {:?}",
                k + 1,
                r.err()
            );
        }
    }
    Ok(())
}

thread_local! {
    static SMALL: (std::sync::Arc<tempfile::TempDir>, PathBuf) = {
        let (d, p) = small_dataset();
        (std::sync::Arc::new(d), p)
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any single-byte change to a record is caught by a read whose prefix covers it, and only then.
    #[test]
    fn any_flipped_byte_is_caught_exactly_when_read(offset in any::<usize>(), mask in 1u8..=255) {
        flip_test(offset, mask)?;
    }

    /// Arbitrary bytes as a record or an index never panic the parser.
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        pcr::fuzz_record(&data);
    }

    /// A valid record with a few bytes changed, run through the whole reader path with checksums
    /// recomputed so the changed bytes reach the JPEG checks and both decoders: never a panic.
    #[test]
    fn mutated_records_never_panic_the_decoders(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)
    ) {
        let (_src, out) = SMALL.with(|s| s.clone());
        let mut bytes = std::fs::read(out.join(pcr::record_file_name(0))).unwrap();
        let header_end = 12 + u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
        for (at, v) in edits {
            // Past the metadata header, so the record still parses and the edits reach JPEG data.
            let i = header_end + at % (bytes.len() - header_end);
            bytes[i] = v;
        }
        pcr::fuzz_record(&bytes);
    }

    /// Truncating the record anywhere is a typed error for every group past the cut.
    #[test]
    fn truncation_is_an_error(cut in any::<usize>()) {
        let (_src, out) = SMALL.with(|s| s.clone());
        let original = std::fs::read(out.join(pcr::record_file_name(0))).unwrap();
        let cut = cut % original.len();
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(out.join(pcr::INDEX_FILE), dir.path().join(pcr::INDEX_FILE)).unwrap();
        std::fs::write(dir.path().join(pcr::record_file_name(0)), &original[..cut]).unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        for k in 1..=ds.groups() {
            prop_assert!(ds.read_record(0, k).is_err());
        }
    }
}

/// Not a check: writes small real records as seeds for the cargo-fuzz target
/// (`cargo test -p pcr --test errors -- --ignored write_fuzz_seeds`).
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/record_parser");
    std::fs::create_dir_all(&dir).unwrap();
    let (_src, out) = small_dataset();
    std::fs::copy(
        out.join(pcr::record_file_name(0)),
        dir.join("three-images.pcr"),
    )
    .unwrap();
    let src = tempfile::tempdir().unwrap();
    let one = common::write(
        src.path(),
        "one.jpg",
        &common::small_jpeg(8, 8, ColorType::Luma, None),
    );
    build(&src.path().join("ds"), &[one], 1).unwrap();
    std::fs::copy(
        src.path().join("ds").join(pcr::record_file_name(0)),
        dir.join("gray-8x8.pcr"),
    )
    .unwrap();
    std::fs::copy(
        src.path().join("ds").join(pcr::INDEX_FILE),
        dir.join("index.cbor"),
    )
    .unwrap();
}
