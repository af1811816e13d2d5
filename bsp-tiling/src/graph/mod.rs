//! General CNN graphs (a DAG of [`ops::Op`]s: skip connections, several resolutions) and their exact tiled
//! execution.
//!
//! Every node is a BSP superstep: each tile computes its part of the node's output from windows of its
//! inputs gathered by *global* coordinates (its own pixels plus the halo the op's geometry asks for, read
//! from whichever tiles store them — the paper's dictionary padding — or through the op's padding outside
//! the image). A normalisation with whole-image statistics (InstanceNorm, GroupNorm, LayerNorm over the
//! channels and the image) first merges its input's per-channel `(count, mean, M2)`, which every tile
//! reported when it produced that input (Chan/Welford in f64), then applies them tile by tile. A whole-image
//! pass is the same engine with one tile; naive runs each tile as an image of its own; sampled and
//! recompute evaluate each output tile in one pass through its receptive field with fixed statistics.
//!
//! Values are numbered `0` (the input image) and `i + 1` (the output of node `i`); nodes are in
//! topological order.

pub mod exec;
pub mod launch;
#[allow(unsafe_code)]
pub mod ops;

use crate::Mode;
use crate::backend::CpuBackend;
use crate::bsp::{RunInfo, inner_threads, superstep};
use crate::error::{Error, Result};
use crate::field::{Field, Input, OutputSink, Region, Sink, gather, span};
use crate::grid::Grid;
use crate::model::{Net, NetStats};
use crate::padding::PaddingMode;
use crate::stats::{ChannelStats, merge_all};
use crate::store::{Budget, Layer};
use crate::tensor::Tensor;
pub use exec::GraphOps;
use ops::{
    AxisPad, BinOp, ConvOp, Ctx, NormKind, NormOp, Op, Operand, PadOp, ResizeOp, Unary, Win,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// One operation of a [`Graph`].
#[derive(Clone, Debug)]
pub struct Node {
    /// The node's name in the model (ONNX `NodeProto.name`, or its first output's name when empty).
    pub name: String,
    /// The ONNX operator type it came from (`Conv`, `GroupNormalization`, ...).
    pub op_type: String,
    pub op: Op,
    /// Value ids read (0 = the image, `i + 1` = node `i`'s output).
    pub inputs: Vec<usize>,
    /// Output channels.
    pub channels: usize,
}

/// A CNN as a DAG of nodes in topological order, one image input (`channels` × H × W, any H and W) and
/// one output.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub channels: usize,
    pub nodes: Vec<Node>,
    /// The value the graph returns.
    pub output: usize,
}

/// Shapes of every value for one input size.
#[derive(Clone, Debug)]
pub struct GraphPlan {
    /// Per value: `(c, h, w)`.
    pub shape: Vec<(usize, usize, usize)>,
    /// Per value: resolution relative to the input, `(num, den)` reduced.
    pub scale: Vec<(usize, usize)>,
    /// Tile borders at the input resolution fall on multiples of this (every value's `den` divides it).
    pub align: usize,
    /// Per value: the last node that reads it (`usize::MAX` for the output, read by the sink).
    pub last_use: Vec<usize>,
    /// Per value: whether a normalisation reads it (its producer reports statistics).
    pub feeds_norm: Vec<bool>,
}

/// How far one node's window reaches past its own pixels, in pixels of its (first) input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeHalo {
    pub name: String,
    pub op_type: String,
    /// Rows before / after, columns before / after.
    pub rows: (usize, usize),
    pub cols: (usize, usize),
    /// The output's resolution relative to the image.
    pub scale: (usize, usize),
    /// Whether the node waits for whole-image statistics (a statistics superstep).
    pub global_stats: bool,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn node_err(n: &Node, reason: impl Into<String>) -> Error {
    Error::Node {
        node: n.name.clone(),
        op: n.op_type.clone(),
        reason: reason.into(),
    }
}

impl Graph {
    /// Checks the graph against an input size and derives every value's shape and resolution.
    pub fn plan(&self, h: usize, w: usize) -> Result<GraphPlan> {
        if h == 0 || w == 0 {
            return Err(Error::EmptyImage {
                width: w,
                height: h,
            });
        }
        let nv = self.nodes.len() + 1;
        let mut p = GraphPlan {
            shape: vec![(self.channels, h, w)],
            scale: vec![(1, 1)],
            align: 1,
            last_use: vec![0; nv],
            feeds_norm: vec![false; nv],
        };
        for (i, n) in self.nodes.iter().enumerate() {
            for &u in &n.inputs {
                if u > i {
                    return Err(node_err(
                        n,
                        "reads a value computed after it (the graph is not in topological order)",
                    ));
                }
                p.last_use[u] = p.last_use[u].max(i);
            }
            let ins: Vec<(usize, usize, usize)> = n.inputs.iter().map(|&u| p.shape[u]).collect();
            let mut dims = [0; 2];
            for (axis, d) in dims.iter_mut().enumerate() {
                let n_in: Vec<usize> = ins
                    .iter()
                    .map(|s| if axis == 0 { s.1 } else { s.2 })
                    .collect();
                *d =
                    n.op.out_len(axis, &n_in)
                        .map_err(|r| Error::ImageTooSmallFor {
                            width: w,
                            height: h,
                            node: n.name.clone(),
                            reason: r,
                        })?;
            }
            let scale = n.inputs.first().map_or((1, 1), |&u| p.scale[u]);
            for &u in &n.inputs[1.min(n.inputs.len())..] {
                if p.scale[u] != scale {
                    return Err(node_err(
                        n,
                        format!(
                            "combines values at resolutions {}/{} and {}/{} of the image",
                            scale.0, scale.1, p.scale[u].0, p.scale[u].1
                        ),
                    ));
                }
            }
            let (a, b) = n.op.scale();
            let (num, den) = (scale.0 * a, scale.1 * b);
            let g = gcd(num, den);
            let s = (num / g, den / g);
            p.align = p.align / gcd(p.align, s.1) * s.1;
            if matches!(n.op, Op::Norm(_)) {
                p.feeds_norm[n.inputs[0]] = true;
            }
            p.shape.push((n.channels, dims[0], dims[1]));
            p.scale.push(s);
        }
        p.last_use[self.output] = usize::MAX;
        Ok(p)
    }

