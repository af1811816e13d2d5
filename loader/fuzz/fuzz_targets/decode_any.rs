//! Every per-item decoder the loader runs on stored bytes (PNG, JPEG, raw PPM/PGM/PAM, L3 — whole and
//! region, into every layout and type) must return an error, never panic, on any input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::{Format, Image};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let mut img = Image::default();
    for f in [Format::Png, Format::Jpeg, Format::Raw, Format::L3] {
        let _ = loader::decode(f, data, Path::new("fuzz"), &mut img);
    }
    loader::fuzz_decode_sample(data);
});
