//! Where a graph's nodes compute: [`GraphOps`], the backend split of the graph engine.
//!
//! The engine (`super`) decides tiles, windows, statistics and storage once; a backend only computes one
//! node's output range from its gathered windows. The windows are gathered on the host (from the input
//! or the stored tiles of earlier nodes, by global coordinates), handed to the backend with
//! [`GraphOps::load`], computed there and brought back with [`GraphOps::store`], where the engine takes
//! the per-channel statistics in f64 and stores the tile. The CPU backend's `load`/`store` are moves and
//! its `compute` is [`ops::compute`], so the CPU path is the engine as it was; `DeviceSim`
//! computes the same numbers with a device's memory accounting; [`crate::CudaBackend`] runs the kernels.
//!
//! A backend with memory of its own may keep the stored values there ([`GraphOps::keeps_values`]): the
//! engine then gathers windows of them with [`GraphOps::gather`] and takes their statistics with
//! [`GraphOps::stats`] where they are, and only the input's windows and the output cross the bus.
//!
//! A node a backend cannot run is refused by [`GraphOps::check`] before any work starts: a typed
//! [`Error::Node`] naming it, never a fallback to the host.

use super::model::Node;
use super::ops::{self, Ctx, Op, Unary};
use crate::backend::CpuBackend;
use crate::device::{Precision, norm_scratch_bytes};
use crate::error::{Error, Result};
use crate::field::{self, Part, Parts};
use crate::meter::{Lease, Meter};
use crate::sim::{DeviceSim, SimBuf};
use crate::stats::ChannelStats;
use crate::tensor::Tensor;
use std::sync::Arc;

/// A backend the graph engine runs nodes on.
pub trait GraphOps: Sync {
    /// A `C×H×W` f32 activation where this backend computes.
    type Buf: Send + Sync;
    /// What a backend prepares once per run (a device: the weights uploaded).
    type Prepared: Send + Sync;

    /// Tiles worked on at once when the caller grants `threads` threads (a GPU: one).
    fn tiles_at_once(&self, threads: usize) -> usize {
        threads.max(1)
    }

    /// The meter of a backend with budgeted memory of its own (a device); `None` for the CPU.
    fn device_meter(&self) -> Option<&Arc<Meter>> {
        None
    }

    /// Whether a unit with a small halo is computed inside its reader's superstep instead of stored
    /// (a halo recomputed to save storing, keeping and copying a value; the same result).
    fn inlines_units(&self) -> bool {
        false
    }

    /// `Ok` when every node of the graph runs here; else the first node that does not, and why.
    fn check(&self, _nodes: &[Node]) -> Result<()> {
        Ok(())
    }

    /// Prepares a run of `nodes` (uploads weights).
    fn prepare(&self, nodes: &[Node]) -> Result<Self::Prepared>;

    /// A gathered host window into the backend.
    fn load(&self, t: Tensor) -> Result<Self::Buf>;
    /// A computed output back to the host.
    fn store(&self, x: Self::Buf) -> Result<Tensor>;

    /// Node `i`'s output range `ctx.range` from its windows (one per node input, gathered with
    /// `ctx.maps`).
    fn compute(
        &self,
        prep: &Self::Prepared,
        i: usize,
        node: &Node,
        ins: Vec<Self::Buf>,
        ctx: &Ctx,
    ) -> Result<Self::Buf>;

    /// An element-wise node fused into its producer's unit ([`ops::fusable`]: a chain runs on the
    /// producer's tile as it is computed), applied to that output in place: the arithmetic of the node's
    /// own computation, without a value stored and gathered between the two.
    fn pointwise(&self, op: &Op, x: Self::Buf) -> Result<Self::Buf>;

    /// Whether the stored values of a run may stay where this backend computes between supersteps (a
    /// device's memory, as far as its budget allows), so that a value crosses the bus only as the input
    /// going up and the output coming down, instead of every node's output going down and its windows up
    /// again. The host's own values are the engine's tiled store (RAM, spilled past the budget).
    fn keeps_values(&self) -> bool {
        false
    }

