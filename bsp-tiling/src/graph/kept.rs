//! A stored value kept where the backend computes (a device's memory): its tiles as the backend's
//! buffers, read by gathering windows there, and moved to the host's tiled store when the budget needs
//! the room back.
//!
//! A value is kept only when its bytes and the working sets of the tiles in flight fit what the device
//! budget leaves; its bytes are reserved on the meter before its superstep starts, and each tile's own
//! buffer takes its part of the reservation over as it is stored, so the value can never run the device
//! out of memory halfway through.
//!
//! On ranks a rank keeps the tiles it computed and, of the other ranks' tiles, the rectangles it reads
//! (`put_part`, from the exchange after the superstep): its reservation is those bytes, not the value's.

use super::exec::GraphOps;
use crate::error::{Error, Result};
use crate::field::Part;
use crate::grid::Grid;
use crate::meter::{Lease, Meter};
use crate::store::{Budget, Layer};
use crate::tensor::Tensor;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

/// A rectangle `(y0, y1, x0, x1)` of a value.
pub(super) type Rect = [usize; 4];

/// What a kept value holds of one tile: all of it, or (on ranks, another rank's tile) the rectangle this
/// rank reads.
struct Held<T> {
    rect: Rect,
    buf: T,
}

/// A `c`-channel value on `grid`'s tiles, each a buffer of the backend once its superstep stored it.
pub(super) struct Kept<B: GraphOps> {
    c: usize,
    grid: Grid,
    tiles: Vec<OnceLock<Held<B::Buf>>>,
    /// What the tiles not stored yet will take.
    reserved: Mutex<Lease>,
}

impl<B: GraphOps> Kept<B> {
    /// The value's bytes on `grid`.
    pub fn bytes(c: usize, grid: &Grid) -> u64 {
        (0..grid.len())
            .map(|t| {
                let (y0, y1, x0, x1) = grid.tile(t);
                Tensor::bytes(c, y1 - y0, x1 - x0)
            })
            .sum()
    }

    /// A value of `c` channels on `grid` of which this process holds `bytes` (the whole value's, or a
    /// rank's share), reserved on `meter` (`what` names it in a refusal).
    pub fn reserve(
        meter: &Arc<Meter>,
        c: usize,
        grid: &Grid,
        bytes: u64,
        what: &str,
    ) -> Result<Kept<B>> {
        Ok(Kept {
            c,
            grid: grid.clone(),
            tiles: (0..grid.len()).map(|_| OnceLock::new()).collect(),
            reserved: Mutex::new(meter.lease(bytes, what)?),
        })
    }

    pub fn channels(&self) -> usize {
        self.c
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// Stores tile `t` (the buffer its superstep computed, which holds a lease of its own).
    pub fn put(&self, t: usize, buf: B::Buf) -> Result<()> {
        let (y0, y1, x0, x1) = self.grid.tile(t);
        self.put_part(t, [y0, y1, x0, x1], buf)
    }

    /// Stores rectangle `rect` of tile `t` (on ranks, another rank's), `buf` holding just that rectangle.
    pub fn put_part(&self, t: usize, rect: Rect, buf: B::Buf) -> Result<()> {
        if self.tiles[t].set(Held { rect, buf }).is_err() {
            return Err(Error::Grid(format!(
                "internal: tile {t} of a kept value stored twice"
            )));
        }
        self.reserved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give_back(Tensor::bytes(self.c, rect[1] - rect[0], rect[3] - rect[2]));
        Ok(())
    }

    /// The tiles stored so far that rows `ys` × columns `xs` read, as parts.
    fn parts(&self, ys: &[Option<usize>], xs: &[Option<usize>]) -> Result<Vec<Part<'_, B::Buf>>> {
        let (Some((ylo, yhi)), Some((xlo, xhi))) = (crate::field::span(ys), crate::field::span(xs))
        else {
            return Ok(vec![]);
        };
        // Tile rows (columns) whose borders overlap the span; windows read a few tiles at most.
        fn band(b: &[usize], lo: usize, hi: usize) -> Vec<usize> {
            (0..b.len().saturating_sub(1))
                .filter(|&k| b[k] < hi && b[k + 1] > lo)
                .collect()
        }
        let mut parts = vec![];
        for ty in band(&self.grid.rows, ylo, yhi) {
            for tx in band(&self.grid.cols, xlo, xhi) {
                let t = ty * self.grid.n_cols() + tx;
                let held = self.tiles[t].get().ok_or_else(|| {
                    Error::Grid(format!(
                        "internal: tile {t} of a kept value read before it was stored"
                    ))
                })?;
                let [y0, y1, x0, x1] = held.rect;
                parts.push(Part {
                    y0,
                    x0,
                    h: y1 - y0,
                    w: x1 - x0,
                    buf: &held.buf,
                });
            }
        }
        Ok(parts)
    }

    /// The window at rows `ys` × columns `xs`, gathered on the backend from the tiles holding it.
    pub fn gather(
        &self,
        backend: &B,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<B::Buf> {
        backend.gather(self.c, &self.parts(ys, xs)?, ys, xs)
    }

    /// The value moved to the host's tiled store (RAM within `budget`, spilled past it): every tile
    /// copied back, its device buffer freed as it goes.
    pub fn into_host(
        self,
        backend: &B,
        budget: &Budget,
        ram_used: &Arc<AtomicU64>,
    ) -> Result<Layer> {
        let layer = Layer::new(self.c, self.grid.clone(), budget, ram_used)?;
        for (t, tile) in self.tiles.into_iter().enumerate() {
            if let Some(Held { rect, buf }) = tile.into_inner() {
                let host = backend.store(buf)?;
                layer.put_rect(t, rect, host.data)?;
            }
        }
        Ok(layer)
    }
}
