//! The on-disk format (see SPEC.md): record preamble and CBOR header, the dataset index, and the one
//! function both sides use to place every piece, so writer and reader cannot disagree about the layout.

use crate::item::Item;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// First bytes of every record file.
pub const RECORD_MAGIC: [u8; 4] = *b"PCR1";
/// First bytes of the index file.
pub const INDEX_MAGIC: [u8; 8] = *b"PCRINDX1";
/// The index's file name inside a dataset directory.
pub const INDEX_FILE: &str = "index.cbor";
/// Format version written in the record header and the index.
pub const VERSION: u32 = 1;
/// Magic (4) + header length (u32 LE) + header CRC-32 (u32 LE).
pub const PREAMBLE_LEN: u64 = 12;
/// Upper bound on a record header, so a corrupt length cannot make a reader allocate without limit.
pub const MAX_HEADER_LEN: u32 = 256 << 20;

/// The CBOR header at the start of a record: everything needed to re-derive the layout, plus metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordHeader {
    pub version: u32,
    pub dataset_id: u64,
    pub record: u32,
    pub images: Vec<ImageHeader>,
}

/// One image in a record header: its metadata and the lengths of its pieces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageHeader {
    pub item: Item,
    pub header_len: u32,
    pub scan_lens: Vec<u32>,
}

/// A byte range of a record file with the CRC-32 of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
}

impl Piece {
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + u64::from(self.len)
    }
}

/// Where one image's pieces lie: its JPEG header (`[0, first SOS)` of the progressive stream) and each scan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub header: Piece,
    pub scans: Vec<Piece>,
}

/// One record in the index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordEntry {
    /// File name inside the dataset directory (`record-00000.pcr`).
    pub file: String,
    pub file_len: u64,
    pub header_len: u32,
    pub header_crc: u32,
    /// `group_ends[g]` is the byte offset where scan group `g + 1` ends: reading `[0, group_ends[k-1])`
    /// yields every image of the record at group `k`.
    pub group_ends: Vec<u64>,
    pub images: Vec<ImageEntry>,
}

/// The dataset index (`index.cbor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub version: u32,
    pub dataset_id: u64,
    /// The number of scan groups of the dataset: the most scans any image has.
    pub groups: u32,
    pub images_per_record: u32,
    pub records: Vec<RecordEntry>,
}

/// Piece positions derived from piece lengths: headers of all images, then group 1 of all images, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub headers: Vec<Range<u64>>,
    pub scans: Vec<Vec<Range<u64>>>,
    pub group_ends: Vec<u64>,
}

/// Places every piece of a record whose CBOR header is `header_len` bytes long.
pub fn layout(header_len: u32, images: &[(u32, &[u32])]) -> Layout {
    let mut at = PREAMBLE_LEN + u64::from(header_len);
    let mut headers = Vec::with_capacity(images.len());
    for &(h, _) in images {
        headers.push(at..at + u64::from(h));
        at += u64::from(h);
    }
    let groups = images.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    let mut scans: Vec<Vec<Range<u64>>> = images
        .iter()
        .map(|(_, s)| Vec::with_capacity(s.len()))
        .collect();
    let mut group_ends = Vec::with_capacity(groups);
    for g in 0..groups {
        for (i, &(_, lens)) in images.iter().enumerate() {
            if let Some(&l) = lens.get(g) {
                scans[i].push(at..at + u64::from(l));
                at += u64::from(l);
            }
        }
        group_ends.push(at);
    }
    Layout {
        headers,
        scans,
        group_ends,
    }
}

impl RecordHeader {
    pub fn layout(&self, header_len: u32) -> Layout {
        let lens: Vec<(u32, &[u32])> = self
            .images
            .iter()
            .map(|i| (i.header_len, i.scan_lens.as_slice()))
            .collect();
        layout(header_len, &lens)
    }
}

impl RecordEntry {
    /// The layout the entry's own piece lengths imply; a well-formed entry's offsets equal it.
    pub fn implied_layout(&self) -> Layout {
        let lens: Vec<(u32, Vec<u32>)> = self
            .images
            .iter()
            .map(|i| (i.header.len, i.scans.iter().map(|p| p.len).collect()))
            .collect();
        let refs: Vec<(u32, &[u32])> = lens.iter().map(|(h, s)| (*h, s.as_slice())).collect();
        layout(self.header_len, &refs)
    }

