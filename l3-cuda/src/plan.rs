//! Host side of a batch, with no GPU involved: parse and validate every image with `l3-format`, lay the
//! images out in the output tensor, and build the patch-descriptor table the kernel reads. A corrupt image
//! is rejected here, with its batch index, before anything is copied or launched.

use crate::error::Error;
use crate::layout::{STAGE_CAP, TensorInfo, block_dim, scale_bias_for};
use crate::v2::{V2Batch, V2Desc};
use l3_format::L3File;
use std::ops::Range;
use vocab::{DType, Layout, Normalize};

/// How a batch is decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    pub layout: Layout,
    pub dtype: DType,
    /// Only for the float types; float batches without it hold pixel / 255.
    pub normalize: Option<Normalize>,
    /// Walk every patch's row headers on the host before the launch, so corrupt row data is rejected with
    /// its batch index before any GPU work. Off by default: the walk costs host time in the hot path, and
    /// the kernel bounds every read by the patch's range anyway and reports a corrupt patch after the decode
    /// ([`Error::CorruptRows`], [`Error::CorruptPatch`]). For a version-2 image the check is a whole decode
    /// on the host (its CRC-32C, verified by the parse, already catches damaged bytes).
    pub check_rows_on_host: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            layout: Layout::Nchw,
            dtype: DType::U8,
            normalize: None,
            check_rows_on_host: false,
        }
    }
}

/// Where one image of the batch landed in the output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSlot {
    /// First output element of the image.
    pub offset: usize,
    pub width: u32,
    pub height: u32,
    pub channels: u8,
}

impl ImageSlot {
    /// Output elements of the image: width × height × channels.
    pub fn len(&self) -> usize {
        self.width as usize * self.height as usize * self.channels as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One patch of one channel of one image: the kernel's unit of work (one thread block).
/// Serialised by [`BatchPlan::descriptor_bytes`] exactly as `struct PatchDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct PatchDesc {
    pub data_offset: u64,
    pub out_offset: u64,
    pub data_len: u32,
    pub row_stride: u32,
    pub pixel_stride: u32,
    pub w: u16,
    pub h: u16,
    pub channel: u32,
    pub pad: u32,
}

/// Size of one [`PatchDesc`] (kernel.cu's struct, 8-byte aligned).
pub(crate) const DESC_BYTES: usize = std::mem::size_of::<PatchDesc>();
const _: () = assert!(DESC_BYTES == 40);

/// A validated batch, ready to copy and launch: the output layout of every image and the patch table.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) descs: Vec<PatchDesc>,
    /// Per image: the first descriptor and the patches per channel (to name a failing patch).
    pub(crate) first_desc: Vec<(usize, usize)>,
    pub(crate) images: Vec<ImageSlot>,
    /// Per image: its patch data within its file bytes, and where that lands in the packed input.
    pub(crate) sources: Vec<(Range<usize>, usize)>,
    pub(crate) data_len: usize,
    pub(crate) out_len: usize,
    pub(crate) block_dim: u32,
    pub(crate) stage_cap: u32,
    /// (scale, bias) for channels 0..4.
    pub(crate) scale_bias: [f32; 8],
    /// The version-2 images' patches (one descriptor per patch, every plane), decoded by the blocks after
    /// the version-1 ones in the same launch.
    pub(crate) v2: V2Batch,
}

impl BatchPlan {
    /// Parses and validates every image (with [`l3_format::L3File::parse`]) and plans the batch. Images may
    /// differ in size, channel count and patch size; each gets its own offset in the output, in batch order.
    pub fn new(images: &[&[u8]], opts: &DecodeOptions) -> Result<Self, Error> {
        Self::build(images, opts, None)
    }

    /// Plans images that already lie back to back in one buffer (a [`crate::PinnedBatch`]): image i starts
    /// at byte `starts[i]`, and the descriptors point into that buffer as it is, so nothing is packed.
    pub(crate) fn new_in_place(
        images: &[&[u8]],
        starts: &[usize],
        total: usize,
        opts: &DecodeOptions,
    ) -> Result<Self, Error> {
        let mut plan = Self::build(images, opts, Some(starts))?;
        plan.sources.clear();
        plan.data_len = total;
        Ok(plan)
    }

