//! The design's 40 conformance vectors (`../shared/specs/l3v2-vectors`, or `$L3V2_VECTORS`): every file
//! decodes pixel-exact (SHA-256 of the raw RGB bytes, and the PNG's pixels), through every decode path, and
//! the encoder making the vectors' choices reproduces every file byte for byte.

use l3_format::{Choices, EncodeOptions, Format, L3File, PixelLayout, Profile, Rect, encode_with};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

fn dir() -> PathBuf {
    std::env::var_os("L3V2_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/specs/l3v2-vectors")
        })
}

struct Vector {
    file: String,
    pixels: String,
    width: u32,
    height: u32,
    profile: Profile,
    patch: u8,
    bytes: usize,
    sha: String,
}

fn manifest() -> Option<Vec<Vector>> {
    let path = dir().join("manifest.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            stdx::testing::skip(format_args!(
                "no conformance vectors at {} ({e}); set L3V2_VECTORS",
                path.display()
            ));
            return None;
        }
    };
    let v: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let list = v.as_array().expect("manifest is a list");
    Some(
        list.iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_else(|| panic!("{k}")).to_string();
                let u = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k}"));
                Vector {
                    file: s("file"),
                    pixels: s("pixels"),
                    width: u("width") as u32,
                    height: u("height") as u32,
                    profile: s("profile").parse().expect("profile"),
                    patch: u("patch") as u8,
                    bytes: u("bytes") as usize,
                    sha: s("pixels_sha256"),
                }
            })
            .collect(),
    )
}

#[test]
fn every_vector_decodes_pixel_exact_and_reencodes_byte_for_byte() {
    let Some(vectors) = manifest() else { return };
    assert_eq!(vectors.len(), 40, "the manifest lists 40 vectors");
    for v in &vectors {
        let bytes = std::fs::read(dir().join(&v.file)).expect("vector file");
        assert_eq!(bytes.len(), v.bytes, "{}", v.file);
        let f = L3File::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", v.file));
        assert_eq!(f.version(), 2);
        assert_eq!(f.format(), Format::V2(v.profile));
        assert_eq!(
            (f.width(), f.height(), f.channels(), f.patch_size()),
            (v.width, v.height, 3, v.patch)
        );
        let mut rgb = vec![0u8; f.decoded_len()];
        f.decode_hwc(&mut rgb)
            .unwrap_or_else(|e| panic!("{}: {e}", v.file));
        assert_eq!(sha256_hex(&rgb), v.sha, "{}: pixel hash", v.file);
        let png = image::open(dir().join(&v.pixels)).expect("png").to_rgb8();
        assert_eq!(png.dimensions(), (v.width, v.height));
        assert!(
            png.as_raw() == &rgb,
            "{}: pixels differ from the PNG",
            v.file
        );

        // Every other decode path agrees.
        let mut par = vec![0u8; rgb.len()];
        f.decode_hwc_parallel(&mut par, 3).unwrap();
        assert!(par == rgb, "{}: parallel", v.file);
        let mut chw = vec![0u8; rgb.len()];
        f.decode_chw_parallel(&mut chw, 2).unwrap();
        let plane = (v.width * v.height) as usize;
        for i in 0..plane {
            for c in 0..3 {
                assert_eq!(chw[c * plane + i], rgb[3 * i + c], "{}: chw", v.file);
            }
        }
        let region = Rect::new(
            v.width / 3,
            v.height / 4,
            v.width.div_ceil(2),
            v.height.div_ceil(2),
        );
        let layout = PixelLayout::packed(region.w, region.h, 3, false);
        let mut crop = vec![0u8; layout.required_len(region.w, region.h, 3).unwrap()];
        f.decode_region(region, &mut crop, layout).unwrap();
        for y in 0..region.h as usize {
            let src = ((region.y as usize + y) * v.width as usize + region.x as usize) * 3;
            let w3 = region.w as usize * 3;
            assert_eq!(
                &crop[y * w3..(y + 1) * w3],
                &rgb[src..src + w3],
                "{}: region",
                v.file
            );
        }

        // The encoder with the vectors' choices writes the same bytes.
        let opts = EncodeOptions {
            format: Format::V2(v.profile),
            patch_size: Some(v.patch),
            threads: 2,
            choices: Choices::Reference,
            entry_crcs: false,
        };
        let again = encode_with(&rgb, v.width, v.height, 3, &opts).unwrap();
        if again != bytes {
            let first = again.iter().zip(&bytes).position(|(a, b)| a != b);
            panic!(
                "{}: re-encoded file differs ({} vs {} bytes, first difference at {:?})",
                v.file,
                again.len(),
                bytes.len(),
                first
            );
        }
    }
    eprintln!(
        "{} conformance vectors: decoded pixel-exact and re-encoded byte for byte",
        vectors.len()
    );
}

/// The SHA-256 of `data` in lowercase hex, as the vectors' manifest writes it.
fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
