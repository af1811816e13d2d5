//! What an inference run can be asked to do, as the surfaces spell it: [`InferSettings`], one field per
//! flag of `l3 infer` and `l3 stylize` and keyword of `l3toolkit.infer` (`padding` is also `Model`'s),
//! with the names, defaults and help text they all show. Built as `loader::Settings` is for the loader:
//! the values are types whose `FromStr` errors are [`vocab::Invalid`] naming the option; the command line
//! derives its flags from this struct (`clap::Args`, behind the `clap` feature); Python fills it from its
//! keywords; [`InferSettings::request`] checks it and turns it into an [`InferRequest`]. So every surface
//! accepts the same names and values, has the same defaults and prints the same words for the same bad
//! value.
//!
//! One option has a default per command: `full`. `l3 infer` and `infer` give a model's output as its
//! framework does (onnxruntime, PyTorch), so their default is the whole output; `l3 stylize` and
//! `stylize` are an image filter, so theirs is the picture at its own size. `crop_to_input` (`l3 infer
//! --crop-to-input`, `infer(..., crop_to_input=True)`) is `full=False` spelt the other way.

use crate::run::InferRequest;
use crate::tiff::OutDType;
use bsp_tiling::{Budget, DeviceOptions, Mode, PaddingMode, Precision};
use loader::Bytes;
use std::path::PathBuf;
use vocab::{Device, Invalid};

#[cfg(feature = "clap")]
use loader::clap_values::Text;

/// The most worker threads a run may ask for: the loader's bound on a pool.
pub use loader::MAX_THREADS;

/// The one tile default of every surface (bsp-tiling's: 512 on the CPU, 2048 on a CUDA device).
pub use bsp_tiling::default_tile;

