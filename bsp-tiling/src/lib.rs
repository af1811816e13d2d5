//! CNN inference on images of any size: BSP tiling with dictionary padding and synchronised
//! normalisation statistics (after "Processing Extremely Large Images with CNNs", CIKM'17).
//!
//! One engine runs every network, tiled:
//!
//! * [`graph`] — the DAG engine for any tileable CNN: `graph::model` ([`Graph`], [`Node`], their plan
//!   for one input size, halos, TransformerNet as a graph), `graph::schedule` (which values are stored,
//!   fused, read through or inlined, and their peak bytes), `graph::working` (a tile's working set, the
//!   tile fitted to the RAM budget), `graph::eval` (one node over one output range), `graph::exact` (the
//!   superstep engine), `graph::superstep` (every tile in parallel, the return the barrier),
//!   `graph::fixed` (one pass per output tile with fixed statistics), `graph::run` ([`run`] and
//!   [`run_device`] with their [`Options`]; [`infer`] and [`infer_on`] into a new tensor),
//!   `graph::halos` (what ranks sharing a run send each other), [`graph::ops`] (each op's geometry and
//!   host computation), [`graph::exec`] ([`GraphOps`]: CPU, simulated device, CUDA), [`graph::launch`] (the graph kernels'
//!   host half).
//! * [`onnx`] — the ONNX importer into a [`Graph`] ([`load_onnx`]), one module per op family.
//! * [`stylize`] and its device/sink forms run [`Net`] (TransformerNet from safetensors, `model`) as
//!   [`Graph::from_net`] through the graph engine, in the [`Mode`] asked, on [`grid_for`]'s tiles
//!   (`grid`: [`Grid`], borders aligned to the total stride, every tile at least as wide as a halo).
//!   `run_info`: what a run reports ([`RunInfo`]).
//!
//! Underneath:
//!
//! * `tensor`, `padding`, [`backend`] — values, PyTorch's paddings, the TransformerNet's parameters and
//!   [`CpuBackend`], the reference backend.
//! * `gemm` — convolution as a packed GEMM in a fixed summation order (portable and AVX2 kernels,
//!   bit-identical); `win` — a window's geometry along one axis, which it and `graph::ops` share.
//! * `cuda` — the CUDA backend ([`CudaBackend`]: NVRTC kernels from `kernels.cu`, cuDNN or cuBLAS
//!   convolutions) on the toolkit's one CUDA setup (`cuda-setup`); `device` selects it ([`Device`],
//!   [`DeviceOptions`], [`Precision`]: f32, TF32 or f16 convolution operands, f32 accumulation) and [`stylize_on`] /
//!   [`run_device`] run on it.
//! * [`Ranks`] (`ranks`) — a run's tiles shared among processes joined by a [`Collective`]
//!   (`torch.distributed`, JAX, [`LocalRanks`]' threads): per-tile statistics merged in tile order, the
//!   halos each rank reads sent to it (`graph::halos`), the output's tiles to rank 0; the output is a
//!   single process's, bit for bit. [`Options::ranks`] names them for [`run`] and [`stylize`].
//! * `meter`, `sim` — device memory: leases against a budget ([`Meter`]), and the device simulated on
//!   the CPU.
//! * `stats` (Chan/Welford, [`ChannelStats`]), `store` (values in RAM or spilled, [`Budget`]),
//!   `buffers` (large buffers reused between supersteps).
//! * [`field`] — inputs and outputs of any size ([`Input`], [`Sink`], [`OutputSink`], [`Output`]), the
//!   index maps a [`Field`] implemented elsewhere reads its windows by, and the sampled mode's
//!   downsampled input. Files read by region and written tile by tile (`.npy`, TIFF, L3, PNG, ...) are the
//!   `infer-io` crate's: this one knows no file format but its models'.
//! * [`metrics`] — error vs a reference, the seam metric, peak RSS.
//!
//! Everything a user of the library needs is re-exported here; what only this crate's tests,
//! benchmarks and fuzz targets drive (the simulated device, the CUDA kernels' source) is in the hidden
//! `testing` module.
#![deny(unsafe_code)]

