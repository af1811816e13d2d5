//! The operations of a [`Graph`](super::Graph), each described the one way the tiler needs: per spatial
//! axis, the output length for given input lengths, and for any output range `o0..o1` the input indices
//! its window reads (`None`: padding, outside the input); then the computation of exactly that output range
//! from the gathered windows. A whole-image pass is the range `0..n`; a tile is its own range, its window
//! gathered by global coordinates from wherever its neighbours stored theirs (dictionary padding). The
//! same code computes both, so tiled and whole differ only where statistics are merged.

use crate::padding::PaddingMode;
use crate::tensor::Tensor;
pub use crate::win::Win;

/// Padding along one axis: explicit, or ONNX's `auto_pad` resolved against the input length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisPad {
    Explicit(usize, usize),
    /// `SAME_UPPER` (extra pixel at the end) or `SAME_LOWER` (at the start).
    Same {
        upper: bool,
    },
}

impl AxisPad {
    /// (before, after) for input length `n`.
    pub fn resolve(&self, n: usize, w: &Win) -> (usize, usize) {
        match *self {
            AxisPad::Explicit(b, e) => (b, e),
            AxisPad::Same { upper } => {
                let out = n.div_ceil(w.stride);
                let total = ((out.max(1) - 1) * w.stride + w.span()).saturating_sub(n);
                let small = total / 2;
                if upper {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            }
        }
    }
}

/// Conv / ConvTranspose weights and geometry. Conv weight `[cout, cin/groups, kh, kw]`; ConvTranspose
/// weight `[cin, cout/groups, kh, kw]` (ONNX layouts).
#[derive(Clone, Debug)]
pub struct ConvOp {
    pub cin: usize,
    pub cout: usize,
    pub groups: usize,
    pub win: [Win; 2],
    pub pad: [AxisPad; 2],
    /// ConvTranspose only: extra output pixels at the end of each axis.
    pub output_padding: [usize; 2],
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// MaxPool / AveragePool.
#[derive(Clone, Debug)]
pub struct PoolOp {
    pub max: bool,
    pub win: [Win; 2],
    pub pad: [AxisPad; 2],
    pub ceil_mode: bool,
    /// AveragePool: padding counts in the divisor.
    pub count_include_pad: bool,
}

/// How Resize maps an output coordinate to the input (ONNX `coordinate_transformation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coord {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
}

/// ONNX `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Resize / Upsample by a per-axis scale (output length `floor(n · scale)`).
#[derive(Clone, Debug)]
pub struct ResizeOp {
    pub linear: bool,
    pub scale: [f64; 2],
    pub coord: Coord,
    pub nearest: Nearest,
}

impl ResizeOp {
    /// The input coordinate output `o` maps to, ONNX's formula.
    fn source(&self, axis: usize, o: usize, n_in: usize, n_out: usize) -> f64 {
        let s = self.scale[axis];
        let o = o as f64;
        match self.coord {
            Coord::HalfPixel => (o + 0.5) / s - 0.5,
            Coord::PytorchHalfPixel => {
                if n_out > 1 {
                    (o + 0.5) / s - 0.5
                } else {
                    0.0
                }
            }
            Coord::AlignCorners => {
                if n_out > 1 {
                    o * (n_in as f64 - 1.0) / (n_out as f64 - 1.0)
                } else {
                    0.0
                }
            }
            Coord::Asymmetric => o / s,
        }
    }

    /// Nearest: the input index of output `o`.
    fn nearest_index(&self, axis: usize, o: usize, n_in: usize, n_out: usize) -> usize {
        let x = self.source(axis, o, n_in, n_out);
        let i = match self.nearest {
            Nearest::Floor => x.floor(),
            Nearest::Ceil => x.ceil(),
            Nearest::RoundPreferFloor => {
                if x.fract() == 0.5 || x.fract() == -0.5 {
                    x.floor()
                } else {
                    x.round()
                }
            }
            Nearest::RoundPreferCeil => {
                if x.fract() == 0.5 || x.fract() == -0.5 {
                    x.ceil()
                } else {
                    x.round()
                }
            }
        };
        (i.max(0.0) as usize).min(n_in - 1)
    }

