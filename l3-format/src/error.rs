//! Typed errors and decoding limits.

use crate::pixel_layout::PixelLayout;
use std::fmt;
use std::path::{Path, PathBuf};
use vocab::Rect;

/// Which patch of which channel an error is about (absent when [`crate::decode_patch`] is called on bare bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchId {
    pub channel: usize,
    pub patch: usize,
}

impl fmt::Display for PatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "patch {} of channel {}", self.patch, self.channel)
    }
}

fn at(p: &Option<PatchId>) -> String {
    match p {
        Some(p) => format!("{p}: "),
        None => String::new(),
    }
}

/// Everything that can go wrong encoding or decoding L3. One variant per failure kind; decoding never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file ends before the header or the offset table does.
    #[error("truncated L3 file: the {what} needs {needed} bytes, the file has {len}")]
    Truncated {
        what: &'static str,
        needed: usize,
        len: usize,
    },
    #[error("not an L3 file: magic {found:02x?}, expected \"L3IM\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported L3 version {found} (this build reads versions 1 and 2)")]
    UnsupportedVersion { found: u16 },
    #[error("zero image dimension {width}x{height}")]
    ZeroDimension { width: u32, height: u32 },
    /// width × height × channels overflows or exceeds [`Limits::max_pixels`].
    #[error("image too large: {width}x{height}x{channels} exceeds the limit of {limit} samples")]
    TooLarge {
        width: u32,
        height: u32,
        channels: u8,
        limit: u64,
    },
    #[error("unsupported channel count {found} (1, 3 or 4)")]
    BadChannels { found: u8 },
    #[error("unsupported bit depth {found} (8)")]
    BadBitDepth { found: u8 },
    #[error("patch size 0")]
    ZeroPatchSize,
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    #[error("the first patch offset is {offset}, must be 0")]
    FirstOffsetNotZero { offset: u32 },
    #[error("{}offset {offset} is before the previous offset {previous}", at(&Some(*patch)))]
    OffsetOutOfOrder {
        patch: PatchId,
        offset: u32,
        previous: u32,
    },
    #[error("{}offset {offset} is past the end of the patch data ({data_len} bytes)", at(&Some(*patch)))]
    OffsetOutOfRange {
        patch: PatchId,
        offset: u32,
        data_len: usize,
    },
    /// Fewer bytes than the 2-byte minimum per row: caught by parse before any decoding.
    #[error("{}{len} bytes cannot hold {rows} rows (at least {min})", at(&Some(*patch)))]
    PatchTooShort {
        patch: PatchId,
        len: usize,
        rows: usize,
        min: usize,
    },
    #[error("{}row {row} declares {nbit} bits per delta (at most 8)", at(patch))]
    NbitTooLarge {
        patch: Option<PatchId>,
        row: usize,
        nbit: u8,
    },
    #[error(
        "{}row {row} needs {needed} bytes past offset {offset}, the patch has {len}",
        at(patch)
    )]
    RowPastPatchEnd {
        patch: Option<PatchId>,
        row: usize,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("{}{unused} bytes left over after the last row", at(patch))]
    TrailingPatchBytes {
        patch: Option<PatchId>,
        unused: usize,
    },
    /// A caller-supplied pixel or output buffer has the wrong length.
    #[error("buffer holds {got} bytes, expected {expected}")]
    BufferSize { expected: usize, got: usize },
    /// `decode_patch`/`encode_patch` called with a patch shape the format cannot hold.
    #[error("bad patch geometry {w}x{h} with stride {stride} (1..=255 each side, stride >= width)")]
    BadPatchGeometry { w: usize, h: usize, stride: usize },
    /// A region to decode that is empty or reaches outside the image.
    #[error("region {region} is empty or outside the {width}x{height} image")]
    BadRegion {
        region: Rect,
        width: u32,
        height: u32,
    },
    /// Output strides that cannot hold the region (a row stride shorter than a row, planes overlapping).
    #[error("output strides ({layout}) cannot hold a region {region}")]
    BadLayout { layout: PixelLayout, region: Rect },
    /// A region decode from partly read data found a patch whose bytes were not read.
    #[error("{patch}: bytes {start}..{end} of the file were not read")]
    MissingBytes {
        patch: PatchId,
        start: u64,
        end: u64,
    },
    /// The patch data would not be addressable by u32 offsets.
    #[error("encoded patch data of {bytes} bytes does not fit u32 offsets")]
    EncodedTooLarge { bytes: usize },

    // ---- Version 2 (SPEC.md, part 2) ----
    /// Header byte 17 of a version-2 file names no profile (0 = BP, 1 = ANS).
    #[error("unknown L3 v2 profile {found} (0 = BP, 1 = ANS)")]
    BadProfile { found: u8 },
    /// Version 2 needs a patch size that is a non-zero multiple of 32 (32 ..= 224).
    #[error("patch size {found} is not a multiple of 32 in 32..=224 (version 2)")]
    BadPatchSize { found: u8 },
    /// The file's last four bytes are not the CRC-32C of everything before them.
    #[error("CRC-32C mismatch: the file says {stored:08x}, its bytes give {computed:08x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// A version-2 flags byte (header offset 18) with a bit this reader does not know.
    #[error("unknown L3 v2 header flags {found:#04x} (bit 0 = entry CRCs)")]
    UnknownFlags { found: u8 },
    /// The CRC-32C stored for one offset-table entry does not match the entry's bytes (SPEC.md §2.11).
    #[error(
        "{patch}: CRC-32C mismatch: the table says {stored:08x}, the entry's bytes give {computed:08x}"
    )]
    EntryCrcMismatch {
        patch: PatchId,
        stored: u32,
        computed: u32,
    },
    /// The CRC-32C of a version-2 prefix (header, tables, offset and CRC tables) does not match it.
    #[error(
        "CRC-32C mismatch in the header and tables: stored {stored:08x}, their bytes give {computed:08x}"
    )]
    PrefixCrcMismatch { stored: u32, computed: u32 },
    /// The first offset of a v2 offset table must point right after the table.
    #[error("the first patch offset is {offset}, must be {expected} (the end of the offset table)")]
    FirstOffsetMisplaced { offset: u32, expected: u64 },
    /// A v2-ANS frequency table whose frequencies do not sum to 4096.
    #[error("frequency table of context {context} sums to {sum}, must be 4096")]
    FrequencySum { context: usize, sum: u32 },
    /// An Exp-Golomb frequency code longer than any frequency up to 4096 needs.
    #[error("frequency table of context {context}: a code longer than 4096 needs")]
    FrequencyCode { context: usize },
    /// A selector context whose table has symbols past 3 (selectors are 0 ..= 3).
    #[error("selector context {context} has {symbols} symbols, at most 4 (selectors 0..=3)")]
    SelectorOutOfRange { context: usize, symbols: usize },
    /// A v2-ANS chunk that cannot be 32 lane states followed by whole 16-bit words.
    #[error(
        "{patch}: chunk of {len} bytes, must be 128 bytes of lane states plus whole 16-bit words"
    )]
    ChunkLength { patch: PatchId, len: usize },
    /// A v2-ANS lane state below 2^16 at the start of a chunk.
    #[error("{patch}: rANS lane {lane} starts at state {state:#x}, below 2^16")]
    RansStateOutOfRange {
        patch: PatchId,
        lane: usize,
        state: u32,
    },
    /// A v2-ANS lane that does not end at 2^16, the encoder's initial state: the chunk is corrupt.
    #[error("{patch}: rANS lane {lane} ends at state {state:#x}, must be 0x10000")]
    RansFinalState {
        patch: PatchId,
        lane: usize,
        state: u32,
    },
    /// A v2-ANS chunk whose lanes need more 16-bit words than it holds.
    #[error("{patch}: the rANS lanes need more words than the chunk's {words}")]
    RansPastChunkEnd { patch: PatchId, words: usize },
    /// A v2-ANS symbol coded in a context the frequency tables mark unused.
    #[error("{patch}: a symbol in context {context}, which has no frequency table")]
    UnusedContext { patch: PatchId, context: usize },
    /// A v2-BP nbit code that leaves 0 ..= 8 (an escape above 8, +1 from 8 or −1 from 0).
    #[error("{patch}: row {row}, group {group}: nbit code gives {nbit}, must be 0..=8")]
    BadNbit {
        patch: PatchId,
        row: usize,
        group: usize,
        nbit: i32,
    },
    /// Options that cannot be honoured (e.g. v2 with a patch size that is not a multiple of 32).
    #[error("encode options: {reason}")]
    BadOptions { reason: &'static str },

    // ---- The streaming encoder ([`crate::L3Writer`]) ----
    /// Reading or writing a file failed: the output, or the spill file beside it.
    #[error("{}: {what}: {message}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        kind: std::io::ErrorKind,
        message: String,
    },
    /// Rows given after the image's last row.
    #[error("{given} rows given to an image of {height} rows")]
    RowsPastEnd { height: u32, given: u64 },
    /// Finishing before every row was given.
    #[error("only {given} of the image's {height} rows were given")]
    RowsMissing { height: u32, given: u32 },
    /// Bytes that are not a whole number of rows.
    #[error("{got} bytes are not whole rows of {row_bytes} bytes")]
    PartialRow { row_bytes: usize, got: usize },
    /// An error of the streaming encoder, with the output file it was writing.
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: Box<Error> },
}

impl Error {
    /// An I/O error on `path` while doing `what`.
    pub(crate) fn io(path: &Path, what: &'static str, e: &std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            what,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// How [`crate::L3File::parse_with`] reads a file: bounds, and whether to verify the v2 checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    pub limits: Limits,
    /// Verify a version-2 file's CRC-32C checksums before decoding (default `true`): the file's, and where
    /// the file has them its prefix's and every entry's (one pass over the bytes). Turn it off only when
    /// the bytes were verified already (e.g. right after a verified read of the same buffer); v1 has no CRC.
    pub verify_crc: bool,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            limits: Limits::default(),
            verify_crc: true,
        }
    }
}

/// Bounds applied when parsing untrusted files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted width × height × channels (decoded bytes).
    pub max_pixels: u64,
}

impl Default for Limits {
    /// 2³² samples (4 GiB decoded): far above any training image, far below what would exhaust memory by surprise.
    fn default() -> Self {
        Limits {
            max_pixels: 1 << 32,
        }
    }
}
