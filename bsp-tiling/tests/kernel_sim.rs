//! The CUDA backend's kernels (src/cuda/kernels.cu), compiled with the host C++ compiler and run on the
//! CPU, against the CPU backend op by op: gather (windows and crops),
//! paste, the four paddings, nearest upsampling, im2col (f32 and f16) with the bias fill and the cuBLAS
//! band GEMM's parameters, the f64 statistics reduction, normalisation + ReLU, ReLU, residual add, and
//! the f32 → binary16 rounding; and the graph engine's kernels against ops.rs (`graph::*`: general
//! im2col with groups, ConvTranspose's col2im, the unary and binary sets, pooling, linear resize, padding
//! values, pixel shuffles, Concat); and the kernels of values kept on the device (windows gathered from
//! a value's tiles, per-channel statistics). Element-wise results must be equal bit for bit; sums (GEMM,
//! statistics, conv-transpose sums) to rounding. The same launches run under AddressSanitizer + UBSan (no access outside any buffer) and
//! the reduction under ThreadSanitizer (its shared-memory tree is ordered by its barriers).
//!
//! The kernels run through the toolkit's CUDA simulator (`cuda-sim`: every CUDA thread a fiber, barriers
//! real); the harness (tests/cpu-sim/harness.cpp) and the kernels are embedded in the test binary. Needs
//! a C++20 compiler (`c++`, or `$CXX`); without one the tests print why and skip.

use bsp_tiling::Tensor;
use cuda_sim::{Flavour, Harness, harness_or_skip};
use std::path::Path;

/// The harness: the launch-file reader and the kernels, built once per flavour. No contraction of
/// `x·a + b` into an fma: NVRTC compiles the kernels with `--fmad=false` too.
static HARNESS: Harness = Harness::new(
    "bsp-tiling",
    include_str!("cpu-sim/harness.cpp"),
    &[("kernels.cu", bsp_tiling::testing::KERNEL_SOURCE)],
    &["-ffp-contract=off"],
);

/// A kernel argument.
#[derive(Clone, Copy)]
enum A {
    /// A buffer, by index.
    B(usize),
    /// An `int`.
    I(i64),
    /// A `long long`.
    L(i64),
    /// A `float`.
    F(f32),
}

/// Buffers and a sequence of launches for one harness run.
#[derive(Default)]
struct Sim {
    bufs: Vec<Vec<u8>>,
    launches: Vec<u8>,
    n: u32,
}