pub mod backend;
mod buffers;
#[allow(unsafe_code)]
mod cuda;
mod device;
mod error;
pub mod field;
#[allow(unsafe_code)]
mod gemm;
pub mod graph;
mod grid;
mod meter;
pub mod metrics;
mod model;
pub mod onnx;
mod padding;
mod ranks;
mod run_info;
mod sim;
mod stats;
#[allow(unsafe_code)]
mod store;
mod tensor;
#[doc(hidden)]
pub mod testing;
mod win;

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;

pub use backend::CpuBackend;
pub use cuda::CudaBackend;
pub use device::{Device, DeviceOptions, Precision, default_tile};
pub use error::{Error, Result};
pub use field::{
    Field, Input, Output, OutputSink, Scaled, ScaledSink, Sink, image_from_tensor, image_to_tensor,
};
pub use graph::{
    Graph, GraphOps, GraphPlan, GraphStats, Node, NodeHalo, infer, infer_on, run, run_device,
    working_set,
};
pub use grid::Grid;
pub use meter::{Lease, Meter};
pub use model::{Axis, Net, NetStats, Plan, Stage, Widths};
pub use onnx::{graph_from_onnx, load_onnx};
pub use padding::PaddingMode;
pub use ranks::{Collective, LocalRanks, Ranks, exchange_by_all_gather};
pub use run_info::RunInfo;
pub use stats::ChannelStats;
pub use store::Budget;
pub use tensor::Tensor;
pub use vocab::Image;

/// How an image is run through the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The whole image at once: the reference (memory grows with the image).
    Whole,
    /// BSP tiling, exact: halo exchange and merged statistics at every layer. A run whose stored
    /// node outputs would not fit the RAM budget plus the spill space runs the [`Mode::Recompute`]
    /// schedule instead (the same output), and its run's notes say so.
    Exact,
    /// Statistics from the image downsampled by this factor, then one pass per tile (approximate).
    Sampled(usize),
    /// Exact statistics recomputed tile by tile per normalising layer; nothing stored but the output.
    Recompute,
    /// Independent tiles: no halo, per-tile statistics (visible seams).
    Naive,
}

impl Mode {
    /// `whole`, `exact`, `sampled` (factor 2), `sampled:N`, `recompute`, `naive`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "whole" => Some(Mode::Whole),
            "exact" => Some(Mode::Exact),
            "sampled" => Some(Mode::Sampled(2)),
            "recompute" => Some(Mode::Recompute),
            "naive" => Some(Mode::Naive),
            _ => s
                .strip_prefix("sampled:")
                .and_then(|f| f.parse().ok())
                .filter(|&f: &usize| f >= 1)
                .map(Mode::Sampled),
        }
    }
}

/// The spelling [`Mode::parse`] reads (`sampled` for the default factor 2).
impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Whole => f.write_str("whole"),
            Mode::Exact => f.write_str("exact"),
            Mode::Sampled(2) => f.write_str("sampled"),
            Mode::Sampled(n) => write!(f, "sampled:{n}"),
            Mode::Recompute => f.write_str("recompute"),
            Mode::Naive => f.write_str("naive"),
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = vocab::Invalid;
    fn from_str(s: &str) -> std::result::Result<Mode, vocab::Invalid> {
        Mode::parse(s).ok_or_else(|| {
            vocab::Invalid::new(
                "mode",
                s,
                "exact, sampled, sampled:N, recompute, naive or whole",
            )
        })
    }
}

/// Settings of a run ([`run`], [`run_device`], [`stylize`]).
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    /// Tile side in input pixels (a multiple of the network's total stride).
    pub tile: usize,
    pub threads: usize,
    pub budget: Budget,
    /// The ranks sharing this run's tiles ([`Ranks`]: processes joined by a collective), or `None`:
    /// this process computes them all. Every rank runs with the same graph, input and options; the
    /// output is written by rank 0 only and equals a single process's bit for bit.
    pub ranks: Option<Ranks>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            mode: Mode::Exact,
            tile: 512,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            budget: Budget::default(),
            ranks: None,
        }
    }
}

