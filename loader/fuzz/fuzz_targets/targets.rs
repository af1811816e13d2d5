//! Arbitrary bytes as a COCO instances file and as a mask: parsing refuses them or succeeds, never
//! panics; a mask that decodes is written through placements at the edges and past the image, and
//! boxes that parse are placed, without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::targets::{Placement, Rect};
use loader::targets::boxes::{CocoBoxes, place_boxes};
use loader::targets::masks::{MaskImage, decode_mask, write_mask};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz");
    if let Ok(coco) = CocoBoxes::parse(data, path) {
        let names = [Some("a.png".to_string()), None];
        if let Ok(items) = coco.match_items(&names, path, "fuzz") {
            let place = Placement {
                src: Rect::new(1, 2, 7, 5),
                scaled: (13, 3),
                offset: (-4, 1),
                out: (9, 6),
                flip: true,
            };
            for b in &items {
                let _ = place_boxes(b, &place, 1.0);
            }
        }
    }
    let mut mask = MaskImage::default();
    if decode_mask(data, path, &mut mask).is_ok() && mask.width < 4096 && mask.height < 4096 {
        let (w, h) = (mask.width, mask.height);
        for (src, scaled, offset) in [
            (Rect::new(0, 0, w, h), (w, h), (0, 0)),
            (Rect::new(w / 2, 0, w - w / 2, h), (3, 17), (-1, 2)),
        ] {
            let place = Placement {
                src,
                scaled,
                offset,
                out: (8, 5),
                flip: true,
            };
            let mut slot = vec![0u8; 8 * 5 * 2];
            write_mask(&mask, &place, 255, true, &mut slot);
        }
    }
});
