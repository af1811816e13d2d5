//! The one error type of the crate: every failure names what it was about, in one line.

use std::path::PathBuf;

/// A tensor shape as `[8, 3, 9, 9]`.
pub fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// A byte count for people: MiB, or "more bytes than the address space holds".
fn bytes_text(bytes: u64) -> String {
    if bytes == u64::MAX {
        "more bytes than the address space holds".into()
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// Everything that can go wrong loading a model or running it over an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{path}: tensor `{key}` is missing")]
    MissingTensor { path: PathBuf, key: String },
    #[error("{path}: tensor `{key}` has shape {}, expected {}", shape_text(.found), shape_text(.expected))]
    BadShape {
        path: PathBuf,
        key: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{key}` has dtype {found}, expected F32")]
    BadDtype {
        path: PathBuf,
        key: String,
        found: String,
    },
    #[error("{path}: unexpected tensor `{key}` (not part of a TransformerNet)")]
    UnexpectedTensor { path: PathBuf, key: String },
    #[error("the image is empty ({width}x{height})")]
    EmptyImage { width: usize, height: usize },
    #[error(
        "the image ({width}x{height}) is too small for the network: layer {layer} needs more than {pad} pixels to reflect"
    )]
    ImageTooSmall {
        width: usize,
        height: usize,
        layer: String,
        pad: usize,
    },
    #[error(
        "tile size {tile} is smaller than the halo of layer {layer} ({halo} input pixels); use tiles of at least {min}"
    )]
    TileSmallerThanHalo {
        tile: usize,
        layer: String,
        halo: usize,
        min: usize,
    },
    /// A node of a graph (an imported ONNX model) that cannot be imported or run, and why.
    #[error("node `{node}` ({op}): {reason}")]
    Node {
        node: String,
        op: String,
        reason: String,
    },
    /// An ONNX file that does not parse, or whose graph is not an image-to-image network.
    #[error("{model}: {reason}")]
    OnnxFormat { model: String, reason: String },
    #[error("the image ({width}x{height}) is too small for the network: node `{node}`: {reason}")]
    ImageTooSmallFor {
        width: usize,
        height: usize,
        node: String,
        reason: String,
    },
    #[error("invalid tile grid: {0}")]
    Grid(String),
    /// Another rank of a run shared among several failed: every rank stops with its error.
    #[error("rank {rank} of {size} failed: {message}")]
    RankFailed {
        rank: usize,
        size: usize,
        message: String,
    },
    /// The ranks' collective itself failed (a rank gone, a connection broken), or the ranks were not at
    /// the same step of the same run.
    #[error(
        "rank {rank} of {size}, at step {step}: the collective between the ranks failed: {message}"
    )]
    Collective {
        rank: usize,
        size: usize,
        step: String,
        message: String,
    },
    #[error(
        "the activations need {needed} bytes at their peak, more than the RAM budget ({ram}) plus the disk budget ({disk}) in {dir}"
    )]
    OverBudget {
        needed: u64,
        ram: u64,
        disk: u64,
        dir: PathBuf,
    },
    #[error(
        "a whole-image run's activations (its stored values and a tile's working set) need {needed} bytes at their peak, more than this machine's memory ({limit} bytes, {limit_from}): tile it (exact mode stores its values tile by tile, spilling to disk past its RAM budget)"
    )]
    WholeTooLarge {
        needed: u64,
        limit: u64,
        limit_from: &'static str,
    },
    /// The tiles worked on at once would hold more than the run may take, even at the smallest tile the
    /// network allows (or the tile of a mode that cannot change it: whole, naive).
    #[error(
        "a tile's working set (its input windows, output and scratch) needs {} with {workers} tile(s) of {tile} input pixels at once, more than {budget_from} ({}); raise the budget (--ram-budget-mib, {}) or use fewer threads",
        stdx::mem::human(*.needed),
        stdx::mem::human(*.budget),
        stdx::mem::LIMIT_VAR
    )]
    TileOverBudget {
        needed: u64,
        budget: u64,
        budget_from: String,
        tile: usize,
        workers: usize,
    },
    /// An allocation past the memory limit, refused before it is made.
    #[error("{0}")]
    TooLarge(#[from] stdx::mem::TooLarge),
    #[error("spill file in {dir}: {source}")]
    Spill {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tensor data of length {len} does not match shape {}", shape_text(.shape))]
    TensorShape { len: usize, shape: [usize; 3] },
    /// An activation buffer the allocator refused: the machine's memory or the process's limit.
    #[error(
        "out of memory: an activation of {} could not be allocated (the machine's memory or this process's limit, e.g. `ulimit -v`, is used up); lower the RAM budget or the tile size",
        bytes_text(*.bytes)
    )]
    OutOfMemory { bytes: u64 },
    #[error("input has {found} channels, the network expects {expected}")]
    Channels { expected: usize, found: usize },
    #[error("unsupported network: {0}")]
    Unsupported(String),
    /// A device other than the CPU was asked for something it cannot do (f16 on the CPU, ...).
    #[error("{0}")]
    Device(String),
    /// libcuda (the NVIDIA driver's user-space library) could not be loaded.
    #[error(
        "device cuda: no CUDA driver (libcuda could not be loaded; is an NVIDIA GPU and driver installed?)"
    )]
    NoDriver,
    /// A CUDA library the backend needs (libnvrtc, libcublas) could not be loaded.
    #[error("device cuda: {lib} could not be loaded ({hint})")]
    NoCudaLibrary {
        lib: &'static str,
        hint: &'static str,
    },
    #[error("device cuda:{ordinal}: no such CUDA device, the driver reports {count}")]
    NoDevice { ordinal: usize, count: usize },
    /// A CUDA driver or cuBLAS call failed.
    #[error("CUDA call {call} failed: {message}")]
    Cuda { call: &'static str, message: String },
    /// NVRTC rejected the embedded kernels (a toolkit/device mismatch, never bad input).
    #[error("NVRTC could not compile the bsp-tiling kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    /// The failure of an [`Input`](crate::Input) or a [`Sink`](crate::Sink) implemented outside this
    /// crate (a file read by region, an output written tile by tile), kept whole: the caller that gave
    /// the reader or the writer gets its own error back (`downcast`), whichever tile met it.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync>),
    /// Device memory would exceed the budget (`gpu_memory`).
    #[error(
        "device memory: {what} needs {needed} bytes, more than the budget of {budget} bytes (raise gpu_memory or use smaller tiles)"
    )]
    DeviceBudget {
        what: String,
        needed: u64,
        budget: u64,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The CUDA setup's reasons in this crate's words (the `device cuda: ...` texts above).
impl From<cuda_setup::Error> for Error {
    fn from(e: cuda_setup::Error) -> Error {
        use cuda_setup::{Error as E, Library};
        match e {
            E::Missing(Library::Driver) => Error::NoDriver,
            E::Missing(lib) => Error::NoCudaLibrary {
                lib: lib.file(),
                hint: lib.hint(),
            },
            E::NoDevice { ordinal, count } => Error::NoDevice { ordinal, count },
            E::Driver { call, message } => Error::Cuda { call, message },
            E::Init { message } => Error::Cuda {
                call: "cuInit",
                message,
            },
            E::Compile { arch, log, .. } => Error::Compile { arch, log },
            other => Error::Cuda {
                call: "CUDA setup",
                message: other.to_string(),
            },
        }
    }
}
