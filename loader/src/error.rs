//! The loader's one error type: every variant names the file (and, inside a run, the item index).

use std::path::PathBuf;

/// Everything that can go wrong while building a dataset or running a loader.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bytes of an item are not a valid image of the format they claim to be.
    #[error("{}: cannot decode {format}: {reason}", path.display())]
    Decode {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },
    /// An item failed inside a running loader: the dataset index says which, `source` says why (and names
    /// the file).
    #[error("item {index}: {source}")]
    Item {
        index: usize,
        #[source]
        source: Box<Error>,
    },
    /// A dataset description (folder, labels CSV, manifest, index) is malformed, empty or ambiguous.
    #[error("{}: {reason}", path.display())]
    Dataset { path: PathBuf, reason: String },
    /// A shard of a shard set (a tar) or its index is damaged, disagrees with the other, or lacks a member:
    /// names the shard and, where one is concerned, the member.
    #[error("{}{}: {reason}", shard.display(), member.as_deref().map(|m| format!(": member {m}")).unwrap_or_default())]
    Shard {
        shard: PathBuf,
        member: Option<String>,
        reason: String,
    },
    /// A PCR dataset or record failed its checks (the message names the file).
    #[error("{0}")]
    Pcr(#[from] pcr::Error),
    /// An option value the loader does not accept, named as the surfaces spell it.
    #[error("{0}")]
    Invalid(#[from] vocab::Invalid),
    /// Loader options that cannot work with this dataset (an empty dataset, no batch per epoch, ...).
    #[error("invalid loader options: {0}")]
    Options(String),
    /// Buffers the options ask for would not fit in memory.
    #[error("{0}")]
    Memory(#[from] stdx::mem::TooLarge),
    /// A resume state that belongs to another configuration.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// GPU decoding was asked for and cannot be done: no usable device, or a batch the device failed on.
    #[error("GPU decoding failed{}: {reason}", at.as_deref().map(|a| format!(" ({a})")).unwrap_or_default())]
    Gpu {
        /// Which batch or item, when the failure is about one.
        at: Option<String>,
        reason: String,
    },
    /// `pin_memory` was asked for and page-locked host memory cannot be had (no driver, no device, a
    /// build without the `gpu` feature, or the allocation refused).
    #[error("pin_memory: cannot page-lock batch memory: {0}")]
    PinMemory(String),
    /// The pipeline stopped unexpectedly (a worker thread panicked or could not start).
    #[error("loader pipeline stopped: {0}")]
    Pipeline(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn decode(
        path: impl Into<PathBuf>,
        format: &'static str,
        reason: impl ToString,
    ) -> Self {
        Error::Decode {
            path: path.into(),
            format,
            reason: reason.to_string(),
        }
    }

    pub(crate) fn dataset(path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        Error::Dataset {
            path: path.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn shard(
        shard: impl Into<PathBuf>,
        member: Option<&str>,
        reason: impl ToString,
    ) -> Self {
        Error::Shard {
            shard: shard.into(),
            member: member.map(str::to_string),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn gpu(at: Option<String>, reason: impl ToString) -> Self {
        Error::Gpu {
            at,
            reason: reason.to_string(),
        }
    }

    /// Wraps an error about dataset item `index`.
    pub(crate) fn item(index: usize, source: Error) -> Self {
        Error::Item {
            index,
            source: Box::new(source),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