    /// Linear: the two taps and the weight of the second, as onnxruntime computes them (f32 weights).
    fn taps(&self, axis: usize, o: usize, n_in: usize, n_out: usize) -> (usize, usize, f32) {
        let x = self.source(axis, o, n_in, n_out) as f32;
        let x = x.clamp(0.0, (n_in - 1) as f32);
        let i0 = (x.floor() as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        (i0, i1, x - i0 as f32)
    }
}

/// Unary element-wise functions.
#[derive(Clone, Debug)]
pub enum Unary {
    Relu,
    LeakyRelu(f32),
    /// One slope per channel (length 1 or C).
    PRelu(Vec<f32>),
    Sigmoid,
    Tanh,
    Clip(f32, f32),
    Softplus,
    Mish,
    HardSigmoid(f32, f32),
    HardSwish,
    Elu(f32),
    Erf,
    /// Gelu (opset 20), exact (`erf`) or `tanh` approximation.
    Gelu {
        tanh: bool,
    },
    Neg,
    Abs,
    Exp,
    Sqrt,
}

/// Binary element-wise operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
}

/// An operand of a binary op: one of the node's inputs, or a constant per channel (length 1 or C).
#[derive(Clone, Debug)]
pub enum Operand {
    Input(usize),
    Const(Vec<f32>),
}

/// Which statistics a normalisation takes over the whole image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// InstanceNormalization: per channel.
    Instance,
    /// GroupNormalization with this many groups (LayerNormalization over C,H,W is one group).
    Group(usize),
}

/// A normalisation with statistics over the whole image (the BSP statistics superstep).
#[derive(Clone, Debug)]
pub struct NormOp {
    pub kind: NormKind,
    /// Per channel.
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
    pub eps: f64,
}

impl NormOp {
    /// Channels per statistics group.
    pub fn group_size(&self, c: usize) -> usize {
        match self.kind {
            NormKind::Instance => 1,
            NormKind::Group(g) => c / g.max(1),
        }
    }

    /// Per-channel `x·scale + shift` from per-channel statistics (merged per group), in f64.
    pub fn scale_shift(&self, stats: &[crate::ChannelStats]) -> (Vec<f32>, Vec<f32>) {
        let c = stats.len();
        let gs = self.group_size(c).max(1);
        let groups: Vec<crate::ChannelStats> = stats
            .chunks(gs)
            .map(|ch| {
                ch.iter()
                    .fold(crate::ChannelStats::default(), |a, s| a.merge(*s))
            })
            .collect();
        (0..c)
            .map(|ch| {
                let st = groups[ch / gs];
                let inv = 1.0 / (st.variance() + self.eps).sqrt();
                let g = self.gamma[ch] as f64;
                (
                    (g * inv) as f32,
                    (self.beta[ch] as f64 - st.mean * g * inv) as f32,
                )
            })
            .unzip()
    }
}

/// Padding with one mode (ONNX Pad on the spatial axes).
#[derive(Clone, Debug)]
pub struct PadOp {
    pub pads: [(usize, usize); 2],
    /// `None`: constant.
    pub mode: Option<PaddingMode>,
    pub value: f32,
}

/// One node's operation.
#[derive(Clone, Debug)]
pub enum Op {
    Conv(ConvOp),
    ConvTranspose(ConvOp),
    Pool(PoolOp),
    Resize(ResizeOp),
    Pad(PadOp),
    /// Pixel shuffle: `blocksize`, CRD (true) or DCR channel order.
    DepthToSpace {
        block: usize,
        crd: bool,
    },
    SpaceToDepth {
        block: usize,
    },
    /// A normalisation with whole-image statistics.
    Norm(NormOp),
    /// A per-channel affine map (BatchNormalization in inference mode where no convolution precedes it).
    Affine {
        scale: Vec<f32>,
        shift: Vec<f32>,
    },
    Unary(Unary),
    Binary {
        op: BinOp,
        lhs: Operand,
        rhs: Operand,
    },
    /// Along channels.
    Concat,
    Identity,
}

/// How an op's output resolution relates to its input's: `(num, den)`, output ≈ input · num / den.
impl Op {
    pub fn scale(&self) -> (usize, usize) {
        match self {
            Op::Conv(c) => (1, c.win[0].stride.max(c.win[1].stride)),
            Op::ConvTranspose(c) => (c.win[0].stride.max(c.win[1].stride), 1),
            Op::Pool(p) => (1, p.win[0].stride.max(p.win[1].stride)),
            Op::Resize(r) => {
                let s = r.scale[0].max(r.scale[1]);
                if s >= 1.0 {
                    (s.round() as usize, 1)
                } else {
                    (1, (1.0 / s).round() as usize)
                }
            }
            Op::DepthToSpace { block, .. } => (*block, 1),
            Op::SpaceToDepth { block } => (1, *block),
            _ => (1, 1),
        }
    }

