//! JPEG marker structure, parsed by hand: the frame header the writer checks before libjpeg-turbo sees a
//! file, the EXIF orientation, and the scan boundaries of a progressive stream.
//!
//! Scan boundaries are found from the markers and re-checked on every read, never inferred from a decoder:
//! a stream cut in the middle of a scan still "decodes" (the missing data reads as zeros), so a decoder's
//! silence proves nothing.

use std::ops::Range;

/// What the frame header (SOFn) says about a JPEG, read before any decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    pub width: u32,
    pub height: u32,
    pub components: u8,
    pub precision: u8,
    pub progressive: bool,
    /// EXIF orientation (1..=8) from an APP1 segment, 1 when absent or unreadable.
    pub orientation: u8,
}

/// Why a stream is not a JPEG this crate can transcode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    NotJpeg(String),
    Unsupported(String),
}

/// A progressive stream cut at its scans: `header` is `[0, first SOS)`, each scan runs from its SOS marker
/// to the next SOS (any tables the next scan needs travel at the end of the previous piece), the last one to EOI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanSplit {
    pub header: Range<usize>,
    pub scans: Vec<Range<usize>>,
}

const SOI: u8 = 0xD8;
const EOI: u8 = 0xD9;
const SOS: u8 = 0xDA;

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]) as usize)
}

/// Reads a marker at `pos` (skipping fill bytes); returns (code, position of the 0xFF before the code).
fn marker_at(b: &[u8], mut pos: usize) -> Result<(u8, usize), String> {
    if b.get(pos) != Some(&0xFF) {
        return Err(format!("expected a marker at byte {pos}"));
    }
    while b.get(pos + 1) == Some(&0xFF) {
        pos += 1;
    }
    match b.get(pos + 1) {
        Some(&c) if c != 0 => Ok((c, pos)),
        _ => Err(format!("bad marker at byte {pos}")),
    }
}

/// Length of the marker segment starting at `pos` (its 0xFF), including the two marker bytes.
fn segment_len(b: &[u8], pos: usize) -> Result<usize, String> {
    let len = be16(b, pos + 2).ok_or_else(|| format!("segment at byte {pos} is cut short"))?;
    if len < 2 || pos + 2 + len > b.len() {
        return Err(format!("segment at byte {pos} has a bad length {len}"));
    }
    Ok(2 + len)
}

/// End of the entropy-coded data that starts at `from`: the position of the first marker that is neither
/// a stuffed zero nor a restart marker, or `b.len()` when the data runs to the end.
fn entropy_end(b: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < b.len() {
        match b[i..].iter().position(|&x| x == 0xFF) {
            None => return b.len(),
            Some(off) => i += off,
        }
        match b.get(i + 1) {
            None => return b.len(),
            Some(0x00) | Some(0xD0..=0xD7) => i += 2,
            Some(0xFF) => i += 1,
            Some(_) => return i,
        }
    }
    b.len()
}

/// Checks the frame header of a JPEG the writer is asked to transcode, without decoding it.
pub fn probe(b: &[u8]) -> Result<FrameInfo, ProbeError> {
    let bad = |s: String| ProbeError::NotJpeg(s);
    if b.len() < 4 || b[0] != 0xFF || b[1] != SOI {
        return Err(bad("no SOI marker at the start".into()));
    }
    let mut pos = 2;
    let mut orientation = 1;
    loop {
        let (code, at) = marker_at(b, pos).map_err(bad)?;
        match code {
            0xC0..=0xCF if code != 0xC4 && code != 0xC8 && code != 0xCC => {
                let len = segment_len(b, at).map_err(bad)?;
                if len < 2 + 8 {
                    return Err(bad("frame header is too short".into()));
                }
                let precision = b[at + 4];
                let height = be16(b, at + 5).unwrap_or(0) as u32;
                let width = be16(b, at + 7).unwrap_or(0) as u32;
                let components = b[at + 9];
                let unsupported = |s: &str| Err(ProbeError::Unsupported(s.to_string()));
                match code {
                    0xC0..=0xC2 => {}
                    0xC3 => return unsupported("lossless JPEG (SOF3)"),
                    0xC5..=0xC7 => return unsupported("hierarchical JPEG"),
                    _ => return unsupported("arithmetic-coded JPEG"),
                }
                if precision != 8 {
                    return Err(ProbeError::Unsupported(format!(
                        "{precision}-bit samples (only 8-bit JPEG is supported)"
                    )));
                }
                match components {
                    1 | 3 => {}
                    4 => return unsupported("CMYK/YCCK (4 components); convert it to RGB first"),
                    n => {
                        return Err(ProbeError::Unsupported(format!(
                            "{n} colour components (1 or 3 are supported)"
                        )));
                    }
                }
                if width == 0 || height == 0 {
                    return Err(ProbeError::Unsupported(
                        "zero width or height (DNL-defined height)".into(),
                    ));
                }
                if len < 2 + 6 + 3 * components as usize {
                    return Err(bad("frame header is too short".into()));
                }
                return Ok(FrameInfo {
                    width,
                    height,
                    components,
                    precision,
                    progressive: code == 0xC2,
                    orientation,
                });
            }
            SOS | EOI | SOI => {
                return Err(bad(format!("marker {code:#04X} before the frame header")));
            }
            0x01 | 0xD0..=0xD7 => pos = at + 2,
            _ => {
                let len = segment_len(b, at).map_err(bad)?;
                if code == 0xE1
                    && let Some(o) = exif_orientation(&b[at + 4..at + len])
                {
                    orientation = o;
                }
                pos = at + len;
            }
        }
    }
}

