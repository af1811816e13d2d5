//! What a loader can be asked to do, in two forms:
//!
//! - [`LoaderOptions`]: the typed model the pipeline runs on — the [`SampleSpec`] (the toolkit's
//!   vocabulary) plus batching, threads, order, sharding and device — checked by
//!   [`LoaderOptions::validate`], the one place its limits live.
//! - [`Settings`]: the same options as the surfaces spell them, one field per `l3 stream` flag and
//!   `l3toolkit.Loader` keyword, with the names, defaults and help text both show. The command line
//!   derives its flags from it (`clap::Args`, behind the `clap` feature); Python fills it from its
//!   keywords; [`Settings::resolve`] turns it into [`LoaderOptions`] and [`OpenOptions`], so both
//!   surfaces accept the same names and values and print the same error text for the same bad value.

use crate::dataset::OpenOptions;
use crate::dataset::masks::MaskNaming;
use crate::sample::DecodeScope;
use crate::storage::{CacheOptions, StorageOptions};
use crate::targets::TargetOptions;
use std::path::PathBuf;
use std::time::Duration;
use vocab::{
    Crop, DEFAULT_RATIO, DType, Device, Interpolation, Invalid, Layout, Normalize, Recipe,
    SampleSpec, ShardPolicy, Whole,
};

/// The most items a batch may hold.
pub const MAX_BATCH_SIZE: usize = 1 << 20;
/// The most threads of one kind, and the most prefetched batches.
pub const MAX_THREADS: usize = 4096;
/// The longest `retry_secs`: a day.
pub const MAX_RETRY: Duration = Duration::from_secs(24 * 3600);
/// The default of [`Settings::pcr_window`]: PCR records whose items are shuffled together.
pub const DEFAULT_PCR_WINDOW: usize = 4;

/// Everything a [`Loader`](crate::Loader) can be asked to do.
/// `LoaderOptions { batch_size: 64, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Items per batch (the last batch of an epoch may be smaller unless `drop_last`).
    pub batch_size: usize,
    /// How each item becomes a sample: size, crop, flip, layout, element type, normalisation.
    pub sample: SampleSpec,
    /// Decode only what each sample's window covers where the format allows it (L3: read and decode only
    /// the patches under the crop), or whole images. Samples are identical either way.
    pub decode: DecodeScope,
    /// Threads that decode and shape samples (default: every core).
    pub decode_threads: usize,
    /// Threads that read stored bytes.
    pub io_threads: usize,
    /// Finished batches kept ready ahead of the consumer.
    pub prefetch: usize,
    pub seed: u64,
    /// Seeded shuffling per epoch; `false` visits items in dataset order.
    pub shuffle: bool,
    /// Epochs to run; `None` runs until dropped.
    pub epochs: Option<usize>,
    pub rank: usize,
    pub world_size: usize,
    pub shard_tail: ShardPolicy,
    /// Drop each epoch's last, incomplete batch.
    pub drop_last: bool,
    /// Skip (and count) corrupt or missing items instead of failing the run.
    pub skip_errors: bool,
    /// Decode a JPEG whose data ends early, its missing rows grey, counted in
    /// [`Stats::items_partial`](crate::Stats::items_partial); refused (an error naming the file)
    /// otherwise.
    pub partial_images: bool,
    /// Where items are decoded: the CPU threads, or one CUDA device through `l3-cuda` (L3 datasets only,
    /// one launch per batch, batches in device memory; needs the `gpu` feature).
    pub device: Device,
    /// With [`Device::Cuda`]: decode a batch the GPU fails on with the CPU instead of failing the run
    /// (counted in [`Stats::gpu_fallback_batches`](crate::Stats::gpu_fallback_batches), the first one
    /// logged). Off by default: a user who asked for the GPU learns when it is not used.
    pub gpu_fallback: bool,
    /// Allocate host batches as page-locked (pinned) memory, so that copying a batch to a GPU
    /// (`tensor.cuda(non_blocking=True)`) is asynchronous. Needs a CUDA driver: refused with the reason
    /// without one, never silently pageable.
    pub pin_memory: bool,
    /// Where the visiting order (and, for [`Order::Liquid`], the stored bytes) comes from.
    pub order: Order,
    /// Segmentation masks and detection boxes delivered with each sample, following its geometry.
    pub targets: TargetOptions,
}

/// The sampling order of a [`Loader`](crate::Loader).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// A seeded permutation per epoch (or dataset order without `shuffle`), sharded across ranks, read
    /// item by item by the loader's I/O threads.
    #[default]
    Seeded,
    /// Liquid's two-region shuffle buffers (`liquid-sampler`'s runtime sampler), for a Liquid multi-format
    /// dataset ([`LiquidShards`](crate::LiquidShards)) only. Each batch is exactly the sampler's
    /// mini-batch — its items, their formats and whether they stayed resident from the previous epoch
    /// ([`Batch::cached`](crate::Batch::cached)) — and the item bytes come from the sampler's buffers,
    /// read with the page cache bypassed by its own I/O threads (`io_threads` of them); the decode threads
    /// and the assembler are the loader's. The disk traffic of a batch is the sampler's refill reads.
    ///
    /// Differences from [`Order::Seeded`]: the order is always shuffled (`shuffle: false` and `drop_last`
    /// are rejected), and each rank's shard is fixed for the whole run (so the buffers can keep it), so
    /// the global order depends on the world size. [`Loader::resume`](crate::Loader::resume) replays the
    /// sampler's schedule (no I/O) to the saved batch and reads back what its buffers held there, so the
    /// batches after are the uninterrupted run's. Resumed at another world size or batch size, the items
    /// of the interrupted epoch that no saved rank delivered (each rank's schedule replayed) are shared
    /// out and sampled once, as an epoch of their own; the next epoch runs as if the job had started at
    /// the new shape.
    Liquid {
        /// Bytes the shuffle buffers of all formats may hold together: at least one slot (the largest
        /// item) per format, or the loader refuses to start; the more, the more items stay resident.
        budget_bytes: u64,
    },
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 32,
            sample: SampleSpec::default(),
            decode: DecodeScope::Region,
            decode_threads: stdx::parallel::threads(0),
            io_threads: 2,
            prefetch: 4,
            seed: 0,
            shuffle: true,
            epochs: Some(1),
            rank: 0,
            world_size: 1,
            shard_tail: ShardPolicy::Pad,
            drop_last: false,
            skip_errors: false,
            partial_images: false,
            device: Device::Cpu,
            gpu_fallback: false,
            pin_memory: false,
            order: Order::Seeded,
            targets: TargetOptions::default(),
        }
    }
}

