//! Arbitrary bytes as a mask file: the header read alone and the whole decode refuse them or agree with
//! each other, never panic; what decodes holds one value per pixel of what it says it decoded; a check
//! that refuses the header stops the decode before any value is allocated.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::Stored;
use loader::targets::masks::{MaskImage, decode_mask, decode_stored_mask, mask_header};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz");
    let header = mask_header(data, path);
    let mut mask = MaskImage::default();
    if decode_mask(data, path, &mut mask).is_ok() {
        let h = header.expect("a mask that decodes has a readable header");
        assert_eq!(
            (h.width, h.height, h.wide),
            (mask.width, mask.height, mask.wide)
        );
        assert_eq!(
            mask.values.len(),
            mask.rect.w as usize * mask.rect.h as usize
        );
        if !mask.wide {
            assert!(mask.values.iter().all(|&v| v <= 255));
        }
    }
    let stored = Stored::Whole(data.to_vec());
    let mut refused = MaskImage::default();
    let r = decode_stored_mask(
        &stored,
        path,
        None,
        |_| Err(loader::Error::Pipeline("refused".into())),
        &mut refused,
    );
    assert!(r.is_err());
    assert_eq!(refused.values.capacity(), 0);
});