/// An inference run's options as `l3 infer`, `l3 stylize` and `l3toolkit.infer` spell them: the field is
/// the Python keyword, the flag the same with `-` for `_`. Defaults are [`InferSettings::default`]'s,
/// shown by `--help` and Python's signature alike.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct InferSettings {
    /// Tile side in input pixels, a multiple of the network's total stride (default: 512 on the CPU,
    /// 2048 on a CUDA device).
    #[cfg_attr(feature = "clap", arg(long, value_name = "PIXELS"))]
    pub tile: Option<usize>,
    /// `exact` (equal to running the whole image at once), `sampled` / `sampled:N` (statistics of an
    /// N-times downsampled image, then one pass per tile), `recompute` (exact statistics recomputed per
    /// normalisation, nothing stored but the output), `naive` (independent tiles: seams) or `whole`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "MODE", value_parser = Text::<Mode>::new("mode"), default_value_t = InferSettings::default().mode))]
    pub mode: Mode,
    /// Where the network runs: `cpu`, `cuda` (GPU 0) or `cuda:N`. A GPU that cannot be used is an error
    /// naming the reason, never a CPU run.
    #[cfg_attr(feature = "clap", arg(long, value_name = "cpu|cuda|cuda:N", value_parser = Text::<Device>::new("device"), default_value_t = InferSettings::default().device))]
    pub device: Device,
    /// `f32`, or `f16` on a CUDA device (convolution operands in binary16, f32 accumulation; a
    /// transposed convolution is refused under f16, naming it).
    #[cfg_attr(feature = "clap", arg(long, value_name = "f32|tf32|f16", value_parser = Text::<Precision>::new("precision"), default_value_t = InferSettings::default().precision))]
    pub precision: Precision,
    /// Bytes of GPU memory the run may use (e.g. 4G; a CUDA device only; default: what is free, less a
    /// margin).
    #[cfg_attr(feature = "clap", arg(long, value_name = "BYTES", value_parser = Text::<Bytes>::new("gpu_memory")))]
    pub gpu_memory: Option<Bytes>,
    /// Worker threads (default: every core).
    #[cfg_attr(feature = "clap", arg(long))]
    pub threads: Option<usize>,
    /// A TransformerNet's padding at the image border: `reflect` (as trained; the default), `circular`,
    /// `zero`, `replicate`. An ONNX model pads as it was exported: giving one is refused.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PADDING", value_parser = Text::<PaddingMode>::new("padding")))]
    pub padding: Option<PaddingMode>,
    /// MiB of RAM a run's activations may take: each tile's working set first (a tile too large is
    /// shrunk to fit, with a note, or the run refused), stored values in the rest, spilled to files
    /// (`spill_dir`) beyond it. `L3_MEMORY_LIMIT`, where smaller, bounds it too.
    #[cfg_attr(feature = "clap", arg(long, value_name = "MIB", default_value_t = InferSettings::default().ram_budget_mib))]
    pub ram_budget_mib: u64,
    /// Where spill files go (default: the system temporary directory).
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR"))]
    pub spill_dir: Option<PathBuf>,
    /// The network's whole output, as onnxruntime and PyTorch give it (a TransformerNet rounds each side
    /// up to a multiple of 4), or (`--full=false`) cropped to the input's size times the network's scale.
    /// Default: the whole output for `l3 infer`, cropped for `l3 stylize`.
    #[cfg_attr(feature = "clap", arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "true|false"))]
    pub full: Option<bool>,
    /// Factor applied to integer input samples (8-bit: 0..255): 0.00392156862 (1/255) for a network
    /// trained on 0..1. Float inputs (`.npy`, float32 TIFF) are taken as they are.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FACTOR", default_value_t = InferSettings::default().in_scale))]
    pub in_scale: f32,
    /// Factor applied to the output before 8-bit clamping (255 for a network whose output is 0..1);
    /// float32 outputs are raw.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FACTOR", default_value_t = InferSettings::default().out_scale))]
    pub out_scale: f32,
    /// The output's samples where the format offers a choice: a `.tif` is `uint8` (clamped, like PNG)
    /// by default or `float32` (the raw output); `.npy` is float32, the image formats uint8.
    #[cfg_attr(feature = "clap", arg(long, value_name = "uint8|float32", value_parser = Text::<OutDType>::new("out_dtype")))]
    pub out_dtype: Option<OutDType>,
    /// The page of a TIFF input (default 0, the first: a slide's full resolution; later pages are
    /// reduced levels, overviews, thumbnails, label images; see `l3 infer --list-pages`). Refused for
    /// other inputs.
    #[cfg_attr(feature = "clap", arg(long))]
    pub page: Option<usize>,
    /// The level of that page: 0 (default) the page itself, N its N-th SubIFD, where pyramidal slides
    /// (OME-TIFF and most whole-slide writers) keep their reduced resolutions. Refused for other inputs.
    #[cfg_attr(feature = "clap", arg(long))]
    pub level: Option<usize>,
}

impl Default for InferSettings {
    fn default() -> InferSettings {
        let budget = Budget::default();
        InferSettings {
            tile: None,
            mode: Mode::Exact,
            device: Device::Cpu,
            precision: Precision::F32,
            gpu_memory: None,
            threads: None,
            padding: None,
            ram_budget_mib: budget.ram >> 20,
            spill_dir: None,
            full: None,
            in_scale: 1.0,
            out_scale: 1.0,
            out_dtype: None,
            page: None,
            level: None,
        }
    }
}

/// The names of every [`InferSettings`] field, in order: what every surface must accept (tests walk
/// them).
pub const INFER_SETTING_NAMES: &[&str] = &[
    "tile",
    "mode",
    "device",
    "precision",
    "gpu_memory",
    "threads",
    "padding",
    "ram_budget_mib",
    "spill_dir",
    "full",
    "in_scale",
    "out_scale",
    "out_dtype",
    "page",
    "level",
];

