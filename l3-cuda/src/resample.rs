//! Host side of a resampled sample batch (random-resized crop, resize then crop, scale jitter): each
//! sample is a [`Geometry`] of its image, made by three kernels in one stream. `l3_samples_u8` decodes
//! every sample's source rectangle (the kept outputs' window plus the filter's margin, so only the patches
//! under it) into an NHWC `u8` intermediate; `l3_resample_h` runs the horizontal pass over its rows;
//! `l3_resample_{u8,f32,f16}` runs the vertical pass (or the nearest pick), and places, mirrors, pads with
//! `fill`, lays out, converts and normalises — writing every element of the batch.
//!
//! The integer tables are `vocab`'s [`Resampling`], the very tables the CPU loader's passes apply, and the
//! kernels compute Pillow's arithmetic on them as the CPU does (`(2^21 + Σ v·w) >> 22`, clamped, per
//! pass, horizontal first), so a batch equals the CPU loader's bit for bit. Channels are converted where
//! the CPU converts them: gray is copied to R, G, B at the decode (channels are resampled independently,
//! so that is the CPU's resample-then-convert); a luma batch takes Pillow's `L` of each pixel as the
//! passes read the intermediate, before resampling (the CPU's convert-then-resample); an RGBA batch
//! resamples an image's alpha like any channel, and gives an image without alpha 255 (not resampled).

use crate::error::Error;
use crate::layout::{SampleOptions, TensorInfo, scale_bias_for};
use vocab::{Geometry, Rect, Resampling, Window};

/// One sample's part of the passes, laid out exactly as `struct ResampleDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct ResampleDesc {
    pub in_offset: u64,
    pub tmp_offset: u64,
    pub in_stride: u32,
    pub tmp_stride: u32,
    pub rx: u32,
    pub ry: u32,
    pub rows: u32,
    pub w: u32,
    pub h: u32,
    pub dx: u32,
    pub dy: u32,
    pub flip: u32,
    pub nearest: u32,
    pub kx: u32,
    pub ky: u32,
    pub x_tab: u32,
    pub y_tab: u32,
    /// Channels per pixel of the intermediate (1, 3 or 4) and of the batch (1, 3 or 4).
    pub in_ch: u8,
    pub out_ch: u8,
    /// 1 when the image has alpha (channel 3 of the intermediate); 0: the batch's alpha is 255.
    pub alpha: u8,
    pub pad: u8,
}

pub(crate) const RESAMPLE_DESC_BYTES: usize = std::mem::size_of::<ResampleDesc>();
const _: () = assert!(RESAMPLE_DESC_BYTES == 80);

/// Threads per block of the two passes.
pub(crate) const RESAMPLE_BLOCK: u32 = 256;

/// The passes of a resampled batch, after the decode into the intermediate.
#[derive(Debug, Clone)]
pub(crate) struct ResampleStage {
    /// The batch the passes write.
    pub tensor: TensorInfo,
    pub descs: Vec<ResampleDesc>,
    /// Every axis's tables, at the descriptors' offsets.
    pub tab: Vec<i32>,
    /// (scale, bias) of the batch's channels.
    pub scale_bias: [f32; 8],
    pub fill: u8,
    /// Rows of the intermediate per sample: the horizontal pass's grid is `n × rows`.
    pub rows: u32,
    /// Bytes of the horizontal pass's output (0 when every sample is nearest).
    pub tmp_len: usize,
}

/// What the decode launch of a resampled batch must produce: each sample's source rectangle, and the
/// intermediate's sample size (the largest rectangle).
pub(crate) struct Sources {
    pub tables: Vec<Resampling>,
    pub windows: Vec<Window>,
    pub size: (u32, u32),
}

impl Sources {
    pub(crate) fn new(geometries: &[Geometry], interpolation: vocab::Interpolation) -> Self {
        // A geometry that resamples nothing is its window, copied (as the CPU loader copies it): the
        // nearest tables of a copy are the identity and read the window alone, where the bilinear ones
        // would read a pixel of margin past it.
        let tables: Vec<Resampling> = geometries
            .iter()
            .map(|g| match g.as_window() {
                Some(_) => Resampling::new(g, vocab::Interpolation::Nearest),
                None => Resampling::new(g, interpolation),
            })
            .collect();
        let rects: Vec<Rect> = tables.iter().map(Resampling::source).collect();
        let size = rects
            .iter()
            .fold((1, 1), |(w, h), r| (w.max(r.w), h.max(r.h)));
        let windows = rects.iter().map(|&r| Window::new(r, 0, 0, false)).collect();
        Sources {
            tables,
            windows,
            size,
        }
    }
}

