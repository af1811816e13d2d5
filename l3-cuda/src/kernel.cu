// L3 batch decoder: CUDA C, compiled at run time by NVRTC (see src/device.rs), and on the CPU by
// cpu-sim/harness.cpp through a small shim header so the very same source can be checked without a GPU.
//
// Parallelism (l3-eccv22, section 4.4):
//   * one thread block per patch descriptor = (image, channel, patch) of the whole batch;
//   * inside a block the patch's compressed bytes are staged in shared memory (when they fit), ONE thread
//     walks only the row headers (h steps of O(1), never the pixels) to find every row's byte offset, nbit
//     and base;
//   * then rows are decoded in order; within a row one thread per pixel unpacks its delta (pixel-wise
//     base-delta) and applies the custom Paeth filter from the previous row, held in shared memory
//     (double-buffered, so a single barrier per row suffices).
// Every read is bounded by the patch's byte range, every write by the descriptor the host validated.
// A patch whose rows do not fit its bytes (nbit > 8, a row past the end, and for whole images bytes left
// over: what the CPU decoder rejects; caught before the launch when the host walks the rows) sets *err to
// the lowest failing descriptor index and writes nothing.
//
// Two entry points share the patch decoder (l3_patch_rows):
//   * l3_decode_{u8,f32,f16}: whole images, every patch of every channel, each image in its own slot;
//   * l3_samples_{u8,f32,f16}: fixed-size 3-channel samples. Only the patches under each image's window
//     have descriptors; a patch is decoded from its top down to the last row the window needs (rows
//     above the window are decoded, not written; rows below are not decoded), only the window's columns
//     are written, mirrored when the sample is flipped, gray copied to R, G, B, alpha never read. Blocks
//     past the descriptors write the padding around each window, in the same launch.
// Output element types: u8 as decoded; f32 = fmaf(v, scale[c], bias[c]); f16 = that f32 rounded to
// nearest even. Every layout is a matter of the strides in the descriptors.
//
// Bit layout (l3-format/SPEC.md v1): each row starts on a byte boundary and is read LSB-first (bit k of a
// row is bit k % 8 of byte k / 8): nbit (bits 0..4), base (bits 4..12), then w deltas of nbit bits, padded
// to a whole byte; a patch's rows use its bytes exactly (no trailing bytes). Row 0 holds the pixel values,
// later rows the residual (x - pred) mod 256; value = (base + delta) mod 256 in both cases.

#ifndef L3_CPU_SIM
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define L3_DYNAMIC_SMEM(name) extern __shared__ __align__(16) u8 name[]
#endif

#define L3_MAX_PATCH 256

// Reads n (0..=8) bits starting at bit `bitpos`, LSB-first; bytes at or past `len` read as 0.
__device__ __forceinline__ u32 l3_bits(const u8* p, u32 len, u32 bitpos, u32 n) {
    u32 byte = bitpos >> 3;
    u32 sh = bitpos & 7u;
    u32 b0 = byte < len ? (u32)p[byte] : 0u;
    u32 b1 = byte + 1u < len ? (u32)p[byte + 1u] : 0u;
    u32 word = b0 | (b1 << 8);
    return (word >> sh) & ((1u << n) - 1u);
}

__device__ __forceinline__ int l3_abs(int v) { return v < 0 ? -v : v; }

// The custom Paeth predictor over the previous row: TL (c-1), T (c), TR (c+1); absence by position.
__device__ __forceinline__ u32 l3_paeth(const u8* prev, u32 c, u32 w) {
    int t = prev[c];
    if (w == 1u) return (u32)t;
    if (c == 0u) {
        int tr = prev[1];
        int p = tr - t;                   // TL absent: counts as 0
        return l3_abs(p - t) <= l3_abs(p - tr) ? (u32)t : (u32)tr;
    }
    if (c == w - 1u) {
        int tl = prev[c - 1u];
        int p = tl - t;                   // TR absent: counts as 0
        return l3_abs(p - tl) <= l3_abs(p - t) ? (u32)tl : (u32)t;
    }
    int tl = prev[c - 1u];
    int tr = prev[c + 1u];
    int p = tl + tr - t;
    int dtl = l3_abs(p - tl), dt = l3_abs(p - t), dtr = l3_abs(p - tr);
    if (dtl <= dt && dtl <= dtr) return (u32)tl;
    if (dt <= dtr) return (u32)t;
    return (u32)tr;
}