impl InferSettings {
    /// Each setting's default as text (`none` for an unset one), in [`INFER_SETTING_NAMES`] order: what
    /// the command line's help and Python's signature both show.
    pub fn defaults() -> Vec<(&'static str, String)> {
        let d = InferSettings::default();
        let opt = |v: Option<String>| v.unwrap_or_else(|| "none".into());
        let values = [
            opt(d.tile.map(|v| v.to_string())),
            d.mode.to_string(),
            d.device.to_string(),
            d.precision.to_string(),
            opt(d.gpu_memory.map(|v| v.to_string())),
            opt(d.threads.map(|v| v.to_string())),
            opt(d.padding.map(|v| v.to_string())),
            d.ram_budget_mib.to_string(),
            opt(d.spill_dir.map(|v| v.display().to_string())),
            opt(d.full.map(|v| v.to_string())),
            d.in_scale.to_string(),
            d.out_scale.to_string(),
            opt(d.out_dtype.map(|v| v.to_string())),
            opt(d.page.map(|v| v.to_string())),
            opt(d.level.map(|v| v.to_string())),
        ];
        INFER_SETTING_NAMES.iter().copied().zip(values).collect()
    }

    /// The tile side: the one given, else [`default_tile`] of the device.
    pub fn tile(&self) -> Result<usize, Invalid> {
        match self.tile {
            Some(0) => Err(Invalid::new(
                "tile",
                0,
                "a positive number of pixels (a multiple of the network's total stride), or none",
            )),
            Some(t) => Ok(t),
            None => Ok(default_tile(self.device)),
        }
    }

    /// Worker threads: the ones given, else every core.
    pub fn threads(&self) -> Result<usize, Invalid> {
        match self.threads {
            Some(t) if !(1..=MAX_THREADS).contains(&t) => Err(Invalid::new(
                "threads",
                t,
                format!("1 to {MAX_THREADS}, or none for every core"),
            )),
            t => Ok(stdx::parallel::threads(t.unwrap_or(0))),
        }
    }

    /// The device, its memory budget and precision, checked together.
    pub fn device_options(&self) -> Result<DeviceOptions, Invalid> {
        let d = DeviceOptions {
            device: self.device,
            gpu_memory: self.gpu_memory.map(|b| b.0),
            precision: self.precision,
        };
        if d.gpu_memory == Some(0) {
            return Err(Invalid::new(
                "gpu_memory",
                0,
                "a positive number of bytes (e.g. 4G), or none for what is free",
            ));
        }
        d.check()?;
        Ok(d)
    }

    /// The RAM budget of activations and where spill files go.
    pub fn budget(&self) -> Result<Budget, Invalid> {
        let ram = self.ram_budget_mib.checked_mul(1 << 20).ok_or_else(|| {
            Invalid::new(
                "ram_budget_mib",
                self.ram_budget_mib,
                format!("0 to {} MiB", u64::MAX >> 20),
            )
        })?;
        Ok(Budget {
            ram,
            disk: None,
            spill_dir: self.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        })
    }

    /// These settings with `stylize`'s default output size: cropped to the input's size times the
    /// network's scale unless `full` was given.
    pub fn cropped_by_default(mut self) -> InferSettings {
        self.full.get_or_insert(false);
        self
    }