    /// The tiles of value `v` for the image grid `grid` (borders scaled by the value's resolution, the last
    /// one its own side).
    pub fn value_grid(&self, plan: &GraphPlan, grid: &Grid, v: usize) -> Result<Grid> {
        let (num, den) = plan.scale[v];
        let (_, h, w) = plan.shape[v];
        let scale = |b: &[usize], n: usize| -> Result<Vec<usize>> {
            let mut out: Vec<usize> = b.iter().map(|&x| x * num / den).collect();
            *out.last_mut().expect("nonempty") = n;
            if out.windows(2).any(|p| p[0] >= p[1]) {
                let name = if v == 0 {
                    "the input".to_string()
                } else {
                    self.nodes[v - 1].name.clone()
                };
                return Err(Error::Grid(format!(
                    "tiles this small leave an empty tile at {name}'s resolution ({num}/{den} of the image); use larger tiles"
                )));
            }
            Ok(out)
        };
        Ok(Grid {
            rows: scale(&grid.rows, h)?,
            cols: scale(&grid.cols, w)?,
        })
    }

    /// The grid of `tile`-sided tiles for an `h × w` image, borders on multiples of the graph's alignment; a
    /// remainder smaller than the alignment joins its neighbour.
    pub fn grid(&self, h: usize, w: usize, tile: usize) -> Result<Grid> {
        let plan = self.plan(h, w)?;
        if tile == 0 || !tile.is_multiple_of(plan.align) {
            return Err(Error::Grid(format!(
                "tile size {tile} is not a positive multiple of {}, the product of the graph's strides (every resolution must cut at whole pixels)",
                plan.align
            )));
        }
        Grid::with_tile(h, w, tile, plan.align, plan.align)
    }

    /// Per node: the halo its superstep gathers (how far its window reaches past its own pixels, in input
    /// pixels of that node) and its resolution — what the graph's geometry asks of the tiler.
    pub fn halos(&self) -> Result<Vec<NodeHalo>> {
        // A large virtual image, so that the middle tile is far from every border.
        let side = 1 << 16;
        let plan = self.plan(side, side)?;
        let mut out = vec![];
        for (i, n) in self.nodes.iter().enumerate() {
            let v = i + 1;
            let u = n.inputs[0];
            let (num_o, den_o) = plan.scale[v];
            let (num_i, den_i) = plan.scale[u];
            // Output range of 8 "units" in the middle, and the input range it owns.
            let unit = plan.align;
            let b0 = side / 2 / unit * unit;
            let b1 = b0 + 8 * unit;
            let (o0, o1) = (b0 * num_o / den_o, b1 * num_o / den_o);
            let (i0, i1) = (b0 * num_i / den_i, b1 * num_i / den_i);
            let reach = |axis: usize| {
                let n_in: Vec<usize> = n
                    .inputs
                    .iter()
                    .map(|&u| {
                        if axis == 0 {
                            plan.shape[u].1
                        } else {
                            plan.shape[u].2
                        }
                    })
                    .collect();
                let n_out = if axis == 0 {
                    plan.shape[v].1
                } else {
                    plan.shape[v].2
                };
                let m = n.op.in_map(axis, 0, &n_in, n_out, o0, o1);
                let lo = m.iter().flatten().min().copied().unwrap_or(i0);
                let hi = m.iter().flatten().max().map_or(i1, |x| x + 1);
                (i0.saturating_sub(lo), hi.saturating_sub(i1))
            };
            out.push(NodeHalo {
                name: n.name.clone(),
                op_type: n.op_type.clone(),
                rows: reach(0),
                cols: reach(1),
                scale: plan.scale[v],
                global_stats: matches!(n.op, Op::Norm(_)),
            });
        }
        Ok(out)
    }

    /// Parameters (weights, biases, normalisation affine) of the graph.
    pub fn parameters(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match &n.op {
                Op::Conv(c) | Op::ConvTranspose(c) => c.weight.len() + c.bias.len(),
                Op::Norm(m) => m.gamma.len() + m.beta.len(),
                Op::Affine { scale, shift } => scale.len() + shift.len(),
                _ => 0,
            })
            .sum()
    }

    /// Johnson et al.'s TransformerNet ([`Net`]) as a graph: Resize (nearest ×2), Pad (the net's padding),
    /// Conv, InstanceNormalization, Relu and the residual Add, one node each — the same arithmetic.
    pub fn from_net(net: &Net) -> Graph {
        let mut g = Graph {
            name: "TransformerNet".into(),
            channels: net.channels,
            nodes: vec![],
            output: 0,
        };
        let push = |g: &mut Graph,
                    name: String,
                    op_type: &str,
                    op: Op,
                    inputs: Vec<usize>,
                    channels: usize| {
            g.nodes.push(Node {
                name,
                op_type: op_type.into(),
                op,
                inputs,
                channels,
            });
            g.nodes.len()
        };
        let mut stage_out = vec![];
        let mut cur = 0;
        let mut ch = net.channels;
        for s in &net.stages {
            if s.upsample {
                cur = push(
                    &mut g,
                    format!("{}.upsample", s.name),
                    "Resize",
                    Op::Resize(ResizeOp {
                        linear: false,
                        scale: [2.0, 2.0],
                        coord: ops::Coord::Asymmetric,
                        nearest: ops::Nearest::Floor,
                    }),
                    vec![cur],
                    ch,
                );
            }
            if s.pad > 0 {
                let mode = match net.padding {
                    PaddingMode::Zero => None,
                    m => Some(m),
                };
                cur = push(
                    &mut g,
                    format!("{}.pad", s.name),
                    "Pad",
                    Op::Pad(PadOp {
                        pads: [(s.pad, s.pad); 2],
                        mode,
                        value: 0.0,
                    }),
                    vec![cur],
                    ch,
                );
            }
            let w = Win {
                k: s.conv.k,
                stride: s.conv.stride,
                dilation: 1,
            };
            cur = push(
                &mut g,
                s.name.clone(),
                "Conv",
                Op::Conv(ConvOp {
                    cin: s.conv.cin,
                    cout: s.conv.cout,
                    groups: 1,
                    win: [w; 2],
                    pad: [AxisPad::Explicit(0, 0); 2],
                    output_padding: [0; 2],
                    weight: s.conv.weight.clone(),
                    bias: s.conv.bias.clone(),
                }),
                vec![cur],
                s.conv.cout,
            );
            ch = s.conv.cout;
            if let Some(nm) = &s.norm {
                cur = push(
                    &mut g,
                    format!("{}.norm", s.name),
                    "InstanceNormalization",
                    Op::Norm(NormOp {
                        kind: NormKind::Instance,
                        gamma: nm.gamma.clone(),
                        beta: nm.beta.clone(),
                        eps: nm.eps,
                    }),
                    vec![cur],
                    ch,
                );
            }
            if s.relu {
                cur = push(
                    &mut g,
                    format!("{}.relu", s.name),
                    "Relu",
                    Op::Unary(Unary::Relu),
                    vec![cur],
                    ch,
                );
            }
            if let Some(r) = s.residual {
                cur = push(
                    &mut g,
                    format!("{}.add", s.name),
                    "Add",
                    Op::Binary {
                        op: BinOp::Add,
                        lhs: Operand::Input(0),
                        rhs: Operand::Input(1),
                    },
                    vec![cur, stage_out[r]],
                    ch,
                );
            }
            stage_out.push(cur);
        }
        g.output = cur;
        g
    }
}

