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
//! A run may be shared among ranks ([`crate::Ranks`]): each computes its share of every superstep's
//! tiles, the statistics are merged in tile order across them, and `halos` plans what each sends the
//! others after a stored value's superstep.
//!
//! Values are numbered `0` (the input image) and `i + 1` (the output of node `i`); nodes are in
//! topological order.

mod eval;
mod exact;
pub mod exec;
mod fixed;
mod halos;
mod kept;
pub mod launch;
mod model;
#[allow(unsafe_code)]
pub mod ops;
mod run;
mod schedule;
mod superstep;
mod working;

pub use exec::GraphOps;
pub use model::{Graph, GraphPlan, GraphStats, MinTile, Node, NodeHalo};
pub use run::{infer, infer_on, run, run_device, working_set};