// f32 -> IEEE binary16 bits, round to nearest even (no cuda_fp16.h: NVRTC needs no include path).
__device__ __forceinline__ u16 l3_f32_to_f16(float f) {
    union { float f; u32 u; } v;
    v.f = f;
    u32 x = v.u;
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);            // rounds to >= 65520: inf
    if (ax < 0x38800000u) {                                          // subnormal half (or zero)
        if (ax < 0x33000000u) return (u16)sign;                      // < 2^-25: rounds to 0
        u32 e = ax >> 23;
        u32 m = (ax & 0x7fffffu) | 0x800000u;
        u32 shift = 126u - e;                                        // 14 + (113 - e)
        u32 half_m = m >> shift;
        u32 rem = m & ((1u << shift) - 1u);
        u32 mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half_m & 1u))) half_m++;
        return (u16)(sign | half_m);
    }
    u32 r = ax - 0x38000000u;                                        // rebias exponent 127 -> 15
    u32 half_v = r >> 13;
    u32 rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half_v & 1u))) half_v++;
    return (u16)(sign | half_v);
}

__device__ __forceinline__ void l3_store(u8* out, u64 i, u32 v, const float*) { out[i] = (u8)v; }
__device__ __forceinline__ void l3_store(float* out, u64 i, u32 v, const float* sb) {
    out[i] = fmaf((float)v, sb[0], sb[1]);
}
__device__ __forceinline__ void l3_store(u16* out, u64 i, u32 v, const float* sb) {
    out[i] = l3_f32_to_f16(fmaf((float)v, sb[0], sb[1]));
}

// Decodes rows [0, rows) of one patch `w` pixels wide and hands every pixel to `emit(row, column, value)`.
// `exact`: the rows must use the patch's bytes exactly (a whole patch, as the CPU's whole-image decoder
// checks); otherwise only the rows decoded must lie inside them (as the CPU's region decoder checks).
// A patch that fails sets *err to min(*err, d) and emits nothing. Must be reached by every thread of the
// block (it holds barriers); `w`, `rows` and `len` are block-uniform.
template <typename Emit>
__device__ void l3_patch_rows(const u8* __restrict__ data, u64 data_offset, u32 len, u32 w, u32 rows,
                              bool exact, u32 d, u32* __restrict__ err, u32 stage_cap, const Emit& emit) {
    __shared__ u32 s_off[L3_MAX_PATCH];
    __shared__ u8 s_nbit[L3_MAX_PATCH];
    __shared__ u8 s_base[L3_MAX_PATCH];
    __shared__ u8 s_rows[2][L3_MAX_PATCH];
    __shared__ u32 s_ok;
    L3_DYNAMIC_SMEM(s_stage);

    u32 tid = threadIdx.x, nthreads = blockDim.x;
    if (w == 0u || rows == 0u || w > 255u || rows > 255u) {
        if (tid == 0u) atomicMin(err, d);
        return;
    }

    // Stage the compressed patch in shared memory when it fits: the header walk and the unpack then
    // touch only shared memory. Otherwise both read global memory directly.
    const u8* src = data + data_offset;
    if (len <= stage_cap) {
        for (u32 i = tid; i < len; i += nthreads) s_stage[i] = src[i];
        src = s_stage;
    }
    __syncthreads();

    // One thread walks the row headers only: row r's bytes start where row r-1's (12 + w*nbit bits,
    // byte-padded) end. Every row decoded must fit in the patch's bytes.
    if (tid == 0u) {
        u32 pos = 0u, ok = 1u;
        for (u32 r = 0; r < rows; r++) {
            if (pos + 2u > len) { ok = 0u; break; }
            u32 bit = pos * 8u;
            u32 nbit = l3_bits(src, len, bit, 4u);
            if (nbit > 8u) { ok = 0u; break; }
            u32 row_len = (12u + w * nbit + 7u) >> 3;
            if (pos + row_len > len) { ok = 0u; break; }
            s_off[r] = pos;
            s_nbit[r] = (u8)nbit;
            s_base[r] = (u8)l3_bits(src, len, bit + 4u, 8u);
            pos += row_len;
        }
        if (exact && pos != len) ok = 0u;  // trailing bytes: the CPU's whole decode rejects them too
        s_ok = ok;
        if (!ok) atomicMin(err, d);
    }
    __syncthreads();
    if (!s_ok) return;

    for (u32 r = 0; r < rows; r++) {
        u8* cur = s_rows[r & 1u];
        const u8* prev = s_rows[(r & 1u) ^ 1u];
        u32 nbit = s_nbit[r], base = s_base[r];
        u32 bit0 = s_off[r] * 8u + 12u;
        for (u32 c = tid; c < w; c += nthreads) {
            u32 v = (base + l3_bits(src, len, bit0 + c * nbit, nbit)) & 255u;
            if (r > 0u) v = (v + l3_paeth(prev, c, w)) & 255u;
            cur[c] = (u8)v;
            emit(r, c, v);
        }
        __syncthreads();
    }
}

