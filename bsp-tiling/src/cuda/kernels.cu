// The CUDA backend's kernels (bsp-tiling): the graph engine's ops. Compiled at run time by NVRTC
// (`--fmad=false`, so that every element-wise result is the same IEEE operation sequence as the CPU
// backend's Rust), and by g++ through the toolkit's CUDA simulator (cuda-sim) for the CPU simulation that
// checks them against the CPU backend op by op (tests/kernel_sim.rs).
//
// Layouts: activations are C×H×W f32, row-major within each channel plane (the CPU backend's `Tensor`).
// Every kernel is a grid-stride loop over its output elements with 64-bit indices
// (a 16384² layer of 8 channels has more than 2^31 elements). No CUDA headers are needed.

#ifndef CUDA_CPU_SIM
typedef unsigned short u16;
typedef long long i64;
#endif

#ifdef CUDA_CPU_SIM
#define BSP_NEG_INF (-HUGE_VALF)
#else
#define BSP_NEG_INF (__int_as_float((int)0xff800000u))
#endif

#define BSP_FOR(i, n)                                                                    \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n);              \
         i += (i64)gridDim.x * blockDim.x)

// IEEE binary16 bits of `f`, rounded to nearest even (as the `half` crate's `f16::from_f32`).
__device__ __forceinline__ u16 bsp_f16_bits(float f) {
    unsigned int x = __float_as_uint(f);
    unsigned int sign = (x >> 16) & 0x8000u;
    unsigned int mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) {  // inf, NaN (quiet, top payload bits kept)
        return (u16)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0u));
    }
    if (mag >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // rounds past 65504: infinity
    if (mag < 0x38800000u) {                               // below 2^-14: subnormal or zero
        if (mag < 0x33000000u) return (u16)sign;            // below 2^-25: zero
        unsigned int e = mag >> 23;
        unsigned int m = (mag & 0x7fffffu) | 0x800000u;
        unsigned int shift = 126u - e;
        unsigned int r = m >> shift;
        unsigned int rem = m & ((1u << shift) - 1u);
        unsigned int half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (u16)(sign | r);
    }
    unsigned int r = mag - 0x38000000u;  // exponent rebiased from 127 to 15
    unsigned int res = r >> 13;
    unsigned int rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) res++;  // a carry moves into the exponent
    return (u16)(sign | res);
}

#define BSP_AS_F32(v) (v)
#define BSP_AS_F16(v) bsp_f16_bits(v)

extern "C" __global__ void bsp_to_f16(const float* __restrict__ x, i64 n, u16* __restrict__ out) {
    BSP_FOR(i, n) { out[i] = bsp_f16_bits(x[i]); }
}

// The f32 value of binary16 bits `h` (exact: every binary16 value is an f32).
__device__ __forceinline__ float bsp_f16_value(u16 h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int e = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int m = (unsigned int)h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));  // inf, NaN
    if (e == 0u) {  // zero or subnormal: m · 2^-24, exact in f32
        float v = (float)m * 5.9604644775390625e-8f;
        return __uint_as_float(sign | __float_as_uint(v));
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));  // exponent rebiased from 15 to 127
}

// out += y as f32: a convolution's binary16 result (cuDNN's, under f16) onto the output that holds its
// bias, in f32.
extern "C" __global__ void bsp_add_f16(float* __restrict__ out, const u16* __restrict__ y, i64 n) {
    BSP_FOR(i, n) { out[i] = out[i] + bsp_f16_value(y[i]); }
}

// Every output plane filled with its channel's bias (the GEMM then accumulates onto it, beta = 1).
extern "C" __global__ void bsp_fill_bias(float* __restrict__ out, int c, i64 plane,
                                         const float* __restrict__ bias) {
    BSP_FOR(i, (i64)c * plane) { out[i] = bias[i / plane]; }
}

