//! Detection boxes: a COCO instances file read once ([`CocoBoxes::parse`]), each dataset item matched to
//! its image entry by path and stem, and each box carried through a sample's geometry ([`place_boxes`]).

use crate::dataset::masks::strip_extension;
use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use vocab::Geometry;

/// One item's boxes in source pixels: `[x1, y1, x2, y2]`, with their category ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ItemBoxes {
    pub boxes: Vec<[f64; 4]>,
    pub labels: Vec<i64>,
}

/// A sample's boxes: `[x1, y1, x2, y2]` in output pixels, with their category ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleBoxes {
    pub boxes: Vec<[f32; 4]>,
    pub labels: Vec<i64>,
}

#[derive(Deserialize)]
struct CocoFile {
    images: Vec<CocoImage>,
    #[serde(default)]
    annotations: Vec<CocoAnnotation>,
}

#[derive(Deserialize)]
struct CocoImage {
    id: i64,
    file_name: String,
}

#[derive(Deserialize)]
struct CocoAnnotation {
    #[serde(default)]
    id: Option<i64>,
    image_id: i64,
    bbox: Vec<f64>,
    category_id: i64,
    #[serde(default)]
    iscrowd: i64,
}

/// The boxes of a COCO instances file, by image name without extension.
#[derive(Debug, Default)]
pub struct CocoBoxes {
    by_stem: HashMap<String, ItemBoxes>,
}

impl CocoBoxes {
    /// Reads `path` (a local file) and parses it.
    pub fn open(path: &Path) -> Result<CocoBoxes> {
        let bytes = stdx::fs::read_regular(path, 1 << 32).map_err(|e| Error::io(path, e))?;
        Self::parse(&bytes, path)
    }

    /// Parses a COCO instances file: `images[]` (`id`, `file_name`) and `annotations[]` (`image_id`,
    /// `bbox` as x, y, width, height, `category_id`, `iscrowd`). Crowd regions (`iscrowd` 1) are left out,
    /// as torchvision's detection references leave them out of training targets. Every error names
    /// `path` and the entry.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<CocoBoxes> {
        let bad = |why: String| Error::dataset(path, why);
        let file: CocoFile = serde_json::from_slice(bytes).map_err(|e| {
            let e = e.to_string();
            bad(format!("not a COCO instances file: {}", stdx::Quoted(&e)))
        })?;
        // Image id -> position in `entries`; stems are checked unique below.
        let mut at: HashMap<i64, usize> = HashMap::with_capacity(file.images.len());
        let mut entries: Vec<(String, ItemBoxes)> = Vec::with_capacity(file.images.len());
        for img in &file.images {
            let name = img.file_name.trim_start_matches("./");
            if name.is_empty() || name.starts_with('/') || name.split('/').any(|c| c == "..") {
                return Err(bad(format!(
                    "image {}: file_name {} is not a path relative to the source",
                    img.id,
                    stdx::Quoted(&img.file_name)
                )));
            }
            if at.insert(img.id, entries.len()).is_some() {
                return Err(bad(format!("image id {} is listed twice", img.id)));
            }
            entries.push((strip_extension(name).to_string(), ItemBoxes::default()));
        }
        for (i, a) in file.annotations.iter().enumerate() {
            let which = || match a.id {
                Some(id) => format!("annotation {id}"),
                None => format!("annotations[{i}]"),
            };
            let Some(&e) = at.get(&a.image_id) else {
                return Err(bad(format!(
                    "{}: image_id {} is not in images[]",
                    which(),
                    a.image_id
                )));
            };
            let [x, y, w, h] = a.bbox[..] else {
                return Err(bad(format!(
                    "{}: bbox has {} numbers, not 4 (x, y, width, height)",
                    which(),
                    a.bbox.len()
                )));
            };
            if ![x, y, w, h].iter().all(|v| v.is_finite()) || w < 0.0 || h < 0.0 {
                return Err(bad(format!(
                    "{}: bbox {:?} is not a finite box of non-negative size",
                    which(),
                    a.bbox
                )));
            }
            if a.iscrowd != 0 {
                continue;
            }
            let boxes = &mut entries[e].1;
            boxes.boxes.push([x, y, x + w, y + h]);
            boxes.labels.push(a.category_id);
        }
        let mut by_stem = HashMap::with_capacity(entries.len());
        for (stem, boxes) in entries {
            if by_stem.contains_key(&stem) {
                return Err(bad(format!(
                    "{} is listed twice in images[] (file names are matched without their \
                     extension)",
                    stdx::Quoted(&stem)
                )));
            }
            by_stem.insert(stem, boxes);
        }
        Ok(CocoBoxes { by_stem })
    }

    /// Matches the file's images to the dataset's items (`names[i]`: item `i`'s relative path), by path
    /// and stem: per item, its boxes (none when the file lists no such image). An image of the file that
    /// is no item of the source is an error naming `path` and the image.
    pub fn match_items(
        mut self,
        names: &[Option<String>],
        path: &Path,
        source: &str,
    ) -> Result<Vec<ItemBoxes>> {
        let out = names
            .iter()
            .map(|n| {
                n.as_deref()
                    .and_then(|n| self.by_stem.remove(strip_extension(n)))
                    .unwrap_or_default()
            })
            .collect();
        if !self.by_stem.is_empty() {
            let mut left: Vec<&String> = self.by_stem.keys().collect();
            left.sort();
            let shown: Vec<String> = left
                .iter()
                .take(3)
                .map(|s| stdx::Quoted(s).to_string())
                .collect();
            return Err(Error::dataset(
                path,
                format!(
                    "{} image(s) of images[] are not in the source {source} (matched by path without \
                     extension): {}{}",
                    left.len(),
                    shown.join(", "),
                    if left.len() > 3 { ", ..." } else { "" }
                ),
            ));
        }
        Ok(out)
    }
}