impl ResampleStage {
    /// The passes that turn the intermediate (`src.size` per sample, NHWC u8 with `in_ch` channels) into
    /// the batch `opts` describes; `alpha[i]`: image `i` has alpha (in the intermediate's channel 3).
    /// Errors name the batch index: a sample whose kept outputs do not fit the sample
    /// ([`Error::BadWindow`]); and for the batch: sizes and tables past the kernel's integers.
    pub(crate) fn new(
        geometries: &[Geometry],
        src: &Sources,
        opts: &SampleOptions,
        in_ch: u8,
        alpha: &[bool],
    ) -> Result<Self, Error> {
        let too_large = |what| Error::TooLarge { what };
        let (sw, sh) = (opts.width, opts.height);
        let n = geometries.len();
        let scale_bias = scale_bias_for(opts.dtype, opts.normalize)?;
        let out_ch = opts.channels;
        let (ci, co) = (u32::from(in_ch), u32::from(out_ch));
        let tensor = TensorInfo::dense(
            opts.layout,
            opts.dtype,
            n,
            sh as usize,
            sw as usize,
            co as usize,
        );
        let (iw, ih) = src.size;
        let kept_w = src
            .tables
            .iter()
            .map(|t| t.size().0)
            .max()
            .unwrap_or(1)
            .max(1);
        let in_sample = u64::from(iw) * u64::from(ih) * u64::from(ci);
        let tmp_sample = u64::from(kept_w) * u64::from(ih) * u64::from(co);
        let mut stage = ResampleStage {
            tensor,
            descs: Vec::with_capacity(n),
            tab: Vec::new(),
            scale_bias,
            fill: opts.fill,
            rows: ih,
            tmp_len: 0,
        };
        let mut any_bilinear = false;
        for (index, (g, t)) in geometries.iter().zip(&src.tables).enumerate() {
            let (w, h) = t.size();
            if u64::from(g.dx) + u64::from(w) > u64::from(sw)
                || u64::from(g.dy) + u64::from(h) > u64::from(sh)
            {
                return Err(Error::BadWindow {
                    index,
                    window: Window::new(Rect::new(0, 0, w, h), g.dx, g.dy, g.flip),
                    what: "sample",
                    width: sw,
                    height: sh,
                });
            }
            let r = src.windows[index].src;
            let mut desc = ResampleDesc {
                in_offset: index as u64 * in_sample,
                tmp_offset: index as u64 * tmp_sample,
                in_stride: iw * ci,
                tmp_stride: kept_w * co,
                rx: r.x,
                ry: r.y,
                rows: r.h,
                w,
                h,
                dx: g.dx,
                dy: g.dy,
                flip: u32::from(g.flip),
                in_ch,
                out_ch,
                alpha: u8::from(out_ch == 4 && alpha.get(index).copied().unwrap_or(false)),
                ..ResampleDesc::default()
            };
            let at = |tab: &Vec<i32>| u32::try_from(tab.len()).map_err(|_| too_large("tables"));
            let int = |v: u32| i32::try_from(v).map_err(|_| too_large("a source index"));
            match t {
                Resampling::Bilinear { x, y } => {
                    any_bilinear = true;
                    for (axis, k, off) in [
                        (x, &mut desc.kx, &mut desc.x_tab),
                        (y, &mut desc.ky, &mut desc.y_tab),
                    ] {
                        *k = axis.ksize as u32;
                        *off = at(&stage.tab)?;
                        for &f in &axis.first {
                            stage.tab.push(int(f)?);
                        }
                        for &n in &axis.taps {
                            stage.tab.push(int(n)?);
                        }
                        stage.tab.extend_from_slice(&axis.weights);
                    }
                }
                Resampling::Nearest { x, y } => {
                    desc.nearest = 1;
                    desc.x_tab = at(&stage.tab)?;
                    for &v in x {
                        stage.tab.push(int(v)?);
                    }
                    desc.y_tab = at(&stage.tab)?;
                    for &v in y {
                        stage.tab.push(int(v)?);
                    }
                }
            }
            stage.descs.push(desc);
        }
        if any_bilinear {
            stage.tmp_len = usize::try_from(tmp_sample * n as u64)
                .map_err(|_| too_large("the horizontal pass's rows exceed the address space"))?;
        }
        u32::try_from(n as u64 * u64::from(ih))
            .ok()
            .and(u32::try_from(n as u64 * u64::from(sh)).ok())
            .ok_or(too_large("more than 2^32 - 1 thread blocks in one pass"))?;
        u32::try_from(u64::from(sw) * u64::from(co))
            .ok()
            .and(u32::try_from(u64::from(iw) * u64::from(ci)).ok())
            .ok_or(too_large("a row exceeds the kernel's strides"))?;
        Ok(stage)
    }

