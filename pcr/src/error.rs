//! The one error type of the crate: every variant names the file (input JPEG, record or index) it is about,
//! in one line that already holds the whole story (no `source()` chain to print a second time).

use std::path::PathBuf;

/// Everything that can go wrong writing or reading Progressive Compressed Records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system error on a file or folder (including an output folder another build holds
    /// locked, and a path that is a folder or a FIFO where a file is needed).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// An input given to the writer is not a JPEG stream (wrong magic, broken marker structure).
    #[error("{path}: not a JPEG file: {reason}")]
    NotJpeg { path: PathBuf, reason: String },
    /// An input is a JPEG of a kind the writer does not transcode (CMYK, 12-bit, lossless, arithmetic, ...).
    #[error("{path}: unsupported JPEG: {reason}")]
    UnsupportedJpeg { path: PathBuf, reason: String },
    /// An input's compressed data is damaged (cut short, bad Huffman codes, ...): libjpeg would fill in
    /// zeros, so the records would not hold the image the file was meant to. Refused unless
    /// [`BuildOptions::allow_corrupt`](crate::BuildOptions::allow_corrupt) is set.
    #[error("{path}: corrupt JPEG data: {reason} (refused unless corrupt inputs are allowed)")]
    CorruptJpeg { path: PathBuf, reason: String },
    /// libjpeg-turbo refused an input while transcoding it.
    #[error("{path}: libjpeg-turbo could not transcode it: {message}")]
    Transcode { path: PathBuf, message: String },
    /// Two inputs that cannot both go into one dataset: the same file twice, or two files that would get
    /// the same image name.
    #[error("{first} and {second}: {reason}")]
    DuplicateInput {
        first: PathBuf,
        second: PathBuf,
        reason: String,
    },
    /// A folder of inputs could not be listed or holds no JPEG files (the message names the entry).
    #[error("listing the inputs: {0}")]
    ListInputs(String),
    /// The labels CSV file is malformed, or names no label for an input.
    #[error("{path}: {reason}")]
    Labels { path: PathBuf, reason: String },
    /// The writer was asked for something impossible (no inputs, zero images per record, a bad name, ...).
    #[error("invalid build options: {0}")]
    Options(String),
    /// The folder has no index: not a dataset, or one whose build did not finish (the index is written
    /// last).
    #[error("{path}: not a PCR dataset: no index.cbor (a build that did not finish leaves none)")]
    NotADataset { path: PathBuf },
    /// The index file is missing a part, fails its checksum or does not parse.
    #[error("{path}: corrupt index: {reason}")]
    CorruptIndex { path: PathBuf, reason: String },
    /// A record file is shorter than the index says.
    #[error("{path}: truncated record: need {needed} bytes, the file has {actual}")]
    TruncatedRecord {
        path: PathBuf,
        needed: u64,
        actual: u64,
    },
    /// Bytes of a record fail their checksum, or are not the JPEG structure they must be.
    #[error("{path}: corrupt record: {reason}")]
    CorruptRecord { path: PathBuf, reason: String },
    /// One image of a record failed verification (a piece of it read with a checksum mismatch or a broken
    /// JPEG structure); the record's other images are intact.
    #[error("{path}: image {image} ({name}) is corrupt: {reason}")]
    CorruptImage {
        path: PathBuf,
        image: usize,
        name: String,
        reason: String,
    },
    /// A record's own header disagrees with the index entry for it (another build, a moved file, ...).
    #[error("{path}: record disagrees with the index: {reason}")]
    IndexMismatch { path: PathBuf, reason: String },
    /// A scan group outside `1..=groups` was asked for.
    #[error("scan group {group} is out of range: this dataset has groups 1..={groups}")]
    GroupOutOfRange { group: usize, groups: usize },
    /// A record number past the end of the dataset was asked for.
    #[error("record {record} is out of range: this dataset has {records} records")]
    RecordOutOfRange { record: usize, records: usize },
    /// An image number past the end of a record was asked for.
    #[error("image {image} is out of range: this record has {images} images")]
    ImageOutOfRange { image: usize, images: usize },
    /// A rebuilt JPEG stream did not decode.
    #[error("{name}: decoding failed ({decoder}): {message}")]
    Decode {
        name: String,
        decoder: &'static str,
        message: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }
}

/// What the byte-level JPEG functions report — libjpeg's [`Reader`](crate::libjpeg::Reader) and
/// [`transcode_progressive`](crate::libjpeg::transcode_progressive), and both [`Decoder`](crate::Decoder)s.
/// They see bytes, not files: a caller that knows the file names it ([`Error::Decode`],
/// [`Error::Transcode`], the loader's decode errors).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JpegError {
    /// No bytes at all.
    #[error("empty input")]
    Empty,
    /// libjpeg-turbo stopped on the stream, in its own words (a bad marker, a stream cut short, ...).
    #[error("{0}")]
    Libjpeg(String),
    /// libjpeg-turbo's output rows did not match the header's geometry, or it stopped handing out rows.
    #[error("unexpected output geometry or stalled decoder")]
    Stalled,
    /// libjpeg-turbo finished without writing any output.
    #[error("libjpeg produced no output")]
    NoOutput,
    /// The image has more pixels than the decoders accept.
    #[error("{width}x{height} is larger than {max} pixels")]
    TooLarge { width: u32, height: u32, max: u64 },
    /// A decode that allows no warning ([`decode_rgb`](crate::libjpeg::decode_rgb)) got one: libjpeg
    /// would have filled in what the stream lacks.
    #[error("libjpeg warning: {0}")]
    Warning(String),
    /// zune-jpeg refused the stream, in its own words.
    #[error("{0}")]
    Zune(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// ciborium's `Display` prints its `Debug` form (`Io(Error { kind: UnexpectedEof, .. })`); this says the
/// same in words.
pub(crate) fn cbor_message<T: std::fmt::Debug>(e: ciborium::de::Error<T>) -> String {
    use ciborium::de::Error as E;
    match e {
        E::Io(_) => "the data ends in the middle of a value".into(),
        E::Syntax(at) => format!("malformed CBOR at byte {at}"),
        E::Semantic(Some(at), msg) => format!("{msg} (at byte {at})"),
        E::Semantic(None, msg) => msg,
        E::RecursionLimitExceeded => "values nested too deeply".into(),
    }
}