/// A shard sample's `KEY.json` member (what `l3 convert --to shards --boxes` writes).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CarriedBoxes {
    boxes: Vec<[f64; 4]>,
    labels: Vec<i64>,
}

/// Parses a `KEY.json` member carried in a shard (`source` names it): `{"boxes": [[x1, y1, x2, y2],
/// ...], "labels": [...]}` in source pixels, one label per box.
pub fn parse_carried(bytes: &[u8], source: &Path) -> Result<ItemBoxes> {
    let bad = |why: String| Error::dataset(source, why);
    let c: CarriedBoxes = serde_json::from_slice(bytes).map_err(|e| {
        let e = e.to_string();
        bad(format!(
            "not a boxes member ({{\"boxes\": [[x1, y1, x2, y2], ...], \"labels\": [...]}}): {}",
            stdx::Quoted(&e)
        ))
    })?;
    if c.boxes.len() != c.labels.len() {
        return Err(bad(format!(
            "{} boxes but {} labels",
            c.boxes.len(),
            c.labels.len()
        )));
    }
    if let Some(b) = c
        .boxes
        .iter()
        .find(|b| !b.iter().all(|v| v.is_finite()) || b[2] < b[0] || b[3] < b[1])
    {
        return Err(bad(format!(
            "box {b:?} is not a finite [x1, y1, x2, y2] with x1 <= x2 and y1 <= y2"
        )));
    }
    Ok(ItemBoxes {
        boxes: c.boxes,
        labels: c.labels,
    })
}

