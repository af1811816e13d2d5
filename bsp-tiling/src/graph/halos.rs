//! What a run shared among ranks sends after each stored value's superstep: for every tile of the value,
//! the rectangle of it that another rank's later supersteps read (their tiles' windows, through the
//! values they compute where they read them), planned from the graph before anything runs. A rank then
//! holds its own tiles of each stored value and the parts of its neighbours' that it reads — never the
//! whole value.

use super::exec::GraphOps;
use super::fixed::needs;
use super::kept::{Kept, Rect};
use super::model::{Graph, GraphPlan};
use crate::error::Result;
use crate::field::gather;
use crate::grid::Grid;
use crate::ranks::{Ranks, Reader, Wire};
use crate::store::Layer;
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// A rank's storage of a stored value as the exchange reads and fills it: the host's tiled layer, or
/// tiles kept on the device ([`KeptOn`]).
pub(super) trait Exchanged {
    fn channels(&self) -> usize;
    fn grid(&self) -> &Grid;
    /// Rectangle `r` of one of this rank's tiles, on the host (`c × h × w` values).
    fn read_rect(&self, r: Rect) -> Result<Vec<f32>>;
    /// Stores rectangle `r` of tile `t` (another rank's), `data` its `c × h × w` values.
    fn put_rect(&self, t: usize, r: Rect, data: Vec<f32>) -> Result<()>;
}

/// The rows or columns `lo..hi`, as a window's index map.
fn range(lo: usize, hi: usize) -> Vec<Option<usize>> {
    (lo..hi).map(Some).collect()
}

/// A kept value with the backend holding it.
pub(super) struct KeptOn<'a, B: GraphOps> {
    pub kept: &'a Kept<B>,
    pub backend: &'a B,
}

impl<B: GraphOps> Exchanged for KeptOn<'_, B> {
    fn channels(&self) -> usize {
        self.kept.channels()
    }
    fn grid(&self) -> &Grid {
        self.kept.grid()
    }
    fn read_rect(&self, r: Rect) -> Result<Vec<f32>> {
        let window = self
            .kept
            .gather(self.backend, &range(r[0], r[1]), &range(r[2], r[3]))?;
        Ok(self.backend.store(window)?.data)
    }
    fn put_rect(&self, t: usize, r: Rect, data: Vec<f32>) -> Result<()> {
        let part = Tensor::from_vec(self.kept.channels(), r[1] - r[0], r[3] - r[2], data)?;
        self.kept.put_part(t, r, self.backend.load(part)?)
    }
}

impl Exchanged for Layer {
    fn channels(&self) -> usize {
        self.c
    }
    fn grid(&self) -> &Grid {
        &self.grid
    }
    fn read_rect(&self, r: Rect) -> Result<Vec<f32>> {
        Ok(gather(self, &range(r[0], r[1]), &range(r[2], r[3]))?.data)
    }
    fn put_rect(&self, t: usize, r: Rect, data: Vec<f32>) -> Result<()> {
        Layer::put_rect(self, t, r, data)
    }
}

/// Per value: `(rank, tile) → rectangle` of that tile the rank reads and another rank computes.
pub(super) struct Halos {
    wants: Vec<BTreeMap<(usize, usize), Rect>>,
}

/// The tiles of `grid` along one axis (`borders`) that `lo..hi` overlaps.
fn overlapping(borders: &[usize], (lo, hi): (usize, usize)) -> std::ops::Range<usize> {
    let first = borders.partition_point(|&b| b <= lo).saturating_sub(1);
    let last = borders.partition_point(|&b| b < hi).min(borders.len() - 1);
    first..last.max(first)
}