impl Sim {
    fn bytes(&mut self, b: Vec<u8>) -> usize {
        self.bufs.push(b);
        self.bufs.len() - 1
    }
    fn f32s(&mut self, v: &[f32]) -> usize {
        self.bytes(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn i32s(&mut self, v: &[i32]) -> usize {
        self.bytes(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn zeros(&mut self, bytes: usize) -> usize {
        self.bytes(vec![0; bytes])
    }
    fn launch(&mut self, name: &str, grid: (u32, u32), block: u32, args: &[A]) {
        let l = &mut self.launches;
        l.extend((name.len() as u32).to_le_bytes());
        l.extend(name.as_bytes());
        for v in [grid.0, grid.1, block, args.len() as u32] {
            l.extend(v.to_le_bytes());
        }
        for a in args {
            let (kind, v): (u32, i64) = match *a {
                A::B(i) => (0, i as i64),
                A::I(v) => (1, v),
                A::L(v) => (2, v),
                A::F(v) => (3, v.to_bits() as i64),
            };
            l.extend(kind.to_le_bytes());
            l.extend(v.to_le_bytes());
        }
        self.n += 1;
    }
    /// Runs the launches; returns every buffer afterwards.
    fn run(self, exe: &Path, tag: &str) -> Vec<Vec<u8>> {
        let mut f = Vec::new();
        f.extend((self.bufs.len() as u32).to_le_bytes());
        for b in &self.bufs {
            f.extend((b.len() as u64).to_le_bytes());
            f.extend(b);
        }
        f.extend(self.n.to_le_bytes());
        f.extend(&self.launches);
        let bytes = cuda_sim::run(exe, tag, &f, &[]).unwrap_or_else(|e| panic!("{e}"));
        let mut out = vec![];
        let mut pos = 0;
        while pos < bytes.len() {
            let n = u64::from_le_bytes(bytes[pos..pos + 8].try_into().unwrap()) as usize;
            out.push(bytes[pos + 8..pos + 8 + n].to_vec());
            pos += 8 + n;
        }
        out
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Equal bit for bit (a signed zero aside, and NaN's payload).
fn assert_same(got: &[f32], want: &[f32], tag: &str) {
    assert_eq!(got.len(), want.len(), "{tag}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0) || (a.is_nan() && b.is_nan()),
            "{tag}: element {i}: {a} vs {b}"
        );
    }
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0
    }
    fn tensor(&mut self, c: usize, h: usize, w: usize) -> Tensor {
        Tensor::from_vec(c, h, w, (0..c * h * w).map(|_| self.f()).collect()).unwrap()
    }
}

const GRID: (u32, u32) = (3, 1);
const BLOCK: u32 = 32;

fn i(v: usize) -> A {
    A::I(v as i64)
}
fn l(v: usize) -> A {
    A::L(v as i64)
}

fn check_f16_rounding(exe: &Path) {
    let mut v: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        65519.0,
        65520.0,
        -70000.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.1035156e-5, // 2^-14, the smallest normal
        6.097555e-5,  // just below: subnormal
        5.9604645e-8, // 2^-24, the smallest subnormal
        2.9802322e-8, // 2^-25: a tie, rounds to zero
        2.9802326e-8, // just above: rounds up to 2^-24
        1e-10,
        1.0009766, // 1 + 2^-10
        1.0004883, // 1 + 2^-11: a tie, to even (1)
        1.0014648, // 1 + 3·2^-11: a tie, to even (1 + 2^-9)
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
    ];
    let mut s = 99u32;
    for _ in 0..5000 {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        // Random bit patterns across the exponent range around binary16's.
        let bits = (s & 0x807f_ffff) | (((s >> 8) % 60 + 95) << 23);
        v.push(f32::from_bits(bits));
    }
    let mut sim = Sim::default();
    let xb = sim.f32s(&v);
    let ob = sim.zeros(v.len() * 2);
    sim.launch("bsp_to_f16", GRID, BLOCK, &[A::B(xb), l(v.len()), A::B(ob)]);
    let nan = [f32::NAN];
    let nb = sim.f32s(&nan);
    let nob = sim.zeros(2);
    sim.launch("bsp_to_f16", GRID, BLOCK, &[A::B(nb), l(1), A::B(nob)]);
    let res = sim.run(exe, "f16");
    let got = u16s(&res[ob]);
    for (x, g) in v.iter().zip(&got) {
        assert_eq!(
            *g,
            half::f16::from_f32(*x).to_bits(),
            "{x:e} ({:#010x})",
            x.to_bits()
        );
    }
    assert!(half::f16::from_bits(u16s(&res[nob])[0]).is_nan());
}

/// `bsp_add_f16` (cuDNN's binary16 convolution result added onto the f32 bias) against the `half`
/// crate's conversion and one f32 addition: every one of the 65,536 binary16 values, onto biases of
/// both signs and magnitudes.
fn check_add_f16(exe: &Path) {
    let ys: Vec<u16> = (0..=u16::MAX).collect();
    let bias: Vec<f32> = (0..ys.len())
        .map(|i| [0.0, -0.0, 1.5, -3.25e-3, 7e4, -1e-30][i % 6])
        .collect();
    let mut sim = Sim::default();
    let ob = sim.f32s(&bias);
    let yb = sim.bytes(ys.iter().flat_map(|v| v.to_le_bytes()).collect());
    sim.launch(
        "bsp_add_f16",
        GRID,
        BLOCK,
        &[A::B(ob), A::B(yb), l(ys.len())],
    );
    let got = f32s(&sim.run(exe, "add_f16")[ob]);
    for ((&y, &b), &g) in ys.iter().zip(&bias).zip(&got) {
        let want = b + half::f16::from_bits(y).to_f32();
        assert!(
            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
            "{b:e} + f16 {y:#06x}: {g:e}, not {want:e}"
        );
    }
}

/// The kept values' kernels: windows gathered from the tiles of a value on an odd grid (plain ranges
/// across tiles, reflected rows read twice, zero padding, one tile alone) equal the host's gather of the
/// whole value, every pixel written by exactly one part where there is no padding (the window starts as
/// NaN); and the per-channel statistics equal, bit for bit, the kernel's summation order replayed on the
/// host, and `ChannelStats::of` to f64 rounding, on planes of one value to several blocks.
fn check_kept(exe: &Path) {
    use bsp_tiling::ChannelStats;
    use bsp_tiling::field::Part;
    use bsp_tiling::graph::launch::{STATS_THREADS, gather_map, merge_stat_blocks, stats_blocks};
    let mut rng = Rng(0x5eed_4b1d);
    let (c, rows, cols) = (3, [0usize, 5, 11, 13], [0usize, 7, 9]);
    let whole = rng.tensor(c, 13, 9);
    let tiles: Vec<(usize, usize, Tensor)> = rows
        .windows(2)
        .flat_map(|r| cols.windows(2).map(move |q| (r[0], r[1], q[0], q[1])))
        .map(|(y0, y1, x0, x1)| (y0, x0, whole.crop(y0, y1, x0, x1)))
        .collect();
    let some = |v: &[usize]| v.iter().map(|&i| Some(i)).collect::<Vec<_>>();
    type Window = (Vec<Option<usize>>, Vec<Option<usize>>);
    let windows: Vec<Window> = vec![
        (
            some(&(0..13).collect::<Vec<_>>()),
            some(&(0..9).collect::<Vec<_>>()),
        ),
        (some(&[4, 5, 6, 10, 11, 12]), some(&[6, 7, 8])),
        // A reflected border: rows 1 and 0 read twice.
        (
            some(&[1, 0, 1, 2, 3]),
            some(&[2, 1, 0, 1, 2, 3, 4, 5, 6, 7]),
        ),
        // Zero padding around a crop across four tiles.
        (
            vec![None, Some(3), Some(4), Some(5), Some(6), None],
            vec![None, None, Some(6), Some(7), None],
        ),
        (some(&[2, 3]), some(&[1, 2, 3])),
        (vec![None, None], vec![None]),
    ];
    let mut sim = Sim::default();
    let srcs: Vec<usize> = tiles.iter().map(|(_, _, t)| sim.f32s(&t.data)).collect();
    let mut checks = vec![];
    for (k, (ys, xs)) in windows.iter().enumerate() {
        let padded = ys.contains(&None) || xs.contains(&None);
        let fill = if padded { 0.0 } else { f32::NAN };
        let out = sim.f32s(&vec![fill; c * ys.len() * xs.len()]);
        for ((y0, x0, t), &src) in tiles.iter().zip(&srcs) {
            let part = Part {
                y0: *y0,
                x0: *x0,
                h: t.h,
                w: t.w,
                buf: t,
            };
            let Some((map, ny, nx)) = gather_map(&part, ys, xs).unwrap() else {
                continue;
            };
            let m = sim.i32s(&map);
            sim.launch(
                "bsp_gather_part",
                GRID,
                BLOCK,
                &[
                    A::B(src),
                    i(c),
                    i(t.w),
                    l(t.h * t.w),
                    A::B(m),
                    i(ny),
                    i(nx),
                    i(xs.len()),
                    l(ys.len() * xs.len()),
                    A::B(out),
                ],
            );
        }
        let want = bsp_tiling::field::gather(&whole, ys, xs).unwrap();
        checks.push((out, want, format!("kept window {k}")));
    }
    // Statistics: a plane of one value, one block's worth, one past a multiple of the threads, and
    // several blocks, around a large mean (the second pass's deviations matter).
    let mut stats = vec![];
    for plane in [1usize, 255, 257, 70_001, 200_000] {
        let x: Vec<f32> = (0..2 * plane).map(|_| 1000.0 + rng.f()).collect();
        let (nb, chunk) = stats_blocks(plane);
        let xb = sim.f32s(&x);
        let ob = sim.zeros(2 * nb * 2 * 8);
        sim.launch(
            "bsp_channel_stats",
            (nb as u32, 2),
            STATS_THREADS as u32,
            &[A::B(xb), l(plane), l(chunk), A::B(ob)],
        );
        stats.push((x, plane, nb, chunk, ob));
    }
    let res = sim.run(exe, "kept");
    for (b, want, tag) in checks {
        assert_same(&f32s(&res[b]), &want.data, &tag);
    }
    for (x, plane, nb, chunk, ob) in stats {
        let got: Vec<f64> = res[ob]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // The kernel's order: thread t sums values t, t + 256, ... of its block, then the tree.
        let block_sum = |v: &[f32], f: &dyn Fn(f32) -> f64| {
            let mut acc: Vec<f64> = (0..STATS_THREADS)
                .map(|t| v.iter().skip(t).step_by(STATS_THREADS).map(|&e| f(e)).sum())
                .collect();
            let mut k = STATS_THREADS / 2;
            while k > 0 {
                for t in 0..k {
                    acc[t] += acc[t + k];
                }
                k /= 2;
            }
            acc[0]
        };
        for ch in 0..2 {
            for b in 0..nb {
                let v = &x[ch * plane + b * chunk..ch * plane + ((b + 1) * chunk).min(plane)];
                let mean = block_sum(v, &|e| e as f64) / v.len() as f64;
                let m2 = block_sum(v, &|e| {
                    let d = e as f64 - mean;
                    d * d
                });
                let k = (ch * nb + b) * 2;
                assert_eq!(
                    (got[k].to_bits(), got[k + 1].to_bits()),
                    (mean.to_bits(), m2.to_bits()),
                    "plane {plane} channel {ch} block {b}"
                );
            }
        }
        let merged = merge_stat_blocks(&got, 2, plane, nb, chunk);
        for (ch, st) in merged.iter().enumerate() {
            let host = ChannelStats::of(&x[ch * plane..(ch + 1) * plane]);
            assert_eq!(st.count, host.count);
            assert!(
                (st.mean - host.mean).abs() <= 1e-12 * host.mean.abs(),
                "plane {plane}: mean {} vs {}",
                st.mean,
                host.mean
            );
            assert!(
                (st.m2 - host.m2).abs() <= 1e-9 * host.m2.max(1e-30),
                "plane {plane}: m2 {} vs {}",
                st.m2,
                host.m2
            );
        }
    }
}

fn check_all(exe: &Path) {
    check_f16_rounding(exe);
    check_add_f16(exe);
    check_kept(exe);
    graph::check_graph_conv(exe);
    graph::check_graph_conv_transpose(exe);
    graph::check_graph_elementwise(exe);
    graph::check_graph_windows(exe);
}

/// The graph engine's ops (src/graph/ops.rs) against their kernels, on windows gathered as the engine
/// gathers them (`Op::in_map` over an output range) from odd-sized inputs.
mod graph {
    use super::*;
    use bsp_tiling::Precision;
    use bsp_tiling::graph::exec;
    use bsp_tiling::graph::launch::{self, Gemm};
    use bsp_tiling::graph::ops::{
        self, AxisPad, BinOp, ConvOp, Coord, Ctx, Nearest, Op, Operand, PadOp, PoolOp, ResizeOp,
        Unary, Win,
    };

    /// A node's windows for output range `range` of inputs `xs`, with the maps and input lengths.
    pub struct Windows {
        pub wins: Vec<Tensor>,
        pub maps: Vec<[Vec<Option<usize>>; 2]>,
        pub n_in: Vec<[usize; 2]>,
    }

    pub fn windows(op: &Op, xs: &[&Tensor], range: [(usize, usize); 2]) -> Windows {
        let n_in: Vec<[usize; 2]> = xs.iter().map(|t| [t.h, t.w]).collect();
        let mut wins = vec![];
        let mut maps = vec![];
        for (j, x) in xs.iter().enumerate() {
            let m: [Vec<Option<usize>>; 2] = std::array::from_fn(|a| {
                let lens: Vec<usize> = n_in.iter().map(|d| d[a]).collect();
                let n_out = op.out_len(a, &lens).unwrap();
                op.in_map(a, j, &lens, n_out, range[a].0, range[a].1)
            });
            wins.push(bsp_tiling::field::gather(*x, &m[0], &m[1]).unwrap());
            maps.push(m);
        }
        Windows { wins, maps, n_in }
    }

    pub fn out_len(op: &Op, xs: &[&Tensor]) -> [usize; 2] {
        std::array::from_fn(|a| {
            let lens: Vec<usize> = xs.iter().map(|t| if a == 0 { t.h } else { t.w }).collect();
            op.out_len(a, &lens).unwrap()
        })
    }

    /// The host reference: ops.rs `compute` on the windows.
    pub fn reference(op: &Op, w: &Windows, range: [(usize, usize); 2]) -> Tensor {
        let ctx = Ctx {
            range,
            n_in: &w.n_in,
            maps: &w.maps,
            norm: None,
            threads: 1,
        };
        ops::compute(op, w.wins.clone(), &ctx).unwrap()
    }

    fn ctx<'a>(w: &'a Windows, range: [(usize, usize); 2]) -> Ctx<'a> {
        Ctx {
            range,
            n_in: &w.n_in,
            maps: &w.maps,
            norm: None,
            threads: 1,
        }
    }

    /// cuBLAS's column-major GEMM with `g`'s parameters, in f64.
    fn gemm(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        let u = |v: i32| v as usize;
        let (a, b, c) = (&a[g.a_offset..], &b[g.b_offset..], &mut c[g.c_offset..]);
        for j in 0..u(g.n) {
            for r in 0..u(g.m) {
                let mut acc = g.beta as f64 * c[r + j * u(g.ldc)] as f64;
                for p in 0..u(g.k) {
                    let bv = if g.trans_b {
                        b[j + p * u(g.ldb)]
                    } else {
                        b[p + j * u(g.ldb)]
                    };
                    acc += a[r + p * u(g.lda)] as f64 * bv as f64;
                }
                c[r + j * u(g.ldc)] = acc as f32;
            }
        }
    }

    fn close(got: &[f32], want: &[f32], tag: &str) {
        assert_eq!(got.len(), want.len(), "{tag}: length");
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-5 * scale, "{tag}: {err} (of {scale})");
    }

    fn conv_op(rng: &mut Rng, transpose: bool, cin: usize, cout: usize, groups: usize) -> ConvOp {
        let win = [
            Win {
                k: 3,
                stride: 2,
                dilation: 1,
            },
            Win {
                k: 2,
                stride: if transpose { 3 } else { 1 },
                dilation: 2,
            },
        ];
        let wlen = if transpose {
            cin * (cout / groups) * 6
        } else {
            cout * (cin / groups) * 6
        };
        ConvOp {
            cin,
            cout,
            groups,
            win,
            pad: [AxisPad::Explicit(1, 2), AxisPad::Explicit(0, 1)],
            output_padding: if transpose { [1, 0] } else { [0, 0] },
            weight: (0..wlen).map(|_| rng.f() * 0.1).collect(),
            bias: (0..cout).map(|_| rng.f()).collect(),
        }
    }

    /// General im2col (kh ≠ kw, per-axis stride and dilation, groups) + the bias fill, the GEMMs
    /// `launch::conv_gemm` gives cuBLAS, against ops.rs `conv`, for a middle range and the whole output;
    /// in bands of output rows as `exec::conv_band` sizes them for a band budget (all rows, two, one):
    /// the banded columns and GEMMs give the one-band output bit for bit.
    pub fn check_graph_conv(exe: &Path) {
        let mut rng = Rng(21);
        let c = conv_op(&mut rng, false, 4, 6, 2);
        let op = Op::Conv(c.clone());
        let x = rng.tensor(4, 13, 11);
        let [ho_all, wo_all] = out_len(&op, &[&x]);
        for range in [[(0, ho_all), (0, wo_all)], [(1, ho_all - 1), (2, wo_all)]] {
            let w = windows(&op, &[&x], range);
            let want = reference(&op, &w, range);
            let (ho, wo) = (range[0].1 - range[0].0, range[1].1 - range[1].0);
            let row_bytes = c.cin / c.groups * 6 * wo * 4;
            let mut one_band = None;
            for band_bytes in [usize::MAX, 2 * row_bytes + 7, 1] {
                let (rows, _) = exec::conv_band(&c, ho, wo, band_bytes, Precision::F32);
                let got = banded_conv(exe, &c, &w.wins[0], (ho, wo), rows, range);
                close(
                    &got,
                    &want.data,
                    &format!("graph conv {range:?} rows {rows}"),
                );
                match &one_band {
                    None => one_band = Some(got),
                    Some(all) => assert!(
                        got.iter().zip(all).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "graph conv {range:?}: bands of {rows} rows differ from one band"
                    ),
                }
            }
        }
    }

    /// The bias fill, im2col (f32 and f16) per group and band of `rows` output rows, and the band GEMMs
    /// (through the reference GEMM) of a convolution over window `win`.
    fn banded_conv(
        exe: &Path,
        c: &ConvOp,
        win: &Tensor,
        (ho, wo): (usize, usize),
        rows: usize,
        range: [(usize, usize); 2],
    ) -> Vec<f32> {
        let mut sim = Sim::default();
        let xb = sim.f32s(&win.data);
        let bias = sim.f32s(&c.bias);
        let out = sim.zeros(c.cout * ho * wo * 4);
        sim.launch(
            "bsp_fill_bias",
            GRID,
            BLOCK,
            &[A::B(out), i(c.cout), l(ho * wo), A::B(bias)],
        );
        let cg = c.cin / c.groups;
        let mut bands = vec![];
        for g in 0..c.groups {
            for y0 in (0..ho).step_by(rows) {
                let y1 = (y0 + rows).min(ho);
                let col = sim.zeros(cg * 6 * (y1 - y0) * wo * 4);
                let col16 = sim.zeros(cg * 6 * (y1 - y0) * wo * 2);
                for (kernel, out) in [("bsp_im2col_g", col), ("bsp_im2col_g_f16", col16)] {
                    sim.launch(
                        kernel,
                        GRID,
                        BLOCK,
                        &[
                            A::B(xb),
                            i(g * cg),
                            i(cg),
                            i(win.h),
                            i(win.w),
                            i(3),
                            i(2),
                            i(2),
                            i(1),
                            i(1),
                            i(2),
                            i(y0),
                            i(y1),
                            i(wo),
                            A::B(out),
                        ],
                    );
                }
                bands.push((g, y0, y1, col, col16));
            }
        }
        let res = sim.run(exe, "graph-conv");
        let mut got = f32s(&res[out]);
        for (g, y0, y1, col, col16) in bands {
            let gm = launch::conv_gemm(c, g, ho, wo, y0, y1).unwrap();
            let cols = f32s(&res[col]);
            // The f16 columns: the f32 ones rounded to binary16, nearest even (the `half` crate's).
            let want16: Vec<u16> = cols
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            assert_eq!(u16s(&res[col16]), want16, "graph im2col f16 {range:?}");
            gemm(&gm, &cols, &c.weight, &mut got);
        }
        got
    }

    /// ConvTranspose: the GEMM `launch::convt_gemm` gives cuBLAS, then the col2im kernel (fixed
    /// summation order), against ops.rs `conv_transpose`.
    pub fn check_graph_conv_transpose(exe: &Path) {
        let mut rng = Rng(23);
        let c = conv_op(&mut rng, true, 4, 6, 2);
        let op = Op::ConvTranspose(c.clone());
        let x = rng.tensor(4, 7, 6);
        let [ho_all, wo_all] = out_len(&op, &[&x]);
        for range in [[(0, ho_all), (0, wo_all)], [(3, ho_all - 2), (1, 9)]] {
            let w = windows(&op, &[&x], range);
            let want = reference(&op, &w, range);
            let (ho, wo) = (range[0].1 - range[0].0, range[1].1 - range[1].0);
            let win = &w.wins[0];
            let mut cols = vec![0.0f32; c.cout * 6 * win.h * win.w];
            for g in 0..c.groups {
                let gm = launch::convt_gemm(&c, g, win.h, win.w).unwrap();
                gemm(&gm, &win.data, &c.weight, &mut cols);
            }
            let off = ops::convt_offsets(&c, &ctx(&w, range));
            let mut sim = Sim::default();
            let cb = sim.f32s(&cols);
            let bias = sim.f32s(&c.bias);
            let out = sim.zeros(c.cout * ho * wo * 4);
            sim.launch(
                "bsp_col2im",
                GRID,
                BLOCK,
                &[
                    A::B(cb),
                    A::B(bias),
                    i(c.cout),
                    i(win.h),
                    i(win.w),
                    i(3),
                    i(2),
                    i(2),
                    i(3),
                    i(1),
                    i(2),
                    A::L(off[0] as i64),
                    A::L(off[1] as i64),
                    i(ho),
                    i(wo),
                    A::B(out),
                ],
            );
            let res = sim.run(exe, "graph-convt");
            close(
                &f32s(&res[out]),
                &want.data,
                &format!("conv transpose {range:?}"),
            );
        }
    }

    /// Every unary function (bit for bit, the erf/softplus helpers included), the binary ops with
    /// every broadcast ops.rs supports, the per-channel affine map, Concat and Identity.
    pub fn check_graph_elementwise(exe: &Path) {
        let mut rng = Rng(29);
        let (c, h, w) = (3, 9, 7);
        let mut x = rng.tensor(c, h, w);
        // Both erf branches, softplus's cut-off, zeros and infinities.
        for (p, v) in [
            0.3f32,
            -0.2,
            0.0,
            -0.0,
            25.0,
            -25.0,
            0.5,
            -0.5,
            f32::INFINITY,
        ]
        .into_iter()
        .enumerate()
        {
            x.data[p * 5] = v;
        }
        let y = rng.tensor(c, h, w);
        let y1 = rng.tensor(1, h, w);
        let plane = h * w;
        let unaries = [
            Unary::Relu,
            Unary::LeakyRelu(0.2),
            Unary::PRelu(vec![0.1, -0.3, 2.0]),
            Unary::PRelu(vec![0.25]),
            Unary::Sigmoid,
            Unary::Tanh,
            Unary::Clip(-1.5, 2.25),
            Unary::Softplus,
            Unary::Mish,
            Unary::HardSigmoid(0.2, 0.5),
            Unary::HardSwish,
            Unary::Elu(1.3),
            Unary::Erf,
            Unary::Gelu { tanh: false },
            Unary::Gelu { tanh: true },
            Unary::Neg,
            Unary::Abs,
            Unary::Exp,
            Unary::Sqrt,
        ];
        let mut sim = Sim::default();
        let mut checks: Vec<(usize, Tensor, String)> = vec![];
        for u in &unaries {
            let b = sim.f32s(&x.data);
            let (kind, a, bb) = launch::unary_code(u);
            let slope = match u {
                Unary::PRelu(s) => s.clone(),
                _ => vec![0.0],
            };
            let sb = sim.f32s(&slope);
            sim.launch(
                "bsp_unary",
                GRID,
                BLOCK,
                &[
                    A::B(b),
                    l(c * plane),
                    l(plane),
                    A::I(kind as i64),
                    A::F(a),
                    A::F(bb),
                    A::B(sb),
                    i(slope.len()),
                ],
            );
            let mut want = x.clone();
            ops::unary(u, &mut want);
            checks.push((b, want, format!("{u:?}")));
        }
        let all = [
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::Div,
            BinOp::Max,
            BinOp::Min,
            BinOp::Pow,
        ];
        let range = [(0, h), (0, w)];
        for op in all {
            // Two images: same channels, and either side with one channel.
            for (a, b) in [(&x, &y), (&x, &y1), (&y1, &x)] {
                let node = Op::Binary {
                    op,
                    lhs: Operand::Input(0),
                    rhs: Operand::Input(1),
                };
                let wd = windows(&node, &[a, b], range);
                let want = reference(&node, &wd, range);
                let (ab, bb) = (sim.f32s(&a.data), sim.f32s(&b.data));
                let out = sim.zeros(want.data.len() * 4);
                sim.launch(
                    "bsp_binary",
                    GRID,
                    BLOCK,
                    &[
                        A::B(ab),
                        i(a.c),
                        A::B(bb),
                        i(b.c),
                        i(want.c),
                        l(plane),
                        A::I(launch::binop_code(op) as i64),
                        A::B(out),
                    ],
                );
                checks.push((out, want, format!("{op:?} {}+{}", a.c, b.c)));
            }
            // An image and a constant, per channel or scalar, on either side.
            for k in [vec![1.5f32, -0.75, 3.0], vec![-2.5]] {
                for const_first in [false, true] {
                    let (lhs, rhs) = if const_first {
                        (Operand::Const(k.clone()), Operand::Input(0))
                    } else {
                        (Operand::Input(0), Operand::Const(k.clone()))
                    };
                    let node = Op::Binary { op, lhs, rhs };
                    let wd = windows(&node, &[&x], range);
                    let want = reference(&node, &wd, range);
                    let xb = sim.f32s(&x.data);
                    let kb = sim.f32s(&k);
                    sim.launch(
                        "bsp_binary_const",
                        GRID,
                        BLOCK,
                        &[
                            A::B(xb),
                            i(c),
                            l(plane),
                            A::B(kb),
                            i(k.len()),
                            i(const_first as usize),
                            A::I(launch::binop_code(op) as i64),
                        ],
                    );
                    checks.push((xb, want, format!("{op:?} const {k:?} first={const_first}")));
                }
            }
        }
        // The per-channel affine map (BatchNormalization without a convolution before it).
        let affine = Op::Affine {
            scale: vec![0.5],
            shift: vec![1.0, -2.0, 0.125],
        };
        let wd = windows(&affine, &[&x], range);
        let want = reference(&affine, &wd, range);
        let xb = sim.f32s(&x.data);
        let (sb, hb) = (
            sim.f32s(&launch::per_channel(&[0.5], c)),
            sim.f32s(&launch::per_channel(&[1.0, -2.0, 0.125], c)),
        );
        sim.launch(
            "bsp_scale_shift",
            GRID,
            BLOCK,
            &[A::B(xb), i(c), l(plane), A::B(sb), A::B(hb), i(0)],
        );
        checks.push((xb, want, "affine".into()));
        // Concat: each input copied at its channel offset.
        let wd = windows(&Op::Concat, &[&x, &y1, &y], range);
        let want = reference(&Op::Concat, &wd, range);
        let out = sim.zeros(want.data.len() * 4);
        let mut off = 0;
        for t in [&x, &y1, &y] {
            let b = sim.f32s(&t.data);
            sim.launch(
                "bsp_copy",
                GRID,
                BLOCK,
                &[A::B(out), l(off), A::B(b), l(t.data.len())],
            );
            off += t.data.len();
        }
        checks.push((out, want, "concat".into()));
        let res = sim.run(exe, "graph-elementwise");
        for (b, want, tag) in checks {
            assert_same(&f32s(&res[b]), &want.data, &tag);
        }
    }

    /// Ops that read a window other than their own pixels: max/average pooling (padding, dilation,
    /// ceil_mode, count_include_pad), linear resize (up and down, two coordinate modes), constant padding
    /// with a value, DepthToSpace (DCR and CRD) and SpaceToDepth — on middle and border ranges.
    pub fn check_graph_windows(exe: &Path) {
        let mut rng = Rng(31);
        let x = rng.tensor(3, 11, 13);
        let mut sim = Sim::default();
        let mut checks: Vec<(usize, Tensor, String)> = vec![];
        for (max, include, ceil) in [
            (true, false, false),
            (false, true, true),
            (false, false, true),
            (false, true, false),
        ] {
            let p = PoolOp {
                max,
                win: [
                    Win {
                        k: 3,
                        stride: 2,
                        dilation: 1,
                    },
                    Win {
                        k: 2,
                        stride: 2,
                        dilation: 2,
                    },
                ],
                pad: [AxisPad::Explicit(1, 1), AxisPad::Explicit(1, 0)],
                ceil_mode: ceil,
                count_include_pad: include,
            };
            let op = Op::Pool(p.clone());
            let [ho_all, wo_all] = out_len(&op, &[&x]);
            for range in [[(0, ho_all), (0, wo_all)], [(1, ho_all), (2, wo_all - 1)]] {
                let wd = windows(&op, &[&x], range);
                let want = reference(&op, &wd, range);
                let tb = ops::pool_tables(&p, &ctx(&wd, range));
                let win = &wd.wins[0];
                let (ho, wo) = (want.h, want.w);
                let xb = sim.f32s(&win.data);
                let t: Vec<usize> = [
                    launch::flags(&tb.inside[0]),
                    launch::flags(&tb.inside[1]),
                    launch::ints(tb.count[0].iter().copied()).unwrap(),
                    launch::ints(tb.count[1].iter().copied()).unwrap(),
                ]
                .iter()
                .map(|v| sim.i32s(v))
                .collect();
                let out = sim.zeros(want.data.len() * 4);
                sim.launch(
                    "bsp_pool",
                    GRID,
                    BLOCK,
                    &[
                        A::B(xb),
                        i(3),
                        i(win.h),
                        i(win.w),
                        i(ho),
                        i(wo),
                        i(3),
                        i(2),
                        i(2),
                        i(2),
                        i(1),
                        i(2),
                        i(max as usize),
                        A::B(t[0]),
                        A::B(t[1]),
                        A::B(t[2]),
                        A::B(t[3]),
                        A::B(out),
                    ],
                );
                checks.push((
                    out,
                    want,
                    format!("pool max={max} include={include} {range:?}"),
                ));
            }
        }
        for (scale, coord) in [
            ([2.0, 3.0], Coord::HalfPixel),
            ([0.5, 2.0], Coord::PytorchHalfPixel),
            ([2.0, 0.5], Coord::Asymmetric),
        ] {
            let r = ResizeOp {
                linear: true,
                scale,
                coord,
                nearest: Nearest::Floor,
            };
            let op = Op::Resize(r.clone());
            let [ho_all, wo_all] = out_len(&op, &[&x]);
            for range in [[(0, ho_all), (0, wo_all)], [(1, ho_all - 1), (2, wo_all)]] {
                let wd = windows(&op, &[&x], range);
                let want = reference(&op, &wd, range);
                let [ty, tx] = ops::linear_tables(&r, &ctx(&wd, range));
                let win = &wd.wins[0];
                let xb = sim.f32s(&win.data);
                let mut tabs = vec![];
                for t in [&ty, &tx] {
                    tabs.push(sim.i32s(&launch::ints(t.iter().map(|v| v.0)).unwrap()));
                    tabs.push(sim.i32s(&launch::ints(t.iter().map(|v| v.1)).unwrap()));
                    tabs.push(sim.f32s(&t.iter().map(|v| v.2).collect::<Vec<_>>()));
                }
                let out = sim.zeros(want.data.len() * 4);
                let mut args = vec![A::B(xb), i(3), i(win.h), i(win.w), i(want.h), i(want.w)];
                args.extend(tabs.iter().map(|&b| A::B(b)));
                args.push(A::B(out));
                sim.launch("bsp_resize_linear", GRID, BLOCK, &args);
                checks.push((out, want, format!("resize {scale:?} {coord:?} {range:?}")));
            }
        }
        let pad = PadOp {
            pads: [(2, 1), (0, 3)],
            mode: None,
            value: 1.5,
        };
        let op = Op::Pad(pad);
        let [ho_all, wo_all] = out_len(&op, &[&x]);
        for range in [[(0, ho_all), (0, wo_all)], [(1, 6), (10, wo_all)]] {
            let wd = windows(&op, &[&x], range);
            let want = reference(&op, &wd, range);
            let win = &wd.wins[0];
            let xb = sim.f32s(&win.data);
            let ys = sim.i32s(&launch::flags(
                &wd.maps[0][0]
                    .iter()
                    .map(Option::is_some)
                    .collect::<Vec<_>>(),
            ));
            let xs = sim.i32s(&launch::flags(
                &wd.maps[0][1]
                    .iter()
                    .map(Option::is_some)
                    .collect::<Vec<_>>(),
            ));
            sim.launch(
                "bsp_fill_outside",
                GRID,
                BLOCK,
                &[
                    A::B(xb),
                    i(3),
                    i(win.h),
                    i(win.w),
                    A::B(ys),
                    A::B(xs),
                    A::F(1.5),
                ],
            );
            checks.push((xb, want, format!("pad value {range:?}")));
        }
        let x8 = rng.tensor(8, 5, 7);
        for crd in [false, true] {
            let op = Op::DepthToSpace { block: 2, crd };
            let [ho_all, wo_all] = out_len(&op, &[&x8]);
            for range in [[(0, ho_all), (0, wo_all)], [(3, 8), (1, 12)]] {
                let wd = windows(&op, &[&x8], range);
                let want = reference(&op, &wd, range);
                let xb = sim.f32s(&wd.wins[0].data);
                let out = sim.zeros(want.data.len() * 4);
                sim.launch(
                    "bsp_depth_to_space",
                    GRID,
                    BLOCK,
                    &[
                        A::B(xb),
                        i(2),
                        i(want.h),
                        i(want.w),
                        i(2),
                        i(crd as usize),
                        i(range[0].0 % 2),
                        i(range[1].0 % 2),
                        A::B(out),
                    ],
                );
                checks.push((out, want, format!("depth to space crd={crd} {range:?}")));
            }
        }
        let x6 = rng.tensor(3, 9, 12);
        let op = Op::SpaceToDepth { block: 3 };
        for range in [[(0, 3), (0, 4)], [(1, 3), (2, 4)]] {
            let wd = windows(&op, &[&x6], range);
            let want = reference(&op, &wd, range);
            let xb = sim.f32s(&wd.wins[0].data);
            let out = sim.zeros(want.data.len() * 4);
            sim.launch(
                "bsp_space_to_depth",
                GRID,
                BLOCK,
                &[A::B(xb), i(3), i(want.h), i(want.w), i(3), A::B(out)],
            );
            checks.push((out, want, format!("space to depth {range:?}")));
        }
        let res = sim.run(exe, "graph-windows");
        for (b, want, tag) in checks {
            assert_same(&f32s(&res[b]), &want.data, &tag);
        }
    }
}

#[test]
fn sim_kernels_match_the_cpu_backend() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    check_all(exe);
}

#[test]
fn sim_kernels_under_address_and_ub_sanitizers() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    check_all(exe);
}

#[test]
fn sim_kernels_under_thread_sanitizer() {
    let exe = harness_or_skip!(HARNESS, Flavour::Tsan);
    check_all(exe);
}