    /// Ops that touch each pixel alone (their window is their own range): fused into their producer's tile.
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Affine { .. } | Op::Identity | Op::Binary { .. } | Op::Concat
        )
    }

    /// The output length along `axis` for input lengths `n_in` (one per node input); `Err` says why none.
    pub fn out_len(&self, axis: usize, n_in: &[usize]) -> Result<usize, String> {
        let n = n_in[0];
        match self {
            Op::Conv(c) => {
                let w = &c.win[axis];
                let (b, e) = c.pad[axis].resolve(n, w);
                let padded = n + b + e;
                if padded < w.span() {
                    return Err(format!(
                        "its kernel spans {} pixels, the padded input has {padded}",
                        w.span()
                    ));
                }
                Ok((padded - w.span()) / w.stride + 1)
            }
            Op::ConvTranspose(c) => {
                let w = &c.win[axis];
                let (b, e) = match c.pad[axis] {
                    AxisPad::Explicit(b, e) => (b, e),
                    AxisPad::Same { upper } => {
                        // ONNX: output = input · stride; the total padding is what makes it so.
                        let total = (w.stride * (n - 1) + c.output_padding[axis] + w.span())
                            .saturating_sub(n * w.stride);
                        let small = total / 2;
                        if upper {
                            (small, total - small)
                        } else {
                            (total - small, small)
                        }
                    }
                };
                let full = (n - 1) * w.stride + w.span() + c.output_padding[axis];
                full.checked_sub(b + e)
                    .filter(|&v| v > 0)
                    .ok_or_else(|| "its padding removes the whole output".to_string())
            }
            Op::Pool(p) => {
                let w = &p.win[axis];
                let (b, e) = p.pad[axis].resolve(n, w);
                let padded = n + b + e;
                if padded < w.span() {
                    return Err(format!(
                        "its window spans {} pixels, the padded input has {padded}",
                        w.span()
                    ));
                }
                let mut out = if p.ceil_mode {
                    (padded - w.span()).div_ceil(w.stride) + 1
                } else {
                    (padded - w.span()) / w.stride + 1
                };
                // A window may not start in the end padding.
                if p.ceil_mode && (out - 1) * w.stride >= n + b {
                    out -= 1;
                }
                Ok(out)
            }
            Op::Resize(r) => {
                let v = (n as f64 * r.scale[axis]).floor() as usize;
                if v == 0 {
                    return Err("it resizes the image to nothing".into());
                }
                Ok(v)
            }
            Op::Pad(p) => {
                let (b, e) = p.pads[axis];
                if p.mode == Some(PaddingMode::Reflect) && (b >= n || e >= n) {
                    return Err(format!(
                        "reflect padding of {} needs more than that many pixels, the input has {n}",
                        b.max(e)
                    ));
                }
                Ok(n + b + e)
            }
            Op::DepthToSpace { block, .. } => Ok(n * block),
            Op::SpaceToDepth { block } => {
                if !n.is_multiple_of(*block) {
                    return Err(format!(
                        "the side {n} is not a multiple of the block {block}"
                    ));
                }
                Ok(n / block)
            }
            _ => {
                if let Some(&m) = n_in.iter().find(|&&m| m != n) {
                    return Err(format!("its inputs are {n} and {m} pixels along one axis"));
                }
                Ok(n)
            }
        }
    }

    /// The input indices (of node input `j`, length `n_in[j]`) that outputs `o0..o1` along `axis` read,
    /// in window order; `None` is outside the input.
    pub fn in_map(
        &self,
        axis: usize,
        j: usize,
        n_in: &[usize],
        n_out: usize,
        o0: usize,
        o1: usize,
    ) -> Vec<Option<usize>> {
        let n = n_in[j];
        let inside = |u: isize| (u >= 0 && (u as usize) < n).then_some(u as usize);
        match self {
            Op::Conv(ConvOp { win, pad, .. }) | Op::Pool(PoolOp { win, pad, .. }) => {
                let w = &win[axis];
                let (b, _) = pad[axis].resolve(n, w);
                let start = (o0 * w.stride) as isize - b as isize;
                let len = (o1 - o0 - 1) * w.stride + w.span();
                (start..start + len as isize).map(inside).collect()
            }
            Op::ConvTranspose(c) => {
                let (lo, hi) = convt_range(c, axis, n, o0, o1);
                (lo..hi).map(inside).collect()
            }
            Op::Resize(r) => {
                if r.linear {
                    let (mut lo, mut hi) = (usize::MAX, 0);
                    for o in o0..o1 {
                        let (a, b, _) = r.taps(axis, o, n, n_out);
                        lo = lo.min(a);
                        hi = hi.max(b + 1);
                    }
                    (lo..hi).map(Some).collect()
                } else {
                    (o0..o1)
                        .map(|o| Some(r.nearest_index(axis, o, n, n_out)))
                        .collect()
                }
            }
            Op::Pad(p) => {
                let b = p.pads[axis].0 as isize;
                (o0..o1)
                    .map(|o| {
                        let u = o as isize - b;
                        match p.mode {
                            None => inside(u),
                            Some(m) => m.map(u, n),
                        }
                    })
                    .collect()
            }
            Op::DepthToSpace { block, .. } => (o0..o1).map(|o| Some(o / block)).collect(),
            Op::SpaceToDepth { block } => (o0 * block..o1 * block).map(Some).collect(),
            _ => (o0..o1).map(Some).collect(),
        }
    }
}

