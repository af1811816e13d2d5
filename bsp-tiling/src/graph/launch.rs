//! The host half of the graph ops' device kernels (`kernels.cu`): operation codes, the cuBLAS GEMMs of
//! convolutions in column-major terms, and the 32-bit tables the kernels read. No CUDA here: the CUDA
//! backend launches with exactly these, and the CPU simulation of the kernels (tests/kernel_sim.rs)
//! checks them against [`ops::compute`](super::ops::compute).

use super::ops::{BinOp, ConvOp, Unary};
use crate::error::{Error, Result};
use crate::field::Part;
use crate::stats::ChannelStats;

/// `bsp_unary`'s `kind` and its two scalar parameters.
pub fn unary_code(u: &Unary) -> (i32, f32, f32) {
    match *u {
        Unary::Relu => (0, 0.0, 0.0),
        Unary::LeakyRelu(a) => (1, a, 0.0),
        Unary::PRelu(_) => (2, 0.0, 0.0),
        Unary::Sigmoid => (3, 0.0, 0.0),
        Unary::Tanh => (4, 0.0, 0.0),
        Unary::Clip(lo, hi) => (5, lo, hi),
        Unary::Softplus => (6, 0.0, 0.0),
        Unary::Mish => (7, 0.0, 0.0),
        Unary::HardSigmoid(a, b) => (8, a, b),
        Unary::HardSwish => (9, 0.0, 0.0),
        Unary::Elu(a) => (10, a, 0.0),
        Unary::Erf => (11, 0.0, 0.0),
        Unary::Gelu { tanh: false } => (12, 0.0, 0.0),
        Unary::Gelu { tanh: true } => (13, 0.0, 0.0),
        Unary::Neg => (14, 0.0, 0.0),
        Unary::Abs => (15, 0.0, 0.0),
        Unary::Exp => (16, 0.0, 0.0),
        Unary::Sqrt => (17, 0.0, 0.0),
    }
}

/// `bsp_binary`'s `op`.
pub fn binop_code(op: BinOp) -> i32 {
    match op {
        BinOp::Add => 0,
        BinOp::Sub => 1,
        BinOp::Mul => 2,
        BinOp::Div => 3,
        BinOp::Max => 4,
        BinOp::Min => 5,
        BinOp::Pow => 6,
    }
}

/// One cuBLAS GEMM in column-major terms, `C[m × n] = A[m × k] · op(B) + beta·C` (op(B) = Bᵀ when
/// `trans_b`), with each operand's first element at its offset (in elements) into its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    pub trans_b: bool,
    pub a_offset: usize,
    pub b_offset: usize,
    pub c_offset: usize,
    /// 1: accumulate onto C (a convolution's bias fill); 0: overwrite.
    pub beta: f32,
}

pub fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::Device(format!("{what} ({v}) is beyond the kernels' 32-bit range")))
}

/// Group `g`'s GEMM for output rows `y0..y1` of a graph convolution producing `ho × wo`: the band's
/// im2col columns (`[cg·kh·kw, pixels]` row-major, A with lda = pixels) times the group's weights
/// (`[og, cg·kh·kw]` row-major, B with ldb = cg·kh·kw) onto the group's output planes from the band's
/// first pixel (ldc = ho·wo) — ops.rs `conv`'s `out = W · col` per band and group.
pub fn conv_gemm(c: &ConvOp, g: usize, ho: usize, wo: usize, y0: usize, y1: usize) -> Result<Gemm> {
    let cg = c.cin / c.groups;
    let og = c.cout / c.groups;
    let kk = cg * c.win[0].k * c.win[1].k;
    let pixels = (y1 - y0) * wo;
    i32_of(pixels * kk, "an im2col band's elements")?;
    Ok(Gemm {
        m: i32_of(pixels, "a band's pixels")?,
        n: i32_of(og, "channels")?,
        k: i32_of(kk, "columns")?,
        lda: i32_of(pixels, "a band's pixels")?,
        ldb: i32_of(kk, "columns")?,
        ldc: i32_of(ho * wo, "an output plane")?,
        trans_b: false,
        a_offset: 0,
        b_offset: g * og * kk,
        c_offset: g * og * ho * wo + y0 * wo,
        beta: 1.0,
    })
}

