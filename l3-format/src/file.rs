//! [`L3File`]: a whole file in memory as a validated zero-copy view (the header through `Geometry::parse`,
//! then version 1's offset table or version 2's container), and its decoders, each handing the work to the
//! file's version (`v1/`, `v2/`).

use crate::error::{Error, Limits, ParseOptions};
use crate::format::{Format, HEADER_LEN, Profile};
use crate::geometry::{Geometry, u32_at};
use crate::pixel_layout::PixelLayout;
use crate::region;
use crate::v1::{self, container::V1};
use crate::v2::{self, AnsTables, V2Plan, container::Layout, decode::V2};
use std::ops::Range;
use vocab::Rect;

/// A parsed L3 file (version 1 or 2) borrowing its bytes. Construction validates everything the decoder
/// relies on (and, for version 2, the CRC-32C unless told otherwise), so the accessors below cannot fail and
/// decoding only has to check the inside of each patch.
#[derive(Debug, Clone, Copy)]
pub struct L3File<'a> {
    geometry: Geometry,
    bytes: &'a [u8],
    kind: Kind,
}

/// Where the parts of the file are.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Version 1: the offset table ends (and the patch data starts) at `data_start`.
    V1 {
        data_start: usize,
    },
    V2(Layout),
}

/// A file as its version's decoders see it (made from [`Kind`] when needed).
enum View<'a> {
    V1(V1<'a>),
    V2(V2<'a>),
}

impl<'a> L3File<'a> {
    /// Parses and validates with the default [`ParseOptions`] (default [`Limits`], CRC verified).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        Self::parse_with(bytes, &ParseOptions::default())
    }

    /// [`parse`](Self::parse) with other limits (the CRC of a version-2 file is verified).
    pub fn parse_with_limits(bytes: &'a [u8], limits: &Limits) -> Result<Self, Error> {
        Self::parse_with(
            bytes,
            &ParseOptions {
                limits: *limits,
                verify_crc: true,
            },
        )
    }

    /// Parses and validates a file of either version: magic, version, dimensions against the limits,
    /// channels, bit depth, patch size, reserved bytes; then
    /// - version 1: every offset (first is 0, non-decreasing, within the data, room for each row's 2-byte
    ///   minimum);
    /// - version 2: the profile, the ANS frequency tables (each used one sums to 4096), every offset (the
    ///   first right after the table — or after the entry CRCs —, non-decreasing, before the CRC, room for
    ///   each entry's minimum), and unless `opts.verify_crc` is false every checksum: the whole file's
    ///   CRC-32C and, where the file has them, its prefix's and every entry's (one pass),
    ///
    /// all before any patch data is read.
    pub fn parse_with(bytes: &'a [u8], opts: &ParseOptions) -> Result<Self, Error> {
        let geometry = Geometry::parse(bytes, &opts.limits)?;
        if geometry.version == 2 {
            let layout = v2::container::layout(&geometry, bytes, bytes.len() as u64, false);
            let layout = match (layout, opts.verify_crc) {
                (Ok(l), true) => {
                    v2::container::verify_file(&geometry, &l, bytes)?;
                    l
                }
                (Ok(l), false) => l,
                // Damage anywhere is reported as damage, whatever part of the container it broke.
                (Err(e), true) => {
                    v2::container::verify_crc(bytes)?;
                    return Err(e);
                }
                (Err(e), false) => return Err(e),
            };
            return Ok(L3File {
                geometry,
                bytes,
                kind: Kind::V2(layout),
            });
        }
        let data_start = v1::container::data_offset(&geometry);
        if bytes.len() < data_start {
            return Err(Error::Truncated {
                what: "offset table",
                needed: data_start,
                len: bytes.len(),
            });
        }
        let table = &bytes[HEADER_LEN..data_start];
        let data_len = (bytes.len() - data_start) as u64;
        v1::container::validate_offsets(&geometry, |i| u32_at(table, 4 * i), data_len)?;
        Ok(L3File {
            geometry,
            bytes,
            kind: Kind::V1 { data_start },
        })
    }

    /// Whether this is a version-2 file with a CRC-32C per offset-table entry (SPEC.md §2.11), which
    /// [`parse`](Self::parse) verified.
    pub fn has_entry_crcs(&self) -> bool {
        self.geometry.entry_crcs
    }

    /// The host-side plan of a version-2 file for a device decoder (`None` for version 1).
    pub fn v2_plan(&self) -> Option<V2Plan> {
        match self.kind {
            Kind::V1 { .. } => None,
            // Everything was validated by parse, so building the plan cannot fail.
            Kind::V2(l) => V2Plan::new(&self.geometry, &l, self.bytes).ok(),
        }
    }

    /// The frequency tables of a v2-ANS file (`None` for v1 and v2-BP), parsed again from the bytes that
    /// [`parse`](Self::parse) validated.
    pub fn ans_tables(&self) -> Option<AnsTables> {
        self.v2()?.tables()
    }

    /// The format version in the header: 1 or 2.
    pub fn version(&self) -> u16 {
        self.geometry.version
    }

    /// The v2 profile, `None` for version 1.
    pub fn profile(&self) -> Option<Profile> {
        self.geometry.profile
    }

    /// Version and profile together.
    pub fn format(&self) -> Format {
        match self.geometry.profile {
            None => Format::V1,
            Some(p) => Format::V2(p),
        }
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn width(&self) -> u32 {
        self.geometry.width
    }
    pub fn height(&self) -> u32 {
        self.geometry.height
    }
    pub fn channels(&self) -> u8 {
        self.geometry.channels
    }
    pub fn patch_size(&self) -> u8 {
        self.geometry.patch_size
    }
    /// Patches per row of the grid: ⌈W / N⌉.
    pub fn patches_x(&self) -> u32 {
        self.geometry.patches_x
    }
    /// Rows of patches: ⌈H / N⌉.
    pub fn patches_y(&self) -> u32 {
        self.geometry.patches_y
    }
    pub fn patches_per_channel(&self) -> usize {
        self.geometry.patches_per_channel()
    }

    /// Rectangle of patch `patch` (row-major over the grid). Panics if `patch >= patches_per_channel()`.
    pub fn patch_rect(&self, patch: usize) -> Rect {
        assert!(
            patch < self.patches_per_channel(),
            "patch index out of range"
        );
        self.geometry.patch_rect(patch)
    }

    /// The patch data: every byte after the header, the tables and the offset table, up to the end of the
    /// file (v1) or to the CRC (v2). Its length is what `l3 info` reports as "patch data bytes".
    pub fn patch_data(&self) -> &'a [u8] {
        match self.kind {
            Kind::V1 { data_start } => &self.bytes[data_start..],
            Kind::V2(l) => &self.bytes[l.data_start..l.data_end],
        }
    }

    /// Byte range of one patch within [`patch_data`](Self::patch_data): the patch of one channel (v1, and
    /// v2-BP where it is one plane of the colour-transformed image: G, R−G, B−G, A), or for v2-ANS the
    /// chunk of patch `patch`, which holds every channel (so the same range for every `channel`). Panics on
    /// an out-of-range index.
    pub fn patch_range(&self, channel: usize, patch: usize) -> Range<usize> {
        assert!(
            channel < self.channels() as usize && patch < self.patches_per_channel(),
            "patch index out of range"
        );
        match self.view() {
            View::V1(v) => v.entry_range(channel * self.patches_per_channel() + patch),
            View::V2(V2 { l, .. }) => {
                let i = match l.profile {
                    Profile::Bp => channel * self.patches_per_channel() + patch,
                    Profile::Ans => patch,
                };
                let r = v2::container::entry_range(&l, self.bytes, i);
                r.start - l.data_start..r.end - l.data_start
            }
        }
    }

    /// The bytes of one patch (validated to lie inside the file); see [`patch_range`](Self::patch_range).
    pub fn patch_bytes(&self, channel: usize, patch: usize) -> &'a [u8] {
        &self.patch_data()[self.patch_range(channel, patch)]
    }

    /// Bytes of the decoded image: width × height × channels.
    pub fn decoded_len(&self) -> usize {
        self.width() as usize * self.height() as usize * self.channels() as usize
    }

    /// Offset of the patch data from the start of the file (header, tables and offset table).
    pub fn data_offset(&self) -> usize {
        match self.kind {
            Kind::V1 { data_start } => data_start,
            Kind::V2(l) => l.data_start,
        }
    }

    /// Checks every patch's rows the way a decode would, without writing pixels anywhere: version 1 walks
    /// each patch's row headers ([`crate::patch_rows_len`]: 2 bytes a row) and requires its rows to fill
    /// its offset-table entry exactly; version 2 has no such cheap walk (an ANS symbol depends on every
    /// one before it), so the file is decoded into scratch memory. What passes is exactly what the
    /// decoders accept: a device decoder that cannot report which row failed is checked by this first.
    pub fn check_rows(&self) -> Result<(), Error> {
        if self.version() >= 2 {
            let mut px = vec![0u8; self.decoded_len()];
            return self.decode_chw(&mut px);
        }
        for channel in 0..self.channels() as usize {
            for patch in 0..self.patches_per_channel() {
                let rect = self.patch_rect(patch);
                let bytes = self.patch_bytes(channel, patch);
                let at = Some(crate::PatchId { channel, patch });
                let used = v1::patch_rows_len(bytes, rect.w as usize, rect.h as usize, at)?;
                if used != bytes.len() {
                    return Err(Error::TrailingPatchBytes {
                        patch: at,
                        unused: bytes.len() - used,
                    });
                }
            }
        }
        Ok(())
    }

    /// Decodes into `out` (exactly `decoded_len()` bytes) as interleaved rows: `out[(y*W + x)*C + c]`.
    pub fn decode_hwc(&self, out: &mut [u8]) -> Result<(), Error> {
        self.decode(out, false, 1)
    }

    /// Decodes into `out` (exactly `decoded_len()` bytes) as planes: `out[(c*H + y)*W + x]`.
    pub fn decode_chw(&self, out: &mut [u8]) -> Result<(), Error> {
        self.decode(out, true, 1)
    }

    /// [`decode_hwc`](Self::decode_hwc) with rows of patches spread over `threads` threads (0 = every core).
    pub fn decode_hwc_parallel(&self, out: &mut [u8], threads: usize) -> Result<(), Error> {
        self.decode(out, false, threads)
    }

    /// [`decode_chw`](Self::decode_chw) with (channel, row of patches) bands spread over `threads` threads.
    pub fn decode_chw_parallel(&self, out: &mut [u8], threads: usize) -> Result<(), Error> {
        self.decode(out, true, threads)
    }

    /// Decodes only `region` into `out` at `layout`'s strides, touching only the patches under it. The
    /// pixels equal the same rectangle of a whole-image decode.
    pub fn decode_region(
        &self,
        region: Rect,
        out: &mut [u8],
        layout: PixelLayout,
    ) -> Result<(), Error> {
        let tables = self.ans_tables();
        region::decode(&self.geometry, tables.as_ref(), region, out, layout, |i| {
            Ok(self.entry(i))
        })
    }
}