    /// Checks that offsets, group ends and file length agree with the piece lengths.
    pub fn check_self(&self, groups: u32) -> Result<(), String> {
        if self.file.is_empty()
            || self.file.contains(['/', '\\'])
            || self.file.starts_with('.')
            || !self.file.ends_with(".pcr")
        {
            return Err(format!("bad record file name {:?}", self.file));
        }
        if self.header_len > MAX_HEADER_LEN {
            return Err(format!(
                "{}: header length {} is too large",
                self.file, self.header_len
            ));
        }
        let l = self.implied_layout();
        let offsets_ok = self.images.iter().enumerate().all(|(i, img)| {
            img.header.range() == l.headers[i]
                && img
                    .scans
                    .iter()
                    .map(Piece::range)
                    .eq(l.scans[i].iter().cloned())
        });
        if !offsets_ok {
            return Err(format!("{}: piece offsets are not contiguous", self.file));
        }
        if self.group_ends != l.group_ends {
            return Err(format!(
                "{}: group ends disagree with the pieces",
                self.file
            ));
        }
        if self.group_ends.is_empty() || self.group_ends.len() > groups as usize {
            return Err(format!("{}: {} groups", self.file, self.group_ends.len()));
        }
        if self.group_ends.last() != Some(&self.file_len) {
            return Err(format!(
                "{}: the last group does not end the file",
                self.file
            ));
        }
        Ok(())
    }

    /// Bytes to read for group `k` (1-based; past the record's last group means the whole record).
    pub fn prefix_len(&self, k: usize) -> u64 {
        let g = k.clamp(1, self.group_ends.len().max(1));
        self.group_ends.get(g - 1).copied().unwrap_or(0)
    }
}

/// Serialises to CBOR.
pub fn to_cbor<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(v, &mut out).expect("writing CBOR to a Vec cannot fail");
    out
}

/// Parses CBOR that must span all of `bytes`.
pub fn from_cbor<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut rest = bytes;
    let v = ciborium::from_reader(&mut rest).map_err(crate::error::cbor_message)?;
    if !rest.is_empty() {
        return Err(format!("{} stray bytes after the CBOR value", rest.len()));
    }
    Ok(v)
}

/// The index file's bytes: magic, CRC-32 of the payload (u32 LE), CBOR payload.
pub fn index_bytes(index: &Index) -> Vec<u8> {
    let payload = to_cbor(index);
    let mut out = Vec::with_capacity(12 + payload.len());
    out.extend_from_slice(&INDEX_MAGIC);
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Parses and checks an index file's bytes.
pub fn parse_index(bytes: &[u8]) -> Result<Index, String> {
    if bytes.len() < 12 || bytes[..8] != INDEX_MAGIC {
        return Err("no PCR index magic".into());
    }
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let payload = &bytes[12..];
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    let index: Index = from_cbor(payload)?;
    if index.version != VERSION {
        return Err(format!(
            "format version {} (this reader knows {VERSION})",
            index.version
        ));
    }
    if index.groups == 0 {
        return Err("zero scan groups".into());
    }
    let mut names = std::collections::HashSet::new();
    for r in &index.records {
        r.check_self(index.groups)?;
        for img in &r.images {
            check_name(&img.name).map_err(|e| format!("{}: {e}", r.file))?;
            if !names.insert(img.name.as_str()) {
                return Err(format!(
                    "{}: image name {:?} appears twice",
                    r.file, img.name
                ));
            }
        }
    }
    if index.records.iter().map(|r| r.group_ends.len()).max() != Some(index.groups as usize) {
        return Err("the group count disagrees with the records".into());
    }
    Ok(index)
}

/// Checks an image name: a relative path of plain components separated by `/` (`x.jpg`, `a/x.jpg`), so a
/// reader can write `<name without extension>.png` under its output folder and stay inside it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an image has an empty name".into());
    }
    if name.contains(['\0', '\\']) || name.chars().any(char::is_control) {
        return Err(format!(
            "image name {name:?} holds a control character or a backslash"
        ));
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "image name {name:?} is not a relative path of plain components"
        ));
    }
    Ok(())
}