/// Group `g`'s GEMM of a transposed convolution over a `xh × xw` window: `cols[(co, ky, kx), pixel] =
/// Σ_ci W[ci, co, ky, kx] · x[ci, pixel]` — A the group's input planes (`[pixels × cg]` column-major,
/// lda = pixels), B the group's weights (`[cg, og·kh·kw]` row-major, used transposed, ldb = og·kh·kw),
/// C the group's rows of `cols` (`[cout·kh·kw, pixels]` row-major, ldc = pixels).
pub fn convt_gemm(c: &ConvOp, g: usize, xh: usize, xw: usize) -> Result<Gemm> {
    let cg = c.cin / c.groups;
    let og = c.cout / c.groups;
    let m = og * c.win[0].k * c.win[1].k;
    let pixels = xh * xw;
    i32_of(
        c.cout * c.win[0].k * c.win[1].k * pixels,
        "a transposed convolution's columns",
    )?;
    Ok(Gemm {
        m: i32_of(pixels, "a window's pixels")?,
        n: i32_of(m, "columns")?,
        k: i32_of(cg, "channels")?,
        lda: i32_of(pixels, "a window's pixels")?,
        ldb: i32_of(m, "columns")?,
        ldc: i32_of(pixels, "a window's pixels")?,
        trans_b: true,
        a_offset: g * cg * pixels,
        b_offset: g * cg * m,
        c_offset: g * m * pixels,
        beta: 0.0,
    })
}

/// A per-channel vector of length 1 or `c` as `c` values (the kernels index by channel).
pub fn per_channel(v: &[f32], c: usize) -> Vec<f32> {
    (0..c)
        .map(|ch| if v.len() == 1 { v[0] } else { v[ch] })
        .collect()
}

/// A boolean table as the kernels read it (1 / 0).
pub fn flags(v: &[bool]) -> Vec<i32> {
    v.iter().map(|&b| b as i32).collect()
}

/// Integers as the kernels read them.
pub fn ints(v: impl IntoIterator<Item = usize>) -> Result<Vec<i32>> {
    v.into_iter().map(|x| i32_of(x, "a table entry")).collect()
}

/// `bsp_gather_part`'s map for the part of window `ys` × `xs` that `part` holds, and its row and column
/// counts: the window rows it holds, their rows in the part, the window columns, their columns in the
/// part. `None` when the part holds none of the window.
pub fn gather_map<T>(
    part: &Part<'_, T>,
    ys: &[Option<usize>],
    xs: &[Option<usize>],
) -> Result<Option<(Vec<i32>, usize, usize)>> {
    let pairs = |axis: usize, m: &[Option<usize>]| -> Vec<(usize, usize)> {
        part.local(axis, m)
            .into_iter()
            .enumerate()
            .filter_map(|(i, l)| l.map(|l| (i, l)))
            .collect()
    };
    let (rows, cols) = (pairs(0, ys), pairs(1, xs));
    if rows.is_empty() || cols.is_empty() {
        return Ok(None);
    }
    let map = ints(
        rows.iter()
            .map(|r| r.0)
            .chain(rows.iter().map(|r| r.1))
            .chain(cols.iter().map(|c| c.0))
            .chain(cols.iter().map(|c| c.1)),
    )?;
    Ok(Some((map, rows.len(), cols.len())))
}

/// Threads per block of `bsp_channel_stats`.
pub const STATS_THREADS: usize = 256;

/// `bsp_channel_stats`'s blocks per channel and values per block for planes of `plane` values: about
/// 64 Ki values a block, at most 64 blocks a channel, none empty.
pub fn stats_blocks(plane: usize) -> (usize, usize) {
    let nb = (plane >> 16).clamp(1, 64);
    let chunk = plane.div_ceil(nb).max(1);
    (plane.div_ceil(chunk).max(1), chunk)
}

/// Per-channel statistics from `bsp_channel_stats`'s output (`c` channels of `nb` blocks of `chunk`
/// values over planes of `plane`): each channel's blocks merged in order.
pub fn merge_stat_blocks(
    out: &[f64],
    c: usize,
    plane: usize,
    nb: usize,
    chunk: usize,
) -> Vec<ChannelStats> {
    (0..c)
        .map(|ch| {
            (0..nb).fold(ChannelStats::default(), |acc, b| {
                let lo = b * chunk;
                let count = (lo + chunk).min(plane).saturating_sub(lo) as u64;
                let k = (ch * nb + b) * 2;
                acc.merge(ChannelStats {
                    count,
                    mean: out[k],
                    m2: out[k + 1],
                })
            })
        })
        .collect()
}