/// A value's storage during a run: the image, a tiled layer (RAM or spill), or a region of one
/// (one-pass evaluation).
enum Val<'a> {
    Input(&'a dyn Input),
    Layer(Layer),
}

impl Val<'_> {
    fn field(&self) -> &dyn Field {
        match self {
            Val::Input(i) => *i as &dyn Field,
            Val::Layer(l) => l,
        }
    }
}

fn spill_err(budget: &Budget) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Spill {
        dir: budget.spill_dir.clone(),
        source,
    }
}

fn tensor_stats(t: &Tensor) -> Vec<ChannelStats> {
    (0..t.c).map(|c| ChannelStats::of(t.plane(c))).collect()
}

/// The window of an input value that is not stored but computed where it is read (see [`inline_units`]):
/// `Some` for such a value, given its rows and columns.
type Inlined<'a> = dyn Fn(usize, &[Option<usize>], &[Option<usize>]) -> Option<Result<Tensor>> + 'a;

/// Gathers node `n`'s input windows for output rows `ry` × columns `rx` from `field(u)` (or computes them,
/// for the values `inlined` gives) and computes.
#[allow(clippy::too_many_arguments)]
fn eval_node<'f, B: GraphOps>(
    be: &Run<'_, B>,
    i: usize,
    n: &Node,
    plan: &GraphPlan,
    v: usize,
    ry: (usize, usize),
    rx: (usize, usize),
    field: &dyn Fn(usize) -> &'f dyn Field,
    through: &[Through],
    moves: &[bool],
    norm: Option<&(Vec<f32>, Vec<f32>)>,
    threads: usize,
    inlined: &Inlined,
) -> Result<Tensor> {
    let n_in: Vec<[usize; 2]> = n
        .inputs
        .iter()
        .map(|&u| [plan.shape[u].1, plan.shape[u].2])
        .collect();
    let nh: Vec<usize> = n_in.iter().map(|d| d[0]).collect();
    let nw: Vec<usize> = n_in.iter().map(|d| d[1]).collect();
    let (_, oh, ow) = plan.shape[v];
    let mut maps = vec![];
    let mut wins = vec![];
    for (j, &u) in n.inputs.iter().enumerate() {
        let ys = n.op.in_map(0, j, &nh, oh, ry.0, ry.1);
        let xs = n.op.in_map(1, j, &nw, ow, rx.0, rx.1);
        if let Some(win) = inlined(u, &ys, &xs) {
            wins.push(be.backend.load(win?)?);
            maps.push([ys, xs]);
            continue;
        }
        let win = match through.get(u).and_then(Option::as_ref) {
            Some((src, [my, mx])) => {
                let via = |idx: &[Option<usize>], m: &[Option<usize>]| -> Vec<Option<usize>> {
                    idx.iter().map(|o| o.and_then(|i| m[i])).collect()
                };
                gather(field(*src), &via(&ys, my), &via(&xs, mx))?
            }
            None => match moves
                .get(u)
                .copied()
                .unwrap_or(false)
                .then(|| field(u).take(&ys, &xs))
            {
                Some(Some(data)) => Tensor {
                    c: field(u).channels(),
                    h: ys.len(),
                    w: xs.len(),
                    data,
                },
                _ => gather(field(u), &ys, &xs)?,
            },
        };
        wins.push(be.backend.load(win)?);
        maps.push([ys, xs]);
    }
    let ctx = Ctx {
        range: [ry, rx],
        n_in: &n_in,
        maps: &maps,
        norm,
        threads,
    };
    let out = be.backend.compute(be.prep, i, n, wins, &ctx)?;
    be.backend.store(out)
}

/// A backend and what it prepared for this run.
pub struct Run<'a, B: GraphOps> {
    pub backend: &'a B,
    pub prep: &'a B::Prepared,
}

/// Per node: the statistics a normalisation applied (`None` elsewhere) — [`NetStats`]'s shape.
pub type GraphStats = NetStats;

/// Checks the input against the graph and the grid against the input.
fn prepare(g: &Graph, input: &dyn Input, grid: &Grid) -> Result<GraphPlan> {
    if input.channels() != g.channels {
        return Err(Error::Channels {
            expected: g.channels,
            found: input.channels(),
        });
    }
    let plan = g.plan(input.height(), input.width())?;
    if grid.rows.last() != Some(&input.height()) || grid.cols.last() != Some(&input.width()) {
        return Err(Error::Grid(format!(
            "grid does not cover the {}x{} image",
            input.width(),
            input.height()
        )));
    }
    let inner = grid.rows[1..grid.rows.len() - 1]
        .iter()
        .chain(&grid.cols[1..grid.cols.len() - 1]);
    if inner.clone().any(|b| b % plan.align != 0) {
        return Err(Error::Grid(format!(
            "tile borders must fall on multiples of {}",
            plan.align
        )));
    }
    Ok(plan)
}