// ---- Whole images: every patch of every channel, each image in its own slot of the output. ----

// Must match `PatchDesc` in src/plan.rs byte for byte (40 bytes, 8-aligned).
struct PatchDesc {
    u64 data_offset;   // first byte of the patch in the batch's data buffer
    u64 out_offset;    // output element of the patch's top-left pixel (channel plane included)
    u32 data_len;      // bytes of the patch
    u32 row_stride;    // output elements between two rows
    u32 pixel_stride;  // output elements between two pixels of a row
    u16 w;             // patch width  (1..=255)
    u16 h;             // patch height (1..=255)
    u32 channel;       // index into the per-channel scale/bias table
    u32 reserved;
};

template <typename Out>
struct L3WholeEmit {
    Out* out;
    u64 base;
    u32 row_stride, pixel_stride;
    const float* sb;
    __device__ __forceinline__ void operator()(u32 r, u32 c, u32 v) const {
        l3_store(out, base + (u64)r * row_stride + (u64)c * pixel_stride, v, sb);
    }
};

// scale_bias: 2 floats (scale, bias) per channel index, out = v * scale + bias (unused for u8).
template <typename Out>
__device__ void l3_decode_patches(const u8* __restrict__ data, const PatchDesc* __restrict__ descs,
                                  u32 n_descs, Out* __restrict__ out, const float* __restrict__ scale_bias,
                                  u32* __restrict__ err, u32 stage_cap) {
    u32 d = blockIdx.x;
    if (d >= n_descs) return;
    PatchDesc pd = descs[d];
    L3WholeEmit<Out> emit{out, pd.out_offset, pd.row_stride, pd.pixel_stride, scale_bias + 2u * pd.channel};
    l3_patch_rows(data, pd.data_offset, pd.data_len, pd.w, pd.h, true, d, err, stage_cap, emit);
}

extern "C" __global__ void l3_decode_u8(const u8* data, const PatchDesc* descs, u32 n_descs, u8* out,
                                        const float* scale_bias, u32* err, u32 stage_cap) {
    l3_decode_patches<u8>(data, descs, n_descs, out, scale_bias, err, stage_cap);
}

extern "C" __global__ void l3_decode_f32(const u8* data, const PatchDesc* descs, u32 n_descs, float* out,
                                         const float* scale_bias, u32* err, u32 stage_cap) {
    l3_decode_patches<float>(data, descs, n_descs, out, scale_bias, err, stage_cap);
}

extern "C" __global__ void l3_decode_f16(const u8* data, const PatchDesc* descs, u32 n_descs, u16* out,
                                         const float* scale_bias, u32* err, u32 stage_cap) {
    l3_decode_patches<u16>(data, descs, n_descs, out, scale_bias, err, stage_cap);
}

// ---- Samples: a window of each image, flipped or not, into a fixed-size 3-channel sample; the rest of
// ---- the sample is padding. One launch: blocks [0, n_descs) decode patches, the next n_fills blocks
// ---- write the padding (disjoint from every window, so the two kinds of block never touch one element).