/// The smallest tile side the exact engine accepts for `net`: every tile at every resolution at least
/// as wide as the halo of the convolution reading it.
pub fn min_tile(net: &Net) -> usize {
    min_tile_layer(net).0
}

/// [`min_tile`], the layer whose halo sets it (the first, where several tie) and that halo in input pixels.
pub(crate) fn min_tile_layer(net: &Net) -> (usize, String, usize) {
    let align = net.total_stride();
    let mut div = 1;
    let (mut need, mut layer) = (
        1,
        net.stages.first().map_or(String::new(), |s| s.name.clone()),
    );
    for s in &net.stages {
        let halo = s.pad.max(s.conv.k - 1 - s.pad);
        let halo = if s.upsample { halo.div_ceil(2) } else { halo };
        if halo * div > need {
            need = halo * div;
            layer = s.name.clone();
        }
        div = div * s.conv.stride / if s.upsample { 2 } else { 1 };
        div = div.max(1);
    }
    (need.div_ceil(align) * align, layer, need)
}

/// The grid [`stylize`] uses ([`Graph::from_net`]'s [`Graph::grid`]): `tile`-sided tiles, a remainder
/// narrower than [`min_tile`] joining its neighbour.
pub fn grid_for(net: &Net, h: usize, w: usize, tile: usize) -> Result<Grid> {
    if h == 0 || w == 0 {
        return Err(Error::EmptyImage {
            width: w,
            height: h,
        });
    }
    Graph::from_net(net).grid(h, w, tile)
}

/// The output size (channels, height, width) [`stylize`] gives `net` for an `h`×`w` input: PyTorch's
/// whole-image size (for the TransformerNet: each side rounded up to a multiple of 4, see the README).
pub fn stylize_shape(net: &Net, h: usize, w: usize) -> Result<(usize, usize, usize)> {
    net.plan(h, w)?
        .out
        .last()
        .copied()
        .ok_or_else(|| Error::Unsupported("empty network".into()))
}

/// Runs `net` over `input` in the chosen mode on `backend`: [`Graph::from_net`] through [`run`], on
/// [`grid_for`]'s tiles. The output has PyTorch's whole-image size for this input ([`stylize_shape`]),
/// in memory: 8-bit RGB (clamped and rounded) with `sink_rgb8`, else float32. [`run`] and
/// [`run_device`] on [`Graph::from_net`] hand it to a [`Sink`] instead, tile by tile as tiles complete.
pub fn stylize<B: GraphOps>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    opts: &Options,
    sink_rgb8: bool,
) -> Result<(Output, RunInfo)> {
    let sink = output_sink(net, input, sink_rgb8)?;
    let info = run(backend, &Graph::from_net(net), input, opts, &sink)?;
    Ok((sink.finish(), info))
}

/// The in-memory output of [`stylize`] / [`stylize_on`] for `input`: 8-bit RGB or float32 (the net
/// checked against the input's size first).
fn output_sink(net: &Net, input: &dyn Input, rgb8: bool) -> Result<OutputSink> {
    let (c, oh, ow) = stylize_shape(net, input.height(), input.width())?;
    if rgb8 {
        Ok(OutputSink::rgb8(oh, ow))
    } else {
        OutputSink::f32(c, oh, ow)
    }
}

/// [`stylize`] on the device `dev` names: the CPU backend, or the CUDA backend opened with its memory
/// budget and precision ([`run_device`]). Without a usable GPU, `Device::Cuda` fails with the reason (no
/// driver, no device, no NVRTC or cuBLAS); it never falls back to the CPU.
pub fn stylize_on(
    dev: &DeviceOptions,
    net: &Net,
    input: &dyn Input,
    opts: &Options,
    sink_rgb8: bool,
) -> Result<(Output, RunInfo)> {
    dev.validate()?;
    let sink = output_sink(net, input, sink_rgb8)?;
    let info = run_device(dev, &Graph::from_net(net), input, opts, &sink)?;
    Ok((sink.finish(), info))
}
