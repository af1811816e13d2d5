//! Where the BSP engine keeps every tile's activations: RAM up to a budget, spill files beyond.
//!
//! A layer is stored whole in RAM or whole in one spill file (tiles at page-aligned offsets). Spilled tiles
//! are written and read with `pwrite`/`pread` into buffers of [`crate::buffers`], a window's rows only, so
//! they take memory only while a worker uses them: the image size is bounded by the disk, not by RAM.
//! (Mapping the tiles instead cost a page fault per 4 KiB on every touch, most of the run's system time
//! when a ×4 upscaler's 8192² activations spilled.)

use crate::error::{Error, Result};
use crate::field::Field;
use crate::grid::Grid;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// RAM and disk allowances for activations.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Bytes of activations kept in RAM before layers spill to disk.
    pub ram: u64,
    /// Bytes the spill files may take; `None` = the free space of `spill_dir`.
    pub disk: Option<u64>,
    pub spill_dir: PathBuf,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            ram: 2 << 30,
            disk: None,
            spill_dir: std::env::temp_dir(),
        }
    }
}

/// Free bytes on the file system holding `dir`.
pub fn free_space(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| Error::Spill {
        dir: dir.to_path_buf(),
        source: std::io::Error::other("path contains NUL"),
    })?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive across the call; `s` is our own writable `statvfs`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(Error::Spill {
            dir: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

impl Budget {
    pub fn disk_limit(&self) -> Result<u64> {
        match self.disk {
            Some(d) => Ok(d),
            None => free_space(&self.spill_dir),
        }
    }
}

/// Page size multiple for tile offsets in spill files.
const PAGE: u64 = 4096;

enum Backing {
    Ram(Vec<RwLock<Vec<f32>>>),
    Disk { file: File, offsets: Vec<u64> },
}

/// One stored value for every tile of its grid.
pub struct Layer {
    pub c: usize,
    pub grid: Grid,
    backing: Backing,
    /// Per axis: which tile row/column holds each global index, and where in it.
    loc_y: Vec<(u32, u32)>,
    loc_x: Vec<(u32, u32)>,
    ram_bytes: u64,
    ram_used: Arc<AtomicU64>,
    dir: PathBuf,
}

/// A tile's data, borrowed from RAM or read from the spill file (its buffer handed back when dropped).
pub enum TileRef<'a> {
    Ram(RwLockReadGuard<'a, Vec<f32>>),
    Read(Vec<f32>),
}

impl std::ops::Deref for TileRef<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            TileRef::Ram(g) => g,
            TileRef::Read(v) => v,
        }
    }
}

impl Drop for TileRef<'_> {
    fn drop(&mut self) {
        if let TileRef::Read(v) = self {
            crate::buffers::give(std::mem::take(v));
        }
    }
}

impl Layer {
    /// Bytes a layer of `c` channels over `grid` needs.
    pub fn bytes(c: usize, grid: &Grid) -> u64 {
        (0..grid.len())
            .map(|t| {
                let (y0, y1, x0, x1) = grid.tile(t);
                (c * (y1 - y0) * (x1 - x0) * 4) as u64
            })
            .sum()
    }

    /// Allocates in RAM if the budget allows, else in a fresh (already unlinked) spill file.
    pub fn new(c: usize, grid: Grid, budget: &Budget, ram_used: &Arc<AtomicU64>) -> Result<Layer> {
        let bytes = Layer::bytes(c, &grid);
        let in_ram = ram_used.load(Ordering::Relaxed) + bytes <= budget.ram;
        let tile_len = |t: usize| {
            let (y0, y1, x0, x1) = grid.tile(t);
            c * (y1 - y0) * (x1 - x0)
        };
        let backing = if in_ram {
            ram_used.fetch_add(bytes, Ordering::Relaxed);
            // Empty until put (or first modified): a tile's buffer comes with its data.
            Backing::Ram((0..grid.len()).map(|_| RwLock::new(Vec::new())).collect())
        } else {
            let spill = |source| Error::Spill {
                dir: budget.spill_dir.clone(),
                source,
            };
            // An anonymous temporary (unlinked at creation, gone with the process however it ends):
            // `tempfile` rather than `stdx::fs`, whose files are durable outputs (AtomicFile: a
            // temporary name renamed into place) — the opposite of what a spill file needs.
            let file = tempfile::tempfile_in(&budget.spill_dir).map_err(spill)?;
            let mut offsets = vec![];
            let mut off = 0u64;
            for t in 0..grid.len() {
                offsets.push(off);
                off += ((tile_len(t) * 4) as u64).div_ceil(PAGE) * PAGE;
            }
            file.set_len(off.max(PAGE)).map_err(spill)?;
            Backing::Disk { file, offsets }
        };
        Ok(Layer {
            c,
            loc_y: Grid::locate(&grid.rows),
            loc_x: Grid::locate(&grid.cols),
            grid,
            backing,
            ram_bytes: if in_ram { bytes } else { 0 },
            ram_used: ram_used.clone(),
            dir: budget.spill_dir.clone(),
        })
    }

