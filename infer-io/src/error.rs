//! The one error of the crate: every failure names the file it is about.

use std::path::PathBuf;

/// Everything that can go wrong reading an input, writing an output, or running a network between them.
///
/// A failure met while the network runs (a tile's window read from a damaged file, an output that cannot
/// be written) is this same error, whichever tile met it: the reader and the writers hand theirs to the
/// engine inside [`bsp_tiling::Error::External`] and get them back from [`Error::from_run`]. So damage
/// found when a file is opened and damage found by the window that reads it are one error of one kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file that could not be opened, read, created or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An L3 input that is damaged or not L3 at all.
    #[error("{}: {source}", path.display())]
    L3 {
        path: PathBuf,
        #[source]
        source: l3_format::Error,
    },
    /// A TIFF that cannot be read by region, or is damaged, or a TIFF output that cannot be written.
    #[error("{}: {reason}", path.display())]
    Tiff { path: PathBuf, reason: String },
    /// A TIFF page (image file directory, counted from 0) the file does not have.
    #[error("{}: there is no page {page}: the file has {pages} page{}", path.display(), if *.pages == 1 { "" } else { "s" })]
    NoSuchPage {
        path: PathBuf,
        page: usize,
        pages: usize,
    },
    /// A level (a SubIFD, counted from 1; 0 is the page itself) that a TIFF page does not have.
    #[error(
        "{}: page {page} has no level {level}: its levels are 0 (the page itself) to {subifds} (its SubIFDs)", path.display()
    )]
    NoSuchLevel {
        path: PathBuf,
        page: usize,
        level: usize,
        subifds: usize,
    },
    /// A `.npy` that is not the float32 C-order array it must be, or whose header numpy would refuse.
    #[error("{}: not a float32 .npy: {reason}", path.display())]
    Npy { path: PathBuf, reason: String },
    /// Any other image, decoded whole through the loader's one import path.
    #[error("{}: {source}", path.display())]
    Image {
        path: PathBuf,
        #[source]
        source: loader::Error,
    },
    /// An output's encoder (PNG, L3, JPEG) refused what it was given or failed.
    #[error("writing {}: {reason}", path.display())]
    Encode { path: PathBuf, reason: String },
    /// A request that cannot work with these files or this model: `option` names the setting by its
    /// Python keyword (the command line's flag is the same with `-` for `_`), or the file it is about.
    #[error("{subject}: {reason}")]
    Refused { subject: String, reason: String },
    /// The network: loading it, or running it.
    #[error(transparent)]
    Run(bsp_tiling::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn refused(subject: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Refused {
            subject: subject.into(),
            reason: reason.into(),
        }
    }

    /// The engine's error, or ours back where a reader or a writer of this crate failed inside the run.
    pub fn from_run(e: bsp_tiling::Error) -> Error {
        match e {
            bsp_tiling::Error::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::Run(bsp_tiling::Error::External(other)),
            },
            e => Error::Run(e),
        }
    }
}

impl From<bsp_tiling::Error> for Error {
    fn from(e: bsp_tiling::Error) -> Error {
        Error::from_run(e)
    }
}

/// Our failure inside a run (a window read, a tile written), carried by the engine to whoever started it.
impl From<Error> for bsp_tiling::Error {
    fn from(e: Error) -> bsp_tiling::Error {
        match e {
            Error::Run(inner) => inner,
            e => bsp_tiling::Error::External(Box::new(e)),
        }
    }
}