/// ConvTranspose: the input range `lo..hi` (may reach outside `0..n`) whose pixels contribute to outputs
/// `o0..o1`: output `o = i·s − pad + k·d`.
fn convt_range(c: &ConvOp, axis: usize, n: usize, o0: usize, o1: usize) -> (isize, isize) {
    let w = &c.win[axis];
    let b = convt_pad_begin(c, axis, n) as isize;
    let s = w.stride as isize;
    let reach = (w.span() - 1) as isize;
    let lo = (o0 as isize + b - reach).div_euclid(s)
        + ((o0 as isize + b - reach).rem_euclid(s) != 0) as isize;
    let hi = (o1 as isize - 1 + b).div_euclid(s) + 1;
    (lo, hi.max(lo))
}

fn convt_pad_begin(c: &ConvOp, axis: usize, n: usize) -> usize {
    let w = &c.win[axis];
    match c.pad[axis] {
        AxisPad::Explicit(b, _) => b,
        AxisPad::Same { upper } => {
            let total = (w.stride * (n - 1) + c.output_padding[axis] + w.span())
                .saturating_sub(n * w.stride);
            let small = total / 2;
            if upper { small } else { total - small }
        }
    }
}

/// Everything [`compute`] needs besides the windows.
pub struct Ctx<'a> {
    /// Output ranges `(o0, o1)` per axis.
    pub range: [(usize, usize); 2],
    /// Input lengths per node input, per axis.
    pub n_in: &'a [[usize; 2]],
    /// The input index maps the windows were gathered with, per node input, per axis.
    pub maps: &'a [[Vec<Option<usize>>; 2]],
    /// A normalisation's per-channel `(scale, shift)`.
    pub norm: Option<&'a (Vec<f32>, Vec<f32>)>,
    pub threads: usize,
}

fn per_channel(v: &[f32], c: usize) -> f32 {
    if v.len() == 1 { v[0] } else { v[c] }
}

/// Computes the output range `ctx.range` from the gathered windows (taken: element-wise ops work in place
/// on the window they were given).
pub fn compute(op: &Op, mut ins: Vec<Tensor>, ctx: &Ctx) -> crate::error::Result<Tensor> {
    let out = compute_from(op, &mut ins, ctx);
    for t in ins {
        crate::buffers::give(t.data);
    }
    out
}

/// [`compute`]; element-wise ops take their window out of `ins`.
fn compute_from(op: &Op, ins: &mut Vec<Tensor>, ctx: &Ctx) -> crate::error::Result<Tensor> {
    let (ho, wo) = (
        ctx.range[0].1 - ctx.range[0].0,
        ctx.range[1].1 - ctx.range[1].0,
    );
    Ok(match op {
        Op::Conv(c) => conv(&ins[0], c, ho, wo, ctx.threads)?,
        Op::ConvTranspose(c) => conv_transpose(&ins[0], c, ctx)?,
        Op::Pool(p) => pool(&ins[0], p, ctx)?,
        Op::Resize(r) => {
            if !r.linear {
                return Ok(ins.swap_remove(0));
            }
            resize_linear(&ins[0], r, ctx)?
        }
        Op::Pad(p) => {
            let mut t = ins.swap_remove(0);
            if p.mode.is_none() && p.value != 0.0 {
                let [ys, xs] = &ctx.maps[0];
                for ch in 0..t.c {
                    for (y, my) in ys.iter().enumerate() {
                        for (x, mx) in xs.iter().enumerate() {
                            if my.is_none() || mx.is_none() {
                                t.data[(ch * t.h + y) * t.w + x] = p.value;
                            }
                        }
                    }
                }
            }
            t
        }
        Op::DepthToSpace { block, crd } => {
            let x = &ins[0];
            let b = *block;
            let c = x.c / (b * b);
            let mut out = Tensor::zeros(c, ho, wo)?;
            let (oy0, ox0) = (ctx.range[0].0, ctx.range[1].0);
            for ch in 0..c {
                for y in 0..ho {
                    let ry = (oy0 + y) % b;
                    for xx in 0..wo {
                        let rx = (ox0 + xx) % b;
                        let src = if *crd {
                            ch * b * b + ry * b + rx
                        } else {
                            (ry * b + rx) * c + ch
                        };
                        out.data[(ch * ho + y) * wo + xx] = x.data[(src * x.h + y) * x.w + xx];
                    }
                }
            }
            out
        }
        Op::SpaceToDepth { block } => {
            let x = &ins[0];
            let b = *block;
            let mut out = Tensor::zeros(x.c * b * b, ho, wo)?;
            for ch in 0..x.c {
                for ry in 0..b {
                    for rx in 0..b {
                        let dst = (ry * b + rx) * x.c + ch;
                        for y in 0..ho {
                            for xx in 0..wo {
                                out.data[(dst * ho + y) * wo + xx] =
                                    x.data[(ch * x.h + y * b + ry) * x.w + xx * b + rx];
                            }
                        }
                    }
                }
            }
            out
        }
        Op::Norm(_) => {
            let (scale, shift) = ctx
                .norm
                .expect("a normalisation is computed with its statistics");
            affine(ins.swap_remove(0), scale, shift)
        }
        Op::Affine { scale, shift } => affine(ins.swap_remove(0), scale, shift),
        Op::Unary(u) => {
            let mut t = ins.swap_remove(0);
            unary(u, &mut t);
            t
        }
        Op::Binary { op, lhs, rhs } => binary(*op, lhs, rhs, ins)?,
        Op::Concat => {
            let c = ins.iter().map(|t| t.c).sum();
            let mut data = crate::buffers::scratch(c * ho * wo)?;
            let mut at = 0;
            for t in ins.iter() {
                data[at..at + t.data.len()].copy_from_slice(&t.data);
                at += t.data.len();
            }
            Tensor {
                c,
                h: ho,
                w: wo,
                data,
            }
        }
        Op::Identity => ins.swap_remove(0),
    })
}