fn in_range(option: &'static str, v: usize, max: usize) -> Result<(), Invalid> {
    if (1..=max).contains(&v) {
        Ok(())
    } else {
        Err(Invalid::new(option, v, format!("1 to {max}")))
    }
}

impl LoaderOptions {
    /// Checks the options on their own (the dataset is checked when the loader opens it). The error names
    /// the option by its surface name (`batch_size`, `threads`, ...).
    pub fn validate(&self) -> Result<(), Invalid> {
        in_range("batch_size", self.batch_size, MAX_BATCH_SIZE)?;
        self.sample.validate()?;
        in_range("threads", self.decode_threads, MAX_THREADS)?;
        in_range("io_threads", self.io_threads, MAX_THREADS)?;
        in_range("prefetch", self.prefetch, MAX_THREADS)?;
        if self.world_size == 0 {
            return Err(Invalid::new("world_size", 0, "at least 1"));
        }
        if self.rank >= self.world_size {
            let (r, w) = (self.rank, self.world_size);
            return Err(Invalid::new(
                "rank",
                r,
                format!("0 to {} (rank {r} of world size {w} does not exist)", w - 1),
            ));
        }
        if self.epochs == Some(0) {
            return Err(Invalid::new("epochs", 0, "at least 1, or none"));
        }
        if self.gpu_fallback && !self.device.is_cuda() {
            return Err(Invalid::new(
                "gpu_fallback",
                true,
                "a CUDA device (it decodes on the CPU only the batches the GPU fails on)",
            ));
        }
        self.targets.validate()?;
        if let Order::Liquid { budget_bytes } = self.order {
            if budget_bytes == 0 {
                return Err(Invalid::new("budget", 0, "a positive number of bytes"));
            }
            if !self.shuffle {
                return Err(Invalid::new(
                    "shuffle",
                    false,
                    "true with sampler liquid (its buffers always shuffle)",
                ));
            }
            if self.drop_last {
                return Err(Invalid::new(
                    "drop_last",
                    true,
                    "false with sampler liquid (it keeps every epoch's last batch)",
                ));
            }
        }
        Ok(())
    }
}

/// The sampler a surface names: `uniform` (a seeded shuffle; the command line's older `shuffle` is an
/// alias) or `liquid` (two-region shuffle buffers, with a `budget`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Sampler {
    #[default]
    #[cfg_attr(feature = "clap", value(alias = "shuffle"))]
    Uniform,
    Liquid,
}

impl Sampler {
    pub fn name(self) -> &'static str {
        match self {
            Sampler::Uniform => "uniform",
            Sampler::Liquid => "liquid",
        }
    }
}

impl std::fmt::Display for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Sampler {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Sampler, Invalid> {
        match s {
            "uniform" | "shuffle" => Ok(Sampler::Uniform),
            "liquid" => Ok(Sampler::Liquid),
            _ => Err(Invalid::new("sampler", s, "uniform or liquid")),
        }
    }
}

impl std::str::FromStr for DecodeScope {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<DecodeScope, Invalid> {
        match s {
            "region" => Ok(DecodeScope::Region),
            "whole" => Ok(DecodeScope::Whole),
            _ => Err(Invalid::new("decode", s, "region or whole")),
        }
    }
}

impl std::fmt::Display for DecodeScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeScope::Region => "region",
            DecodeScope::Whole => "whole",
        })
    }
}

/// A sample size: `N` (square) or `HxW`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub height: u32,
    pub width: u32,
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.height, self.width)
    }
}

impl std::str::FromStr for Size {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Size, Invalid> {
        let bad = || Invalid::new("crop", s, "N or HxW (positive integers)");
        let num = |t: &str| t.trim().parse::<u32>().ok().filter(|&v| v > 0);
        let (height, width) = match s.split_once(['x', 'X']) {
            Some((h, w)) => (num(h).ok_or_else(bad)?, num(w).ok_or_else(bad)?),
            None => {
                let n = num(s).ok_or_else(bad)?;
                (n, n)
            }
        };
        Ok(Size { height, width })
    }
}

/// The `crop` setting: a sample size, or `none` for whole images (each at its own size, or resized by
/// `resize` / `jitter` / `max_size`; a batch is padded to its largest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleSize {
    Fixed(Size),
    Whole,
}

impl std::fmt::Display for SampleSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SampleSize::Fixed(s) => s.fmt(f),
            SampleSize::Whole => f.write_str("none"),
        }
    }
}