/// Host bytes of the stored values alive at once at their peak (values computed where they are read,
/// `inline_of`, are not stored).
fn peak_bytes(
    g: &Graph,
    plan: &GraphPlan,
    grids: &[Grid],
    last_use: &[usize],
    inline_of: &[Option<usize>],
) -> u64 {
    (0..g.nodes.len())
        .map(|i| {
            (1..=i + 1)
                .filter(|&v| v != g.output && inline_of[v].is_none())
                .filter(|&v| v == i + 1 || last_use[v] >= i)
                .map(|v| Layer::bytes(plan.shape[v].0, &grids[v]))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Per node: the chain of element-wise nodes that follow it and are computed on its tiles in place
/// (pointwise fusion: their inputs are never stored), and whether the node is itself part of such a chain.
/// A node joins its predecessor's chain when it is the next node, it reads only the chain's last value,
/// nothing else reads that value, and no normalisation needs that value's statistics.
fn fusion(g: &Graph, plan: &GraphPlan) -> (Vec<Vec<usize>>, Vec<bool>) {
    let mut readers = vec![0usize; g.nodes.len() + 1];
    for n in &g.nodes {
        for &u in &n.inputs {
            readers[u] += 1;
        }
    }
    let mut chains = vec![vec![]; g.nodes.len()];
    let mut fused = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        if fused[i] {
            continue;
        }
        let mut last = i;
        while let Some(next) = g.nodes.get(last + 1) {
            let v = last + 1;
            let ok = ops::fusable(&next.op, next.inputs.len())
                && next.inputs[0] == v
                && readers[v] == 1
                && v != g.output
                && !plan.feeds_norm[v];
            if !ok {
                break;
            }
            last += 1;
            chains[i].push(last);
            fused[last] = true;
        }
    }
    (chains, fused)
}

/// A value read through: where its node's index maps lead, over the whole value (rows, columns).
type Through = Option<(usize, [Vec<Option<usize>>; 2])>;

/// Per value: whether it is read through rather than computed (pad fusion). A Pad that only copies or
/// mirrors values (reflect, edge, wrap, or zeros) and whose output one Conv alone reads is not computed
/// and stored: that Conv gathers its window from the Pad's input through the Pad's index maps (a zero
/// pad's `None` is the zero the Conv's own padding reads). The window is the same, without a stored
/// copy of the padded value and a second gather.
fn pad_through(g: &Graph, plan: &GraphPlan, chains: &[Vec<usize>], fused: &[bool]) -> Vec<Through> {
    let mut readers: Vec<Vec<usize>> = vec![vec![]; plan.shape.len()];
    for (r, n) in g.nodes.iter().enumerate() {
        for &u in &n.inputs {
            readers[u].push(r);
        }
    }
    let mut through: Vec<Through> = vec![None; plan.shape.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        let v = i + 1;
        let Op::Pad(p) = &n.op else { continue };
        let copies = p.mode.is_some() || p.value == 0.0;
        let one_conv = matches!(readers[v][..], [r] if matches!(g.nodes[r].op, Op::Conv(_)));
        if !copies
            || !one_conv
            || v == g.output
            || plan.feeds_norm[v]
            || fused[i]
            || !chains[i].is_empty()
        {
            continue;
        }
        let u = n.inputs[0];
        let (_, ih, iw) = plan.shape[u];
        let (_, oh, ow) = plan.shape[v];
        through[v] = Some((
            u,
            [
                n.op.in_map(0, 0, &[ih], oh, 0, oh),
                n.op.in_map(1, 0, &[iw], ow, 0, ow),
            ],
        ));
    }
    through
}

/// Per value: whether its one reader takes its stored tiles instead of copying them. That reader is
/// the value's only one, reads it once, and reads each tile's own pixels alone (an element-wise node,
/// a normalisation, a concatenation), so no other tile's window needs them.
fn moved_values(g: &Graph, through: &[Through]) -> Vec<bool> {
    let mut readers: Vec<Vec<usize>> = vec![vec![]; through.len()];
    for (r, n) in g.nodes.iter().enumerate() {
        for &u in &n.inputs {
            readers[u].push(r);
        }
    }
    (0..through.len())
        .map(|u| {
            u != 0
                && u != g.output
                && through[u].is_none()
                && matches!(readers[u][..], [r] if g.nodes[r].op.is_pointwise()
                    || matches!(g.nodes[r].op, Op::Norm(_)))
        })
        .collect()
}

/// The value unit `i` stores: its node's, or its element-wise chain's last.
fn stored_value(chains: &[Vec<usize>], i: usize) -> usize {
    chains[i].last().map_or(i, |&j| j) + 1
}

/// Computed regions of an inlined unit cost at most this many times its value's area: the halo a
/// reader's windows add (a 3×3 convolution's reader adds a pixel each side of its tiles).
const INLINE_RATIO: f64 = 1.1;

/// Per node: for the head of a superstep unit (a node with its element-wise chain) whose value is not
/// stored but computed inside its one reader's superstep, over that reader's windows (halo included),
/// that reader.
///
/// A stored value costs its memory (faulted in fresh when the pool has none) and a copy into each
/// reader's window; an inlined one costs recomputing the halo that neighbouring windows share. So a
/// unit is inlined when one node reads its value, once, no normalisation needs that value's statistics
/// (they need every tile first), it is not the output, and the regions computed for it — its reader's
/// windows over the reader's tiles, or over the reader's own computed regions when the reader is inlined
/// too — cover at most [`INLINE_RATIO`] times its area. The result is the same bits: every output
/// pixel sees the same operations in any window.
fn inline_units(
    g: &Graph,
    plan: &GraphPlan,
    grids: &[Grid],
    chains: &[Vec<usize>],
    fused: &[bool],
    through: &[Through],
) -> Vec<Option<usize>> {
    let n = g.nodes.len();
    let mut readers: Vec<Vec<usize>> = vec![vec![]; n + 1];
    for (r, node) in g.nodes.iter().enumerate() {
        for &u in &node.inputs {
            readers[u].push(r);
        }
    }
    let unit = |i: usize| !fused[i] && through[i + 1].is_none();
    let stored = |i: usize| stored_value(chains, i);
    // Per inlined unit: the regions it is computed over, in its output's coordinates.
    let mut regions: Vec<Option<Vec<Range2>>> = vec![None; n];
    let mut reader = vec![None; n];
    for i in (0..n).rev() {
        if !unit(i) {
            continue;
        }
        let v = stored(i);
        let [r] = readers[v][..] else { continue };
        if v == g.output || plan.feeds_norm[v] || !unit(r) {
            continue;
        }
        // The reader must not read the value through a Pad (a Pad read through is itself a reader).
        if g.nodes[r].inputs.iter().filter(|&&u| u == v).count() != 1 {
            continue;
        }
        let j = g.nodes[r]
            .inputs
            .iter()
            .position(|&u| u == v)
            .expect("r reads v");
        let at: Vec<Range2> = match &regions[r] {
            Some(rs) => rs.clone(),
            None => {
                let gr = &grids[stored(r)];
                (0..gr.len())
                    .map(|t| {
                        let (y0, y1, x0, x1) = gr.tile(t);
                        ((y0, y1), (x0, x1))
                    })
                    .collect()
            }
        };
        let node = &g.nodes[r];
        let nh: Vec<usize> = node.inputs.iter().map(|&u| plan.shape[u].1).collect();
        let nw: Vec<usize> = node.inputs.iter().map(|&u| plan.shape[u].2).collect();
        let (_, oh, ow) = plan.shape[r + 1];
        let mine: Vec<Range2> = at
            .iter()
            .filter_map(|&(ry, rx)| {
                let ys = node.op.in_map(0, j, &nh, oh, ry.0, ry.1);
                let xs = node.op.in_map(1, j, &nw, ow, rx.0, rx.1);
                Some((span(&ys)?, span(&xs)?))
            })
            .collect();
        let area: usize = mine
            .iter()
            .map(|((y0, y1), (x0, x1))| (y1 - y0) * (x1 - x0))
            .sum();
        let (_, h, w) = plan.shape[v];
        if area as f64 <= INLINE_RATIO * (h * w) as f64 {
            regions[i] = Some(mine);
            reader[i] = Some(r);
        }
    }
    reader
}

type FieldRef<'f> = &'f dyn Field;

/// What a superstep of [`exact_on`] evaluates units with: the stored values, and the units computed
/// where they are read.
struct Exact<'a, 'f, B: GraphOps> {
    be: &'a Run<'a, B>,
    g: &'a Graph,
    plan: &'a GraphPlan,
    field: &'a (dyn Fn(usize) -> FieldRef<'f> + Sync),
    through: &'a [Through],
    moves: &'a [bool],
    chains: &'a [Vec<usize>],
    /// Per value: the unit computing it where it is read, when it is inlined.
    inline_of: &'a [Option<usize>],
    norms: &'a [Option<(Vec<f32>, Vec<f32>)>],
    threads: usize,
}

impl<B: GraphOps> Exact<'_, '_, B> {
    /// Unit `i` (node `i` and its element-wise chain) over output rows `ry` × columns `rx`.
    fn unit(&self, i: usize, ry: (usize, usize), rx: (usize, usize)) -> Result<Tensor> {
        let g = self.g;
        let hook = |u: usize, ys: &[Option<usize>], xs: &[Option<usize>]| {
            let p = self.inline_of.get(u).copied().flatten()?;
            Some(self.window(p, u, ys, xs))
        };
        let mut out = eval_node(
            self.be,
            i,
            &g.nodes[i],
            self.plan,
            i + 1,
            ry,
            rx,
            self.field,
            self.through,
            self.moves,
            self.norms[i].as_ref(),
            self.threads,
            &hook,
        )?;
        for &j in &self.chains[i] {
            out = ops::apply_pointwise(&g.nodes[j].op, out);
        }
        Ok(out)
    }

    /// The window at `ys` × `xs` of value `u`, computed by unit `p` over the rows and columns it spans.
    fn window(
        &self,
        p: usize,
        u: usize,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<Tensor> {
        let c = self.plan.shape[u].0;
        let (Some(ry), Some(rx)) = (span(ys), span(xs)) else {
            return Ok(Tensor::zeros(c, ys.len(), xs.len()));
        };
        let t = self.unit(p, ry, rx)?;
        let plain = |m: &[Option<usize>], (lo, hi): (usize, usize)| {
            m.len() == hi - lo && m.iter().enumerate().all(|(k, &o)| o == Some(lo + k))
        };
        if plain(ys, ry) && plain(xs, rx) {
            return Ok(t);
        }
        let win = gather(
            &Region {
                t: &t,
                y0: ry.0,
                x0: rx.0,
            },
            ys,
            xs,
        );
        crate::buffers::give(t.data);
        win
    }
}

/// Exact BSP execution of `g` over `input`: a superstep per node on the tiles of `grid`, statistics merged
/// for every normalisation; writes `sink` (the output value's tiles as they are computed). With `fixed`,
/// normalisations apply those statistics instead of the image's own.
pub fn run_graph_exact(
    g: &Graph,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
    fixed: Option<&GraphStats>,
) -> Result<RunInfo> {
    let be = Run {
        backend: &CpuBackend,
        prep: &(),
    };
    exact_on(&be, g, input, grid, threads, budget, sink, fixed)
}

/// [`run_graph_exact`] with every node computed on `be`'s backend.
#[allow(clippy::too_many_arguments)]
pub fn exact_on<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
    fixed: Option<&GraphStats>,
) -> Result<RunInfo> {
    let plan = prepare(g, input, grid)?;
    let grids: Vec<Grid> = (0..plan.shape.len())
        .map(|v| g.value_grid(&plan, grid, v))
        .collect::<Result<_>>()?;
    // Element-wise chains run in place on their producer's tile, and small-halo units inside their
    // reader's superstep, where the backend computes on the host.
    let host = be.backend.fuses_pointwise();
    let (chains, fused) = if host {
        fusion(g, &plan)
    } else {
        (vec![Vec::new(); g.nodes.len()], vec![false; g.nodes.len()])
    };
    let through = pad_through(g, &plan, &chains, &fused);
    // Per unit head: the reader whose superstep computes it, when it is inlined.
    let inlined_into = if host {
        inline_units(g, &plan, &grids, &chains, &fused, &through)
    } else {
        vec![None; g.nodes.len()]
    };
    let inlined: Vec<bool> = inlined_into.iter().map(Option::is_some).collect();
    let stored_value = |i: usize| stored_value(&chains, i);
    let mut inline_of: Vec<Option<usize>> = vec![None; plan.shape.len()];
    for (i, _) in inlined.iter().enumerate().filter(|(_, b)| **b) {
        inline_of[stored_value(i)] = Some(i);
    }
    // The unit whose superstep computes each unit: itself, or its reader's host when inlined.
    let mut host_of: Vec<usize> = (0..g.nodes.len()).collect();
    for i in (0..g.nodes.len()).rev() {
        if let Some(r) = inlined_into[i] {
            host_of[i] = host_of[r];
        }
    }
    let mut moves = moved_values(g, &through);
    // A value read by an inlined unit may be read by several of its regions: copied, never taken. (The
    // nodes of its element-wise chain read only the chain's own value.)
    for (i, n) in g.nodes.iter().enumerate().filter(|(i, _)| inlined[*i]) {
        debug_assert!(chains[i].iter().all(|&k| g.nodes[k].inputs == [k]));
        for &u in &n.inputs {
            moves[u] = false;
        }
    }
    let mut last_use = plan.last_use.clone();
    for (v, t) in through.iter().enumerate() {
        if let Some((u, _)) = t {
            last_use[*u] = last_use[*u].max(plan.last_use[v]);
        }
    }
    // What an inlined unit reads stays alive until its host's superstep.
    for i in (0..g.nodes.len()).filter(|&i| inlined[i]) {
        let h = host_of[i];
        let host_last = stored_value(h) - 1;
        for k in std::iter::once(i).chain(chains[i].iter().copied()) {
            for &u in &g.nodes[k].inputs {
                last_use[u] = last_use[u].max(host_last);
                if let Some((src, _)) = &through[u] {
                    last_use[*src] = last_use[*src].max(host_last);
                }
            }
        }
    }
    let needed = peak_bytes(g, &plan, &grids, &last_use, &inline_of);
    let disk = budget.disk_limit()?;
    if needed > budget.ram.saturating_add(disk) {
        return Err(Error::OverBudget {
            needed,
            ram: budget.ram,
            disk,
            dir: budget.spill_dir.clone(),
        });
    }
    crate::buffers::limit(budget.ram);
    let n_tiles = grid.len();
    let workers = be
        .backend
        .tiles_at_once(threads)
        .clamp(1, threads.max(1))
        .clamp(1, n_tiles.max(1));
    let inner = inner_threads(threads, workers);
    let ram_used = Arc::new(AtomicU64::new(0));
    let mut vals: Vec<Option<Val>> = (0..plan.shape.len()).map(|_| None).collect();
    vals[0] = Some(Val::Input(input));
    let mut stats: Vec<Option<Vec<ChannelStats>>> = vec![None; plan.shape.len()];
    let mut norms: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; g.nodes.len()];
    let mut info = RunInfo {
        stats: vec![None; g.nodes.len()],
        tiles: n_tiles,
        peak_store_bytes: needed,
        inlined_values: inlined.iter().filter(|&&b| b).count(),
        ..RunInfo::default()
    };
    let spill = spill_err(budget);
    // A normalisation of the graph input itself: the input's statistics, tile by tile, first.
    if plan.feeds_norm[0] {
        let g0 = &grids[0];
        let local = superstep(g0.len(), workers, |t| {
            let (y0, y1, x0, x1) = g0.tile(t);
            let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
            let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
            Ok(tensor_stats(&crate::field::gather(input, &ys, &xs)?))
        })?;
        stats[0] = Some(merge_all(&local));
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if fused[i] || through[i + 1].is_some() {
            continue;
        }
        if let Op::Norm(m) = &n.op {
            let st = match fixed.and_then(|f| f.get(i).cloned().flatten()) {
                Some(st) => st,
                None => stats[n.inputs[0]]
                    .clone()
                    .ok_or_else(|| node_err(n, "internal: its input reported no statistics"))?,
            };
            norms[i] = Some(m.scale_shift(&st));
            info.stats[i] = Some(st);
        }
        if inlined[i] {
            continue;
        }
        // The value this superstep stores: the node's, or its chain's last.
        let v = stored_value(i);
        let gv = &grids[v];
        let layer = if v == g.output {
            None
        } else {
            let l = Layer::new(plan.shape[v].0, gv.clone(), budget, &ram_used)?;
            info.spilled_layers += l.spilled() as usize;
            Some(l)
        };
        let field = |u: usize| vals[u].as_ref().expect("value alive").field();
        let exact = Exact {
            be,
            g,
            plan: &plan,
            field: &field,
            through: &through,
            moves: &moves,
            chains: &chains,
            inline_of: &inline_of,
            norms: &norms,
            threads: inner,
        };
        let local = superstep(gv.len(), workers, |t| {
            let (y0, y1, x0, x1) = gv.tile(t);
            let out = exact.unit(i, (y0, y1), (x0, x1))?;
            let st = plan.feeds_norm[v].then(|| tensor_stats(&out));
            match &layer {
                Some(l) => l.put(t, out.data).map_err(&spill)?,
                None => {
                    sink.put_tile(y0, x0, &out)?;
                    crate::buffers::give(out.data);
                }
            }
            Ok(st)
        })?;
        if plan.feeds_norm[v] {
            let tiles: Vec<Vec<ChannelStats>> = local.into_iter().flatten().collect();
            stats[v] = Some(merge_all(&tiles));
        }
        vals[v] = layer.map(Val::Layer);
        let done = v - 1;
        for (u, val) in vals.iter_mut().enumerate() {
            if u > 0
                && last_use[u] != usize::MAX
                && last_use[u] <= done
                && let Some(Val::Layer(l)) = val.take()
            {
                l.recycle();
            }
        }
    }
    if let Some(m) = be.backend.device_meter() {
        info.device_peak_bytes = m.peak();
    }
    drop(vals);
    crate::buffers::clear();
    Ok(info)
}