// x = x·scale[ch] + shift[ch], then max(·, 0) if relu: normalisation with given statistics folded into
// a per-channel affine map (computed on the host in f64, exactly as the CPU backend does).
extern "C" __global__ void bsp_scale_shift(float* __restrict__ x, int c, i64 plane,
                                           const float* __restrict__ scale,
                                           const float* __restrict__ shift, int relu) {
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        float v = x[i] * scale[ch] + shift[ch];
        x[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// ---- The graph engine's ops (src/graph/ops.rs), each computing a tile's output from its gathered window.

// Columns of one group for output rows y0..y1 of a valid convolution with a kh×kw kernel, per-axis stride
// and dilation: [cg·kh·kw, (y1-y0)·wo], rows in (channel, ky, kx) order, channels c0..c0+cg of x (c×h×w).
// ops.rs `im2col`, element for element. A band has fewer than 2^31 elements (the host checks).
#define BSP_IM2COL_G(STORE)                                                              \
    unsigned int n = (unsigned int)(y1 - y0) * (unsigned int)wo;                         \
    unsigned int kk2 = (unsigned int)(kh * kw);                                          \
    unsigned int total = (unsigned int)cg * kk2 * n;                                     \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total;              \
         i += gridDim.x * blockDim.x) {                                                  \
        unsigned int r = i / n;                                                          \
        unsigned int p = i - r * n;                                                      \
        unsigned int ch = r / kk2;                                                       \
        unsigned int rk = r - ch * kk2;                                                  \
        unsigned int ky = rk / (unsigned int)kw;                                         \
        unsigned int kx = rk - ky * (unsigned int)kw;                                    \
        unsigned int oy = (unsigned int)y0 + p / (unsigned int)wo;                       \
        unsigned int ox = p % (unsigned int)wo;                                          \
        float v = x[((i64)(c0 + (int)ch) * h + (i64)oy * sy + (i64)ky * dy) * w +        \
                    (i64)ox * sx + (i64)kx * dx];                                        \
        col[i] = STORE(v);                                                               \
    }

extern "C" __global__ void bsp_im2col_g(const float* __restrict__ x, int c0, int cg, int h, int w,
                                        int kh, int kw, int sy, int sx, int dy, int dx, int y0,
                                        int y1, int wo, float* __restrict__ col) {
    BSP_IM2COL_G(BSP_AS_F32)
}

// The same columns as binary16 bit patterns, for the f16 GEMM (f32 accumulation) of Precision::F16.
extern "C" __global__ void bsp_im2col_g_f16(const float* __restrict__ x, int c0, int cg, int h,
                                            int w, int kh, int kw, int sy, int sx, int dy, int dx,
                                            int y0, int y1, int wo, u16* __restrict__ col) {
    BSP_IM2COL_G(BSP_AS_F16)
}

// Transposed convolution, second half: cols [cout·kh·kw, xh·xw] (row (co, ky, kx) = Wᵀ·x of the window,
// from the GEMM) scattered to the outputs. Each output (co, oy, ox) starts from its bias and adds its
// contributions in (ky, kx) order — a fixed order, no atomics: input row iy reaches output row oy when
// oy + offy - ky·dy = iy·sy (offy = the output range's start + the begin padding - the window's first
// input row · sy), likewise for columns.
extern "C" __global__ void bsp_col2im(const float* __restrict__ cols, const float* __restrict__ bias,
                                      int cout, int xh, int xw, int kh, int kw, int sy, int sx,
                                      int dy, int dx, i64 offy, i64 offx, int ho, int wo,
                                      float* __restrict__ out) {
    i64 plane = (i64)ho * wo;
    i64 n = (i64)xh * xw;
    BSP_FOR(i, (i64)cout * plane) {
        i64 co = i / plane;
        i64 r = i - co * plane;
        i64 oy = r / wo;
        i64 ox = r - oy * wo;
        float acc = bias[co];
        for (int ky = 0; ky < kh; ky++) {
            i64 ty = oy + offy - (i64)ky * dy;
            if (ty < 0 || ty % sy != 0 || ty / sy >= xh) continue;
            i64 iy = ty / sy;
            for (int kx = 0; kx < kw; kx++) {
                i64 tx = ox + offx - (i64)kx * dx;
                if (tx < 0 || tx % sx != 0 || tx / sx >= xw) continue;
                acc += cols[((co * kh + ky) * kw + kx) * n + iy * xw + tx / sx];
            }
        }
        out[i] = acc;
    }
}

__device__ __forceinline__ float bsp_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

// Rust's f32::clamp (NaN passes through).
__device__ __forceinline__ float bsp_clamp(float v, float lo, float hi) {
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    return v;
}

// The unary functions, numbered as `ops::Unary` is listed: 0 Relu, 1 LeakyRelu(a), 2 PRelu (slope per
// channel, ns = 1 or c), 3 Sigmoid, 4 Tanh, 5 Clip(a, b), 6 Softplus, 7 Mish, 8 HardSigmoid(a, b),
// 9 HardSwish, 10 Elu(a), 11 Erf, 12 Gelu (erf), 13 Gelu (tanh), 14 Neg, 15 Abs, 16 Exp, 17 Sqrt.
// In place, the same f32/f64 expressions as ops.rs `unary`. Erf and Gelu take the f64 `erf` of the
// platform (CUDA's here, musl's `libm::erf` in ops.rs; both within 2 ulp of f64) rounded to f32: the
// same f32 except where the exact value lies within ~1e-15 of a rounding boundary.
extern "C" __global__ void bsp_unary(float* __restrict__ x, i64 n, i64 plane, int kind, float a,
                                     float b, const float* __restrict__ slope, int ns) {
    BSP_FOR(i, n) {
        float v = x[i];
        float r;
        switch (kind) {
            case 0: r = fmaxf(v, 0.0f); break;
            case 1: r = v < 0.0f ? v * a : v; break;
            case 2: {
                float s = slope[ns == 1 ? 0 : i / plane];
                r = v < 0.0f ? v * s : v;
                break;
            }
            case 3: r = 1.0f / (1.0f + expf(-v)); break;
            case 4: r = tanhf(v); break;
            case 5: r = fminf(fmaxf(v, a), b); break;
            case 6: r = bsp_softplus(v); break;
            case 7: r = v * tanhf(bsp_softplus(v)); break;
            case 8: r = bsp_clamp(a * v + b, 0.0f, 1.0f); break;
            case 9: r = v * bsp_clamp(v / 6.0f + 0.5f, 0.0f, 1.0f); break;
            case 10: r = v < 0.0f ? a * (expf(v) - 1.0f) : v; break;
            case 11: r = (float)erf((double)v); break;
            case 12: r = (float)(0.5 * (double)v * (1.0 + erf((double)v / 1.4142135623730951))); break;
            case 13: {
                double z = (double)v;
                r = (float)(0.5 * z *
                            (1.0 + tanh(sqrt(2.0 / 3.141592653589793) * (z + 0.044715 * z * z * z))));
                break;
            }
            case 14: r = -v; break;
            case 15: r = fabsf(v); break;
            case 16: r = expf(v); break;
            default: r = sqrtf(v); break;
        }
        x[i] = r;
    }
}

// The binary operations, numbered as `ops::BinOp`: 0 Add, 1 Sub, 2 Mul, 3 Div, 4 Max, 5 Min, 6 Pow.
__device__ __forceinline__ float bsp_binop(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return fmaxf(a, b);
        case 5: return fminf(a, b);
        default: return powf(a, b);
    }
}