/// Whether a node of `op` reading `inputs` values is element-wise on one input: then it can run in place on
/// its producer's tile ([`apply_pointwise`]) instead of as a superstep of its own.
pub fn fusable(op: &Op, inputs: usize) -> bool {
    inputs == 1
        && match op {
            Op::Unary(_) | Op::Affine { .. } | Op::Identity => true,
            Op::Binary { lhs, rhs, .. } => {
                matches!(
                    (lhs, rhs),
                    (Operand::Input(0), Operand::Const(_)) | (Operand::Const(_), Operand::Input(0))
                )
            }
            _ => false,
        }
}

/// A [`fusable`] op on its one input, in place: the same arithmetic as [`compute`].
pub fn apply_pointwise(op: &Op, t: Tensor) -> crate::error::Result<Tensor> {
    Ok(match op {
        Op::Unary(u) => {
            let mut t = t;
            unary(u, &mut t);
            t
        }
        Op::Affine { scale, shift } => affine(t, scale, shift),
        Op::Binary { op, lhs, rhs } => binary(*op, lhs, rhs, &mut vec![t])?,
        _ => t,
    })
}

fn affine(mut t: Tensor, scale: &[f32], shift: &[f32]) -> Tensor {
    let plane = t.h * t.w;
    for ch in 0..t.c {
        let (a, b) = (per_channel(scale, ch), per_channel(shift, ch));
        for v in &mut t.data[ch * plane..(ch + 1) * plane] {
            *v = *v * a + b;
        }
    }
    t
}

/// Applies `u` in place.
pub fn unary(u: &Unary, t: &mut Tensor) {
    /// One monomorphised loop per function (not a call through `dyn Fn` per element), so the simple
    /// ones vectorise.
    fn map(d: &mut [f32], f: impl Fn(f32) -> f32) {
        for v in d {
            *v = f(*v);
        }
    }
    let plane = t.h * t.w;
    let d = &mut t.data[..];
    match u {
        Unary::Relu => map(d, |v| v.max(0.0)),
        Unary::LeakyRelu(a) => map(d, |v| if v < 0.0 { v * a } else { v }),
        Unary::PRelu(slope) => {
            for (ch, p) in d.chunks_mut(plane.max(1)).enumerate() {
                let a = per_channel(slope, ch);
                map(p, |v| if v < 0.0 { v * a } else { v });
            }
        }
        Unary::Sigmoid => map(d, |v| 1.0 / (1.0 + (-v).exp())),
        Unary::Tanh => map(d, |v| v.tanh()),
        Unary::Clip(lo, hi) => map(d, |v| v.max(*lo).min(*hi)),
        Unary::Softplus => map(d, softplus),
        Unary::Mish => map(d, |v| v * softplus(v).tanh()),
        Unary::HardSigmoid(a, b) => map(d, |v| (a * v + b).clamp(0.0, 1.0)),
        Unary::HardSwish => map(d, |v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        Unary::Elu(a) => map(d, |v| if v < 0.0 { a * (v.exp() - 1.0) } else { v }),
        Unary::Erf => map(d, |v| libm::erf(v as f64) as f32),
        Unary::Gelu { tanh: false } => map(d, |v| {
            (0.5 * v as f64 * (1.0 + libm::erf(v as f64 / std::f64::consts::SQRT_2))) as f32
        }),
        Unary::Gelu { tanh: true } => map(d, |v| {
            let x = v as f64;
            (0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()))
                as f32
        }),
        Unary::Neg => map(d, |v| -v),
        Unary::Abs => map(d, |v| v.abs()),
        Unary::Exp => map(d, |v| v.exp()),
        Unary::Sqrt => map(d, |v| v.sqrt()),
    }
}

