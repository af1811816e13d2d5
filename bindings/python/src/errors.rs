//! Every failure becomes an exception of the `l3toolkit.Error` family (defined in `l3toolkit/_errors.py`
//! so that `IOError` can also be an `OSError` and `FormatError`/`OptionsError` a `ValueError`), whose
//! message is the Rust error's `Display` — the file or item it is about included.
//!
//! Work runs with the GIL released and panics caught ([`detached`]): a failure there is a [`Failure`]
//! (plain Rust data, `Send`) turned into the Python exception once the thread holds the GIL again.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

/// The exception classes, by meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `l3toolkit.Error`: anything else (a stopped pipeline, an internal failure).
    Base,
    /// `l3toolkit.FormatError`: bytes that are not a valid image, dataset or model of their kind.
    Format,
    /// `l3toolkit.IOError` (also an `OSError`): a file or folder could not be read or written.
    Io,
    /// `l3toolkit.OptionsError` (also a `ValueError`): arguments that cannot work, or a resume state
    /// that belongs to another configuration.
    Options,
    /// `l3toolkit.GpuError`: the GPU was asked for and cannot do it.
    Gpu,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Base => "Error",
            Kind::Format => "FormatError",
            Kind::Io => "IOError",
            Kind::Options => "OptionsError",
            Kind::Gpu => "GpuError",
        }
    }
}

/// A failure computed without the GIL, raised as an exception once it is held again.
#[derive(Debug)]
pub struct Failure {
    pub kind: Kind,
    pub message: String,
    /// For I/O failures: the OS error number and the path, set as the `OSError`'s `errno` and `filename`.
    pub errno: Option<i32>,
    pub path: Option<PathBuf>,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            errno: None,
            path: None,
        }
    }

    pub fn options(message: impl Into<String>) -> Failure {
        Failure::new(Kind::Options, message)
    }

    pub fn io(path: impl Into<PathBuf>, e: &std::io::Error) -> Failure {
        let path = path.into();
        Failure {
            kind: Kind::Io,
            message: format!("{}: {e}", path.display()),
            errno: e.raw_os_error(),
            path: Some(path),
        }
    }

    /// An `l3-format` error about the L3 data called `what` (a path, or "L3 data" for bytes).
    pub fn l3(what: &str, e: l3_format::Error) -> Failure {
        let kind = match e {
            l3_format::Error::BadRegion { .. } => Kind::Options,
            _ => Kind::Format,
        };
        Failure::new(kind, format!("{what}: {e}"))
    }

    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let class = match exception_class(py, self.kind) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let err = PyErr::from_type(class.clone(), (self.message,));
        if self.kind == Kind::Io {
            // OSError's attributes: what `except OSError as e: e.errno, e.filename` code reads.
            let value = err.value(py);
            if let Some(n) = self.errno {
                let _ = value.setattr("errno", n);
            }
            if let Some(p) = &self.path {
                let _ = value.setattr("filename", p.to_string_lossy().as_ref());
            }
        }
        err
    }
}

