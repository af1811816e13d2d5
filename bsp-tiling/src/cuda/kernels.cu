// The CUDA backend's kernels (bsp-tiling). Compiled at run time by NVRTC (`--fmad=false`, so that every
// element-wise result is the same IEEE operation sequence as the CPU backend's Rust), and by g++ through
// the toolkit's CUDA simulator (cuda-sim) for the CPU simulation that checks them against the CPU backend
// op by op (tests/kernel_sim.rs).
//
// Layouts: activations are C×H×W f32, row-major within each channel plane (the CPU backend's `Tensor`).
// Every kernel but the reductions is a grid-stride loop over its output elements with 64-bit indices
// (a 16384² layer of 8 channels has more than 2^31 elements). No CUDA headers are needed.

#ifndef CUDA_CPU_SIM
typedef unsigned short u16;
typedef long long i64;
#endif

#define BSP_FOR(i, n)                                                                    \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n);              \
         i += (i64)gridDim.x * blockDim.x)

// Where coordinate `i` of an axis of length `n` reads from under a padding mode (PaddingMode::map):
// 0 zero (-1 = a zero), 1 replicate, 2 reflect, 3 circular.
__device__ __forceinline__ i64 bsp_pad_index(i64 i, i64 n, int mode) {
    if (i >= 0 && i < n) return i;
    if (mode == 1) return i < 0 ? 0 : n - 1;
    if (mode == 2) {
        if (n == 1) return 0;
        i64 p = 2 * (n - 1);
        i64 r = ((i % p) + p) % p;
        return r < n ? r : p - r;
    }
    if (mode == 3) return ((i % n) + n) % n;
    return -1;
}

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

// out[c][i][j] = src[c][ys[i]][xs[j]], or 0 where ys[i] or xs[j] is -1: a tile's window (own pixels, halo
// and border padding, with nearest upsampling folded into the maps) from a resident layer, or a crop.
extern "C" __global__ void bsp_gather(const float* __restrict__ src, i64 sh, i64 sw, int c,
                                      const int* __restrict__ ys, int ny, const int* __restrict__ xs,
                                      int nx, float* __restrict__ out) {
    i64 plane = (i64)ny * nx;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        int y = ys[r / nx];
        int x = xs[r % nx];
        out[i] = (y < 0 || x < 0) ? 0.0f : src[(ch * sh + y) * sw + x];
    }
}

// Writes `src` (c×sh×sw) into `dst` (c×dh×dw) with its top-left corner at (y0, x0): a tile into its layer.
extern "C" __global__ void bsp_paste(float* __restrict__ dst, i64 dh, i64 dw,
                                     const float* __restrict__ src, int c, int sh, int sw, i64 y0,
                                     i64 x0) {
    i64 plane = (i64)sh * sw;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        i64 y = r / sw;
        i64 x = r - y * sw;
        dst[(ch * dh + y0 + y) * dw + x0 + x] = src[i];
    }
}

// Pads x (c×h×w) by top/left (the output being oh×ow) with a padding mode (see bsp_pad_index).
extern "C" __global__ void bsp_pad(const float* __restrict__ x, int c, int h, int w, int top,
                                   int left, int oh, int ow, int mode, float* __restrict__ out) {
    i64 plane = (i64)oh * ow;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        i64 sy = bsp_pad_index(r / ow - top, h, mode);
        i64 sx = bsp_pad_index(r % ow - left, w, mode);
        out[i] = (sy < 0 || sx < 0) ? 0.0f : x[(ch * h + sy) * w + sx];
    }
}

// Nearest-neighbour ×2 upsampling: out (c×2h×2w).
extern "C" __global__ void bsp_upsample2x(const float* __restrict__ x, int c, int h, int w,
                                          float* __restrict__ out) {
    i64 ow = 2 * (i64)w;
    i64 plane = 4 * (i64)h * w;
    BSP_FOR(i, (i64)c * plane) {
        i64 ch = i / plane;
        i64 r = i - ch * plane;
        out[i] = x[(ch * h + (r / ow) / 2) * w + (r % ow) / 2];
    }
}