    fn build(
        images: &[&[u8]],
        opts: &DecodeOptions,
        in_place: Option<&[usize]>,
    ) -> Result<Self, Error> {
        if images.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let scale_bias = scale_bias_for(opts.dtype, opts.normalize)?;
        let mut plan = BatchPlan {
            layout: opts.layout,
            dtype: opts.dtype,
            descs: Vec::new(),
            first_desc: Vec::with_capacity(images.len()),
            images: Vec::with_capacity(images.len()),
            sources: Vec::with_capacity(images.len()),
            data_len: 0,
            out_len: 0,
            block_dim: 32,
            stage_cap: 0,
            scale_bias,
            v2: V2Batch::default(),
        };
        let mut max_w = 1u32;
        let mut max_len = 0u32;
        // Fixed-size fast path: images shaped like the previous one reuse its descriptor geometry and only
        // shift the data and output offsets.
        let mut template: Option<(ShapeKey, usize, usize, usize)> = None; // (shape, first desc, data start, out start)
        for (index, bytes) in images.iter().enumerate() {
            let file = L3File::parse(bytes).map_err(|source| Error::Image { index, source })?;
            if opts.check_rows_on_host {
                file.check_rows()
                    .map_err(|source| Error::Image { index, source })?;
            }
            let data = file.patch_data();
            if data.len() > u32::MAX as usize {
                return Err(Error::TooLarge {
                    what: "an image's patch data exceeds 4 GiB",
                });
            }
            let slot = ImageSlot {
                offset: plan.out_len,
                width: file.width(),
                height: file.height(),
                channels: file.channels(),
            };
            let key = ShapeKey::of(&file);
            let first = plan.descs.len();
            // Where this image's patch data lies in the device input: packed back to back, or inside its
            // whole file where the file was placed.
            let data_start = match in_place {
                Some(starts) => starts[index] + file.data_offset(),
                None => plan.data_len,
            };
            match template {
                _ if file.version() == 2 => {
                    push_v2_descs(&mut plan.v2, index, &file, &slot, data_start, opts.layout)?;
                }
                Some((k, t_first, t_data, t_out)) if k == key => {
                    let n = key.descs();
                    plan.descs.extend_from_within(t_first..t_first + n);
                    let ppc = file.patches_per_channel();
                    for (i, d) in plan.descs[first..].iter_mut().enumerate() {
                        let r = file.patch_range(i / ppc, i % ppc);
                        d.data_offset = (data_start + r.start) as u64;
                        d.data_len = r.len() as u32;
                        d.out_offset = d.out_offset - t_out as u64 + slot.offset as u64;
                        max_len = max_len.max(d.data_len);
                    }
                    let _ = t_data;
                }
                _ => {
                    push_descs(
                        &mut plan.descs,
                        &file,
                        &slot,
                        data_start,
                        opts.layout,
                        &mut max_len,
                    )?;
                    template = Some((key, first, data_start, slot.offset));
                }
            }
            if file.version() == 1 {
                max_w = max_w.max((file.patch_size() as u32).min(file.width()));
            }
            plan.first_desc.push((first, file.patches_per_channel()));
            // Everything after the prefix (a version-2 file's CRC too: four bytes, and the plan can check
            // that a file is the one it was built from by its length).
            plan.sources
                .push((file.data_offset()..bytes.len(), plan.data_len));
            plan.data_len += bytes.len() - file.data_offset();
            plan.out_len = plan
                .out_len
                .checked_add(slot.len())
                .ok_or(Error::TooLarge {
                    what: "output size overflows",
                })?;
            plan.images.push(slot);
        }
        if plan.descs.len() + plan.v2.descs.len() > i32::MAX as usize {
            return Err(Error::TooLarge {
                what: "more than 2^31 - 1 patches in one launch",
            });
        }
        plan.block_dim = block_dim(max_w);
        plan.stage_cap = max_len.min(STAGE_CAP);
        Ok(plan)
    }

    /// Where each image lands in the output, in batch order.
    pub fn images(&self) -> &[ImageSlot] {
        &self.images
    }

    /// Output elements of the whole batch.
    pub fn output_len(&self) -> usize {
        self.out_len
    }

    /// Bytes of compressed patch data copied to the device for this batch.
    pub fn input_len(&self) -> usize {
        self.data_len
    }