type Range2 = ((usize, usize), (usize, usize));

/// One-pass evaluation of value `target` over rows `ry` × columns `rx`: every value it depends on is
/// computed over the region its consumers' windows need (the receptive field), with the statistics in
/// `stats` for the normalisations.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub fn eval_region<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    input: &dyn Input,
    target: usize,
    ry: (usize, usize),
    rx: (usize, usize),
    stats: &[Option<(Vec<f32>, Vec<f32>)>],
    threads: usize,
) -> Result<Tensor> {
    let mut need: Vec<Option<Range2>> = vec![None; target + 1];
    need[target] = Some((ry, rx));
    for i in (0..target).rev() {
        let v = i + 1;
        let Some(((y0, y1), (x0, x1))) = need[v] else {
            continue;
        };
        let n = &g.nodes[i];
        let nh: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].1).collect();
        let nw: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].2).collect();
        let (_, oh, ow) = plan.shape[v];
        for (j, &u) in n.inputs.iter().enumerate() {
            let ys = n.op.in_map(0, j, &nh, oh, y0, y1);
            let xs = n.op.in_map(1, j, &nw, ow, x0, x1);
            let (Some(a), Some(b)) = (span(&ys), span(&xs)) else {
                continue;
            };
            need[u] = Some(match need[u] {
                None => (a, b),
                Some(((p0, p1), (q0, q1))) => {
                    ((p0.min(a.0), p1.max(a.1)), (q0.min(b.0), q1.max(b.1)))
                }
            });
        }
    }
    let mut regions: Vec<Option<Tensor>> = vec![None; target + 1];
    let mut last = vec![0usize; target + 1];
    for (i, n) in g.nodes.iter().enumerate().take(target) {
        if need[i + 1].is_some() {
            for &u in &n.inputs {
                last[u] = last[u].max(i);
            }
        }
    }
    for i in 0..target {
        let v = i + 1;
        let Some((ry, rx)) = need[v] else { continue };
        let n = &g.nodes[i];
        let out = {
            let holders: Vec<Option<Region>> = (0..=target)
                .map(|u| {
                    regions[u].as_ref().map(|t| {
                        let ((y0, _), (x0, _)) = need[u].expect("computed regions are needed");
                        Region { t, y0, x0 }
                    })
                })
                .collect();
            let field = |u: usize| -> &dyn Field {
                if u == 0 {
                    input as &dyn Field
                } else {
                    holders[u].as_ref().expect("region alive")
                }
            };
            let norm = match &n.op {
                Op::Norm(_) => Some(stats[i].as_ref().ok_or_else(|| {
                    node_err(n, "one-pass evaluation: its statistics are missing")
                })?),
                _ => None,
            };
            eval_node(
                be,
                i,
                n,
                plan,
                v,
                ry,
                rx,
                &field,
                &[],
                &[],
                norm,
                threads,
                &|_, _, _| None,
            )?
        };
        regions[v] = Some(out);
        for u in 1..v {
            if last[u] <= i && u != target {
                regions[u] = None;
            }
        }
    }
    regions[target]
        .take()
        .ok_or_else(|| Error::Grid("internal: the target was not computed".into()))
}