fn softplus(v: f32) -> f32 {
    // ln(1 + e^v) without overflow.
    if v > 20.0 { v } else { v.exp().ln_1p() }
}

fn binary(
    op: BinOp,
    lhs: &Operand,
    rhs: &Operand,
    ins: &mut Vec<Tensor>,
) -> crate::error::Result<Tensor> {
    let f = |a: f32, b: f32| match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
        BinOp::Pow => a.powf(b),
    };
    Ok(match (lhs, rhs) {
        (Operand::Input(a), Operand::Input(b)) => {
            let mut t = if a == b {
                ins[*a].clone()
            } else {
                std::mem::take(&mut ins[*a])
            };
            let (x, y) = (&t, &ins[*b]);
            if y.c == x.c {
                for (v, w) in t.data.iter_mut().zip(&y.data) {
                    *v = f(*v, *w);
                }
            } else {
                // One of them has a single channel, broadcast.
                let plane = x.h * x.w;
                let c = x.c.max(y.c);
                let mut out = Tensor::zeros(c, x.h, x.w)?;
                for ch in 0..c {
                    let xp = &x.data[(ch % x.c) * plane..][..plane];
                    let yp = &y.data[(ch % y.c) * plane..][..plane];
                    for i in 0..plane {
                        out.data[ch * plane + i] = f(xp[i], yp[i]);
                    }
                }
                t = out;
            }
            t
        }
        (Operand::Input(a), Operand::Const(k)) | (Operand::Const(k), Operand::Input(a)) => {
            let const_first = matches!(lhs, Operand::Const(_));
            let mut t = ins.swap_remove(*a);
            let plane = t.h * t.w;
            for ch in 0..t.c {
                let kv = per_channel(k, ch);
                for v in &mut t.data[ch * plane..(ch + 1) * plane] {
                    *v = if const_first { f(kv, *v) } else { f(*v, kv) };
                }
            }
            t
        }
        (Operand::Const(_), Operand::Const(_)) => unreachable!("folded at import"),
    })
}

/// Valid convolution of a window (padding already gathered) to `ho × wo` outputs ([`crate::gemm`]).
pub fn conv(
    x: &Tensor,
    c: &ConvOp,
    ho: usize,
    wo: usize,
    threads: usize,
) -> crate::error::Result<Tensor> {
    crate::gemm::conv_valid(
        crate::gemm::kernel(),
        x,
        c.cout,
        c.groups,
        &c.win,
        &c.weight,
        &c.bias,
        ho,
        wo,
        threads,
    )
}

