//! The crate's one error type: every failure is a value, never a panic.

/// Everything that can go wrong setting up the GPU or decoding a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libcuda (the NVIDIA driver's user-space library) could not be loaded on this machine.
    #[error("no CUDA driver: libcuda could not be loaded (no NVIDIA driver installed?)")]
    NoDriver,
    /// libnvrtc (the CUDA runtime compiler, part of the toolkit) could not be loaded.
    #[error(
        "NVRTC not found: libnvrtc could not be loaded (install the CUDA toolkit's nvrtc library)"
    )]
    NoNvrtc,
    /// The driver loaded but there is no device with this ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    /// NVRTC rejected the embedded kernels (a toolkit/device mismatch, never bad input).
    #[error("NVRTC could not compile the L3 kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    /// Image `index` of the batch failed validation (header, offsets, or rows).
    #[error("image {index} of the batch: {source}")]
    Image {
        index: usize,
        #[source]
        source: l3_format::Error,
    },
    /// The kernel found a patch of image `index` whose rows do not exactly fill its bytes (only possible
    /// when host row validation is off; nothing was read out of bounds).
    #[error("image {index} of the batch: corrupt row data in patch {patch} of channel {channel}")]
    CorruptRows {
        index: usize,
        channel: usize,
        patch: usize,
    },
    /// Filling a [`crate::PinnedBatch`] failed (the caller's reader returned an error).
    #[error("filling the pinned batch: {0}")]
    Io(#[source] std::io::Error),
    /// `submit_plan` was given other images than the plan was built from.
    #[error("the images do not match the batch plan they were submitted with")]
    PlanMismatch,
    /// `stage_into` was given a buffer shorter than the batch's device input (`staged_len`).
    #[error("staging buffer of {len} bytes for a batch input of {needed} bytes")]
    StagingTooSmall { len: usize, needed: usize },
    #[error("empty batch: nothing to decode")]
    EmptyBatch,
    /// The batch exceeds what one launch can address (grid size, u32 strides).
    #[error("batch too large: {what}")]
    TooLarge { what: &'static str },
    /// Normalisation parameters are unusable (a zero or non-finite std, or a non-finite mean).
    #[error("bad normalisation for channel {channel}: mean {mean}, std {std}")]
    BadNormalize { channel: usize, mean: f32, std: f32 },
    /// Normalisation was requested for `u8` output (it needs `F16` or `F32`).
    #[error("normalisation needs a float element type (float16 or float32)")]
    NormalizeNeedsFloat,
    /// Sample `index`'s window does not fit its image (`what` = "image") or the sample ("sample").
    #[error(
        "sample {index} of the batch: window {window} does not fit the {what} ({width}x{height})"
    )]
    BadWindow {
        index: usize,
        window: vocab::Window,
        what: &'static str,
        width: u32,
        height: u32,
    },
    /// A sample batch needs exactly one window per source.
    #[error("{sources} sources but {windows} windows: a sample batch needs one window per source")]
    WindowCount { sources: usize, windows: usize },
    /// Samples must be at least 1×1.
    #[error("bad sample size {width}x{height}")]
    BadSampleSize { width: u32, height: u32 },
    /// Image `index` is one patch per channel and was given as fragments: the channels' boundaries found
    /// by walking its rows differ from its offset table (corrupt patch data).
    #[error("image {index} of the batch: its patch rows do not end where its offset table says")]
    OffsetTableMismatch { index: usize },
    /// The kernel found a version-2 patch of image `index` that does not decode (a BP row outside its
    /// entry or with a bad width, an ANS chunk whose lanes do not end where they should; only possible
    /// when host validation is off, or after the bytes changed since the CRC was checked). Nothing was
    /// read out of bounds, and the patch wrote nothing.
    #[error("image {index} of the batch: corrupt L3 v2 data in patch {patch}")]
    CorruptPatch { index: usize, patch: usize },
    /// A layout and element type the kernel does not produce.
    #[error("unsupported output: {what}")]
    Unsupported { what: &'static str },
    /// The kernels, as this device's driver compiled them, decoded the decoder's built-in test batch
    /// differently from the CPU decoder (checked once per device and process, before the first decoder
    /// is handed out): nothing is decoded on this device rather than decoded wrong.
    #[error(
        "device {ordinal}: the decode kernels as this driver compiled them decode a test batch wrongly ({detail}); no batch is decoded on this device: update the driver, or decode on the CPU"
    )]
    SelfCheck { ordinal: usize, detail: String },
}

impl Error {
    /// The batch index of the image (or sample) this error is about, when it is about one image rather
    /// than the device or the whole batch: a loader drops that item and decodes the rest.
    pub fn image_index(&self) -> Option<usize> {
        match *self {
            Error::Image { index, .. }
            | Error::CorruptRows { index, .. }
            | Error::BadWindow { index, .. }
            | Error::OffsetTableMismatch { index }
            | Error::CorruptPatch { index, .. } => Some(index),
            _ => None,
        }
    }

    /// [`Error::Driver`] for `call`, in the driver's own words (`CUDA_ERROR_OUT_OF_MEMORY: out of memory`),
    /// not the binding's Debug text.
    pub(crate) fn driver(call: &'static str, e: cudarc::driver::DriverError) -> Self {
        Error::Driver {
            call,
            message: cuda_setup::describe(&e),
        }
    }
}

/// The setup's reasons in this crate's words (the texts above, which callers and tests match).
impl From<cuda_setup::Error> for Error {
    fn from(e: cuda_setup::Error) -> Self {
        use cuda_setup::{Error as E, Library};
        match e {
            E::Missing(Library::Driver) => Error::NoDriver,
            E::Missing(Library::Nvrtc) => Error::NoNvrtc,
            E::NoDevice { ordinal, count } => Error::NoDevice { ordinal, count },
            E::Driver { call, message } => Error::Driver { call, message },
            E::Init { message } => Error::Driver {
                call: "cuInit",
                message,
            },
            E::Compile { arch, log, .. } => Error::Compile { arch, log },
            other => Error::Driver {
                call: "CUDA setup",
                message: other.to_string(),
            },
        }
    }
}