/// Per-node `(scale, shift)` of every normalisation for the given statistics.
fn scale_shifts(g: &Graph, stats: &GraphStats) -> Vec<Option<(Vec<f32>, Vec<f32>)>> {
    g.nodes
        .iter()
        .enumerate()
        .map(
            |(i, n)| match (&n.op, stats.get(i).and_then(|s| s.as_ref())) {
                (Op::Norm(m), Some(st)) => Some(m.scale_shift(st)),
                _ => None,
            },
        )
        .collect()
}

/// One pass per output tile with fixed statistics (sampled and recompute modes).
#[allow(clippy::too_many_arguments)]
fn run_fixed<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    input: &dyn Input,
    grid: &Grid,
    stats: &GraphStats,
    threads: usize,
    sink: &dyn Sink,
) -> Result<()> {
    let go = g.value_grid(plan, grid, g.output)?;
    let workers = be.backend.tiles_at_once(threads).clamp(1, go.len());
    let inner = inner_threads(threads, workers);
    let ss = scale_shifts(g, stats);
    superstep(go.len(), workers, |t| {
        let (y0, y1, x0, x1) = go.tile(t);
        let out = eval_region(be, g, plan, input, g.output, (y0, y1), (x0, x1), &ss, inner)?;
        sink.put_tile(y0, x0, &out)
    })?;
    Ok(())
}

