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

/// One image's metadata. `name` is the image's name in the dataset: the source file's name (`Dune.jpg`), or
/// its path relative to the input folder it was found under (`a/Dune.jpg`); names are unique in a dataset
/// and readers write `<stem>.png` (`a/Dune.png`, in a sub-folder).
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
    /// The name without its extension, folders kept, for output names (`a/Dune.jpg` → `a/Dune`).
    pub fn stem(&self) -> &str {
        let file_start = self.name.rfind('/').map_or(0, |i| i + 1);
        match self.name[file_start..].rfind('.') {
            Some(dot) if dot > 0 => &self.name[..file_start + dot],
            _ => &self.name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_keep_folders_and_drop_one_extension() {
        let stem = |name: &str| {
            Item {
                name: name.into(),
                ..Item::default()
            }
            .stem()
            .to_string()
        };
        assert_eq!(stem("Dune.jpg"), "Dune");
        assert_eq!(stem("a/b/Dune.jpeg"), "a/b/Dune");
        assert_eq!(stem("a.d/x"), "a.d/x");
        assert_eq!(stem("x.tar.jpg"), "x.tar");
        assert_eq!(stem(".hidden"), ".hidden");
    }
}