    /// The window at rows `ys` × columns `xs` (global coordinates, `None` a zero) of a `c`-channel value
    /// held here in `parts`, gathered where it is: how a kept value, and a value computed where it is
    /// read, are read.
    fn gather(
        &self,
        c: usize,
        parts: &[Part<'_, Self::Buf>],
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<Self::Buf>;

    /// Per-channel statistics of `x` (f64, in an order fixed by its shape): what the normalisations after
    /// it read of every tile.
    fn stats(&self, x: &Self::Buf) -> Result<Vec<ChannelStats>>;

    /// Gives up a buffer the engine is done with (the host keeps large ones for the next superstep).
    fn recycle(&self, _x: Self::Buf) {}
}

/// Per-channel statistics of a host tensor, each channel's plane in one pass pair
/// ([`ChannelStats::of`]): the CPU backend's, and the simulated device's.
pub fn tensor_stats(t: &Tensor) -> Vec<ChannelStats> {
    (0..t.c).map(|c| ChannelStats::of(t.plane(c))).collect()
}

impl GraphOps for CpuBackend {
    type Buf = Tensor;
    type Prepared = ();

    fn inlines_units(&self) -> bool {
        true
    }

    fn prepare(&self, _nodes: &[Node]) -> Result<()> {
        Ok(())
    }
    fn load(&self, t: Tensor) -> Result<Tensor> {
        Ok(t)
    }
    fn store(&self, x: Tensor) -> Result<Tensor> {
        Ok(x)
    }
    fn compute(
        &self,
        _: &(),
        _: usize,
        node: &Node,
        ins: Vec<Tensor>,
        ctx: &Ctx,
    ) -> Result<Tensor> {
        ops::compute(&node.op, ins, ctx)
    }
    fn pointwise(&self, op: &Op, x: Tensor) -> Result<Tensor> {
        ops::apply_pointwise(op, x)
    }
    fn gather(
        &self,
        c: usize,
        parts: &[Part<'_, Tensor>],
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<Tensor> {
        field::gather(&Parts { c, parts }, ys, xs)
    }
    fn stats(&self, x: &Tensor) -> Result<Vec<ChannelStats>> {
        Ok(tensor_stats(x))
    }
    fn recycle(&self, x: Tensor) {
        crate::buffers::give(x.data);
    }
}

/// Device bytes of a node's prepared parameters: convolution weights and biases in f32, and under
/// [`Precision::F16`] a (transposed) convolution's binary16 copy of its weights beside them (TF32 reads
/// the f32 weights).
pub fn weight_bytes(op: &Op, precision: Precision) -> u64 {
    match op {
        Op::Conv(c) | Op::ConvTranspose(c) => {
            ((c.weight.len() + c.bias.len()) * 4 + f16_weight_len(op, precision) * 2) as u64
        }
        _ => 0,
    }
}

/// Elements of a node's binary16 weight copy: a (transposed) convolution's weights under
/// [`Precision::F16`].
fn f16_weight_len(op: &Op, precision: Precision) -> usize {
    match (op, precision) {
        (Op::Conv(c) | Op::ConvTranspose(c), Precision::F16) => c.weight.len(),
        _ => 0,
    }
}

/// Output rows per im2col band of a graph convolution producing `ho × wo`, and the band's bytes (columns
/// of one group at a time, of [`Precision::elem_bytes`] each): as many rows as `band_bytes` holds, at
/// least one.
pub fn conv_band(
    c: &ops::ConvOp,
    ho: usize,
    wo: usize,
    band_bytes: usize,
    precision: Precision,
) -> (usize, u64) {
    let row = c.cin / c.groups.max(1) * c.win[0].k * c.win[1].k * wo * precision.elem_bytes();
    let rows = (band_bytes / row.max(1)).clamp(1, ho.max(1));
    (rows, (rows * row) as u64)
}

/// The im2col band a device convolution works in, leased: at most `band_bytes`, and no more than the
/// budget leaves, so that a budget shapes the run (more, narrower GEMMs) instead of refusing it. Refused
/// (naming `what` and its bytes) only when one output row's columns do not fit. The CUDA backend and
/// [`DeviceSim`] both size their bands here.
pub fn lease_conv_band(
    meter: &std::sync::Arc<Meter>,
    (c, ho, wo): (&ops::ConvOp, usize, usize),
    band_bytes: usize,
    precision: Precision,
    what: &str,
) -> Result<(usize, Lease)> {
    let mut cap = band_bytes.min(usize::try_from(meter.available()).unwrap_or(usize::MAX));
    loop {
        let (rows, bytes) = conv_band(c, ho, wo, cap, precision);
        match meter.lease(bytes, what) {
            Ok(lease) => return Ok((rows, lease)),
            Err(e) if rows == 1 => return Err(e),
            // Other leases took the room meanwhile: a narrower band (rows strictly fewer each time).
            Err(_) => cap = (bytes as usize - 1).min(meter.available() as usize),
        }
    }
}

/// Device scratch one node's computation takes besides its windows and its output: im2col columns,
/// a transposed convolution's `Wᵀ·x` columns (and under [`Precision::F16`] its input as binary16), index
/// and weight tables, per-channel parameters. The
/// CUDA backend allocates exactly these; [`DeviceSim`] leases the same. `band_bytes`: the backend's im2col
/// band size (a convolution's columns: the most its band takes, [`lease_conv_band`] leases what the budget
/// leaves of it); `precision`: its convolutions' operand type.
pub fn scratch_bytes(
    op: &Op,
    ins: &[(usize, usize, usize)],
    out: (usize, usize, usize),
    band_bytes: usize,
    precision: Precision,
) -> u64 {
    let (c, ho, wo) = out;
    let (xc, xh, xw) = ins[0];
    match op {
        Op::Conv(cv) => conv_band(cv, ho, wo, band_bytes, precision).1,
        Op::ConvTranspose(cv) => {
            let f16_input = match precision {
                Precision::F16 => xc * xh * xw * 2,
                Precision::F32 | Precision::Tf32 => 0,
            };
            (cv.cout * cv.win[0].k * cv.win[1].k * xh * xw * 4 + f16_input) as u64
        }
        Op::Pool(_) => ((xh + xw + ho + wo) * 4) as u64,
        Op::Resize(r) if r.linear => ((ho + wo) * 12) as u64,
        Op::Pad(p) if p.mode.is_none() && p.value != 0.0 => ((ho + wo) * 4) as u64,
        Op::Norm(_) | Op::Affine { .. } => norm_scratch_bytes(c),
        Op::Unary(Unary::PRelu(s)) => (s.len() * 4) as u64,
        Op::Binary {
            lhs: ops::Operand::Const(k),
            ..
        }
        | Op::Binary {
            rhs: ops::Operand::Const(k),
            ..
        } => (k.len() * 4) as u64,
        _ => 0,
    }
}

/// The refusal of a node on a device backend.
pub fn refuse(node: &Node, backend: &str, why: &str) -> Error {
    Error::Node {
        node: node.name.clone(),
        op: node.op_type.clone(),
        reason: format!("does not run on the {backend} backend: {why}"),
    }
}

/// `v` rounded as a convolution's operands are under `p` ([`Precision::round`]: binary16 as
/// `bsp_to_f16` and `bsp_im2col_g_f16` round, bit for bit).
pub fn round_operands(v: &[f32], p: Precision) -> Vec<f32> {
    v.iter().map(|&x| p.round(x)).collect()
}

/// A (transposed) convolution as the device's GEMM computes it under `p`: its weights rounded
/// ([`round_operands`]); `None` for other ops and in f32.
fn rounded_conv(op: &Op, p: Precision) -> Option<Op> {
    if p == Precision::F32 {
        return None;
    }
    let rounded = |c: &ops::ConvOp| ops::ConvOp {
        weight: round_operands(&c.weight, p),
        ..c.clone()
    };
    match op {
        Op::Conv(c) => Some(Op::Conv(rounded(c))),
        Op::ConvTranspose(c) => Some(Op::ConvTranspose(rounded(c))),
        _ => None,
    }
}

/// What the simulated device prepares for a run: the weights' leases, and under TF32 or binary16 each
/// (transposed) convolution with its weights rounded (by node).
pub struct SimPrepared {
    _leases: Vec<Lease>,
    rounded: Vec<Option<Op>>,
}

/// The device simulated on the host: [`ops::compute`]'s numbers, the CUDA backend's leases. Under
/// [`Precision::F16`] (or `Tf32`) a convolution or a transposed convolution computes on its window and
/// weights rounded to binary16 (TF32), products summed in f32: what the device's GEMM computes, up to its
/// order of summation (a product of two binary16 or two TF32 values is exact in f32).
impl GraphOps for DeviceSim {
    type Buf = SimBuf;
    type Prepared = SimPrepared;

    fn tiles_at_once(&self, _threads: usize) -> usize {
        self.concurrency.max(1)
    }
    fn device_meter(&self) -> Option<&Arc<Meter>> {
        Some(self.meter_arc())
    }
    fn inlines_units(&self) -> bool {
        self.inlines
    }
    fn prepare(&self, nodes: &[Node]) -> Result<SimPrepared> {
        let m = self.meter_arc();
        let p = self.precision;
        let leases = nodes
            .iter()
            .filter(|n| weight_bytes(&n.op, p) > 0)
            .map(|n| {
                m.lease(
                    weight_bytes(&n.op, p),
                    &format!("the weights of `{}`", n.name),
                )
            })
            .collect::<Result<_>>()?;
        let rounded = nodes.iter().map(|n| rounded_conv(&n.op, p)).collect();
        Ok(SimPrepared {
            _leases: leases,
            rounded,
        })
    }
    fn load(&self, t: Tensor) -> Result<SimBuf> {
        self.meter().copied(Tensor::bytes(t.c, t.h, t.w));
        self.hold(t, "a gathered window")
    }
    fn store(&self, x: SimBuf) -> Result<Tensor> {
        self.meter().copied(Tensor::bytes(x.t.c, x.t.h, x.t.w));
        Ok(x.t)
    }
    fn compute(
        &self,
        prep: &SimPrepared,
        i: usize,
        node: &Node,
        ins: Vec<SimBuf>,
        ctx: &Ctx,
    ) -> Result<SimBuf> {
        let dims: Vec<_> = ins.iter().map(|b| (b.t.c, b.t.h, b.t.w)).collect();
        let out = (
            node.channels,
            ctx.range[0].1 - ctx.range[0].0,
            ctx.range[1].1 - ctx.range[1].0,
        );
        let what = format!("the output of `{}`", node.name);
        let lease = self
            .meter_arc()
            .lease(Tensor::bytes(out.0, out.1, out.2), &what)?;
        let scratch = match &node.op {
            Op::Conv(c) => {
                let what = format!("the im2col columns of `{}`", node.name);
                let conv = (c, out.1, out.2);
                lease_conv_band(
                    self.meter_arc(),
                    conv,
                    self.band_bytes,
                    self.precision,
                    &what,
                )?
                .1
            }
            op => self.meter_arc().lease(
                scratch_bytes(op, &dims, out, self.band_bytes, self.precision),
                &format!("the scratch of `{}`", node.name),
            )?,
        };
        let mut tensors: Vec<Tensor> = ins.iter().map(|b| b.t.clone()).collect();
        let t = match prep.rounded.get(i).and_then(Option::as_ref) {
            Some(rounded) => {
                tensors[0].data = round_operands(&tensors[0].data, self.precision);
                ops::compute(rounded, tensors, ctx)?
            }
            None => ops::compute(&node.op, tensors, ctx)?,
        };
        drop(ins);
        drop(scratch);
        Ok(SimBuf::with_lease(t, lease))
    }
    fn pointwise(&self, op: &Op, x: SimBuf) -> Result<SimBuf> {
        x.map(|t| ops::apply_pointwise(op, t))
    }
    fn keeps_values(&self) -> bool {
        self.keeps
    }
    /// A copy within the device: leased, not counted as bus traffic.
    fn gather(
        &self,
        c: usize,
        parts: &[Part<'_, SimBuf>],
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<SimBuf> {
        let lease = self
            .meter_arc()
            .lease(Tensor::bytes(c, ys.len(), xs.len()), "a gathered window")?;
        let host: Vec<Part<'_, Tensor>> = parts
            .iter()
            .map(|p| Part {
                y0: p.y0,
                x0: p.x0,
                h: p.h,
                w: p.w,
                buf: &p.buf.t,
            })
            .collect();
        let t = field::gather(&Parts { c, parts: &host }, ys, xs)?;
        Ok(SimBuf::with_lease(t, lease))
    }
    /// The host's statistics ([`tensor_stats`]), so that a simulated run equals the CPU's bit for bit; the
    /// CUDA kernel's blocked order is checked against them in the kernel simulation.
    fn stats(&self, x: &SimBuf) -> Result<Vec<ChannelStats>> {
        Ok(tensor_stats(&x.t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::win::Win;

    /// A 3×3 convolution of 4 channels: one output row of width 10 is 4·9·10 columns.
    fn conv() -> ops::ConvOp {
        let win = Win {
            k: 3,
            stride: 1,
            dilation: 1,
        };
        ops::ConvOp {
            cin: 4,
            cout: 2,
            groups: 1,
            win: [win, win],
            pad: [ops::AxisPad::Explicit(1, 1); 2],
            output_padding: [0, 0],
            weight: vec![0.0; 2 * 4 * 9],
            bias: vec![0.0; 2],
        }
    }

    /// The band takes what the budget leaves (whole rows of it), all rows when they fit, and is refused
    /// naming the columns and their bytes only when one row does not fit.
    #[test]
    fn conv_bands_fit_what_the_budget_leaves() {
        let (c, row) = (conv(), 4 * 9 * 10 * 4u64);
        let m = Meter::new(10 * row);
        let held = m.lease(7 * row + row / 2, "windows").unwrap();
        let (rows, lease) =
            lease_conv_band(&m, (&c, 8, 10), 1 << 30, Precision::F32, "cols").unwrap();
        assert_eq!((rows, lease.bytes()), (2, 2 * row));
        drop(lease);
        // The backend's band size still caps it; f16 columns are half as wide.
        let (rows, _l) =
            lease_conv_band(&m, (&c, 8, 10), row as usize, Precision::F16, "c").unwrap();
        assert_eq!(rows, 2);
        drop((held, _l));
        let (rows, lease) =
            lease_conv_band(&m, (&c, 8, 10), 1 << 30, Precision::F32, "cols").unwrap();
        assert_eq!((rows, lease.bytes()), (8, 8 * row));
        drop(lease);
        let _held = m.lease(9 * row + row / 2, "windows").unwrap();
        match lease_conv_band(
            &m,
            (&c, 8, 10),
            1 << 30,
            Precision::F32,
            "the im2col columns of `c`",
        ) {
            Err(Error::DeviceBudget {
                what,
                needed,
                budget,
            }) => {
                assert!(what.starts_with("the im2col columns of `c`"), "{what}");
                assert_eq!((needed, budget), (10 * row + row / 2, 10 * row));
            }
            other => panic!(
                "expected a refusal of one row, got {:?}",
                other.map(|r| r.0)
            ),
        }
    }
}