/// Carries `boxes` (source pixels) through `g` into output pixels ([`Geometry::map_box`]: scaled and
/// shifted with the image, mirrored with it), clipped to the part of the sample the image covers, and
/// dropped with their labels when narrower or shorter than `min_size` after clipping (torchvision's
/// `SanitizeBoundingBoxes`).
pub fn place_boxes(boxes: &ItemBoxes, g: &Geometry, min_size: f64) -> SampleBoxes {
    let (w, h) = g.size();
    let (x0, y0) = (f64::from(g.dx), f64::from(g.dy));
    let (x1, y1) = (x0 + f64::from(w), y0 + f64::from(h));
    let mut out = SampleBoxes::default();
    for (b, &label) in boxes.boxes.iter().zip(&boxes.labels) {
        let m = g.map_box(*b);
        let (a, c) = (m[0].clamp(x0, x1), m[2].clamp(x0, x1));
        let (t, d) = (m[1].clamp(y0, y1), m[3].clamp(y0, y1));
        if c - a < min_size || d - t < min_size {
            continue;
        }
        out.boxes.push([a as f32, t as f32, c as f32, d as f32]);
        out.labels.push(label);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{
        "images": [{"id": 7, "file_name": "a/x.png", "width": 100, "height": 50},
                   {"id": 8, "file_name": "b.jpg"}],
        "annotations": [
            {"id": 1, "image_id": 7, "bbox": [10, 5, 20, 10], "category_id": 3, "iscrowd": 0},
            {"id": 2, "image_id": 7, "bbox": [0, 0, 100, 50], "category_id": 4, "iscrowd": 1},
            {"id": 3, "image_id": 8, "bbox": [1.5, 2, 3, 4], "category_id": 5}
        ],
        "categories": [{"id": 3, "name": "car"}]
    }"#;

    #[test]
    fn coco_boxes_match_by_path_and_stem_whatever_the_extension() {
        let c = CocoBoxes::parse(JSON.as_bytes(), Path::new("inst.json")).unwrap();
        let names = [
            Some("a/x.l3".into()),
            Some("b.png".into()),
            Some("c.png".into()),
        ];
        let got = c
            .match_items(&names, Path::new("inst.json"), "src")
            .unwrap();
        assert_eq!(got[0].boxes, [[10.0, 5.0, 30.0, 15.0]]);
        assert_eq!(got[0].labels, [3], "the crowd region is left out");
        assert_eq!(got[1].boxes, [[1.5, 2.0, 4.5, 6.0]]);
        assert!(got[2].boxes.is_empty());
    }

    #[test]
    fn coco_errors_name_the_file_and_the_entry() {
        let e = |json: &str, names: &[Option<String>]| {
            let p = Path::new("inst.json");
            CocoBoxes::parse(json.as_bytes(), p)
                .and_then(|c| c.match_items(names, p, "src"))
                .unwrap_err()
                .to_string()
        };
        let x = [Some("a/x.png".to_string())];
        let m = e(JSON, &x);
        assert!(
            m.contains("inst.json") && m.contains("b") && m.contains("not in the source"),
            "{m}"
        );
        let m = e("{\"images\": [", &x);
        assert!(m.contains("inst.json") && m.contains("COCO"), "{m}");
        let m = e(
            r#"{"images":[{"id":1,"file_name":"a/x.png"}],"annotations":[{"id":9,"image_id":2,"bbox":[0,0,1,1],"category_id":1}]}"#,
            &x,
        );
        assert!(
            m.contains("annotation 9") && m.contains("image_id 2"),
            "{m}"
        );
        let m = e(
            r#"{"images":[{"id":1,"file_name":"a/x.png"}],"annotations":[{"image_id":1,"bbox":[0,0,-1,1],"category_id":1}]}"#,
            &x,
        );
        assert!(m.contains("annotations[0]"), "{m}");
        let m = e(r#"{"images":[{"id":1,"file_name":"../x.png"}]}"#, &x);
        assert!(m.contains("not a path relative"), "{m}");
    }

    fn one(b: [f64; 4]) -> ItemBoxes {
        ItemBoxes {
            boxes: vec![b],
            labels: vec![1],
        }
    }

    #[test]
    fn boxes_follow_scale_offset_and_flip_and_are_clipped_and_sanitised() {
        // A 100x50 window at (20, 10) resized to 50x25, landing 5 px from the sample's left edge: the
        // image covers columns 5..55, rows 0..25.
        let axis = |src, src_len, dst_len| vocab::Axis {
            src,
            src_len,
            dst_len,
            offset: 0,
            len: dst_len,
        };
        let g = Geometry {
            x: axis(20, 100, 50),
            y: axis(10, 50, 25),
            dx: 5,
            dy: 0,
            flip: false,
        };
        let b = place_boxes(&one([40.0, 20.0, 60.0, 30.0]), &g, 1.0);
        assert_eq!(b.boxes, [[15.0, 5.0, 25.0, 10.0]]);
        // Clipped at the image's right and bottom edges (not the sample's).
        let b = place_boxes(&one([100.0, 50.0, 200.0, 200.0]), &g, 1.0);
        assert_eq!(b.boxes, [[45.0, 20.0, 55.0, 25.0]]);
        // Mirrored within the image's columns 5..55: x -> 60 - x.
        let flipped = Geometry { flip: true, ..g };
        let b = place_boxes(&one([40.0, 20.0, 60.0, 30.0]), &flipped, 1.0);
        assert_eq!(b.boxes, [[35.0, 5.0, 45.0, 10.0]]);
        // Outside the window, or thinner than min_size once clipped: dropped with its label.
        assert!(
            place_boxes(&one([0.0, 0.0, 10.0, 10.0]), &g, 1.0)
                .labels
                .is_empty()
        );
        let thin = one([40.0, 20.0, 41.0, 30.0]); // 0.5 px wide after scaling
        assert!(place_boxes(&thin, &g, 1.0).boxes.is_empty());
        assert_eq!(place_boxes(&thin, &g, 0.5).labels, [1]);
    }
}
