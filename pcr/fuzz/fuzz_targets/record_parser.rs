//! Arbitrary bytes as a PCR record (and as an index): the record parser, the layout and checksum checks,
//! the JPEG marker checks, stream rebuilding and both decoders must never panic or read out of bounds.
//!
//! Run: `cd pcr/fuzz && cargo +nightly fuzz run record_parser` (seed it with real records, e.g. the
//! `record-*.pcr` files of `l3 pcr build` on a few small JPEGs, copied into `corpus/record_parser/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pcr::fuzz_record(data);
});