impl std::str::FromStr for SampleSize {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<SampleSize, Invalid> {
        if s.trim().eq_ignore_ascii_case("none") {
            return Ok(SampleSize::Whole);
        }
        s.parse()
            .map(SampleSize::Fixed)
            .map_err(|e: Invalid| Invalid {
                expected: "N, HxW (positive integers) or none (whole images)".into(),
                ..e
            })
    }
}

/// A byte count: a plain number, or with a K/M/G/T suffix (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for Bytes {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Bytes, Invalid> {
        stdx::mem::parse_size(s)
            .map(Bytes)
            .ok_or_else(|| Invalid::new("bytes", s, "bytes, such as 2000000000 or 2G"))
    }
}

/// Three per-channel values: `a,b,c` (one number `a` stands for `a,a,a`: a luma sample's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerChannel(pub [f32; 3]);

impl PerChannel {
    /// Three values, or one for all three; `None` for any other count.
    pub fn from_values(v: &[f32]) -> Option<PerChannel> {
        match *v {
            [a] => Some(PerChannel([a; 3])),
            [a, b, c] => Some(PerChannel([a, b, c])),
            _ => None,
        }
    }
}

impl std::fmt::Display for PerChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a},{b},{c}")
    }
}

impl std::str::FromStr for PerChannel {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<PerChannel, Invalid> {
        let v: Option<Vec<f32>> = s.split(',').map(|t| t.trim().parse().ok()).collect();
        v.and_then(|v| PerChannel::from_values(&v))
            .ok_or_else(|| Invalid::new("mean", s, "3 numbers, one per channel (a,b,c), or 1"))
    }
}

/// Two numbers `a,b`: a range (`scale`, `ratio`, `jitter`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair(pub [f64; 2]);

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b] = self.0;
        write!(f, "{a},{b}")
    }
}

impl std::str::FromStr for Pair {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Pair, Invalid> {
        let v: Option<Vec<f64>> = s
            .trim_matches(['(', ')', ' '])
            .split(',')
            .map(|t| t.trim().parse().ok())
            .collect();
        v.and_then(|v| <[f64; 2]>::try_from(v).ok())
            .map(Pair)
            .ok_or_else(|| Invalid::new("scale", s, "2 numbers (a,b)"))
    }
}

/// Value parsers that print an option's error exactly as [`Invalid`] words it (the text Python raises),
/// instead of clap's own wording, while still listing an enum's values in `--help`. Their errors are
/// clap's `ValueValidation` kind, so that a binary can print them in its own error format.
#[cfg(feature = "clap")]
pub mod clap_values {
    use super::Invalid;
    use std::marker::PhantomData;

    fn error(e: Invalid) -> clap::Error {
        clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
    }

    fn text(value: &std::ffi::OsStr) -> String {
        value.to_string_lossy().into_owned()
    }

    /// A value parsed by its `FromStr`, the error naming `option`.
    #[derive(Clone)]
    pub struct Text<T> {
        option: &'static str,
        _t: PhantomData<fn() -> T>,
    }

    impl<T> Text<T> {
        pub fn new(option: &'static str) -> Self {
            Text {
                option,
                _t: PhantomData,
            }
        }
    }

    impl<T> clap::builder::TypedValueParser for Text<T>
    where
        T: std::str::FromStr<Err = Invalid> + Clone + Send + Sync + 'static,
    {
        type Value = T;
        fn parse_ref(
            &self,
            _cmd: &clap::Command,
            _arg: Option<&clap::Arg>,
            value: &std::ffi::OsStr,
        ) -> Result<T, clap::Error> {
            super::parse_setting(self.option, &text(value)).map_err(error)
        }
    }

    /// An enum: parsed by its `FromStr` (any case where it allows, aliases included), its values listed
    /// from `clap::ValueEnum`.
    #[derive(Clone)]
    pub struct Choice<T>(PhantomData<fn() -> T>);

    impl<T> Default for Choice<T> {
        fn default() -> Self {
            Choice(PhantomData)
        }
    }

    impl<T> clap::builder::TypedValueParser for Choice<T>
    where
        T: std::str::FromStr<Err = Invalid> + clap::ValueEnum + Clone + Send + Sync + 'static,
    {
        type Value = T;
        fn parse_ref(
            &self,
            _cmd: &clap::Command,
            _arg: Option<&clap::Arg>,
            value: &std::ffi::OsStr,
        ) -> Result<T, clap::Error> {
            text(value).parse::<T>().map_err(error)
        }
        fn possible_values(
            &self,
        ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
            Some(Box::new(
                T::value_variants()
                    .iter()
                    .filter_map(|v| v.to_possible_value()),
            ))
        }
    }
}

#[cfg(feature = "clap")]
use clap_values::{Choice, Text};