/// Transposed convolution of outputs `ctx.range` from the window of contributing inputs: per band of
/// input rows, `cols = Wᵀ·x` (SGEMM), then each column scattered to the outputs it reaches.
fn conv_transpose(x: &Tensor, c: &ConvOp, ctx: &Ctx) -> crate::error::Result<Tensor> {
    let [(oy0, oy1), (ox0, ox1)] = ctx.range;
    let (ho, wo) = (oy1 - oy0, ox1 - ox0);
    let mut out = Tensor::zeros(c.cout, ho, wo)?;
    for co in 0..c.cout {
        out.data[co * ho * wo..(co + 1) * ho * wo].fill(c.bias[co]);
    }
    if x.h == 0 || x.w == 0 {
        return Ok(out);
    }
    let cg = c.cin / c.groups;
    let og = c.cout / c.groups;
    let (kh, kw) = (c.win[0].k, c.win[1].k);
    let m = og * kh * kw;
    // Global index of the window's first row/column, and the begin padding.
    let nin = ctx.n_in[0];
    let (ly, _) = convt_range(c, 0, nin[0], oy0, oy1);
    let (lx, _) = convt_range(c, 1, nin[1], ox0, ox1);
    let by = convt_pad_begin(c, 0, nin[0]) as isize;
    let bx = convt_pad_begin(c, 1, nin[1]) as isize;
    let rows = ((8usize << 20) / (m * x.w * 4).max(1)).clamp(1, x.h);
    let mut cols = crate::buffers::scratch(m * rows * x.w)?;
    let kernel = crate::gemm::kernel();
    let pixels = crate::gemm::Rows::new(
        x,
        cg,
        &[Win {
            k: 1,
            stride: 1,
            dilation: 1,
        }; 2],
    )?;
    for g in 0..c.groups {
        // cols[(co, ky, kx), pix] = Σ_ci W[ci, co, ky, kx] · x[ci, pix]
        let a = crate::gemm::PackedA::new(&c.weight[g * cg * m..], m, cg, 1, m);
        let mut r0 = 0;
        while r0 < x.h {
            let r1 = (r0 + rows).min(x.h);
            let n = (r1 - r0) * x.w;
            // SAFETY: `cols` holds m rows of n values.
            unsafe {
                pixels.product(
                    &a,
                    g * cg,
                    r0,
                    r1,
                    x.w,
                    cols.as_mut_ptr(),
                    n,
                    crate::gemm::Init::Zero,
                    kernel,
                );
            }
            for co in 0..og {
                let oplane = &mut out.data[(g * og + co) * ho * wo..][..ho * wo];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = &cols[((co * kh + ky) * kw + kx) * n..][..n];
                        for iy in r0..r1 {
                            let gy = ly + iy as isize;
                            let oy = gy * c.win[0].stride as isize - by
                                + (ky * c.win[0].dilation) as isize
                                - oy0 as isize;
                            if oy < 0 || oy >= ho as isize {
                                continue;
                            }
                            let src = &row[(iy - r0) * x.w..(iy - r0 + 1) * x.w];
                            let dst = &mut oplane[oy as usize * wo..(oy as usize + 1) * wo];
                            for (ix, &v) in src.iter().enumerate() {
                                let ox = (lx + ix as isize) * c.win[1].stride as isize - bx
                                    + (kx * c.win[1].dilation) as isize
                                    - ox0 as isize;
                                if ox >= 0 && ox < wo as isize {
                                    dst[ox as usize] += v;
                                }
                            }
                        }
                    }
                }
            }
            r0 = r1;
        }
    }
    crate::buffers::give(cols);
    Ok(out)
}

/// A pooling window's per-axis tables for outputs `ctx.range`: whether each window row / column lies
/// inside the input (padding is skipped), and each output's divisor count along the axis (an average
/// divides by the product; `count_include_pad` counts the declared padding, not the extension
/// `ceil_mode` adds). The CPU and the device kernels use the same tables.
pub struct PoolTables {
    pub inside: [Vec<bool>; 2],
    pub count: [Vec<usize>; 2],
}

pub fn pool_tables(p: &PoolOp, ctx: &Ctx) -> PoolTables {
    let nin = ctx.n_in[0];
    let count = |axis: usize| -> Vec<usize> {
        let w = &p.win[axis];
        let n = nin[axis];
        let (b, e) = p.pad[axis].resolve(n, w);
        let (o0, o1) = ctx.range[axis];
        (o0..o1)
            .map(|o| {
                (0..w.k)
                    .filter(|&k| {
                        let u = (o * w.stride + k * w.dilation) as isize - b as isize;
                        if p.count_include_pad {
                            u >= -(b as isize) && u < (n + e) as isize
                        } else {
                            u >= 0 && u < n as isize
                        }
                    })
                    .count()
            })
            .collect()
    };
    let inside = |axis: usize| ctx.maps[0][axis].iter().map(Option::is_some).collect();
    PoolTables {
        inside: [inside(0), inside(1)],
        count: [count(0), count(1)],
    }
}

