//! Untrusted manifest bytes: parsing and validation must return an error, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = liquid_sampler::Manifest::from_bytes(data, std::path::Path::new("fuzz/manifest.cbor"));
});
