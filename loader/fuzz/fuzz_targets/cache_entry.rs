//! Arbitrary bytes as an object-cache entry: parsing refuses them or returns fields that lie inside
//! them, never panics; whatever parses writes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = loader::CacheEntry::parse(data) {
        assert!(e.url.len() + e.tag.len() + e.data.len() < data.len());
        assert_eq!(e.to_bytes(), data);
    }
    // A valid entry built from the input, with one bit flipped anywhere, is refused.
    let e = loader::CacheEntry {
        url: "s3://bucket/key",
        tag: "\"etag\"",
        object_size: data.len() as u64,
        block: 0,
        data,
    };
    let mut bytes = e.to_bytes();
    assert_eq!(loader::CacheEntry::parse(&bytes).as_ref(), Ok(&e));
    if !data.is_empty() {
        let at = data[0] as usize * 7 % bytes.len();
        bytes[at] ^= 1 << (data[data.len() - 1] % 8);
        assert!(loader::CacheEntry::parse(&bytes).is_err());
    }
});