impl Halos {
    /// The rectangles every rank reads of others' tiles, for the supersteps `units` (`(node, value it
    /// stores)` in run order) over `grids`; `stored[u]` says that value `u` is stored (read, not
    /// computed where it is read).
    pub(super) fn plan(
        g: &Graph,
        plan: &GraphPlan,
        grids: &[Grid],
        units: &[(usize, usize)],
        stored: &[bool],
        ranks: &Ranks,
    ) -> Halos {
        let mut wants: Vec<BTreeMap<(usize, usize), Rect>> = vec![BTreeMap::new(); grids.len()];
        for &(_, v) in units {
            let gv = &grids[v];
            for t in 0..gv.len() {
                let reader = ranks.owner(t, gv.len());
                let (y0, y1, x0, x1) = gv.tile(t);
                let need = needs(g, plan, v, ((y0, y1), (x0, x1)), &|u| stored[u]);
                for (u, region) in need.iter().enumerate().take(v).skip(1) {
                    let Some((ry, rx)) = *region else { continue };
                    if !stored[u] {
                        continue;
                    }
                    let gu = &grids[u];
                    for ti in overlapping(&gu.rows, ry) {
                        for tj in overlapping(&gu.cols, rx) {
                            let t2 = ti * gu.n_cols() + tj;
                            if ranks.owner(t2, gu.len()) == reader {
                                continue;
                            }
                            let (a0, a1, b0, b1) = gu.tile(t2);
                            let r = [ry.0.max(a0), ry.1.min(a1), rx.0.max(b0), rx.1.min(b1)];
                            if r[0] >= r[1] || r[2] >= r[3] {
                                continue;
                            }
                            wants[u]
                                .entry((reader, t2))
                                .and_modify(|w| {
                                    *w = [
                                        w[0].min(r[0]),
                                        w[1].max(r[1]),
                                        w[2].min(r[2]),
                                        w[3].max(r[3]),
                                    ]
                                })
                                .or_insert(r);
                        }
                    }
                }
            }
        }
        Halos { wants }
    }

    /// Bytes of the rectangles of value `v` (`c` channels) that rank `rank` receives: what it holds of
    /// the other ranks' tiles.
    pub(super) fn received_bytes(&self, v: usize, rank: usize, c: usize) -> u64 {
        self.wants[v]
            .iter()
            .filter(|((reader, _), _)| *reader == rank)
            .map(|(_, r)| Tensor::bytes(c, r[1] - r[0], r[3] - r[2]))
            .sum()
    }

    /// What this rank sends of value `u` (stored in `held`), per rank: each rectangle that rank reads of
    /// a tile this rank computed.
    pub(super) fn outgoing(
        &self,
        u: usize,
        held: &dyn Exchanged,
        ranks: &Ranks,
    ) -> Result<Vec<Vec<u8>>> {
        let n = held.grid().len();
        let mut wires: Vec<Wire> = (0..ranks.size()).map(|_| Wire::default()).collect();
        for (&(reader, t), r) in &self.wants[u] {
            if ranks.owner(t, n) != ranks.rank() || reader >= wires.len() {
                continue;
            }
            let w = &mut wires[reader];
            let part = held.read_rect(*r)?;
            w.u64(reader as u64);
            w.u64(t as u64);
            for &b in r {
                w.u64(b as u64);
            }
            w.f32s(&part);
            crate::buffers::give(part);
        }
        Ok(wires.into_iter().map(|w| w.0).collect())
    }

    /// Stores in `held` the rectangles addressed to this rank in `rd` (rank `from`'s message): each
    /// as the part of its tile that this rank reads.
    pub(super) fn incoming(held: &dyn Exchanged, ranks: &Ranks, rd: &mut Reader<'_>) -> Result<()> {
        let c = held.channels();
        while !rd.done() {
            let reader = rd.usize()?;
            let t = rd.usize()?;
            let r = [rd.usize()?, rd.usize()?, rd.usize()?, rd.usize()?];
            let data = rd.f32s()?;
            if reader != ranks.rank() {
                crate::buffers::give(data);
                continue;
            }
            let grid = held.grid();
            if t >= grid.len() {
                return Err(rd.bad());
            }
            let (y0, y1, x0, x1) = grid.tile(t);
            let (h, w) = (r[1].wrapping_sub(r[0]), r[3].wrapping_sub(r[2]));
            if r[0] < y0 || r[1] > y1 || r[2] < x0 || r[3] > x1 || r[0] >= r[1] || r[2] >= r[3] {
                return Err(rd.bad());
            }
            if data.len() != c * h * w {
                return Err(rd.bad());
            }
            held.put_rect(t, r, data)?;
        }
        Ok(())
    }
}