    /// The run these settings ask for, from `input` to `output` (empty paths where the run reads or
    /// writes memory instead). The page and level are checked against the file when it is opened.
    pub fn request(&self, input: PathBuf, output: PathBuf) -> Result<InferRequest, Invalid> {
        for (option, v) in [("in_scale", self.in_scale), ("out_scale", self.out_scale)] {
            if !v.is_finite() {
                return Err(Invalid::new(option, v, "a finite number"));
            }
        }
        Ok(InferRequest {
            input,
            output,
            mode: self.mode,
            tile: self.tile()?,
            threads: self.threads()?,
            budget: self.budget()?,
            full: self.full.unwrap_or(true),
            in_scale: self.in_scale,
            out_scale: self.out_scale,
            out_dtype: self.out_dtype,
            device: self.device_options()?,
            page: self.page,
            level: self.level,
            ranks: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loader::parse_setting;

    #[test]
    fn defaults_resolve_and_every_name_has_a_default() {
        let r = InferSettings::default()
            .request(PathBuf::new(), PathBuf::new())
            .unwrap();
        assert_eq!((r.tile, r.mode, r.full), (512, Mode::Exact, true));
        let styl = InferSettings::default().cropped_by_default();
        assert!(!styl.request(PathBuf::new(), PathBuf::new()).unwrap().full);
        assert_eq!(r.budget.ram, 2 << 30);
        assert_eq!(r.device, DeviceOptions::default());
        assert_eq!(InferSettings::defaults().len(), INFER_SETTING_NAMES.len());
        let cuda = InferSettings {
            device: Device::Cuda(1),
            ..InferSettings::default()
        };
        assert_eq!(cuda.tile(), Ok(2048), "one tile rule: 2048 on a GPU");
    }

    #[test]
    fn every_value_type_names_its_option_and_round_trips() {
        for (option, good, bad) in [
            ("mode", "sampled:4", "fast"),
            ("device", "cuda:1", "gpu"),
            ("precision", "f16", "f64"),
            ("gpu_memory", "4G", "lots"),
            ("padding", "circular", "mirror"),
            ("out_dtype", "float32", "int8"),
        ] {
            let e = match option {
                "mode" => {
                    let m: Mode = parse_setting(option, good).unwrap();
                    assert_eq!(m.to_string(), good);
                    parse_setting::<Mode>(option, bad).unwrap_err()
                }
                "device" => parse_setting::<Device>(option, bad).unwrap_err(),
                "precision" => {
                    let p: Precision = parse_setting(option, good).unwrap();
                    assert_eq!(p.to_string(), good);
                    parse_setting::<Precision>(option, bad).unwrap_err()
                }
                "gpu_memory" => {
                    assert_eq!(parse_setting(option, good), Ok(Bytes(4 << 30)));
                    parse_setting::<Bytes>(option, bad).unwrap_err()
                }
                "padding" => {
                    let p: PaddingMode = parse_setting(option, good).unwrap();
                    assert_eq!(p.to_string(), good);
                    parse_setting::<PaddingMode>(option, bad).unwrap_err()
                }
                _ => {
                    let d: OutDType = parse_setting(option, good).unwrap();
                    assert_eq!(d.to_string(), good);
                    parse_setting::<OutDType>(option, bad).unwrap_err()
                }
            };
            assert_eq!(e.option, option);
            assert!(
                e.to_string()
                    .starts_with(&format!("{option} {bad:?}: expected ")),
                "{e}"
            );
        }
    }

    #[test]
    fn combinations_are_refused_naming_the_option() {
        let bad = |s: InferSettings| {
            s.request(PathBuf::new(), PathBuf::new())
                .unwrap_err()
                .option
        };
        let d = InferSettings::default;
        for (s, option) in [
            (
                InferSettings {
                    precision: Precision::F16,
                    ..d()
                },
                "precision",
            ),
            (
                InferSettings {
                    gpu_memory: Some(Bytes(1 << 30)),
                    ..d()
                },
                "gpu_memory",
            ),
            (
                InferSettings {
                    gpu_memory: Some(Bytes(0)),
                    device: Device::Cuda(0),
                    ..d()
                },
                "gpu_memory",
            ),
            (
                InferSettings {
                    tile: Some(0),
                    ..d()
                },
                "tile",
            ),
            (
                InferSettings {
                    threads: Some(0),
                    ..d()
                },
                "threads",
            ),
            (
                InferSettings {
                    ram_budget_mib: u64::MAX,
                    ..d()
                },
                "ram_budget_mib",
            ),
            (
                InferSettings {
                    in_scale: f32::NAN,
                    ..d()
                },
                "in_scale",
            ),
            (
                InferSettings {
                    out_scale: f32::INFINITY,
                    ..d()
                },
                "out_scale",
            ),
        ] {
            assert_eq!(bad(s), option);
        }
        let gpu = InferSettings {
            device: Device::Cuda(0),
            precision: Precision::F16,
            gpu_memory: Some(Bytes(1 << 30)),
            ..d()
        };
        assert!(gpu.request(PathBuf::new(), PathBuf::new()).is_ok());
    }
}