fn exception_class(py: Python<'_>, kind: Kind) -> PyResult<&Bound<'_, PyType>> {
    static CLASSES: [PyOnceLock<Py<PyType>>; 5] = [
        PyOnceLock::new(),
        PyOnceLock::new(),
        PyOnceLock::new(),
        PyOnceLock::new(),
        PyOnceLock::new(),
    ];
    CLASSES[kind as usize].import(py, "l3toolkit._errors", kind.class_name())
}

/// A Python exception of `kind` (for argument checks made while holding the GIL).
pub fn raise(py: Python<'_>, kind: Kind, message: impl Into<String>) -> PyErr {
    Failure::new(kind, message).into_pyerr(py)
}

/// The class of a loader error: the innermost cause of an item's failure decides.
fn loader_kind(e: &loader::Error) -> Kind {
    use loader::Error as E;
    match e {
        E::Io { .. } => Kind::Io,
        E::Decode { .. } | E::Dataset { .. } => Kind::Format,
        E::Item { source, .. } => loader_kind(source),
        E::Options(_) | E::Invalid(_) | E::Memory(_) | E::Resume(_) => Kind::Options,
        E::Gpu { .. } | E::PinMemory(_) => Kind::Gpu,
        _ => Kind::Base,
    }
}

/// The innermost I/O error of a loader error, with its path.
fn loader_io(e: &loader::Error) -> Option<(&std::path::Path, &std::io::Error)> {
    match e {
        loader::Error::Io { path, source } => Some((path, source)),
        loader::Error::Item { source, .. } => loader_io(source),
        _ => None,
    }
}

impl From<vocab::Invalid> for Failure {
    fn from(e: vocab::Invalid) -> Failure {
        Failure::options(e.to_string())
    }
}

impl From<loader::Error> for Failure {
    fn from(e: loader::Error) -> Failure {
        let (errno, path) = match loader_io(&e) {
            Some((p, io)) => (io.raw_os_error(), Some(p.to_path_buf())),
            None => (None, None),
        };
        Failure {
            kind: loader_kind(&e),
            message: e.to_string(),
            errno,
            path,
        }
    }
}

/// The exception kind of a bsp-tiling error.
pub fn bsp_kind(e: &bsp_tiling::Error) -> Kind {
    use bsp_tiling::Error as E;
    match e {
        E::Io { .. } | E::Spill { .. } => Kind::Io,
        E::Format { .. }
        | E::MissingTensor { .. }
        | E::BadShape { .. }
        | E::BadDtype { .. }
        | E::UnexpectedTensor { .. }
        | E::Unsupported(_)
        | E::Node { .. }
        | E::OnnxFormat { .. } => Kind::Format,
        E::EmptyImage { .. }
        | E::ImageTooSmall { .. }
        | E::ImageTooSmallFor { .. }
        | E::TileSmallerThanHalo { .. }
        | E::Grid(_)
        | E::OverBudget { .. }
        | E::WholeTooLarge { .. }
        | E::TileOverBudget { .. }
        | E::TooLarge(_)
        | E::Channels { .. }
        | E::Device(_)
        | E::DeviceBudget { .. } => Kind::Options,
        E::NoDriver
        | E::NoCudaLibrary { .. }
        | E::NoDevice { .. }
        | E::Cuda { .. }
        | E::Compile { .. } => Kind::Gpu,
        E::TensorShape { .. }
        | E::OutOfMemory { .. }
        | E::External(_)
        | E::RankFailed { .. }
        | E::Collective { .. } => Kind::Base,
    }
}

impl From<bsp_tiling::Error> for Failure {
    fn from(e: bsp_tiling::Error) -> Failure {
        use bsp_tiling::Error as E;
        let kind = bsp_kind(&e);
        let io = match &e {
            E::Io { path, source } => Some((path.clone(), source)),
            E::Spill { dir, source } => Some((dir.clone(), source)),
            _ => None,
        };
        Failure {
            kind,
            message: e.to_string(),
            errno: io.as_ref().and_then(|(_, s)| s.raw_os_error()),
            path: io.map(|(p, _)| p),
        }
    }
}

/// The exception kind of an inference I/O error: damage to a file is a `FormatError` whether it was
/// found when the file was opened or by the window that read it (the same `infer_io::Error`).
pub fn infer_kind(e: &infer_io::Error) -> Kind {
    use infer_io::Error as E;
    match e {
        E::Io { .. } => Kind::Io,
        E::L3 { source, .. } => match source {
            l3_format::Error::BadRegion { .. } => Kind::Options,
            _ => Kind::Format,
        },
        E::Tiff { .. } | E::Npy { .. } | E::Encode { .. } => Kind::Format,
        E::Image { source, .. } => loader_kind(source),
        E::NoSuchPage { .. } | E::NoSuchLevel { .. } | E::Refused { .. } => Kind::Options,
        E::Run(b) => bsp_kind(b),
        _ => Kind::Base,
    }
}

impl From<infer_io::Error> for Failure {
    fn from(e: infer_io::Error) -> Failure {
        use infer_io::Error as E;
        let io = match &e {
            E::Io { path, source } => Some((path.clone(), source.raw_os_error())),
            E::Run(bsp_tiling::Error::Io { path, source }) => {
                Some((path.clone(), source.raw_os_error()))
            }
            E::Run(bsp_tiling::Error::Spill { dir, source }) => {
                Some((dir.clone(), source.raw_os_error()))
            }
            E::Image { source, .. } => {
                loader_io(source).map(|(p, s)| (p.to_path_buf(), s.raw_os_error()))
            }
            _ => None,
        };
        Failure {
            kind: infer_kind(&e),
            message: e.to_string(),
            errno: io.as_ref().and_then(|(_, n)| *n),
            path: io.map(|(p, _)| p),
        }
    }
}

/// Runs `f` with the GIL released, panics caught: what every call into the toolkit's Rust code goes
/// through, so other Python threads run meanwhile and nothing unwinds into the interpreter.
pub fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, Failure> + Send,
{
    py.detach(|| catch(f)).map_err(|e| e.into_pyerr(py))
}

/// `f()`, with a panic turned into an `l3toolkit.Error` naming it.
pub fn catch<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".into());
            Err(Failure::new(
                Kind::Base,
                format!("internal error (a panic in the toolkit): {what}"),
            ))
        }
    }
}