// Column matrix [cin·k·k, (y1-y0)·wo] for output rows y0..y1 of a valid k×k convolution with stride s
// (the CPU backend's im2col, same row order: channel, ky, kx). A band has fewer than 2^31 elements (the
// host checks), so the index arithmetic is 32-bit (64-bit division is slow on a GPU); only the read
// address of the input, which may be a whole image, is 64-bit.
#define BSP_IM2COL(STORE)                                                                \
    unsigned int n = (unsigned int)(y1 - y0) * (unsigned int)wo;                         \
    unsigned int kk2 = (unsigned int)(k * k);                                            \
    unsigned int total = (unsigned int)cin * kk2 * n;                                    \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total;              \
         i += gridDim.x * blockDim.x) {                                                  \
        unsigned int r = i / n;                                                          \
        unsigned int p = i - r * n;                                                      \
        unsigned int ch = r / kk2;                                                       \
        unsigned int rk = r - ch * kk2;                                                  \
        unsigned int ky = rk / (unsigned int)k;                                          \
        unsigned int kx = rk - ky * (unsigned int)k;                                     \
        unsigned int oy = (unsigned int)y0 + p / (unsigned int)wo;                       \
        unsigned int ox = p % (unsigned int)wo;                                          \
        float v = x[((i64)ch * h + (i64)oy * s + ky) * w + (i64)ox * s + kx];            \
        col[i] = STORE(v);                                                               \
    }

#define BSP_AS_F32(v) (v)
#define BSP_AS_F16(v) bsp_f16_bits(v)

extern "C" __global__ void bsp_im2col(const float* __restrict__ x, int cin, int h, int w, int k,
                                      int s, int y0, int y1, int wo, float* __restrict__ col) {
    BSP_IM2COL(BSP_AS_F32)
}

// The same columns as binary16 bit patterns, for the f16 GEMM (f32 accumulation).
extern "C" __global__ void bsp_im2col_f16(const float* __restrict__ x, int cin, int h, int w, int k,
                                          int s, int y0, int y1, int wo, u16* __restrict__ col) {
    BSP_IM2COL(BSP_AS_F16)
}

extern "C" __global__ void bsp_to_f16(const float* __restrict__ x, i64 n, u16* __restrict__ out) {
    BSP_FOR(i, n) { out[i] = bsp_f16_bits(x[i]); }
}

// Every output plane filled with its channel's bias (the GEMM then accumulates onto it, beta = 1).
extern "C" __global__ void bsp_fill_bias(float* __restrict__ out, int c, i64 plane,
                                         const float* __restrict__ bias) {
    BSP_FOR(i, (i64)c * plane) { out[i] = bias[i / plane]; }
}

// Per-channel partial sums in f64: block (b, ch) sums elements b·blockDim + t, stepping by
// gridDim.x·blockDim, of plane ch; with `sums` set, the squared deviations from the channel mean
// sums[ch] / plane instead. partials[ch·gridDim.x + b]. blockDim.x: a power of two, at most 256.
extern "C" __global__ void bsp_channel_partials(const float* __restrict__ x, i64 plane,
                                                const double* __restrict__ sums, int squares,
                                                double* __restrict__ partials) {
    __shared__ double part[256];
    unsigned int t = threadIdx.x;
    i64 ch = blockIdx.y;
    const float* p = x + ch * plane;
    double mean = squares ? sums[ch] / (double)plane : 0.0;
    double acc = 0.0;
    for (i64 j = (i64)blockIdx.x * blockDim.x + t; j < plane; j += (i64)gridDim.x * blockDim.x) {
        double v = (double)p[j];
        if (squares) {
            double d = v - mean;
            acc += d * d;
        } else {
            acc += v;
        }
    }
    part[t] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        __syncthreads();
    }
    if (t == 0) partials[ch * gridDim.x + blockIdx.x] = part[0];
}

// out[ch] = sum of the nb partials of channel ch, in order.
extern "C" __global__ void bsp_sum_partials(const double* __restrict__ partials, int nb, int c,
                                            double* __restrict__ out) {
    BSP_FOR(ch, c) {
        double acc = 0.0;
        for (int b = 0; b < nb; b++) acc += partials[ch * nb + b];
        out[ch] = acc;
    }
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

extern "C" __global__ void bsp_relu(float* __restrict__ x, i64 n) {
    BSP_FOR(i, n) { x[i] = fmaxf(x[i], 0.0f); }
}

// x += y (the residual connection).
extern "C" __global__ void bsp_add(float* __restrict__ x, const float* __restrict__ y, i64 n) {
    BSP_FOR(i, n) { x[i] = x[i] + y[i]; }
}