    /// Stops counting this layer's RAM against the budget: its one reader takes its tiles one by one
    /// into the value it stores (a normalisation, an element-wise node), so the same memory is counted
    /// once, as that value's.
    pub fn hand_over_ram(&mut self) {
        self.ram_used.fetch_sub(self.ram_bytes, Ordering::Relaxed);
        self.ram_bytes = 0;
    }

    /// An I/O error of this layer's spill file.
    pub fn spill_error(&self, source: std::io::Error) -> Error {
        Error::Spill {
            dir: self.dir.clone(),
            source,
        }
    }

    pub fn spilled(&self) -> bool {
        matches!(self.backing, Backing::Disk { .. })
    }

    fn tile_len(&self, t: usize) -> usize {
        let (y0, y1, x0, x1) = self.grid.tile(t);
        self.c * (y1 - y0) * (x1 - x0)
    }

    pub fn read(&self, t: usize) -> std::io::Result<TileRef<'_>> {
        match &self.backing {
            Backing::Ram(v) => Ok(TileRef::Ram(v[t].read().unwrap_or_else(|e| e.into_inner()))),
            Backing::Disk { file, offsets } => {
                let mut buf = crate::buffers::scratch(self.tile_len(t))
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
                file.read_exact_at(bytemuck::cast_slice_mut(&mut buf), offsets[t])?;
                Ok(TileRef::Read(buf))
            }
        }
    }

    /// Hands the tiles held in RAM back to [`crate::buffers`] (the layer is done with).
    pub fn recycle(self) {
        if let Backing::Ram(v) = &self.backing {
            for t in v {
                let data = std::mem::take(&mut *t.write().unwrap_or_else(|e| e.into_inner()));
                crate::buffers::give(data);
            }
        }
    }

    /// Stores tile `t`'s data (`data` must have the tile's length): moved in when the layer is in RAM, written
    /// to the spill file otherwise.
    pub fn put(&self, t: usize, data: Vec<f32>) -> std::io::Result<()> {
        match &self.backing {
            Backing::Ram(v) => {
                debug_assert_eq!(data.len(), self.tile_len(t));
                let mut g = v[t].write().unwrap_or_else(|e| e.into_inner());
                *g = data;
                Ok(())
            }
            Backing::Disk { file, offsets } => {
                file.write_all_at(bytemuck::cast_slice(&data), offsets[t])?;
                crate::buffers::give(data);
                Ok(())
            }
        }
    }

    /// Stores the rectangle `rect` `(y0, y1, x0, x1)` of tile `t`, `data` its `c × h × w` values: the
    /// tile itself, or (a part of another rank's tile, the only part of it this rank reads) the tile
    /// with zeros around the rectangle.
    pub fn put_rect(&self, t: usize, rect: [usize; 4], data: Vec<f32>) -> Result<()> {
        let (y0, y1, x0, x1) = self.grid.tile(t);
        let [r0, r1, c0, c1] = rect;
        if rect == [y0, y1, x0, x1] {
            return self.put(t, data).map_err(|e| self.spill_error(e));
        }
        let (th, tw, h, w) = (y1 - y0, x1 - x0, r1 - r0, c1 - c0);
        let mut tile = crate::buffers::zeros(self.c * th * tw)?;
        for ch in 0..self.c {
            for y in 0..h {
                let src = &data[(ch * h + y) * w..(ch * h + y + 1) * w];
                let at = (ch * th + r0 - y0 + y) * tw + c0 - x0;
                tile[at..at + w].copy_from_slice(src);
            }
        }
        crate::buffers::give(data);
        self.put(t, tile).map_err(|e| self.spill_error(e))
    }

    /// Rows `l0..l1` of tile `t`'s channel `c`, as `dst` (whole rows); with `cols`, only those columns
    /// of each row are read (a narrow strip of a wide tile, such as a halo beside it).
    #[allow(clippy::too_many_arguments)]
    fn read_rows(
        &self,
        file: &File,
        offset: u64,
        (th, tw): (usize, usize),
        c: usize,
        (l0, l1): (usize, usize),
        cols: Option<(usize, usize)>,
        dst: &mut [f32],
    ) -> std::io::Result<()> {
        let at = |row: usize, col: usize| offset + (((c * th + row) * tw + col) * 4) as u64;
        match cols {
            None => file.read_exact_at(
                bytemuck::cast_slice_mut(&mut dst[..(l1 - l0) * tw]),
                at(l0, 0),
            ),
            Some((c0, c1)) => (l0..l1).try_for_each(|row| {
                let d = &mut dst[(row - l0) * tw + c0..(row - l0) * tw + c1];
                file.read_exact_at(bytemuck::cast_slice_mut(d), at(row, c0))
            }),
        }
    }
}

impl Drop for Layer {
    fn drop(&mut self) {
        self.ram_used.fetch_sub(self.ram_bytes, Ordering::Relaxed);
    }
}

