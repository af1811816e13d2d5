//! Per-image metadata stored at the head of every record: what a training loop needs beside the pixels.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A bounding box in pixels of the stored (not orientation-corrected) image, with an optional class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoundingBox {
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// One image's metadata. `name` is the source file's name (`Dune.jpg`); readers write `<stem>.png`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Item {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boxes: Vec<BoundingBox>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
    /// EXIF orientation of the source (1..=8; 1 = upright). The transcoded stream carries no EXIF, so
    /// this is the only place it survives; [`crate::Image::oriented`] applies it.
    pub orientation: u8,
    pub width: u32,
    pub height: u32,
    /// Colour components of the JPEG: 1 (grayscale, 6 scans) or 3 (YCbCr, 10 scans).
    pub components: u8,
}

impl Item {
    /// The file stem the reader uses for output names (`Dune.jpg` → `Dune`).
    pub fn stem(&self) -> &str {
        std::path::Path::new(&self.name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(&self.name)
    }
}
