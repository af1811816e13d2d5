//! Arbitrary and mutated manifest bytes give errors, never panics (the cargo-fuzz target in `fuzz/` does the
//! same with coverage guidance; this runs everywhere on stable).

use liquid_sampler::*;
use std::path::Path;

fn valid() -> Vec<u8> {
    let formats = vec![
        FormatSpec {
            tag: "png".into(),
            kind: FormatKind::Compressed,
        },
        FormatSpec {
            tag: "raw".into(),
            kind: FormatKind::Raw,
        },
    ];
    let mut m = Manifest::new(
        3,
        Ratio {
            compressed: 7,
            raw: 3,
        },
        formats,
    );
    m.files.push(manifest::DataFile {
        name: "png-000.pack".into(),
        format: 0,
        len: 8192,
    });
    m.files.push(manifest::DataFile {
        name: "raw-000.pack".into(),
        format: 1,
        len: 4096,
    });
    let dims = Dims {
        width: 4,
        height: 4,
        channels: 3,
    };
    for (id, (format, file, offset, length)) in
        [(0u16, 0u32, 0u64, 100u64), (0, 0, 4096, 200), (1, 1, 0, 48)]
            .into_iter()
            .enumerate()
    {
        m.items.push(Item {
            id: id as u64,
            label: 0,
            format,
            location: manifest::Location {
                file,
                offset,
                length,
            },
            dims,
        });
    }
    let mut v = Vec::new();
    ciborium::into_writer(&m, &mut v).unwrap();
    v
}

#[test]
fn arbitrary_and_mutated_bytes_never_panic() {
    let path = Path::new("test/manifest.cbor");
    let good = valid();
    Manifest::from_bytes(&good, path).expect("the unmutated manifest is valid");
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut rejected = 0;
    for i in 0..20_000 {
        let mut b = good.clone();
        match i % 4 {
            0 => b.truncate(rnd() as usize % good.len()),
            1 => {
                for _ in 0..1 + rnd() % 4 {
                    let k = rnd() as usize % b.len();
                    b[k] ^= 1 << (rnd() % 8);
                }
            }
            2 => {
                let k = rnd() as usize % b.len();
                b[k] = rnd() as u8;
            }
            _ => b = (0..rnd() % 200).map(|_| rnd() as u8).collect(),
        }
        if Manifest::from_bytes(&b, path).is_err() {
            rejected += 1;
        }
    }
    assert!(
        rejected > 10_000,
        "most mutations must be rejected: {rejected}"
    );
}