impl Field for Layer {
    fn channels(&self) -> usize {
        self.c
    }

    fn take(&self, ys: &[Option<usize>], xs: &[Option<usize>]) -> Option<Vec<f32>> {
        let Backing::Ram(tiles) = &self.backing else {
            return None;
        };
        let (y0, x0) = ((*ys.first()?)?, (*xs.first()?)?);
        let ((ty, ly), (tx, lx)) = (self.loc_y[y0], self.loc_x[x0]);
        let t = ty as usize * self.grid.n_cols() + tx as usize;
        let (gy0, gy1, gx0, gx1) = self.grid.tile(t);
        let exact = |idx: &[Option<usize>], a: usize, b: usize| {
            idx.len() == b - a && idx.iter().zip(a..b).all(|(&i, g)| i == Some(g))
        };
        if ly != 0 || lx != 0 || !exact(ys, gy0, gy1) || !exact(xs, gx0, gx1) {
            return None;
        }
        let mut held = tiles[t].write().unwrap_or_else(|e| e.into_inner());
        // A tile not held here (taken already, or another rank's) is gathered, which says so.
        if held.len() != self.c * (gy1 - gy0) * (gx1 - gx0) {
            return None;
        }
        Some(std::mem::take(&mut *held))
    }

    /// Dictionary padding: each window pixel comes from whichever tile stores it.
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        let n = ys.len() * xs.len();
        // Without padding every window pixel is some tile's and written below.
        if ys.contains(&None) || xs.contains(&None) {
            out.fill(0.0);
        }
        // Window rows (columns) grouped by the tile row (column) that holds them: (window index, local index).
        let group = |idx: &[Option<usize>], loc: &[(u32, u32)], tiles: usize| {
            let mut g: Vec<Vec<(usize, usize)>> = vec![vec![]; tiles];
            for (i, v) in idx.iter().enumerate() {
                if let Some(v) = v {
                    let (t, l) = loc[*v];
                    g[t as usize].push((i, l as usize));
                }
            }
            g
        };
        let gy = group(ys, &self.loc_y, self.grid.n_rows());
        let gx = group(xs, &self.loc_x, self.grid.n_cols());
        let nc = self.grid.n_cols();
        let gx: Vec<Vec<(usize, usize, usize)>> = gx
            .iter()
            .map(|cols| crate::field::runs(cols.iter().map(|&(i, l)| (i, Some(l)))))
            .collect();
        for (ti, rows) in gy.iter().enumerate().filter(|r| !r.1.is_empty()) {
            for (tj, cols) in gx.iter().enumerate().filter(|c| !c.1.is_empty()) {
                let t = ti * nc + tj;
                let (y0, y1, x0, x1) = self.grid.tile(t);
                let (th, tw) = (y1 - y0, x1 - x0);
                let spill = |source| Error::Spill {
                    dir: self.dir.clone(),
                    source,
                };
                match &self.backing {
                    Backing::Ram(_) => {
                        let data = self.read(t).map_err(spill)?;
                        if data.len() != self.c * th * tw {
                            return Err(Error::Grid(format!(
                                "internal: tile {t} of a stored value is not held by this process"
                            )));
                        }
                        for c in 0..self.c {
                            let plane = &data[c * th * tw..(c + 1) * th * tw];
                            let o = &mut out[c * n..(c + 1) * n];
                            for &(iy, ly) in rows {
                                let src = &plane[ly * tw..(ly + 1) * tw];
                                let dst = &mut o[iy * xs.len()..(iy + 1) * xs.len()];
                                crate::field::copy_runs(cols, src, dst);
                            }
                        }
                    }
                    Backing::Disk { file, offsets } => {
                        // Only the rows the window needs; of a narrow strip, only its columns.
                        let l0 = rows.iter().map(|r| r.1).min().unwrap_or(0);
                        let l1 = rows.iter().map(|r| r.1 + 1).max().unwrap_or(0);
                        let c0 = cols.iter().map(|r| r.1).min().unwrap_or(0);
                        let c1 = cols.iter().map(|r| r.1 + r.2).max().unwrap_or(0);
                        let strip = ((c1 - c0) * 8 < tw).then_some((c0, c1));
                        let mut block = crate::buffers::scratch((l1 - l0) * tw)?;
                        for c in 0..self.c {
                            self.read_rows(
                                file,
                                offsets[t],
                                (th, tw),
                                c,
                                (l0, l1),
                                strip,
                                &mut block,
                            )
                            .map_err(spill)?;
                            let o = &mut out[c * n..(c + 1) * n];
                            for &(iy, ly) in rows {
                                let src = &block[(ly - l0) * tw..(ly - l0 + 1) * tw];
                                let dst = &mut o[iy * xs.len()..(iy + 1) * xs.len()];
                                crate::field::copy_runs(cols, src, dst);
                            }
                        }
                        crate::buffers::give(block);
                    }
                }
            }
        }
        Ok(())
    }
}