/// Runs `g` over `input` in `mode` with `tile`-sided tiles, writing `sink` (which must have the output
/// value's shape: [`Graph::plan`]'s last shape).
pub fn run_graph(
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    run_graph_on(&CpuBackend, g, input, mode, tile, threads, budget, sink)
}

/// [`run_graph`] with every node computed on `backend` (the CPU, [`crate::DeviceSim`], CUDA): the
/// backend first checks that it runs every node, then prepares the run (weights), and each superstep
/// hands it the gathered windows. A device's memory peak is reported in [`RunInfo::device_peak_bytes`].
#[allow(clippy::too_many_arguments)]
pub fn run_graph_on<B: GraphOps>(
    backend: &B,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    backend.check(&g.nodes)?;
    let prep = backend.prepare(&g.nodes)?;
    let be = &Run {
        backend,
        prep: &prep,
    };
    let mut info = run_mode(be, g, input, mode, tile, threads, budget, sink)?;
    if let Some(m) = backend.device_meter() {
        info.device_peak_bytes = m.peak();
    }
    Ok(info)
}

/// [`run_graph`] on the device `dev` names: the CPU backend, or the CUDA backend opened with its memory
/// budget and precision. Without a usable GPU, `Device::Cuda` fails with the probe's reason (no driver,
/// no device, no NVRTC or cuBLAS); it never falls back to the CPU.
#[allow(clippy::too_many_arguments)]
pub fn run_graph_device(
    dev: &crate::DeviceOptions,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    dev.validate()?;
    match dev.device {
        crate::Device::Cpu => {
            run_graph_on(&CpuBackend, g, input, mode, tile, threads, budget, sink)
        }
        crate::Device::Cuda(ordinal) => {
            let backend = crate::CudaBackend::new(ordinal, dev.gpu_memory, dev.precision)?;
            // The peak this run reports is its own (cuBLAS's workspace is held from the start).
            backend.memory().reset_peak();
            run_graph_on(&backend, g, input, mode, tile, threads, budget, sink)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_mode<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let (h, w) = (input.height(), input.width());
    let grid = || g.grid(h, w, tile);
    let result = match mode {
        Mode::Whole => one_tile(be, g, input, threads, budget, sink),
        Mode::Exact => match exact_on(be, g, input, &grid()?, threads, budget, sink, None) {
            // Refused before anything was computed or written: the same output, exact, from the
            // recompute schedule, which stores no activation.
            Err(Error::OverBudget {
                needed, ram, disk, ..
            }) => {
                let mut info =
                    run_mode(be, g, input, Mode::Recompute, tile, threads, budget, sink)?;
                let norms = g
                    .nodes
                    .iter()
                    .filter(|n| matches!(n.op, Op::Norm(_)))
                    .count();
                let gb = |b: u64| format!("{:.1} GB", b as f64 / 1e9);
                info.notes.push(format!(
                    "exact: storing every node's output would take {} at its peak, more than the RAM \
                     budget ({}) and the spill space ({}) together, so each normalisation's statistics \
                     were recomputed tile by tile instead ({} passes over the input; the same output)",
                    gb(needed),
                    gb(ram),
                    gb(disk),
                    norms + 1
                ));
                Ok(info)
            }
            other => other,
        },
        Mode::Naive => {
            let grid = grid()?;
            let plan = prepare(g, input, &grid)?;
            let go = g.value_grid(&plan, &grid, g.output)?;
            let workers = be.backend.tiles_at_once(threads).clamp(1, grid.len());
            let inner = inner_threads(threads, workers);
            superstep(grid.len(), workers, |t| {
                let (y0, y1, x0, x1) = grid.tile(t);
                let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
                let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
                let crop = gather(input, &ys, &xs)?;
                let p = g.plan(y1 - y0, x1 - x0)?;
                let (c, oh, ow) = p.shape[g.output];
                let part = OutputSink::f32(c, oh, ow);
                one_tile(be, g, &crop, inner, budget, &part)?;
                let (oy0, _, ox0, _) = go.tile(t);
                sink.put_tile(oy0, ox0, &part.finish().into_tensor())
            })?;
            Ok(RunInfo {
                tiles: grid.len(),
                ..RunInfo::default()
            })
        }
        Mode::Sampled(f) => {
            let grid = grid()?;
            let plan = prepare(g, input, &grid)?;
            // The sample's statistics by the exact mode, tile by tile under the run's budget (its
            // values stored, spilled or recomputed as an exact run's are); its output is not kept.
            let small = crate::onepass::Downsampled::new(input, f);
            let discard = OutputSink::f32(0, 0, 0);
            let sampled = run_mode(be, g, &small, Mode::Exact, tile, threads, budget, &discard)?;
            run_fixed(be, g, &plan, input, &grid, &sampled.stats, threads, sink)?;
            Ok(RunInfo {
                stats: sampled.stats,
                tiles: grid.len(),
                ..RunInfo::default()
            })
        }
        Mode::Recompute => {
            let grid = grid()?;
            let plan = prepare(g, input, &grid)?;
            let mut stats: GraphStats = vec![None; g.nodes.len()];
            for (i, n) in g.nodes.iter().enumerate() {
                if !matches!(n.op, Op::Norm(_)) {
                    continue;
                }
                let u = n.inputs[0];
                let gu = g.value_grid(&plan, &grid, u)?;
                let workers = be.backend.tiles_at_once(threads).clamp(1, gu.len());
                let inner = inner_threads(threads, workers);
                let ss = scale_shifts(g, &stats);
                let tiles = superstep(gu.len(), workers, |t| {
                    let (y0, y1, x0, x1) = gu.tile(t);
                    let x = if u == 0 {
                        gather(
                            input,
                            &(y0..y1).map(Some).collect::<Vec<_>>(),
                            &(x0..x1).map(Some).collect::<Vec<_>>(),
                        )?
                    } else {
                        eval_region(be, g, &plan, input, u, (y0, y1), (x0, x1), &ss, inner)?
                    };
                    Ok(tensor_stats(&x))
                })?;
                stats[i] = Some(merge_all(&tiles));
            }
            run_fixed(be, g, &plan, input, &grid, &stats, threads, sink)?;
            Ok(RunInfo {
                stats,
                tiles: grid.len(),
                ..RunInfo::default()
            })
        }
    };
    crate::buffers::clear();
    result
}

/// `g` over all of `input` as one tile with every value in RAM: the whole-image run, a naive tile, the
/// sampled mode's small image.
fn one_tile<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let one = Grid {
        rows: vec![0, input.height()],
        cols: vec![0, input.width()],
    };
    // Every value in RAM, up to the machine's memory: past it, a typed error before anything runs
    // rather than the kernel's OOM killer halfway.
    let (limit, source) = stdx::mem::limit();
    let ram = Budget {
        ram: limit,
        disk: Some(0),
        ..budget.clone()
    };
    match exact_on(be, g, input, &one, threads, &ram, sink, None) {
        Err(Error::OverBudget { needed, .. }) => Err(Error::WholeTooLarge {
            needed,
            limit,
            limit_from: source,
        }),
        r => r,
    }
}

/// [`run_graph`] into a new f32 tensor (the network's raw output, `C×H×W`).
pub fn infer(
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
) -> Result<(Tensor, RunInfo)> {
    infer_on(&CpuBackend, g, input, mode, tile, threads, budget)
}

/// [`infer`] on `backend` ([`run_graph_on`]).
pub fn infer_on<B: GraphOps>(
    backend: &B,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
) -> Result<(Tensor, RunInfo)> {
    let plan = g.plan(input.height(), input.width())?;
    let (c, h, w) = plan.shape[g.output];
    let sink = OutputSink::f32(c, h, w);
    let info = run_graph_on(backend, g, input, mode, tile, threads, budget, &sink)?;
    Ok((sink.finish().into_tensor(), info))
}