// out (c×plane) = x op y, channel ch reading channel ch % xc of x and ch % yc of y (one of them may have
// a single channel, broadcast).
extern "C" __global__ void bsp_binary(const float* __restrict__ x, int xc, const float* __restrict__ y,
                                      int yc, int c, i64 plane, int op, float* __restrict__ out) {
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 p = i - ch * plane;
        out[i] = bsp_binop(op, x[(ch % xc) * plane + p], y[(ch % yc) * plane + p]);
    }
}

// x = x op k[ch] (or k[ch] op x with const_first), k of length 1 or c, in place.
extern "C" __global__ void bsp_binary_const(float* __restrict__ x, int c, i64 plane,
                                            const float* __restrict__ k, int nk, int const_first,
                                            int op) {
    BSP_FOR(i, (i64)c * plane) {
        float kv = k[nk == 1 ? 0 : i / plane];
        x[i] = const_first ? bsp_binop(op, kv, x[i]) : bsp_binop(op, x[i], kv);
    }
}

// dst[offset + i] = src[i]: Concat (an input pasted at its channel offset), Identity.
extern "C" __global__ void bsp_copy(float* __restrict__ dst, i64 offset, const float* __restrict__ src,
                                    i64 n) {
    BSP_FOR(i, n) { dst[offset + i] = src[i]; }
}