/// The preamble of a record: magic, header length, header CRC.
pub fn preamble(header: &[u8]) -> [u8; PREAMBLE_LEN as usize] {
    let mut p = [0u8; PREAMBLE_LEN as usize];
    p[..4].copy_from_slice(&RECORD_MAGIC);
    p[4..8].copy_from_slice(&(header.len() as u32).to_le_bytes());
    p[8..12].copy_from_slice(&crc32fast::hash(header).to_le_bytes());
    p
}

/// Parses a record's preamble and CBOR header from the start of its bytes; returns the header and its length.
pub fn parse_record_header(bytes: &[u8]) -> Result<(RecordHeader, u32, u32), String> {
    if bytes.len() < PREAMBLE_LEN as usize || bytes[..4] != RECORD_MAGIC {
        return Err("no PCR record magic".into());
    }
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if len > MAX_HEADER_LEN {
        return Err(format!("header length {len} is too large"));
    }
    let end = PREAMBLE_LEN as usize + len as usize;
    let header = bytes
        .get(PREAMBLE_LEN as usize..end)
        .ok_or("header is cut short")?;
    if crc32fast::hash(header) != crc {
        return Err("header checksum mismatch".into());
    }
    let h: RecordHeader = from_cbor(header)?;
    if h.version != VERSION {
        return Err(format!(
            "format version {} (this reader knows {VERSION})",
            h.version
        ));
    }
    if h.images.iter().any(|i| i.scan_lens.is_empty()) {
        return Err("an image has no scans".into());
    }
    Ok((h, len, crc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_groups_scans_and_leaves_short_images_out_of_late_groups() {
        // Two colour-like images with 3 scans and one gray-like with 2.
        let l = layout(10, &[(5, &[1, 2, 3]), (6, &[4, 5]), (7, &[6, 7, 8])]);
        let base = PREAMBLE_LEN + 10;
        assert_eq!(
            l.headers,
            vec![base..base + 5, base + 5..base + 11, base + 11..base + 18]
        );
        let g1 = base + 18;
        assert_eq!(l.scans[0][0], g1..g1 + 1);
        assert_eq!(l.scans[1][0], g1 + 1..g1 + 5);
        assert_eq!(l.scans[2][0], g1 + 5..g1 + 11);
        assert_eq!(
            l.group_ends,
            vec![g1 + 11, g1 + 11 + 2 + 5 + 7, g1 + 11 + 14 + 3 + 8]
        );
        assert_eq!(l.scans[1].len(), 2);
    }

    #[test]
    fn index_round_trip_and_corruption() {
        let l = layout(3, &[(2, &[4, 4])]);
        let entry = RecordEntry {
            file: "record-00000.pcr".into(),
            file_len: *l.group_ends.last().unwrap(),
            header_len: 3,
            header_crc: 0,
            group_ends: l.group_ends.clone(),
            images: vec![ImageEntry {
                name: "a.jpg".into(),
                label: None,
                header: Piece {
                    offset: l.headers[0].start,
                    len: 2,
                    crc: 0,
                },
                scans: l.scans[0]
                    .iter()
                    .map(|r| Piece {
                        offset: r.start,
                        len: 4,
                        crc: 0,
                    })
                    .collect(),
            }],
        };
        let index = Index {
            version: VERSION,
            dataset_id: 7,
            groups: 2,
            images_per_record: 1,
            records: vec![entry],
        };
        let bytes = index_bytes(&index);
        assert_eq!(parse_index(&bytes).unwrap(), index);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(parse_index(&b).is_err(), "flip at {i} accepted");
        }
        for cut in 0..bytes.len() {
            assert!(parse_index(&bytes[..cut]).is_err());
        }
        let mut bad = index.clone();
        bad.records[0].group_ends[0] += 1;
        assert!(parse_index(&index_bytes(&bad)).is_err());
        let mut bad = index.clone();
        bad.records[0].file = "../etc/passwd.pcr".into();
        assert!(parse_index(&index_bytes(&bad)).is_err());
    }
}
