//! [`V2Plan`]: what a device (GPU) decoder needs from a version-2 file, validated on the host.

use super::ans::{self, AnsTables};
use super::container::{Layout, entry_range, tables_end};
use super::front;
use crate::error::Error;
use crate::format::{HEADER_LEN, Profile};
use crate::geometry::Geometry;
use std::ops::Range;
use vocab::Rect;

/// What a device (GPU) decoder needs from a version-2 file, validated on the host: the grid, each
/// offset-table entry's bytes, and for ANS the frequency tables (with [`AnsTables::cum`] to upload). See
/// SPEC.md §2.8 for the schedule a kernel follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Plan {
    pub profile: Profile,
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub patch_size: u8,
    pub patches_x: u32,
    pub patches_y: u32,
    /// File byte range of every offset-table entry: BP has `channels · P` of them, plane-major
    /// ((plane p, patch i) at p·P + i, planes G, R−G, B−G, A); ANS has one chunk per patch.
    pub entries: Vec<Range<u32>>,
    /// The ANS frequency tables (`None` for BP).
    pub tables: Option<AnsTables>,
}

impl V2Plan {
    pub(crate) fn new(g: &Geometry, l: &Layout, prefix: &[u8]) -> Result<V2Plan, Error> {
        let entries = (0..l.entries)
            .map(|i| {
                let r = entry_range(l, prefix, i);
                r.start as u32..r.end as u32
            })
            .collect();
        let tables = match l.profile {
            Profile::Bp => None,
            Profile::Ans => Some(tables_end(g, &prefix[HEADER_LEN..l.offsets_at])?.0),
        };
        Ok(V2Plan {
            profile: l.profile,
            width: g.width,
            height: g.height,
            channels: g.channels,
            patch_size: g.patch_size,
            patches_x: g.patches_x,
            patches_y: g.patches_y,
            entries,
            tables,
        })
    }

    /// Patches per plane (P).
    pub fn patches(&self) -> usize {
        self.patches_x as usize * self.patches_y as usize
    }

    /// Rectangle of patch `patch` (raster order); `None` past the last patch.
    pub fn patch_rect(&self, patch: usize) -> Option<Rect> {
        if patch >= self.patches() {
            return None;
        }
        let n = u32::from(self.patch_size);
        let (x, y) = (
            (patch % self.patches_x as usize) as u32 * n,
            (patch / self.patches_x as usize) as u32 * n,
        );
        Some(Rect::new(
            x,
            y,
            n.min(self.width - x),
            n.min(self.height - y),
        ))
    }

    /// The bytes of plane `plane` of patch `patch` (BP), or of patch `patch`'s chunk (ANS, any plane).
    pub fn entry(&self, plane: usize, patch: usize) -> Option<Range<u32>> {
        let i = match self.profile {
            Profile::Bp => plane.checked_mul(self.patches())?.checked_add(patch)?,
            Profile::Ans => patch,
        };
        if plane >= self.channels as usize || patch >= self.patches() {
            return None;
        }
        self.entries.get(i).cloned()
    }

    /// rANS steps of a `pw`×`ph` patch chunk with `channels` planes: per plane, ⌈(ph−1)·⌈pw/32⌉ / 32⌉ for
    /// the selectors plus ph·⌈pw/32⌉ for the rows (1,584 at N = 128, RGB).
    pub fn ans_steps(pw: usize, ph: usize, channels: usize) -> usize {
        let runs = front::runs(pw);
        channels * (((ph - 1) * runs).div_ceil(ans::LANES) + ph * pw.div_ceil(ans::LANES))
    }
}