    /// Thread blocks of the horizontal pass (0 when no sample is bilinear).
    pub(crate) fn h_blocks(&self) -> u32 {
        if self.tmp_len == 0 {
            0
        } else {
            self.descs.len() as u32 * self.rows
        }
    }

    /// Thread blocks of the vertical pass.
    pub(crate) fn v_blocks(&self) -> u32 {
        self.descs.len() as u32 * self.tensor.sample_size().1
    }

    /// Kernel argument: 1 for NCHW output.
    pub(crate) fn nchw(&self) -> u32 {
        u32::from(self.tensor.layout == vocab::Layout::Nchw)
    }

    /// The device section of the passes, as the kernels read it: the descriptors, the scale/bias pairs
    /// (8 × f32) and the tables (i32), in that order. Its parts start at
    /// [`sections`](Self::sections).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.byte_len());
        out.extend_from_slice(bytemuck::cast_slice(&self.descs));
        out.extend_from_slice(bytemuck::cast_slice(&self.scale_bias));
        out.extend_from_slice(bytemuck::cast_slice(&self.tab));
        out
    }

    /// Bytes of [`bytes`](Self::bytes).
    pub(crate) fn byte_len(&self) -> usize {
        self.descs.len() * RESAMPLE_DESC_BYTES + 32 + self.tab.len() * 4
    }

    /// Offsets of the scale/bias pairs and of the tables within [`bytes`](Self::bytes).
    pub(crate) fn sections(&self) -> (usize, usize) {
        let sb = self.descs.len() * RESAMPLE_DESC_BYTES;
        (sb, sb + 32)
    }

    /// True when every read of the passes stays inside the intermediate (`inter_len` elements), the
    /// horizontal pass's rows and the tables, and every sample's kept outputs inside the sample.
    pub(crate) fn in_bounds(&self, inter_len: usize) -> bool {
        let (sw, sh) = self.tensor.sample_size();
        let tab = |off: u32, len: u64| u64::from(off) + len <= self.tab.len() as u64;
        self.descs.iter().all(|d| {
            let (ci, co) = (u32::from(d.in_ch), u32::from(d.out_ch));
            let channels_ok = matches!(d.in_ch, 1 | 3 | 4)
                && matches!(d.out_ch, 1 | 3 | 4)
                && (d.out_ch == 1 || d.in_ch >= 3)
                && (d.alpha == 0 || (d.in_ch == 4 && d.out_ch == 4))
                && usize::from(d.out_ch) == self.tensor.channels();
            if !channels_ok {
                return false;
            }
            let placed = u64::from(d.dx) + u64::from(d.w) <= u64::from(sw)
                && u64::from(d.dy) + u64::from(d.h) <= u64::from(sh);
            let rows_in = d.in_offset
                + u64::from(d.rows.max(1) - 1) * u64::from(d.in_stride)
                + u64::from(d.in_stride)
                <= inter_len as u64;
            let (w, h) = (u64::from(d.w), u64::from(d.h));
            let tables = if d.nearest == 1 {
                tab(d.x_tab, w)
                    && tab(d.y_tab, h)
                    && self.tab[d.x_tab as usize..][..d.w as usize]
                        .iter()
                        .all(|&v| {
                            v >= d.rx as i32
                                && (u64::from(v as u32 - d.rx) * u64::from(ci))
                                    < u64::from(d.in_stride)
                        })
                    && self.tab[d.y_tab as usize..][..d.h as usize]
                        .iter()
                        .all(|&v| v >= d.ry as i32 && (v as u32 - d.ry) < d.rows)
            } else {
                let axis_ok = |off: u32, len: u32, k: u32, lo: u32, end: u64| {
                    let (len, k) = (u64::from(len), u64::from(k));
                    tab(off, 2 * len + len * k)
                        && (0..len as usize).all(|j| {
                            let f = self.tab[off as usize + j];
                            let t = self.tab[off as usize + len as usize + j];
                            f >= lo as i32
                                && (0..=k as i32).contains(&t)
                                && u64::from(f as u32 - lo) + t as u64 <= end
                        })
                };
                axis_ok(d.x_tab, d.w, d.kx, d.rx, u64::from(d.in_stride / ci))
                    && axis_ok(d.y_tab, d.h, d.ky, d.ry, u64::from(d.rows))
                    && d.tmp_offset + u64::from(d.rows) * u64::from(d.tmp_stride)
                        <= self.tmp_len as u64
                    && w * u64::from(co) <= u64::from(d.tmp_stride)
            };
            placed && rows_in && tables
        })
    }
}