/// Handing the work to the file's version.
impl<'a> L3File<'a> {
    /// The file as its version's decoders see it.
    fn view(&self) -> View<'a> {
        match self.kind {
            Kind::V1 { data_start } => View::V1(V1::new(self.geometry, self.bytes, data_start)),
            Kind::V2(l) => View::V2(V2 {
                g: self.geometry,
                l,
                bytes: self.bytes,
            }),
        }
    }

    /// Version 1's view of this file, `None` for version 2.
    #[cfg(test)]
    pub(crate) fn v1(&self) -> Option<V1<'a>> {
        match self.view() {
            View::V1(v) => Some(v),
            View::V2(_) => None,
        }
    }

    /// Version 2's view of this file, `None` for version 1.
    pub(crate) fn v2(&self) -> Option<V2<'a>> {
        match self.view() {
            View::V1(_) => None,
            View::V2(v) => Some(v),
        }
    }

    /// The bytes of offset-table entry `i` (v1: (channel, patch); v2-BP: (plane, patch); v2-ANS: the chunk
    /// of patch i).
    fn entry(&self, i: usize) -> &'a [u8] {
        match self.view() {
            View::V1(v) => v.entry(i),
            View::V2(v) => v.entry(i),
        }
    }

    /// The whole image, HWC or CHW (`planar`), on `threads` threads (1 = this one only, 0 = every core).
    fn decode(&self, out: &mut [u8], planar: bool, threads: usize) -> Result<(), Error> {
        if out.len() != self.decoded_len() {
            return Err(Error::BufferSize {
                expected: self.decoded_len(),
                got: out.len(),
            });
        }
        match self.view() {
            View::V1(v) => v.whole(out, planar, threads),
            View::V2(v) => v.whole(out, planar, threads),
        }
    }
}