// Must match `SampleDesc` in src/sample.rs byte for byte (48 bytes, 8-aligned).
struct SampleDesc {
    u64 data_offset;   // first byte of the patch in the batch's data buffer
    u64 out_offset;    // output element of patch pixel (col0, skip), output channel `channel`
    u32 data_len;      // bytes of the patch
    int row_stride;    // output elements between two written rows
    int col_stride;    // output elements between two adjacent patch columns (negative when flipped)
    u32 copy_stride;   // output elements between the output channels one gray pixel is copied to
    u16 w;             // patch width (1..=255)
    u16 rows;          // rows decoded: from the patch's top to the last row the window needs (1..=255)
    u16 skip;          // leading rows decoded but not written
    u16 col0, col1;    // patch columns written: [col0, col1)
    u8 channel;        // output channel of the first copy: its scale/bias pair
    u8 copies;         // 1, or 3 for a gray image (replicated to R, G, B)
    u32 reserved;
};

// Must match `FillDesc` in src/sample.rs (32 bytes).
struct FillDesc {
    u64 out_offset;    // first element of the sample
    u32 y0, y1;        // sample rows this block pads
    u32 dx, dy, w, h;  // the window, which is not padded
};

template <typename Out>
struct L3SampleEmit {
    Out* out;
    u64 base;
    int row_stride, col_stride;
    u32 copy_stride, skip, col0, col1, copies;
    const float* sb;
    __device__ __forceinline__ void operator()(u32 r, u32 c, u32 v) const {
        if (r < skip || c < col0 || c >= col1) return;
        long long at = (long long)base + (long long)(r - skip) * row_stride + (long long)(c - col0) * col_stride;
        for (u32 k = 0; k < copies; k++) l3_store(out, (u64)at + (u64)k * copy_stride, v, sb + 2u * k);
    }
};

// width/height: the sample's; nchw: 1 for planar output, 0 for interleaved.
template <typename Out>
__device__ void l3_decode_samples(const u8* __restrict__ data, const SampleDesc* __restrict__ descs,
                                  u32 n_descs, const FillDesc* __restrict__ fills, u32 n_fills,
                                  Out* __restrict__ out, const float* __restrict__ scale_bias,
                                  u32* __restrict__ err, u32 stage_cap, u32 width, u32 height, u32 nchw) {
    u32 b = blockIdx.x;
    if (b < n_descs) {
        SampleDesc sd = descs[b];
        L3SampleEmit<Out> emit{out, sd.out_offset, sd.row_stride, sd.col_stride, sd.copy_stride,
                               sd.skip, sd.col0, sd.col1, sd.copies, scale_bias + 2u * sd.channel};
        l3_patch_rows(data, sd.data_offset, sd.data_len, sd.w, sd.rows, false, b, err, stage_cap, emit);
        return;
    }
    b -= n_descs;
    if (b >= n_fills) return;
    FillDesc f = fills[b];
    u32 cpp = nchw ? 1u : 3u, planes = nchw ? 3u : 1u;
    u64 plane = nchw ? (u64)width * height : 0u;
    u32 row_len = width * cpp;
    for (u32 y = f.y0; y < f.y1; y++) {
        bool in_window = y >= f.dy && y - f.dy < f.h;
        u32 a = in_window ? f.dx * cpp : 0u;       // the window's columns [a, a + gap) stay untouched
        u32 gap = in_window ? f.w * cpp : 0u;
        u32 n = row_len - gap;
        for (u32 p = 0; p < planes; p++) {
            u64 row = f.out_offset + (u64)p * plane + (u64)y * row_len;
            for (u32 k = threadIdx.x; k < n; k += blockDim.x) {
                u32 e = k < a ? k : k + gap;
                u32 ch = nchw ? p : e % 3u;
                l3_store(out, row + e, 0u, scale_bias + 2u * ch);
            }
        }
    }
}

#define L3_SAMPLES_KERNEL(name, Out)                                                                       \
    extern "C" __global__ void name(const u8* data, const SampleDesc* descs, u32 n_descs,                   \
                                    const FillDesc* fills, u32 n_fills, Out* out, const float* scale_bias, \
                                    u32* err, u32 stage_cap, u32 width, u32 height, u32 nchw) {            \
        l3_decode_samples<Out>(data, descs, n_descs, fills, n_fills, out, scale_bias, err, stage_cap,      \
                               width, height, nchw);                                                       \
    }
L3_SAMPLES_KERNEL(l3_samples_u8, u8)
L3_SAMPLES_KERNEL(l3_samples_f32, float)
L3_SAMPLES_KERNEL(l3_samples_f16, u16)
