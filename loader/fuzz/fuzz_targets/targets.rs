//! Arbitrary bytes as a COCO instances file and as a mask: parsing refuses them or succeeds, never
//! panics; a mask that decodes is written through placements at the edges and past the image, and
//! boxes that parse are placed, without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::targets::boxes::{CocoBoxes, place_boxes};
use loader::targets::masks::{MaskImage, decode_mask, write_mask};
use std::path::Path;

fn axis(src: u32, src_len: u32, dst_len: u32, offset: u32, len: u32) -> loader::Axis {
    loader::Axis {
        src,
        src_len,
        dst_len,
        offset,
        len,
    }
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz");
    if let Ok(coco) = CocoBoxes::parse(data, path) {
        let names = [Some("a.png".to_string()), None];
        if let Ok(items) = coco.match_items(&names, path, "fuzz") {
            let g = loader::Geometry {
                x: axis(1, 7, 13, 4, 9),
                y: axis(2, 5, 3, 0, 3),
                dx: 0,
                dy: 1,
                flip: true,
            };
            for b in &items {
                let _ = place_boxes(b, &g, 1.0);
            }
        }
    }
    let mut mask = MaskImage::default();
    if decode_mask(data, path, &mut mask).is_ok() && mask.width < 4096 && mask.height < 4096 {
        let (w, h) = (mask.width, mask.height);
        // The whole mask into an 8x5 sample (cut), and its right half stretched, kept outputs past the
        // sample's edges included: never a panic.
        for g in [
            loader::Geometry {
                x: axis(0, w, w, 0, w.min(8)),
                y: axis(0, h, h, 0, h.min(5)),
                dx: 0,
                dy: 0,
                flip: true,
            },
            loader::Geometry {
                x: axis(w / 2, w - w / 2, 17, 3, 6),
                y: axis(0, h, 3, 0, 3),
                dx: 2,
                dy: 2,
                flip: true,
            },
        ] {
            let mut slot = vec![0u8; 8 * 5 * 2];
            write_mask(&mask, &g, (8, 5), 255, true, &mut slot);
        }
    }
});
