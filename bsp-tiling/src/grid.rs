//! The tile grid: row and column borders, aligned to the network's total stride.

use crate::error::{Error, Result};

/// Tile borders along both axes, each list starting at 0 and ending at the image side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    pub rows: Vec<usize>,
    pub cols: Vec<usize>,
}

/// Borders of square-ish tiles of side `tile` along one axis; a remainder shorter than `min_last` joins
/// the tile before it.
/// `0, 16, 30`: borders in a message.
fn list(b: &[usize]) -> String {
    b.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn by_size(n: usize, tile: usize, min_last: usize) -> Vec<usize> {
    let mut b: Vec<usize> = (0..n).step_by(tile.max(1)).collect();
    b.push(n);
    if b.len() > 2 && n - b[b.len() - 2] < min_last {
        b.remove(b.len() - 2);
    }
    b
}

/// `parts` tiles of near-equal size along one axis, borders on multiples of `align`.
fn by_count(n: usize, parts: usize, align: usize) -> Result<Vec<usize>> {
    let mut b = vec![0];
    for i in 1..parts {
        let raw = (i * n) as f64 / parts as f64;
        let v = ((raw / align as f64).round() as usize) * align;
        if v <= *b.last().expect("nonempty") || v >= n {
            return Err(Error::Grid(format!(
                "cannot cut {n} pixels into {parts} tiles on multiples of {align}"
            )));
        }
        b.push(v);
    }
    b.push(n);
    Ok(b)
}

impl Grid {
    /// Tiles of `tile × tile` pixels (the last row/column takes the remainder), `tile` a multiple of `align`.
    pub fn with_tile(
        h: usize,
        w: usize,
        tile: usize,
        align: usize,
        min_last: usize,
    ) -> Result<Grid> {
        if tile == 0 || !tile.is_multiple_of(align) {
            return Err(Error::Grid(format!(
                "tile size {tile} is not a positive multiple of the network's total stride {align}"
            )));
        }
        Ok(Grid {
            rows: by_size(h, tile, min_last),
            cols: by_size(w, tile, min_last),
        })
    }

    /// `rows × cols` tiles of near-equal size, borders on multiples of `align`.
    pub fn with_count(h: usize, w: usize, rows: usize, cols: usize, align: usize) -> Result<Grid> {
        if rows == 0 || cols == 0 {
            return Err(Error::Grid("a grid needs at least one tile".into()));
        }
        Ok(Grid {
            rows: by_count(h, rows, align)?,
            cols: by_count(w, cols, align)?,
        })
    }

    /// Explicit borders (each list from 0 to the side, increasing, inner ones on multiples of `align`).
    pub fn from_borders(rows: Vec<usize>, cols: Vec<usize>, align: usize) -> Result<Grid> {
        for b in [&rows, &cols] {
            let ok = b.len() >= 2
                && b[0] == 0
                && b.windows(2).all(|p| p[0] < p[1])
                && b[1..b.len() - 1].iter().all(|v| v % align == 0);
            if !ok {
                return Err(Error::Grid(format!(
                    "borders {} must rise from 0, inner ones on multiples of {align}",
                    list(b)
                )));
            }
        }
        Ok(Grid { rows, cols })
    }

    pub fn n_rows(&self) -> usize {
        self.rows.len() - 1
    }
    pub fn n_cols(&self) -> usize {
        self.cols.len() - 1
    }
    pub fn len(&self) -> usize {
        self.n_rows() * self.n_cols()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tile `t` (row-major) as `(y0, y1, x0, x1)`.
    pub fn tile(&self, t: usize) -> (usize, usize, usize, usize) {
        let (i, j) = (t / self.n_cols(), t % self.n_cols());
        (
            self.rows[i],
            self.rows[i + 1],
            self.cols[j],
            self.cols[j + 1],
        )
    }

    /// The same tiles at an activation `div` times smaller of size `h × w`: inner borders divide exactly
    /// (they sit on multiples of the total stride), the outer one is the activation's own side.
    pub fn at_level(&self, div: usize, h: usize, w: usize) -> Result<Grid> {
        let scale = |b: &[usize], n: usize| -> Result<Vec<usize>> {
            let mut v: Vec<usize> = b.iter().map(|x| x / div).collect();
            *v.last_mut().expect("nonempty") = n;
            if v.windows(2).any(|p| p[0] >= p[1]) {
                return Err(Error::Grid(format!(
                    "borders {} leave an empty tile at 1/{div} resolution",
                    list(b)
                )));
            }
            Ok(v)
        };
        Ok(Grid {
            rows: scale(&self.rows, h)?,
            cols: scale(&self.cols, w)?,
        })
    }

    /// Which tile row (column) holds each index of an axis, and the index within it.
    pub fn locate(borders: &[usize]) -> Vec<(u32, u32)> {
        let mut v = Vec::with_capacity(*borders.last().unwrap_or(&0));
        for (t, p) in borders.windows(2).enumerate() {
            for i in p[0]..p[1] {
                v.push((t as u32, (i - p[0]) as u32));
            }
        }
        v
    }
}