/// The Orientation tag (0x0112) of an APP1 "Exif" payload, if present and valid (1..=8).
pub fn exif_orientation(app1: &[u8]) -> Option<u8> {
    let tiff = app1.strip_prefix(b"Exif\0\0")?;
    let le = match tiff.get(..4)? {
        [b'I', b'I', 42, 0] => true,
        [b'M', b'M', 0, 42] => false,
        _ => return None,
    };
    let u16_at = |i: usize| -> Option<u16> {
        let s = tiff.get(i..i + 2)?;
        Some(if le {
            u16::from_le_bytes([s[0], s[1]])
        } else {
            u16::from_be_bytes([s[0], s[1]])
        })
    };
    let u32_at = |i: usize| -> Option<u32> {
        let s = tiff.get(i..i + 4)?;
        let a = [s[0], s[1], s[2], s[3]];
        Some(if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        })
    };
    let ifd = u32_at(4)? as usize;
    let n = u16_at(ifd)? as usize;
    for e in 0..n {
        let at = ifd.checked_add(2 + 12 * e)?;
        if u16_at(at)? == 0x0112 && u16_at(at + 2)? == 3 {
            let v = u16_at(at + 8)?;
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

/// Cuts a complete JPEG stream (SOI ... EOI, nothing after) at its scans.
pub fn split_scans(b: &[u8]) -> Result<ScanSplit, String> {
    if b.len() < 4 || b[0] != 0xFF || b[1] != SOI {
        return Err("no SOI marker".into());
    }
    let mut pos = 2;
    let mut sos_starts = Vec::new();
    loop {
        let (code, at) = marker_at(b, pos)?;
        match code {
            EOI => {
                if at + 2 != b.len() {
                    return Err(format!("{} bytes after EOI", b.len() - at - 2));
                }
                if sos_starts.is_empty() {
                    return Err("no scan".into());
                }
                let header = 0..sos_starts[0];
                let mut scans = Vec::with_capacity(sos_starts.len());
                for (i, &s) in sos_starts.iter().enumerate() {
                    let end = sos_starts.get(i + 1).copied().unwrap_or(at);
                    scans.push(s..end);
                }
                return Ok(ScanSplit { header, scans });
            }
            SOS => {
                sos_starts.push(at);
                let len = segment_len(b, at)?;
                pos = entropy_end(b, at + len);
                if pos >= b.len() {
                    return Err("scan data runs to the end of the stream (no EOI)".into());
                }
            }
            SOI | 0x01 | 0xD0..=0xD7 => {
                return Err(format!("stray marker {code:#04X} at byte {at}"));
            }
            _ => pos = at + segment_len(b, at)?,
        }
    }
}

/// Checks that `piece` is exactly one scan as [`split_scans`] cuts it: an SOS segment whose component
/// count matches its length, entropy-coded data with no marker but restarts, then only table or
/// comment segments, ending exactly at the end of the piece.
pub fn check_scan_piece(piece: &[u8]) -> Result<(), String> {
    let (code, at) = marker_at(piece, 0)?;
    if code != SOS || at != 0 {
        return Err("does not start with an SOS marker".into());
    }
    let len = segment_len(piece, 0)?;
    let ns = *piece.get(4).ok_or("SOS is cut short")? as usize;
    if !(1..=4).contains(&ns) || len != 2 + 6 + 2 * ns {
        return Err(format!("SOS segment of length {len} for {ns} components"));
    }
    let mut pos = entropy_end(piece, len);
    while pos < piece.len() {
        let (code, at) = marker_at(piece, pos)?;
        match code {
            0xC4 | 0xCC | 0xDB | 0xDD | 0xE0..=0xEF | 0xFE => pos = at + segment_len(piece, at)?,
            _ => {
                return Err(format!(
                    "marker {code:#04X} inside a scan piece at byte {at}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks that `header` is a JPEG header as [`split_scans`] cuts it: SOI, then whole marker segments
/// including a progressive frame header, and nothing else.
pub fn check_header_piece(header: &[u8]) -> Result<(), String> {
    if header.len() < 2 || header[0] != 0xFF || header[1] != SOI {
        return Err("does not start with SOI".into());
    }
    let mut pos = 2;
    let mut saw_frame = false;
    while pos < header.len() {
        let (code, at) = marker_at(header, pos)?;
        match code {
            0xC2 => saw_frame = true,
            SOI | EOI | SOS | 0x01 | 0xD0..=0xD7 => {
                return Err(format!("marker {code:#04X} inside the header at byte {at}"));
            }
            0xC0 | 0xC1 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                return Err("frame is not progressive Huffman (SOF2)".into());
            }
            _ => {}
        }
        pos = at + segment_len(header, at)?;
    }
    if !saw_frame {
        return Err("no frame header".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exif(le: bool, orientation: u16) -> Vec<u8> {
        let mut v = b"Exif\0\0".to_vec();
        let w16 =
            |v: &mut Vec<u8>, x: u16| v.extend(if le { x.to_le_bytes() } else { x.to_be_bytes() });
        let w32 =
            |v: &mut Vec<u8>, x: u32| v.extend(if le { x.to_le_bytes() } else { x.to_be_bytes() });
        v.extend(if le { b"II" } else { b"MM" });
        w16(&mut v, 42);
        w32(&mut v, 8);
        w16(&mut v, 2);
        // An unrelated tag first, then Orientation.
        w16(&mut v, 0x010F);
        w16(&mut v, 2);
        w32(&mut v, 4);
        w32(&mut v, 0);
        w16(&mut v, 0x0112);
        w16(&mut v, 3);
        w32(&mut v, 1);
        w16(&mut v, orientation);
        w16(&mut v, 0);
        v
    }

    #[test]
    fn orientation_both_byte_orders() {
        assert_eq!(exif_orientation(&exif(true, 6)), Some(6));
        assert_eq!(exif_orientation(&exif(false, 8)), Some(8));
        assert_eq!(exif_orientation(&exif(true, 9)), None);
        let e = exif(true, 3);
        for cut in 0..e.len() {
            let _ = exif_orientation(&e[..cut]);
        }
    }

    fn sof(precision: u8, components: u8, code: u8) -> Vec<u8> {
        let mut v = vec![0xFF, SOI, 0xFF, code];
        let len = 8 + 3 * components as u16;
        v.extend(len.to_be_bytes());
        v.push(precision);
        v.extend(16u16.to_be_bytes());
        v.extend(24u16.to_be_bytes());
        v.push(components);
        for c in 0..components {
            v.extend([c + 1, 0x11, 0]);
        }
        v.extend([0xFF, EOI]);
        v
    }

    #[test]
    fn probe_classifies_frames() {
        let ok = probe(&sof(8, 3, 0xC0)).unwrap();
        assert_eq!((ok.width, ok.height, ok.components), (24, 16, 3));
        assert!(!ok.progressive);
        assert!(probe(&sof(8, 1, 0xC2)).unwrap().progressive);
        assert!(
            matches!(probe(&sof(12, 3, 0xC1)), Err(ProbeError::Unsupported(s)) if s.contains("12-bit"))
        );
        assert!(
            matches!(probe(&sof(8, 4, 0xC0)), Err(ProbeError::Unsupported(s)) if s.contains("CMYK"))
        );
        assert!(matches!(
            probe(&sof(8, 3, 0xC9)),
            Err(ProbeError::Unsupported(_))
        ));
        assert!(matches!(
            probe(b"\x89PNG\r\n\x1a\n"),
            Err(ProbeError::NotJpeg(_))
        ));
        let good = sof(8, 3, 0xC0);
        for cut in 0..good.len() - 2 {
            assert!(probe(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn entropy_end_skips_stuffing_and_restarts() {
        let b = [1, 2, 0xFF, 0x00, 3, 0xFF, 0xD3, 4, 0xFF, 0xFF, 0xC4, 9];
        assert_eq!(entropy_end(&b, 0), 9);
        assert_eq!(entropy_end(&[1, 2, 3], 0), 3);
    }

    #[test]
    fn scan_piece_checks() {
        let mut piece = vec![0xFF, SOS, 0, 8, 1, 1, 0, 0, 63, 0];
        piece.extend([0x12, 0xFF, 0x00, 0x34]);
        assert!(check_scan_piece(&piece).is_ok());
        let mut with_table = piece.clone();
        with_table.extend([0xFF, 0xC4, 0, 3, 7]);
        assert!(check_scan_piece(&with_table).is_ok());
        // A cut inside the trailing table is caught.
        assert!(check_scan_piece(&with_table[..with_table.len() - 1]).is_err());
        // A stray marker in the data is caught.
        let mut stray = piece.clone();
        stray.extend([0xFF, EOI]);
        assert!(check_scan_piece(&stray).is_err());
        assert!(check_scan_piece(&piece[1..]).is_err());
    }
}
