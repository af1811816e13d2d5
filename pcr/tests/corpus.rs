//! End to end on the real corpus: every JPEG of ../shared/corpus converted, read back at every scan group.

mod common;

use pcr::{BuildOptions, Dataset, Decoder, Input};

#[test]
fn corpus_round_trip_is_pixel_exact_and_prefixes_are_scan_aligned() {
    let jpegs = common::corpus_jpegs();
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<Input> = jpegs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut input = Input::new(p.clone());
            input.label = Some(format!("class{}", i % 3));
            input
        })
        .collect();
    let per_record = 5;
    let summary = pcr::build(
        dir.path(),
        &inputs,
        &BuildOptions {
            images_per_record: per_record,
            ..BuildOptions::default()
        },
        &|_| {},
    )
    .expect("build");
    assert_eq!(summary.images, jpegs.len());
    assert_eq!(summary.records, jpegs.len().div_ceil(per_record));

    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.images(), jpegs.len());
    assert_eq!(ds.records(), summary.records);
    // All corpus JPEGs are YCbCr: libjpeg's standard script has 10 scans.
    assert_eq!(ds.groups(), 10);
    assert_eq!(ds.total_bytes(), summary.record_bytes);
    let total_on_disk: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pcr"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(total_on_disk, ds.total_bytes());

    let mut previous = 0;
    for k in 1..=ds.groups() {
        let bytes = ds.prefix_bytes(k).unwrap();
        assert!(bytes > previous, "group {k} adds no bytes");
        previous = bytes;
    }
    assert_eq!(previous, ds.total_bytes());

    let mut seen = 0;
    for r in 0..ds.records() {
        let full = ds.read_record(r, ds.groups()).unwrap();
        assert_eq!(full.bytes_read(), ds.index().records[r].file_len);
        for j in 0..full.len() {
            let item = &full.items()[j];
            let source = &jpegs[seen + j];
            assert_eq!(item.name, source.file_name().unwrap().to_string_lossy());
            assert_eq!(
                item.label.as_deref(),
                Some(format!("class{}", (seen + j) % 3).as_str())
            );
            assert!(full.is_complete(j));
            let original = std::fs::read(source).unwrap();
            let rebuilt = full.jpeg(j).unwrap();
            // Lossless: the rebuilt progressive stream decodes to exactly the original's pixels, under
            // each decoder.
            for d in Decoder::ALL {
                let a = d.decode(&original).unwrap();
                let b = full.decode(j, d).unwrap();
                assert_eq!((a.width, a.height), (item.width, item.height));
                assert!(a == b, "{}: {} pixels differ", item.name, d.name());
            }
            // Every lower group rebuilds a stream whose scans are a prefix of the full one, cut at an SOS.
            for k in 1..ds.groups() {
                let part = ds.read_record(r, k).unwrap();
                assert_eq!(part.bytes_read(), ds.index().records[r].group_ends[k - 1]);
                assert!(!part.is_complete(j));
                let s = part.jpeg(j).unwrap();
                let body = &s[..s.len() - 2];
                assert!(
                    rebuilt.starts_with(body),
                    "{} group {k} is not a prefix",
                    item.name
                );
                assert_eq!(
                    &rebuilt[body.len()..body.len() + 2],
                    &[0xFF, 0xDA],
                    "{} group {k}",
                    item.name
                );
            }
        }
        seen += full.len();
    }
    assert_eq!(seen, jpegs.len());
}

#[test]
fn lower_groups_decode_with_rising_fidelity() {
    // Two of the smaller corpus files keep this quick; the decoder must accept every prefix (libjpeg
    // reports a scan cut short as a warning, which the reader turns into an error).
    let jpegs: Vec<_> = common::corpus_jpegs()
        .into_iter()
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n == "Dune.jpg" || n == "Wood.jpg"
        })
        .collect();
    assert_eq!(jpegs.len(), 2);
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<Input> = jpegs.iter().map(|p| Input::new(p.clone())).collect();
    pcr::build(dir.path(), &inputs, &BuildOptions::default(), &|_| {}).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    for d in Decoder::ALL {
        let reference = ds
            .read_record(0, ds.groups())
            .unwrap()
            .decode_all(d)
            .unwrap();
        let mut scores = Vec::new();
        for k in 1..=ds.groups() {
            let images = ds.read_record(0, k).unwrap().decode_all(d).unwrap();
            let mean = images
                .iter()
                .zip(&reference)
                .map(|(a, b)| pcr::mssim_luma(a, b).unwrap())
                .sum::<f64>()
                / images.len() as f64;
            scores.push(mean);
        }
        assert!((scores[9] - 1.0).abs() < 1e-12, "{}: {scores:?}", d.name());
        assert!(
            scores[0] < 0.99 && scores[0] > 0.3,
            "{}: {scores:?}",
            d.name()
        );
        assert!(scores[4] > scores[0], "{}: {scores:?}", d.name());
    }
}