/// The loader's options as `l3 stream` and `l3toolkit.Loader` spell them: one field per flag and
/// keyword. The field is the Python keyword; the flag is the same with `-` for `_`, except `crop`, whose
/// flag is `--size` (the command line's `--crop` names the crop mode, as it always has), and `shuffle`,
/// whose flag is `--no-shuffle` (a default-true switch). Defaults are [`Settings::default`]'s, shown by
/// `l3 stream --help` and Python's signature alike.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Settings {
    /// Samples per batch.
    #[cfg_attr(feature = "clap", arg(long, visible_alias = "batch", default_value_t = Settings::default().batch_size))]
    pub batch_size: usize,
    /// Sample size, `N` (square) or `HxW`: every item is cropped (or padded) to it; `none`: whole
    /// images (after `resize`, `jitter` or `max_size` if given), each batch padded (bottom and right)
    /// to its largest height and width.
    #[cfg_attr(feature = "clap", arg(long = "size", value_name = "N|HxW|none", value_parser = Text::<SampleSize>::new("crop"), default_value_t = Settings::default().crop))]
    pub crop: SampleSize,
    /// Random crop windows (seeded per item) instead of centre crops.
    #[cfg_attr(feature = "clap", arg(long))]
    pub random_crop: bool,
    /// Mirror each sample left-right with probability 1/2 (seeded per item).
    #[cfg_attr(feature = "clap", arg(long))]
    pub flip: bool,
    /// Shuffle every epoch (seeded); off visits items in dataset order.
    #[cfg_attr(feature = "clap", arg(long = "no-shuffle", action = clap::ArgAction::SetFalse))]
    pub shuffle: bool,
    /// Seed of the order, the crops and the flips.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Epochs to run; none: one epoch per iteration (each `for` loop in Python, one run of `l3 stream`).
    /// [`Settings::resolve`] keeps none as none (a loader that runs until dropped); the command line
    /// then runs one epoch.
    #[cfg_attr(feature = "clap", arg(long))]
    pub epochs: Option<usize>,
    /// Drop each epoch's last, incomplete batch.
    #[cfg_attr(feature = "clap", arg(long))]
    pub drop_last: bool,
    /// This process's rank (default: `RANK` from the environment, as torchrun sets it, else 0).
    #[cfg_attr(feature = "clap", arg(long))]
    pub rank: Option<usize>,
    /// Ranks the epochs are sharded across (default: `WORLD_SIZE` from the environment, else 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub world_size: Option<usize>,
    /// Decode threads (default: every core).
    #[cfg_attr(feature = "clap", arg(long))]
    pub threads: Option<usize>,
    /// Batch memory layout.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<Layout>::default(), default_value_t = Settings::default().layout))]
    pub layout: Layout,
    /// Element type; floats hold pixel/255 unless normalised with `mean` and `std`.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<DType>::default(), default_value_t = Settings::default().dtype))]
    pub dtype: DType,
    /// Per-channel mean of the normalisation (three numbers, `a,b,c`), on the [0, 1] scale; with `std`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "A,B,C", value_parser = Text::<PerChannel>::new("mean")))]
    pub mean: Option<PerChannel>,
    /// Per-channel standard deviation of the normalisation; with `mean`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "A,B,C", value_parser = Text::<PerChannel>::new("std")))]
    pub std: Option<PerChannel>,
    /// Where items are decoded: `cpu`, `cuda` or `cuda:N` (L3 datasets; batches stay in device memory;
    /// fails with the reason when no GPU can do it).
    #[cfg_attr(feature = "clap", arg(long, value_parser = Text::<Device>::new("device"), default_value_t = Settings::default().device))]
    pub device: Device,
    /// Sampling order: `uniform` (a seeded shuffle) or `liquid` (two-region shuffle buffers, with
    /// `budget`).
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<Sampler>::default(), default_value_t = Settings::default().sampler))]
    pub sampler: Sampler,
    /// Bytes the Liquid sampler's shuffle buffers may hold (e.g. 2G).
    #[cfg_attr(feature = "clap", arg(long, value_parser = Text::<Bytes>::new("budget")))]
    pub budget: Option<Bytes>,
    /// PCR datasets: the scan group to read (1-based; default: all groups, full fidelity).
    #[cfg_attr(feature = "clap", arg(long))]
    pub group: Option<usize>,
    /// Image folders: labels from a `path,label` CSV instead of sub-folder names.
    #[cfg_attr(feature = "clap", arg(long))]
    pub labels: Option<PathBuf>,
    /// Threads that read stored bytes.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().io_threads))]
    pub io_threads: usize,
    /// Batches prepared ahead of the consumer.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().prefetch))]
    pub prefetch: usize,
    /// Skip (and count) corrupt or missing items instead of stopping.
    #[cfg_attr(feature = "clap", arg(long))]
    pub skip_errors: bool,
    /// Decode a JPEG whose data ends before the image does (a file cut short), its missing rows grey and
    /// counted as partial, instead of failing it.
    #[cfg_attr(feature = "clap", arg(long))]
    pub partial_images: bool,
    /// Cap on read bandwidth in MB/s (10^6 bytes), shared by every reader: a model of network storage.
    #[cfg_attr(feature = "clap", arg(long))]
    pub storage_mbps: Option<f64>,
    /// Object storage: seconds a failing request (a reset, a 5xx, SlowDown, a body cut short; listings
    /// too) is retried, with exponential backoff and jitter, before the read fails.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().retry_secs))]
    pub retry_secs: f64,
    /// A local cache of objects read from object storage (`s3://` datasets), for repeated epochs.
    #[cfg_attr(feature = "clap", arg(long))]
    pub cache_dir: Option<PathBuf>,
    /// Bytes the cache may hold (e.g. 20G; default 10G); least recently used entries go first.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Text::<Bytes>::new("cache_limit")))]
    pub cache_limit: Option<Bytes>,
    /// PCR datasets: records whose items are shuffled together.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().pcr_window))]
    pub pcr_window: usize,
    /// PCR datasets: deliver an image one of whose scans is corrupt at the largest scan group below the
    /// bad scan, counted as partial, instead of failing it.
    #[cfg_attr(feature = "clap", arg(long))]
    pub pcr_partial: bool,
    /// `region`: read and decode only what each crop covers where the format allows it (L3's patches
    /// under the crop); `whole`: whole images. Samples are identical either way.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<DecodeScope>::default(), default_value_t = Settings::default().decode))]
    pub decode: DecodeScope,
    /// With a CUDA device: decode a batch the GPU fails on with the CPU instead of stopping (counted,
    /// logged once).
    #[cfg_attr(feature = "clap", arg(long))]
    pub gpu_fallback: bool,
    /// Page-locked host batches, so that a copy to the GPU is asynchronous (needs a CUDA driver).
    #[cfg_attr(feature = "clap", arg(long))]
    pub pin_memory: bool,
    /// What ranks do with an epoch that does not split evenly: `pad` (repeat items) or `drop`.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<ShardPolicy>::default(), default_value_t = Settings::default().shard_tail))]
    pub shard_tail: ShardPolicy,
    /// Random-resized crop (torchvision's `RandomResizedCrop`): the window's share of the image area,
    /// `a,b`; the window is then resized to `crop`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "A,B", value_parser = Text::<Pair>::new("scale")))]
    pub scale: Option<Pair>,
    /// With `scale`: the window's aspect ratio range, sampled log-uniformly (default 3/4,4/3).
    #[cfg_attr(feature = "clap", arg(long, value_name = "R1,R2", value_parser = Text::<Pair>::new("ratio")))]
    pub ratio: Option<Pair>,
    /// Resize so that the shorter side is this many pixels (aspect kept), then crop `crop` (centre, or
    /// random with `random_crop`): the evaluation recipe.
    #[cfg_attr(feature = "clap", arg(long, value_name = "S"))]
    pub resize: Option<u32>,
    /// Rescale the whole image by a factor uniform in `a,b`, then crop `crop` (random with
    /// `random_crop`, else centre); where the crop reaches past the image the sample holds `fill`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "A,B", value_parser = Text::<Pair>::new("jitter")))]
    pub jitter: Option<Pair>,
    /// With `crop=None`: shrink each image whose longer side exceeds this many pixels so that it is
    /// this long (aspect kept; after `resize` or `jitter`), as torchvision's `max_size`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "M"))]
    pub max_size: Option<u32>,
    /// How `scale`, `resize` and `jitter` resample: `bilinear` (antialiased when shrinking) or `nearest`.
    #[cfg_attr(feature = "clap", arg(long, value_parser = Choice::<Interpolation>::default(), default_value_t = Settings::default().interpolation))]
    pub interpolation: Interpolation,
    /// The value of every channel where a sample shows no image (padding).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().fill))]
    pub fill: u8,
    /// Channels per sample: 3 (RGB), 1 (luma, as Pillow's `L`: ITU-R 601-2) or 4 (RGBA, opaque where
    /// the image has no alpha). With 1, `mean` and `std` are one number each.
    #[cfg_attr(feature = "clap", arg(long, value_name = "1|3|4", default_value_t = Settings::default().channels))]
    pub channels: u8,
    /// A folder (or `s3://` prefix) of label maps, one per image at the same relative path and stem
    /// (gray PNG at 1 to 16 bits, values kept as stored; 8-bit PGM/PPM or one-channel L3), each given
    /// exactly its image's geometry with nearest interpolation; `@shards` over a shard set: each
    /// sample's `KEY.seg.*` member.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR"))]
    pub masks: Option<PathBuf>,
    /// The end of an image's stem that its mask's name replaces with `mask_suffix` (Cityscapes:
    /// `_leftImg8bit`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub image_suffix: Option<String>,
    /// The end of a mask's stem (Cityscapes: `_gtFine_labelIds`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub mask_suffix: Option<String>,
    /// The mask value where a sample reaches past its image.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().ignore_index))]
    pub ignore_index: u16,
    /// A local COCO instances JSON file whose boxes follow every crop and flip (`images[].file_name`
    /// relative to the source, matched by path and stem); `@shards` over a shard set: each sample's
    /// `KEY.json` member.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE.json"))]
    pub boxes: Option<PathBuf>,
    /// Boxes narrower or shorter than this many output pixels after clipping are dropped with their
    /// labels.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::default().min_box_size))]
    pub min_box_size: f64,
}

