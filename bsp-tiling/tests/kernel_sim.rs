//! The CUDA backend's kernels (src/cuda/kernels.cu), compiled with the host C++ compiler and run on the
//! CPU, against the CPU backend op by op: gather (windows and crops),
//! paste, the four paddings, nearest upsampling, im2col (f32 and f16) with the bias fill and the cuBLAS
//! band GEMM's parameters, the f64 statistics reduction, normalisation + ReLU, ReLU, residual add, and
//! the f32 → binary16 rounding. Element-wise results must be equal bit for bit; sums (GEMM, statistics)
//! to rounding. The same launches run under AddressSanitizer + UBSan (no access outside any buffer) and
//! the reduction under ThreadSanitizer (its shared-memory tree is ordered by its barriers).
//!
//! The kernels run through the toolkit's CUDA simulator (`cuda-sim`: every CUDA thread a fiber, barriers
//! real); the harness (tests/cpu-sim/harness.cpp) and the kernels are embedded in the test binary. Needs
//! a C++20 compiler (`c++`, or `$CXX`); without one the tests print why and skip.

use bsp_tiling::backend::{Backend, Conv2d, CpuBackend, Norm, Pad, host};
use bsp_tiling::{ChannelStats, PaddingMode, Tensor, band_gemm, stats_blocks};
use cuda_sim::{Flavour, Harness, harness_or_skip};
use std::path::Path;