    /// Patch descriptors of the batch's launches: one per (channel, patch) of a version-1 image, one per
    /// patch of a version-2 image.
    pub fn patch_count(&self) -> usize {
        self.descs.len() + self.v2.descs.len()
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// True when every image has the same width, height and channels (a dense `[N, ...]` tensor).
    pub fn is_uniform(&self) -> bool {
        let s = &self.images[0];
        self.images
            .iter()
            .all(|i| (i.width, i.height, i.channels) == (s.width, s.height, s.channels))
    }

    /// The batch as one dense tensor (`[n, h, w, c]` or `[n, c, h, w]`) when every image has the same
    /// width, height and channels; `None` otherwise.
    pub fn tensor(&self) -> Option<TensorInfo> {
        let s = self.images[0];
        self.is_uniform().then(|| {
            TensorInfo::dense(
                self.layout,
                self.dtype,
                self.images.len(),
                s.height as usize,
                s.width as usize,
                s.channels as usize,
            )
        })
    }

    /// True when every descriptor reads inside the device input and writes inside the output: the
    /// property that makes the launch memory-safe whatever the patch bytes hold. Checked by the tests and
    /// the fuzz target on every plan they build.
    #[doc(hidden)]
    pub fn descriptors_in_bounds(&self) -> bool {
        let out_len = self.out_len as u64;
        let v2_ok = self.v2.in_bounds(self.data_len, |_, (lo, hi)| {
            lo >= 0 && hi < i128::from(out_len)
        });
        v2_ok
            && self.descs.iter().all(|d| {
                let (w, h) = (d.w as u64, d.h as u64);
                (1..=255).contains(&w)
                    && (1..=255).contains(&h)
                    && d.data_offset + d.data_len as u64 <= self.data_len as u64
                    && d.out_offset
                        + (h - 1) * (d.row_stride as u64)
                        + (w - 1) * (d.pixel_stride as u64)
                        < out_len
                    && d.channel < 4
            })
    }

    /// Copies every image's patch data, back to back, into `dst` (at least [`input_len`](Self::input_len)
    /// bytes): the device input the descriptors point into. `images` must be the slice the plan was built from.
    /// One thread, in order: what the tests hold [`stage_into`](Self::stage_into) to.
    #[cfg(test)]
    pub(crate) fn pack_into(&self, images: &[&[u8]], dst: &mut [u8]) {
        for ((src, at), bytes) in self.sources.iter().zip(images) {
            dst[*at..*at + src.len()].copy_from_slice(&bytes[src.clone()]);
        }
    }

    /// Whether `images` are (by count and size) the files this packed plan was built from.
    pub(crate) fn built_from(&self, images: &[&[u8]]) -> bool {
        self.sources.len() == images.len()
            && self
                .sources
                .iter()
                .zip(images)
                .all(|((r, _), b)| r.end == b.len())
    }

    /// The descriptor table as the kernel reads it (`struct PatchDesc`).
    pub(crate) fn descriptor_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.descs)
    }

    /// The kernel's error word (the lowest failing descriptor, or u32::MAX) as an error naming the image.
    pub(crate) fn kernel_error(&self, err: u32) -> Result<(), Error> {
        if err == u32::MAX {
            return Ok(());
        }
        let d = err as usize;
        if d >= self.descs.len() {
            return Err(self
                .v2
                .kernel_error(d - self.descs.len())
                .unwrap_or(Error::Driver {
                    call: "l3_decode",
                    message: format!("the kernel reported block {err} of {}", self.patch_count()),
                }));
        }
        let index = self.first_desc.partition_point(|&(first, _)| first <= d) - 1;
        let (first, ppc) = self.first_desc[index];
        Err(Error::CorruptRows {
            index,
            channel: (d - first) / ppc,
            patch: (d - first) % ppc,
        })
    }

    /// Dynamic shared memory per block: none. The v1 kernel keeps a patch's rows in registers and reads
    /// its bytes through L1, so `stage_cap` is passed but no longer staged.
    pub(crate) fn shared_bytes(&self) -> u32 {
        0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ShapeKey {
    w: u32,
    h: u32,
    c: u8,
    n: u8,
}

impl ShapeKey {
    fn of(f: &L3File<'_>) -> Self {
        ShapeKey {
            w: f.width(),
            h: f.height(),
            c: f.channels(),
            n: f.patch_size(),
        }
    }
    fn descs(&self) -> usize {
        let n = self.n as usize;
        (self.w as usize).div_ceil(n) * (self.h as usize).div_ceil(n) * self.c as usize
    }
}

fn push_descs(
    descs: &mut Vec<PatchDesc>,
    file: &L3File<'_>,
    slot: &ImageSlot,
    data_start: usize,
    layout: Layout,
    max_len: &mut u32,
) -> Result<(), Error> {
    let (w, h, c) = (slot.width as u64, slot.height as u64, slot.channels as u64);
    let too_large = Error::TooLarge {
        what: "an output row stride exceeds u32",
    };
    let (row_stride, pixel_stride) = match layout {
        Layout::Nhwc => (u32::try_from(w * c).map_err(|_| too_large)?, c as u32),
        Layout::Nchw => (u32::try_from(w).map_err(|_| too_large)?, 1),
    };
    let ppc = file.patches_per_channel();
    for ch in 0..c as usize {
        for p in 0..ppc {
            let rect = file.patch_rect(p);
            let r = file.patch_range(ch, p);
            let (x, y) = (rect.x as u64, rect.y as u64);
            let pixel = match layout {
                Layout::Nhwc => (y * w + x) * c + ch as u64,
                Layout::Nchw => ch as u64 * w * h + y * w + x,
            };
            *max_len = (*max_len).max(r.len() as u32);
            descs.push(PatchDesc {
                data_offset: (data_start + r.start) as u64,
                out_offset: slot.offset as u64 + pixel,
                data_len: r.len() as u32,
                row_stride,
                pixel_stride,
                w: rect.w as u16,
                h: rect.h as u16,
                channel: ch as u32,
                pad: 0,
            });
        }
    }
    Ok(())
}

/// One descriptor per patch of a version-2 image (every plane: the block inverts the colour transform),
/// writing every pixel of every channel into the image's slot.
fn push_v2_descs(
    v2: &mut V2Batch,
    index: usize,
    file: &L3File<'_>,
    slot: &ImageSlot,
    data_start: usize,
    layout: Layout,
) -> Result<(), Error> {
    let (w, h, c) = (slot.width as u64, slot.height as u64, slot.channels);
    let too_large = |_| Error::TooLarge {
        what: "an output row or plane exceeds the kernel's strides",
    };
    let (row_stride, col_stride, chan_stride) = match layout {
        Layout::Nhwc => (w * u64::from(c), u64::from(c), 1),
        Layout::Nchw => (w, 1, w * h),
    };
    let row_stride = i32::try_from(row_stride).map_err(too_large)?;
    let chan_stride = u32::try_from(chan_stride).map_err(too_large)?;
    let profile = file.profile().unwrap_or(l3_format::Profile::Bp);
    let (table_offset, buckets) = match file.ans_tables() {
        Some(t) => v2.add_tables(&t)?,
        None => (0, 0),
    };
    for p in 0..file.patches_per_channel() {
        let rect = file.patch_rect(p);
        let (pw, ph) = (rect.w as u16, rect.h as u16);
        let mut d = V2Desc {
            out_offset: slot.offset as u64
                + match layout {
                    Layout::Nhwc => (u64::from(rect.y) * w + u64::from(rect.x)) * u64::from(c),
                    Layout::Nchw => u64::from(rect.y) * w + u64::from(rect.x),
                },
            table_offset,
            buckets,
            row_stride,
            col_stride: col_stride as i32,
            chan_stride,
            pw,
            ph,
            rows: ph,
            skip: 0,
            col0: 0,
            col1: pw,
            planes: c,
            decoded: c,
            profile: profile.byte(),
            out_channels: c,
            exact: 1,
            ..V2Desc::default()
        };
        for e in 0..d.entries() {
            let r = file.patch_range(e, p);
            d.off[e] = (data_start + r.start) as u64;
            d.len[e] = r.len() as u32;
        }
        if profile == l3_format::Profile::Ans {
            d.scratch_offset = v2.reserve_scratch(c, pw, ph);
        }
        v2.descs.push(d);
        v2.ids.push((index as u32, p as u32));
    }
    Ok(())
}