impl Default for Settings {
    fn default() -> Settings {
        let o = LoaderOptions::default();
        Settings {
            batch_size: o.batch_size,
            crop: SampleSize::Fixed(Size {
                height: o.sample.height,
                width: o.sample.width,
            }),
            random_crop: o.sample.crop == Crop::Random,
            flip: o.sample.hflip,
            shuffle: o.shuffle,
            seed: o.seed,
            epochs: None,
            drop_last: o.drop_last,
            rank: None,
            world_size: None,
            threads: None,
            layout: o.sample.layout,
            dtype: o.sample.dtype,
            mean: None,
            std: None,
            device: o.device,
            sampler: Sampler::Uniform,
            budget: None,
            group: None,
            labels: None,
            io_threads: o.io_threads,
            prefetch: o.prefetch,
            skip_errors: o.skip_errors,
            partial_images: o.partial_images,
            storage_mbps: None,
            retry_secs: crate::storage::DEFAULT_RETRY.as_secs_f64(),
            cache_dir: None,
            cache_limit: None,
            pcr_window: DEFAULT_PCR_WINDOW,
            pcr_partial: false,
            decode: o.decode,
            gpu_fallback: o.gpu_fallback,
            pin_memory: o.pin_memory,
            shard_tail: o.shard_tail,
            scale: None,
            ratio: None,
            resize: None,
            jitter: None,
            max_size: None,
            interpolation: o.sample.interpolation,
            fill: o.sample.fill,
            channels: o.sample.channels,
            masks: None,
            image_suffix: None,
            mask_suffix: None,
            ignore_index: o.targets.ignore_index,
            boxes: None,
            min_box_size: o.targets.min_box_size,
        }
    }
}