// Max or average pooling of a gathered window x (c×xh×xw) to ho×wo: window rows/columns with
// yin/xin = 0 are padding (skipped); an average divides by cy[y]·cx[x] (at least 1), the divisor counts
// the host computed (count_include_pad as ops.rs). Sums in (ky, kx) order, as ops.rs `pool`.
extern "C" __global__ void bsp_pool(const float* __restrict__ x, int c, int xh, int xw, int ho,
                                    int wo, int kh, int kw, int sy, int sx, int dy, int dx,
                                    int is_max, const int* __restrict__ yin,
                                    const int* __restrict__ xin, const int* __restrict__ cy,
                                    const int* __restrict__ cx, float* __restrict__ out) {
    i64 plane = (i64)ho * wo;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        int y = (int)(r / wo);
        int xo = (int)(r - (i64)y * wo);
        const float* p = x + ch * xh * (i64)xw;
        float acc = is_max ? BSP_NEG_INF : 0.0f;
        for (int ky = 0; ky < kh; ky++) {
            int wy = y * sy + ky * dy;
            if (!yin[wy]) continue;
            for (int kx = 0; kx < kw; kx++) {
                int wx = xo * sx + kx * dx;
                if (!xin[wx]) continue;
                float v = p[(i64)wy * xw + wx];
                acc = is_max ? fmaxf(acc, v) : acc + v;
            }
        }
        if (!is_max) {
            int cnt = cy[y] * cx[xo];
            acc /= (float)(cnt > 1 ? cnt : 1);
        }
        out[i] = acc;
    }
}

// Linear resize of a gathered window x (c×xh×xw) by per-axis tables from the host (ops.rs `taps`, made
// relative to the window): output row y blends window rows ya[y], yb[y] with weight fy[y] of the second.
extern "C" __global__ void bsp_resize_linear(const float* __restrict__ x, int c, int xh, int xw,
                                             int ho, int wo, const int* __restrict__ ya,
                                             const int* __restrict__ yb,
                                             const float* __restrict__ fy,
                                             const int* __restrict__ xa,
                                             const int* __restrict__ xb,
                                             const float* __restrict__ fx,
                                             float* __restrict__ out) {
    i64 plane = (i64)ho * wo;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        int y = (int)(r / wo);
        int xo = (int)(r - (i64)y * wo);
        const float* ra = x + (ch * xh + ya[y]) * (i64)xw;
        const float* rb = x + (ch * xh + yb[y]) * (i64)xw;
        float wx = fx[xo];
        float wy = fy[y];
        float top = ra[xa[xo]] * (1.0f - wx) + ra[xb[xo]] * wx;
        float bot = rb[xa[xo]] * (1.0f - wx) + rb[xb[xo]] * wx;
        out[i] = top * (1.0f - wy) + bot * wy;
    }
}

// x (c×h×w) = value wherever its window row or column is padding (yin/xin = 0): constant Pad with a
// value other than zero (the gather wrote zeros there).
extern "C" __global__ void bsp_fill_outside(float* __restrict__ x, int c, int h, int w,
                                            const int* __restrict__ yin,
                                            const int* __restrict__ xin, float value) {
    i64 plane = (i64)h * w;
    BSP_FOR(i, (i64)c * plane) {
        i64 r = i % plane;
        if (!yin[r / w] || !xin[r % w]) x[i] = value;
    }
}

// DepthToSpace of a gathered window x (c·b·b × ho × wo: row y holds input row (oy0 + y) / b): output
// (ch, y, x) reads channel ch·b² + ry·b + rx (CRD) or (ry·b + rx)·c + ch (DCR), ry = (oy0 + y) mod b.
extern "C" __global__ void bsp_depth_to_space(const float* __restrict__ x, int c, int ho, int wo,
                                              int b, int crd, int ry0, int rx0,
                                              float* __restrict__ out) {
    i64 plane = (i64)ho * wo;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        int y = (int)(r / wo);
        int xo = (int)(r - (i64)y * wo);
        int ry = (ry0 + y) % b;
        int rx = (rx0 + xo) % b;
        i64 src = crd ? ch * b * b + ry * b + rx : (i64)(ry * b + rx) * c + ch;
        out[i] = x[src * plane + r];
    }
}

