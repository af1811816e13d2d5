//! The crate's one error type: every variant names the file, item or setting at fault.

use std::path::PathBuf;

/// Everything that can go wrong opening, profiling, writing or streaming a multi-format dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: data file is missing")]
    MissingDataFile { path: PathBuf },
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
    move |source| Error::Io { path, source }
}