/// The names of every [`Settings`] field, in order: what a surface must accept (a test walks them).
pub const SETTING_NAMES: &[&str] = &[
    "batch_size",
    "crop",
    "random_crop",
    "flip",
    "shuffle",
    "seed",
    "epochs",
    "drop_last",
    "rank",
    "world_size",
    "threads",
    "layout",
    "dtype",
    "mean",
    "std",
    "device",
    "sampler",
    "budget",
    "group",
    "labels",
    "io_threads",
    "prefetch",
    "skip_errors",
    "partial_images",
    "storage_mbps",
    "retry_secs",
    "cache_dir",
    "cache_limit",
    "pcr_window",
    "pcr_partial",
    "decode",
    "gpu_fallback",
    "pin_memory",
    "shard_tail",
    "scale",
    "ratio",
    "resize",
    "jitter",
    "max_size",
    "interpolation",
    "fill",
    "channels",
    "masks",
    "image_suffix",
    "mask_suffix",
    "ignore_index",
    "boxes",
    "min_box_size",
];

impl Settings {
    /// Each setting's default as text (`none` for an unset one), in [`SETTING_NAMES`] order: what the
    /// command line's help and Python's signature both show.
    pub fn defaults() -> Vec<(&'static str, String)> {
        let d = Settings::default();
        let opt = |v: Option<String>| v.unwrap_or_else(|| "none".into());
        let values = [
            d.batch_size.to_string(),
            d.crop.to_string(),
            d.random_crop.to_string(),
            d.flip.to_string(),
            d.shuffle.to_string(),
            d.seed.to_string(),
            opt(d.epochs.map(|v| v.to_string())),
            d.drop_last.to_string(),
            opt(d.rank.map(|v| v.to_string())),
            opt(d.world_size.map(|v| v.to_string())),
            opt(d.threads.map(|v| v.to_string())),
            d.layout.to_string(),
            d.dtype.to_string(),
            opt(d.mean.map(|v| v.to_string())),
            opt(d.std.map(|v| v.to_string())),
            d.device.to_string(),
            d.sampler.to_string(),
            opt(d.budget.map(|v| v.to_string())),
            opt(d.group.map(|v| v.to_string())),
            opt(d.labels.map(|v| v.display().to_string())),
            d.io_threads.to_string(),
            d.prefetch.to_string(),
            d.skip_errors.to_string(),
            d.partial_images.to_string(),
            opt(d.storage_mbps.map(|v| v.to_string())),
            d.retry_secs.to_string(),
            opt(d.cache_dir.map(|v| v.display().to_string())),
            opt(d.cache_limit.map(|v| v.to_string())),
            d.pcr_window.to_string(),
            d.pcr_partial.to_string(),
            d.decode.to_string(),
            d.gpu_fallback.to_string(),
            d.pin_memory.to_string(),
            d.shard_tail.to_string(),
            opt(d.scale.map(|v| v.to_string())),
            opt(d.ratio.map(|v| v.to_string())),
            opt(d.resize.map(|v| v.to_string())),
            opt(d.jitter.map(|v| v.to_string())),
            opt(d.max_size.map(|v| v.to_string())),
            d.interpolation.to_string(),
            d.fill.to_string(),
            d.channels.to_string(),
            opt(d.masks.map(|v| v.display().to_string())),
            opt(d.image_suffix),
            opt(d.mask_suffix),
            d.ignore_index.to_string(),
            opt(d.boxes.map(|v| v.display().to_string())),
            d.min_box_size.to_string(),
        ];
        SETTING_NAMES.iter().copied().zip(values).collect()
    }

