//! The graph itself: nodes in topological order over numbered values, and what one input size makes of
//! it (every value's shape and resolution, the grid alignment, the halos), checked before anything runs.
//! Also the TransformerNet of [`crate::Net`] as a graph.

use super::ops::{
    AxisPad, BinOp, ConvOp, Coord, Nearest, NormKind, NormOp, Op, Operand, PadOp, ResizeOp, Unary,
    Win,
};
use crate::error::{Error, Result};
use crate::field::Input;
use crate::grid::Grid;
use crate::model::{Net, NetStats};
use crate::padding::PaddingMode;

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
    /// The narrowest tile [`Graph::grid`] accepts, where the graph asks for one: a TransformerNet's
    /// tiles are at least as wide as the halo of every convolution reading them ([`Graph::from_net`]).
    /// `None`: any tile aligned to the strides (windows then reach past the neighbouring tiles).
    pub min_tile: Option<MinTile>,
}

/// The narrowest tile of a graph, the layer that sets it and that layer's halo in input pixels (what a
/// refusal names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinTile {
    pub pixels: usize,
    pub layer: String,
    pub halo: usize,
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

pub(super) fn node_err(n: &Node, reason: impl Into<String>) -> Error {
    Error::Node {
        node: n.name.clone(),
        op: n.op_type.clone(),
        reason: reason.into(),
    }
}

/// Per node: the statistics a normalisation applied (`None` elsewhere) — [`NetStats`]'s shape.
pub type GraphStats = NetStats;

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
        if let Some(m) = &self.min_tile {
            if tile < m.pixels {
                return Err(Error::TileSmallerThanHalo {
                    tile,
                    layer: m.layer.clone(),
                    halo: m.halo,
                    min: m.pixels,
                });
            }
            // A remainder narrower than the minimum joins its neighbour.
            return Grid::with_tile(h, w, tile, plan.align, m.pixels);
        }
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
        let (pixels, layer, halo) = crate::min_tile_layer(net);
        let mut g = Graph {
            name: "TransformerNet".into(),
            channels: net.channels,
            nodes: vec![],
            output: 0,
            min_tile: Some(MinTile {
                pixels,
                layer,
                halo,
            }),
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
                        coord: Coord::Asymmetric,
                        nearest: Nearest::Floor,
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

/// Checks the input against the graph and the grid against the input.
pub(super) fn prepare(g: &Graph, input: &dyn Input, grid: &Grid) -> Result<GraphPlan> {
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