// SpaceToDepth of a gathered window x (c × ho·b × wo·b) to c·b² × ho × wo, channel (ry·b + rx)·c + ch.
extern "C" __global__ void bsp_space_to_depth(const float* __restrict__ x, int c, int ho, int wo,
                                              int b, float* __restrict__ out) {
    i64 plane = (i64)ho * wo;
    BSP_FOR(i, (i64)c * b * b * plane) {
        i64 d = i / plane;
        i64 r = i - d * plane;
        int y = (int)(r / wo);
        int xo = (int)(r - (i64)y * wo);
        i64 ch = d % c;
        i64 k = d / c;
        int ry = (int)(k / b);
        int rx = (int)(k % b);
        out[i] = x[(ch * ho * b + (i64)y * b + ry) * ((i64)wo * b) + (i64)xo * b + rx];
    }
}

// ---- Values kept on the device between supersteps (src/graph/kept.rs): windows gathered from the tiles
// that hold them, and the per-channel statistics the normalisations read.

// The part of a window (c channels of wplane = wh·ww values, rows ww wide) that one tile (c channels of
// splane values, rows sw wide) holds: `map` lists the ny window rows it holds, then their rows in the
// tile, then the nx window columns and their columns in the tile. Tiles partition a value, so each window
// pixel is written by one part at most, whatever the order of the launches; the host zeroes the window
// first where it has padding. `field::Parts` on the host, element for element.
extern "C" __global__ void bsp_gather_part(const float* __restrict__ src, int c, int sw, i64 splane,
                                         const int* __restrict__ map, int ny, int nx, int ww,
                                         i64 wplane, float* __restrict__ dst) {
    const int* yw = map;
    const int* yt = map + ny;
    const int* xw = map + 2 * ny;
    const int* xt = xw + nx;
    i64 n = (i64)ny * nx;
    BSP_FOR(i, (i64)c * n) {
        i64 ch = i / n;
        i64 p = i - ch * n;
        int a = (int)(p / nx);
        int b = (int)(p - (i64)a * nx);
        dst[ch * wplane + (i64)yw[a] * ww + xw[b]] = src[ch * splane + (i64)yt[a] * sw + xt[b]];
    }
}

#define BSP_STATS_THREADS 256

// Sum of the block's `acc` in a fixed tree (pairs k apart, k halving); every thread returns it.
__device__ __forceinline__ double bsp_block_sum(double* acc, int t) {
    for (int k = BSP_STATS_THREADS / 2; k > 0; k >>= 1) {
        if (t < k) acc[t] += acc[t + k];
        __syncthreads();
    }
    double s = acc[0];
    __syncthreads();  // every thread has read the sum before `acc` is written again
    return s;
}

// Per-channel statistics of x (c planes of `plane` values) in blocks of `chunk` values: grid (nb, c) of
// BSP_STATS_THREADS threads; block b of channel ch takes values b·chunk .. min((b+1)·chunk, plane) (none
// empty), two passes in f64: the mean (thread t sums values t, t + 256, ... in order, then the tree), then
// the squared deviations from it the same way. out[(ch·nb + b)·2] = the block's mean, [+1] = its M2; the
// host merges the blocks in order (Chan et al.), so the result depends only on the shape.
extern "C" __global__ void bsp_channel_stats(const float* __restrict__ x, i64 plane, i64 chunk,
                                           double* __restrict__ out) {
    __shared__ double acc[BSP_STATS_THREADS];
    int b = blockIdx.x, ch = blockIdx.y, t = threadIdx.x;
    i64 lo = (i64)b * chunk;
    i64 hi = lo + chunk < plane ? lo + chunk : plane;
    const float* p = x + (i64)ch * plane;
    double s = 0.0;
    for (i64 i = lo + t; i < hi; i += BSP_STATS_THREADS) s += (double)p[i];
    acc[t] = s;
    __syncthreads();
    double mean = bsp_block_sum(acc, t) / (double)(hi - lo);
    double m2 = 0.0;
    for (i64 i = lo + t; i < hi; i += BSP_STATS_THREADS) {
        double d = (double)p[i] - mean;
        m2 += d * d;
    }
    acc[t] = m2;
    __syncthreads();
    m2 = bsp_block_sum(acc, t);
    if (t == 0) {
        out[((i64)ch * gridDim.x + b) * 2] = mean;
        out[((i64)ch * gridDim.x + b) * 2 + 1] = m2;
    }
}