    /// The rank and world size: the settings', else `RANK` / `WORLD_SIZE` from the environment (what
    /// torchrun and most launchers set), else 0 / 1.
    pub fn rank_and_world_size(&self) -> Result<(usize, usize), Invalid> {
        let env = |option: &'static str, var: &str, given: Option<usize>, default: usize| {
            if let Some(v) = given {
                return Ok(v);
            }
            match std::env::var(var) {
                Ok(s) => s
                    .trim()
                    .parse()
                    .map_err(|_| Invalid::new(option, s, format!("a whole number in ${var}"))),
                Err(_) => Ok(default),
            }
        };
        Ok((
            env("rank", "RANK", self.rank, 0)?,
            env("world_size", "WORLD_SIZE", self.world_size, 1)?,
        ))
    }

    /// The typed options, validated: the one mapping from surface names to the model.
    pub fn resolve(&self) -> Result<(LoaderOptions, OpenOptions), Invalid> {
        let normalize = match (self.mean, self.std) {
            (None, None) => None,
            (Some(mean), Some(std)) => {
                // A luma sample has one channel: one number each (a single number fills all three).
                for (option, v) in [("mean", mean), ("std", std)] {
                    if self.channels == 1 && !(v.0[0] == v.0[1] && v.0[1] == v.0[2]) {
                        return Err(Invalid::new(option, v, "one number with channels 1 (luma)"));
                    }
                }
                Some(Normalize {
                    mean: mean.0,
                    std: std.0,
                })
            }
            (Some(_), None) => {
                let why = "3 numbers: give both mean and std, or neither";
                return Err(Invalid::new("std", "none", why));
            }
            (None, Some(_)) => {
                let why = "3 numbers: give both mean and std, or neither";
                return Err(Invalid::new("mean", "none", why));
            }
        };
        let dtype = self.dtype;
        let order = match (self.sampler, self.budget) {
            (Sampler::Uniform, None) => Order::Seeded,
            (Sampler::Uniform, Some(b)) => {
                return Err(Invalid::new(
                    "budget",
                    b,
                    "no budget with sampler uniform (it sizes the liquid sampler's buffers)",
                ));
            }
            (Sampler::Liquid, Some(b)) => Order::Liquid { budget_bytes: b.0 },
            (Sampler::Liquid, None) => {
                return Err(Invalid::new(
                    "budget",
                    "none",
                    "bytes the liquid sampler's shuffle buffers may hold (e.g. 2G)",
                ));
            }
        };
        if self.threads == Some(0) {
            return Err(Invalid::new(
                "threads",
                0,
                "at least 1, or none for every core",
            ));
        }
        let (rank, world_size) = self.rank_and_world_size()?;
        let recipe = self.recipe()?;
        // Whole images have no fixed size: the spec holds their bound (max_size, else the largest side).
        let (height, width) = match (self.crop, recipe) {
            (SampleSize::Fixed(s), _) => (s.height, s.width),
            (SampleSize::Whole, r) => {
                let bound = match r {
                    Recipe::Whole(w) => w.max_size,
                    _ => None,
                };
                let side = bound.unwrap_or(vocab::MAX_SAMPLE_SIDE);
                (side, side)
            }
        };
        if self.crop == SampleSize::Whole && self.random_crop {
            return Err(Invalid::new(
                "random_crop",
                true,
                "False with crop=None (whole images are not cropped)",
            ));
        }
        let options = LoaderOptions {
            batch_size: self.batch_size,
            sample: SampleSpec {
                height,
                width,
                crop: if self.random_crop {
                    Crop::Random
                } else {
                    Crop::Center
                },
                hflip: self.flip,
                layout: self.layout,
                dtype,
                normalize,
                recipe,
                interpolation: self.interpolation,
                fill: self.fill,
                channels: self.channels,
            },
            decode: self.decode,
            decode_threads: stdx::parallel::threads(self.threads.unwrap_or(0)),
            io_threads: self.io_threads,
            prefetch: self.prefetch,
            seed: self.seed,
            shuffle: self.shuffle,
            epochs: self.epochs,
            rank,
            world_size,
            shard_tail: self.shard_tail,
            drop_last: self.drop_last,
            skip_errors: self.skip_errors,
            partial_images: self.partial_images,
            device: self.device,
            gpu_fallback: self.gpu_fallback,
            pin_memory: self.pin_memory,
            order,
            targets: TargetOptions::default(),
        };
        let open = self.open_options()?;
        let options = LoaderOptions {
            targets: TargetOptions {
                masks: self.masks.clone(),
                naming: MaskNaming {
                    image_suffix: self.image_suffix.clone().unwrap_or_default(),
                    mask_suffix: self.mask_suffix.clone().unwrap_or_default(),
                },
                ignore_index: self.ignore_index,
                boxes: self.boxes.clone(),
                min_box_size: self.min_box_size,
                storage: open.storage.clone(),
            },
            ..options
        };
        options.validate()?;
        Ok((options, open))
    }

    /// The recipe `scale` / `ratio`, `resize` or `jitter` name (at most one of them), or the plain crop;
    /// with `crop=None`, whole images sized by `resize`, `jitter` and `max_size`.
    pub fn recipe(&self) -> Result<Recipe, Invalid> {
        let given: Vec<(&'static str, String)> = [
            ("scale", self.scale.map(|v| v.to_string())),
            ("resize", self.resize.map(|v| v.to_string())),
            ("jitter", self.jitter.map(|v| v.to_string())),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
        if let [(first, _), (second, v), ..] = given.as_slice() {
            return Err(Invalid::new(
                second,
                v,
                format!("none with {first} (one recipe at a time: scale, resize or jitter)"),
            ));
        }
        if let (Some(r), None) = (self.ratio, self.scale) {
            return Err(Invalid::new(
                "ratio",
                r,
                "none without scale (it shapes the random-resized crop's window)",
            ));
        }
        if self.crop == SampleSize::Whole {
            if let Some(scale) = self.scale {
                return Err(Invalid::new(
                    "scale",
                    scale,
                    "none with crop=None (a random-resized crop needs a crop size)",
                ));
            }
            return Ok(Recipe::Whole(Whole {
                shorter: self.resize,
                jitter: self.jitter.map(|j| j.0),
                max_size: self.max_size,
            }));
        }
        if let Some(m) = self.max_size {
            return Err(Invalid::new(
                "max_size",
                m,
                "none unless crop=None (it bounds whole images)",
            ));
        }
        Ok(if let Some(scale) = self.scale {
            Recipe::ResizedCrop {
                scale: scale.0,
                ratio: self.ratio.map_or(DEFAULT_RATIO, |r| r.0),
            }
        } else if let Some(shorter) = self.resize {
            Recipe::Resize { shorter }
        } else if let Some(range) = self.jitter {
            Recipe::Jitter { range: range.0 }
        } else {
            Recipe::Crop
        })
    }

    /// How the dataset is opened: scan group, labels, the read layer, the PCR window.
    pub fn open_options(&self) -> Result<OpenOptions, Invalid> {
        let bandwidth = self
            .storage_mbps
            .map(|m| {
                StorageOptions::bytes_per_sec(m).ok_or_else(|| {
                    Invalid::new(
                        "storage_mbps",
                        m,
                        "a positive number of MB/s, or none for no cap",
                    )
                })
            })
            .transpose()?;
        let retry = Duration::try_from_secs_f64(self.retry_secs)
            .ok()
            .filter(|d| *d <= MAX_RETRY)
            .ok_or_else(|| {
                Invalid::new(
                    "retry_secs",
                    self.retry_secs,
                    format!("0 to {} seconds", MAX_RETRY.as_secs()),
                )
            })?;
        let cache = match (&self.cache_dir, self.cache_limit) {
            (None, None) => None,
            (Some(dir), limit) => Some(CacheOptions {
                dir: dir.clone(),
                limit: limit.map_or(CacheOptions::DEFAULT_LIMIT, |b| b.0),
            }),
            (None, Some(l)) => {
                return Err(Invalid::new(
                    "cache_limit",
                    l,
                    "a cache_dir too (it sizes the cache in that folder)",
                ));
            }
        };
        if self.group == Some(0) {
            return Err(Invalid::new(
                "group",
                0,
                "a scan group from 1, or none for all",
            ));
        }
        if self.pcr_window == 0 {
            return Err(Invalid::new("pcr_window", 0, "at least 1 record"));
        }
        Ok(OpenOptions {
            group: self.group,
            labels: self.labels.clone(),
            storage: StorageOptions {
                bandwidth,
                cache,
                retry: Some(retry),
            },
            pcr_window: self.pcr_window,
            pcr_partial: self.pcr_partial,
        })
    }
}