/// The harness: the launch-file reader and the kernels, built once per flavour. No contraction of
/// `x·a + b` into an fma: NVRTC compiles the kernels with `--fmad=false` too.
static HARNESS: Harness = Harness::new(
    "bsp-tiling",
    include_str!("cpu-sim/harness.cpp"),
    &[("kernels.cu", bsp_tiling::KERNEL_SOURCE)],
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
fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Equal bit for bit (a signed zero aside).
fn assert_same(got: &[f32], want: &[f32], tag: &str) {
    assert_eq!(got.len(), want.len(), "{tag}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0),
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

fn check_gather_paste_pad_upsample(exe: &Path) {
    let mut rng = Rng(11);
    let x = rng.tensor(3, 5, 6);
    let mut sim = Sim::default();
    let xb = sim.f32s(&x.data);
    // A window with zeros (None) and repeated, out-of-order indices.
    let ys = [Some(4), None, Some(0), Some(0), Some(3), None, Some(2)];
    let xs = [None, Some(5), Some(1), Some(2), Some(2)];
    let map = |m: &[Option<usize>]| {
        m.iter()
            .map(|v| v.map_or(-1, |v| v as i32))
            .collect::<Vec<_>>()
    };
    let (yb, xsb) = (sim.i32s(&map(&ys)), sim.i32s(&map(&xs)));
    let gb = sim.zeros(3 * ys.len() * xs.len() * 4);
    sim.launch(
        "bsp_gather",
        GRID,
        BLOCK,
        &[
            A::B(xb),
            l(5),
            l(6),
            i(3),
            A::B(yb),
            i(ys.len()),
            A::B(xsb),
            i(xs.len()),
            A::B(gb),
        ],
    );
    // Paste x into a 3×9×10 layer at (3, 2).
    let mut layer = rng.tensor(3, 9, 10);
    let lb = sim.f32s(&layer.data);
    sim.launch(
        "bsp_paste",
        GRID,
        BLOCK,
        &[
            A::B(lb),
            l(9),
            l(10),
            A::B(xb),
            i(3),
            i(5),
            i(6),
            l(3),
            l(2),
        ],
    );
    let pads = [
        Pad {
            top: 2,
            bottom: 3,
            left: 1,
            right: 4,
        },
        Pad {
            top: 7,
            bottom: 0,
            left: 0,
            right: 9,
        },
    ];
    let modes = [
        PaddingMode::Zero,
        PaddingMode::Replicate,
        PaddingMode::Reflect,
        PaddingMode::Circular,
    ];
    let mut pad_bufs = vec![];
    for pad in pads {
        for (m, mode) in modes.iter().enumerate() {
            let (oh, ow) = (5 + pad.top + pad.bottom, 6 + pad.left + pad.right);
            let ob = sim.zeros(3 * oh * ow * 4);
            sim.launch(
                "bsp_pad",
                GRID,
                BLOCK,
                &[
                    A::B(xb),
                    i(3),
                    i(5),
                    i(6),
                    i(pad.top),
                    i(pad.left),
                    i(oh),
                    i(ow),
                    i(m),
                    A::B(ob),
                ],
            );
            pad_bufs.push((pad, *mode, ob));
        }
    }
    let ub = sim.zeros(3 * 10 * 12 * 4);
    sim.launch(
        "bsp_upsample2x",
        GRID,
        BLOCK,
        &[A::B(xb), i(3), i(5), i(6), A::B(ub)],
    );
    let out = sim.run(exe, "layout");
    let want = CpuBackend.gather(&x, &ys, &xs).unwrap();
    assert_same(&f32s(&out[gb]), &want.data, "gather");
    layer.paste(3, 2, &x);
    assert_same(&f32s(&out[lb]), &layer.data, "paste");
    for (pad, mode, ob) in pad_bufs {
        let want = CpuBackend.pad(&x, pad, mode).unwrap();
        assert_same(
            &f32s(&out[ob]),
            &want.data,
            &format!("pad {mode:?} {pad:?}"),
        );
    }
    let want = CpuBackend.upsample_nearest2x(&x).unwrap();
    assert_same(&f32s(&out[ub]), &want.data, "upsample");
}

/// A column-major GEMM with cuBLAS's parameters (`C[m×n] += A[m×k]·B[k×n]`, leading dimensions), in f64.
#[allow(clippy::too_many_arguments)]
fn colmajor_gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for j in 0..n {
        for r in 0..m {
            let mut acc = c[r + j * ldc] as f64;
            for p in 0..k {
                acc += a[r + p * lda] as f64 * b[p + j * ldb] as f64;
            }
            c[r + j * ldc] = acc as f32;
        }
    }
}

fn check_conv(exe: &Path) {
    let mut rng = Rng(5);
    for (k, s, cin, cout, h, w, rows) in [
        (9, 1, 3, 4, 14, 13, 2),
        (3, 2, 4, 5, 11, 12, 3),
        (3, 1, 2, 3, 6, 7, 100),
        (1, 1, 3, 2, 4, 5, 1),
    ] {
        let x = rng.tensor(cin, h, w);
        let conv = Conv2d {
            cin,
            cout,
            k,
            stride: s,
            weight: (0..cout * cin * k * k).map(|_| rng.f() * 0.1).collect(),
            bias: (0..cout).map(|_| rng.f()).collect(),
        };
        let (ho, wo) = ((h - k) / s + 1, (w - k) / s + 1);
        let kk = cin * k * k;
        let mut sim = Sim::default();
        let xb = sim.f32s(&x.data);
        let bias = sim.f32s(&conv.bias);
        let out = sim.zeros(cout * ho * wo * 4);
        sim.launch(
            "bsp_fill_bias",
            GRID,
            BLOCK,
            &[A::B(out), i(cout), l(ho * wo), A::B(bias)],
        );
        let mut bands = vec![];
        for y0 in (0..ho).step_by(rows) {
            let y1 = (y0 + rows).min(ho);
            let n = (y1 - y0) * wo;
            let col = sim.zeros(kk * n * 4);
            let col16 = sim.zeros(kk * n * 2);
            let args = |dst| {
                [
                    A::B(xb),
                    i(cin),
                    i(h),
                    i(w),
                    i(k),
                    i(s),
                    i(y0),
                    i(y1),
                    i(wo),
                    A::B(dst),
                ]
            };
            sim.launch("bsp_im2col", GRID, BLOCK, &args(col));
            sim.launch("bsp_im2col_f16", GRID, BLOCK, &args(col16));
            bands.push((y0, y1, col, col16));
        }
        let tag = format!("conv k{k} s{s}");
        let res = sim.run(exe, "conv");
        // The bias fill, then each band's columns as the CPU builds them, then the GEMM with the exact
        // parameters the CUDA backend gives cuBLAS.
        let mut got = f32s(&res[out]);
        for (p, v) in got.iter().enumerate() {
            assert_eq!(*v, conv.bias[p / (ho * wo)], "{tag}: bias fill");
        }
        for (y0, y1, col, col16) in bands {
            let cols = f32s(&res[col]);
            let mut want = vec![];
            host::im2col(&x, k, s, y0, y1, wo, &mut want);
            let n = (y1 - y0) * wo;
            assert_same(
                &cols,
                &want[..kk * n],
                &format!("{tag}: im2col rows {y0}..{y1}"),
            );
            let bits: Vec<u16> = want[..kk * n]
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let g16 = u16s(&res[col16]);
            if let Some(p) = (0..bits.len()).find(|&p| g16[p] != bits[p]) {
                panic!(
                    "{tag}: im2col_f16 rows {y0}..{y1}, element {p}: {:#06x} for {}, want {:#06x}",
                    g16[p], want[p], bits[p]
                );
            }
            let g = band_gemm(&conv, ho, wo, y0, y1).unwrap();
            let u = |v: i32| v as usize;
            colmajor_gemm(
                u(g.m),
                u(g.n),
                u(g.k),
                &cols,
                u(g.lda),
                &conv.weight,
                u(g.ldb),
                &mut got[g.c_offset..],
                u(g.ldc),
            );
        }
        let want = CpuBackend.conv2d_valid(&x, &conv, &(), 1).unwrap();
        let err = got
            .iter()
            .zip(&want.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "{tag}: band GEMM vs CPU conv: {err}");
    }
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

fn check_stats_and_elementwise(exe: &Path) {
    let mut rng = Rng(3);
    let (c, h, w) = (3, 37, 29);
    let x = rng.tensor(c, h, w);
    let plane = h * w;
    let mut sim = Sim::default();
    let xb = sim.f32s(&x.data);
    // Several blocks per channel (the real launch uses device::stats_blocks of a GPU-sized plane).
    let nb = 3;
    let partials = sim.zeros(c * nb * 8);
    let sums = sim.zeros(c * 8);
    let m2 = sim.zeros(c * 8);
    for (squares, target) in [(0, sums), (1, m2)] {
        sim.launch(
            "bsp_channel_partials",
            (nb as u32, c as u32),
            BLOCK,
            &[A::B(xb), l(plane), A::B(sums), i(squares), A::B(partials)],
        );
        sim.launch(
            "bsp_sum_partials",
            GRID,
            BLOCK,
            &[A::B(partials), i(nb), i(c), A::B(target)],
        );
    }
    let stats: Vec<ChannelStats> = CpuBackend.channel_stats(&x).unwrap();
    let norm = Norm {
        gamma: vec![1.5, -0.5, 2.0],
        beta: vec![0.25, 3.0, -1.0],
        eps: 1e-5,
    };
    let (scale, shift) = norm.scale_shift(&stats);
    let (sb, hb) = (sim.f32s(&scale), sim.f32s(&shift));
    let mut outs = vec![];
    for relu in [0, 1] {
        let yb = sim.f32s(&x.data);
        sim.launch(
            "bsp_scale_shift",
            GRID,
            BLOCK,
            &[A::B(yb), i(c), l(plane), A::B(sb), A::B(hb), i(relu)],
        );
        outs.push(yb);
    }
    let rb = sim.f32s(&x.data);
    sim.launch("bsp_relu", GRID, BLOCK, &[A::B(rb), l(c * plane)]);
    let y = rng.tensor(c, h, w);
    let (ab, yb) = (sim.f32s(&x.data), sim.f32s(&y.data));
    sim.launch("bsp_add", GRID, BLOCK, &[A::B(ab), A::B(yb), l(c * plane)]);
    let res = sim.run(exe, "stats");
    let (s, q) = (f64s(&res[sums]), f64s(&res[m2]));
    for ch in 0..c {
        let mean = s[ch] / plane as f64;
        let want = stats[ch];
        assert!(
            (mean - want.mean).abs() <= 1e-12 * (1.0 + want.mean.abs()),
            "mean {ch}"
        );
        assert!(
            (q[ch] - want.m2).abs() <= 1e-10 * want.m2,
            "m2 {ch}: {} vs {}",
            q[ch],
            want.m2
        );
    }
    for (relu, yb) in outs.into_iter().enumerate() {
        let mut want = x.clone();
        CpuBackend
            .normalize(&mut want, &stats, &norm, relu == 1)
            .unwrap();
        assert_same(
            &f32s(&res[yb]),
            &want.data,
            &format!("normalise relu={relu}"),
        );
    }
    let mut want = x.clone();
    CpuBackend.relu(&mut want).unwrap();
    assert_same(&f32s(&res[rb]), &want.data, "relu");
    let mut want = x.clone();
    CpuBackend.add(&mut want, &y).unwrap();
    assert_same(&f32s(&res[ab]), &want.data, "add");
    // The launch the backend makes has this many blocks per channel for a 512² tile.
    assert!(stats_blocks(512 * 512) > 1 && stats_blocks(1) == 1);
}

fn check_all(exe: &Path) {
    check_gather_paste_pad_upsample(exe);
    check_conv(exe);
    check_f16_rounding(exe);
    check_stats_and_elementwise(exe);
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
fn sim_reduction_under_thread_sanitizer() {
    let exe = harness_or_skip!(HARNESS, Flavour::Tsan);
    check_stats_and_elementwise(exe);
}
