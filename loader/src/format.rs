//! The on-disk encodings the loader reads.

use std::path::Path;

/// The stored encoding of one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    Png,
    Jpeg,
    /// Uncompressed pixels: binary PPM/PGM/PAM (P5, P6, P7), the "raw" format of this toolkit.
    Raw,
    L3,
    /// A JPEG stream rebuilt from a Progressive Compressed Record at some scan group.
    Pcr,
    /// WebP (lossy or lossless), TIFF, BMP and GIF (its first frame): read through the `image` crate,
    /// as import reads them, so that a folder of them streams instead of being passed over.
    Webp,
    Tiff,
    Bmp,
    Gif,
}

impl Format {
    /// The short tag written in traces and tables (`png`, `jpeg`, `raw`, `l3`, `pcr`, `webp`, `tiff`,
    /// `bmp`, `gif`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Jpeg => "jpeg",
            Format::Raw => "raw",
            Format::L3 => "l3",
            Format::Pcr => "pcr",
            Format::Webp => "webp",
            Format::Tiff => "tiff",
            Format::Bmp => "bmp",
            Format::Gif => "gif",
        }
    }

    /// The format a file name's extension stands for, if it is one the loader reads.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "png" => Format::Png,
            "jpg" | "jpeg" => Format::Jpeg,
            "ppm" | "pgm" | "pnm" | "pam" => Format::Raw,
            "l3" => Format::L3,
            "webp" => Format::Webp,
            "tif" | "tiff" => Format::Tiff,
            "bmp" => Format::Bmp,
            "gif" => Format::Gif,
            _ => return None,
        })
    }

    /// The format the first bytes of a file announce, if any.
    pub fn sniff(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(&l3_format::MAGIC) {
            Some(Format::L3)
        } else if bytes.len() >= 2 && bytes[0] == b'P' && matches!(bytes[1], b'5' | b'6' | b'7') {
            Some(Format::Raw)
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(Format::Webp)
        } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
            Some(Format::Tiff)
        } else if bytes.starts_with(b"BM") {
            Some(Format::Bmp)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Format::Gif)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
