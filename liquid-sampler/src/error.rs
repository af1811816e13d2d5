//! The crate's one error type: every variant names the file, item or setting at fault, in one line that
//! already holds the whole story (no `source()` chain to print a second time).

use std::path::PathBuf;

/// Everything that can go wrong opening, profiling, writing or streaming a multi-format dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system error on a file or folder (including a folder another writer holds locked).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: data file is missing")]
    MissingDataFile { path: PathBuf },
    /// A data file that exists but is a folder, a FIFO, a device, ...
    #[error("{path}: data file is {reason}")]
    NotAFile { path: PathBuf, reason: String },
    #[error(
        "{path}: data file is truncated: the manifest needs {needed} bytes, the file has {actual}"
    )]
    TruncatedDataFile {
        path: PathBuf,
        needed: u64,
        actual: u64,
    },
    #[error("{path}: manifest disagrees with the data: {reason}")]
    ManifestMismatch { path: PathBuf, reason: String },
    #[error("{path}: not a Liquid manifest: {reason}")]
    BadManifest { path: PathBuf, reason: String },
    #[error("the dataset has no items")]
    EmptyDataset,
    #[error(
        "memory budget of {budget} bytes is smaller than one item of each format ({needed} bytes needed)"
    )]
    BudgetTooSmall { budget: u64, needed: u64 },
    #[error("bad setting: {0}")]
    BadSetting(String),
    #[error("item {id} ({format}): decode failed: {reason}")]
    Decode {
        id: u64,
        format: String,
        reason: String,
    },
    #[error("{path}: source image failed: {reason}")]
    Source { path: PathBuf, reason: String },
    #[error("the I/O threads stopped unexpectedly")]
    IoThreadsGone,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps an `io::Error` with the path it came from.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |error| Error::Io { path, error }
}

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

/// Reads a whole regular file of at most `limit` bytes: FIFOs, devices and folders fail at once (a
/// blocking open or an endless read would hang the caller) with a message naming what they are.
pub(crate) fn read_file(path: &std::path::Path, limit: u64) -> Result<Vec<u8>> {
    stdx::fs::read_regular(path, limit).map_err(io(path))
}