/// Parses a setting's value from text — what a command line gives, and what Python passes for strings —
/// with the same error text everywhere. Used by surfaces that receive `name=value` pairs.
pub fn parse_setting<T: std::str::FromStr<Err = Invalid>>(
    option: &'static str,
    text: &str,
) -> Result<T, Invalid> {
    text.parse::<T>().map_err(|e| Invalid { option, ..e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_and_every_name_has_a_default() {
        let (o, open) = Settings {
            rank: Some(0),
            world_size: Some(1),
            ..Settings::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(o.sample, SampleSpec::default());
        assert_eq!(o.order, Order::Seeded);
        assert_eq!(open.pcr_window, DEFAULT_PCR_WINDOW);
        assert_eq!(Settings::defaults().len(), SETTING_NAMES.len());
    }

    #[test]
    fn errors_name_the_surface_option() {
        let bad = |s: Settings| s.resolve().unwrap_err().option;
        let base = Settings {
            rank: Some(0),
            world_size: Some(1),
            ..Settings::default()
        };
        assert_eq!(
            bad(Settings {
                batch_size: 0,
                ..base.clone()
            }),
            "batch_size"
        );
        assert_eq!(
            bad(Settings {
                sampler: Sampler::Liquid,
                ..base.clone()
            }),
            "budget"
        );
        assert_eq!(
            bad(Settings {
                rank: Some(2),
                world_size: Some(2),
                ..base.clone()
            }),
            "rank"
        );
        assert_eq!(
            bad(Settings {
                mean: Some(PerChannel([0.5; 3])),
                ..base.clone()
            }),
            "std"
        );
        assert_eq!(
            bad(Settings {
                dtype: DType::U8,
                mean: Some(PerChannel([0.5; 3])),
                std: Some(PerChannel([0.5; 3])),
                ..base.clone()
            }),
            "dtype"
        );
        assert_eq!(
            bad(Settings {
                cache_limit: Some(Bytes(5)),
                ..base.clone()
            }),
            "cache_limit"
        );
        // The recipes: one at a time, ratio only with scale, and none on the GPU path yet.
        let pair = |a, b| Some(Pair([a, b]));
        for (s, name) in [
            (
                Settings {
                    scale: pair(0.1, 1.0),
                    jitter: pair(0.5, 2.0),
                    ..base.clone()
                },
                "jitter",
            ),
            (
                Settings {
                    ratio: pair(1.0, 2.0),
                    ..base.clone()
                },
                "ratio",
            ),
            (
                Settings {
                    scale: pair(0.5, 0.1),
                    ..base.clone()
                },
                "scale",
            ),
        ] {
            assert_eq!(bad(s), name);
        }
        // The GPU path resamples and pads with any fill.
        for s in [
            Settings {
                resize: Some(256),
                device: Device::Cuda(0),
                ..base.clone()
            },
            Settings {
                jitter: pair(0.5, 2.0),
                fill: 3,
                device: Device::Cuda(0),
                ..base.clone()
            },
        ] {
            s.resolve().unwrap();
        }
        let (o, _) = Settings {
            scale: pair(0.08, 1.0),
            interpolation: Interpolation::Nearest,
            ..base.clone()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            o.sample.recipe,
            Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: DEFAULT_RATIO
            }
        );
        assert_eq!("0.5, 2".parse::<Pair>(), Ok(Pair([0.5, 2.0])));
        assert_eq!("shuffle".parse::<Sampler>(), Ok(Sampler::Uniform));
        assert_eq!(
            "3x".parse::<Size>().unwrap_err().to_string(),
            "crop \"3x\": expected N or HxW (positive integers)"
        );
        assert_eq!(
            "512x1024".parse::<Size>(),
            Ok(Size {
                height: 512,
                width: 1024
            })
        );
        assert_eq!(
            parse_setting::<PerChannel>("std", "1,2")
                .unwrap_err()
                .option,
            "std"
        );
    }
}