fn pool(x: &Tensor, p: &PoolOp, ctx: &Ctx) -> crate::error::Result<Tensor> {
    let [(oy0, oy1), (ox0, ox1)] = ctx.range;
    let (ho, wo) = (oy1 - oy0, ox1 - ox0);
    let tb = pool_tables(p, ctx);
    let [ys, xs] = &tb.inside;
    let ([sy, sx], [dy, dx]) = (
        [p.win[0].stride, p.win[1].stride],
        [p.win[0].dilation, p.win[1].dilation],
    );
    // For each kernel column, the runs of outputs whose window column lies inside the input, so that
    // the loops below run over whole output rows without a test per value.
    let runs: Vec<Vec<(usize, usize)>> = (0..p.win[1].k)
        .map(|kx| {
            let mut r: Vec<(usize, usize)> = Vec::new();
            for xx in (0..wo).filter(|&xx| xs[xx * sx + kx * dx]) {
                match r.last_mut() {
                    Some((_, hi)) if *hi == xx => *hi += 1,
                    _ => r.push((xx, xx + 1)),
                }
            }
            r
        })
        .collect();
    let init = if p.max { f32::NEG_INFINITY } else { 0.0 };
    // With a column stride, the window's rows split into phases: each kernel column's values for a run
    // of outputs are then consecutive (column `xx·sx + kx·dx` is phase `(kx·dx) mod sx`, at
    // `xx + (kx·dx) div sx`), and the loops below vectorise.
    let phased = (sx > 1)
        .then(|| crate::gemm::pack::phases(x, sx))
        .transpose()?;
    let starts = crate::gemm::pack::phase_starts(x.w, sx);
    let src_of = |kx: usize| {
        let col = kx * dx;
        starts[col % sx] + col / sx
    };
    let xd = phased.as_ref().map_or(&x.data, |t| &t.data);
    // Every element is written: each output row starts at `init`.
    let mut out = Tensor::scratch(x.c, ho, wo)?;
    for ch in 0..x.c {
        let plane = &xd[ch * x.h * x.w..(ch + 1) * x.h * x.w];
        for y in 0..ho {
            let acc = &mut out.data[(ch * ho + y) * wo..][..wo];
            acc.fill(init);
            // Each output takes its window's values in the same order (rows, then columns) in any tile.
            for ky in 0..p.win[0].k {
                let wy = y * sy + ky * dy;
                if !ys[wy] {
                    continue;
                }
                let row = &plane[wy * x.w..(wy + 1) * x.w];
                for (kx, kruns) in runs.iter().enumerate() {
                    let at = src_of(kx);
                    for &(lo, hi) in kruns {
                        let src = row[at + lo..at + hi].iter();
                        let dst = acc[lo..hi].iter_mut();
                        if p.max {
                            dst.zip(src).for_each(|(a, &v)| *a = a.max(v));
                        } else {
                            dst.zip(src).for_each(|(a, &v)| *a += v);
                        }
                    }
                }
            }
            if !p.max {
                let cy = tb.count[0][y];
                for (a, &cx) in acc.iter_mut().zip(&tb.count[1]) {
                    *a /= (cy * cx).max(1) as f32;
                }
            }
        }
    }
    if let Some(t) = phased {
        crate::buffers::give(t.data);
    }
    Ok(out)
}

/// Linear resize's per-axis taps for outputs `ctx.range`, relative to the gathered window: `(first,
/// second, weight of the second)` per output row (axis 0) and column (axis 1). The CPU and the device
/// kernel blend with the same tables.
pub fn linear_tables(r: &ResizeOp, ctx: &Ctx) -> [Vec<(usize, usize, f32)>; 2] {
    let nin = ctx.n_in[0];
    let axis = |a: usize| {
        let w0 = ctx.maps[0][a][0].unwrap_or(0);
        let n_out = ctx_out(r, a, nin[a]);
        let (o0, o1) = ctx.range[a];
        (o0..o1)
            .map(|o| {
                let (p, q, f) = r.taps(a, o, nin[a], n_out);
                (p - w0, q - w0, f)
            })
            .collect()
    };
    [axis(0), axis(1)]
}

/// ConvTranspose: per axis, `offset` such that window input `i` with kernel tap `k` reaches the local
/// output `i·stride + k·dilation − offset` (the output range's start + the begin padding − the window's
/// first input index · stride).
pub fn convt_offsets(c: &ConvOp, ctx: &Ctx) -> [isize; 2] {
    let nin = ctx.n_in[0];
    let axis = |a: usize| {
        let (o0, o1) = ctx.range[a];
        let (lo, _) = convt_range(c, a, nin[a], o0, o1);
        o0 as isize + convt_pad_begin(c, a, nin[a]) as isize - lo * c.win[a].stride as isize
    };
    [axis(0), axis(1)]
}

fn resize_linear(x: &Tensor, r: &ResizeOp, ctx: &Ctx) -> crate::error::Result<Tensor> {
    let [ty, tx] = linear_tables(r, ctx);
    let (ho, wo) = (ty.len(), tx.len());
    let mut out = Tensor::zeros(x.c, ho, wo)?;
    for ch in 0..x.c {
        let plane = &x.data[ch * x.h * x.w..(ch + 1) * x.h * x.w];
        for (y, &(a, b, fy)) in ty.iter().enumerate() {
            let (ra, rb) = (&plane[a * x.w..][..x.w], &plane[b * x.w..][..x.w]);
            for (xx, &(c, d, fx)) in tx.iter().enumerate() {
                let top = ra[c] * (1.0 - fx) + ra[d] * fx;
                let bot = rb[c] * (1.0 - fx) + rb[d] * fx;
                out.data[(ch * ho + y) * wo + xx] = top * (1.0 - fy) + bot * fy;
            }
        }
    }
    Ok(out)
}

fn ctx_out(r: &ResizeOp, axis: usize, n: usize) -> usize {
    (n as f64 * r.scale[axis]).floor() as usize
}
