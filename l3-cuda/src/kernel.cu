// L3 batch decoder: CUDA C, compiled at run time by NVRTC (see src/kernels.rs), and on the CPU by
// cpu-sim/harness.cpp through the toolkit's CUDA simulator (cuda-sim) so the very same source can be
// checked without a GPU.
//
// Parallelism (l3-eccv22, section 4.4; version 1):
//   * one team of lanes per patch descriptor = (image, channel, patch) of the whole batch, several teams
//     per block (l3_patch_rows has the geometry);
//   * every lane of a team first walks the patch's row headers (h steps of O(1), never the pixels) to
//     check that the rows fit its bytes;
//   * then rows are decoded in order; within a row each lane decodes 8 adjacent pixels from one 64-bit
//     window of the row (pixel-wise base-delta) and applies the custom Paeth filter from the previous
//     row, which stays in its registers (binary16 pairs: two columns an instruction); the two
//     neighbours from other lanes come by warp shuffle;
//   * a lane stores its 8 pixels in one vector store where they are adjacent in the output (NCHW);
//     elsewhere each decoded row goes through a small per-warp stage in shared memory so that the lanes
//     of a warp store adjacent columns side by side (coalesced), not eight columns apart. Warp barriers
//     only, no block barrier.
// Every read is bounded by the patch's byte range plus the input's WINDOW_SLACK bytes after the last
// patch, every write by the descriptor the host validated.
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
//   * l3_resample_h and l3_resample_{u8,f32,f16}: a resampled sample batch (crop, resize, scale jitter),
//     after l3_samples_u8 decoded each sample's source rectangle (window plus filter margin) into an
//     NHWC u8 intermediate (1, 3 or 4 channels; alpha decoded only for 4): Pillow's separable passes in
//     integers, from the host's tables (vocab's `Resampling`, the CPU loader's own), so the two compute
//     the same bytes. Batches of 1 or 4 channels (luma, RGBA) and label maps always take this path.
//   * l3v2_decode_{u8,f32,f16}: the version-2 patches of either kind of batch, a warp each (below), in a
//     launch of their own after the version-1 one: a register budget of its own (the rANS chain wants
//     many warps an SM), into the same output and error word.
// Output element types: u8 as decoded; f32 = fmaf(v, scale[c], bias[c]); f16 = that f32 rounded to
// nearest even. Every layout is a matter of the strides in the descriptors.
//
// Bit layout (l3-format/SPEC.md v1): each row starts on a byte boundary and is read LSB-first (bit k of a
// row is bit k % 8 of byte k / 8): nbit (bits 0..4), base (bits 4..12), then w deltas of nbit bits, padded
// to a whole byte; a patch's rows use its bytes exactly (no trailing bytes). Row 0 holds the pixel values,
// later rows the residual (x - pred) mod 256; value = (base + delta) mod 256 in both cases.

#ifndef CUDA_CPU_SIM
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define L3_DYNAMIC_SMEM(name) extern __shared__ __align__(16) u8 name[]
#endif

// Fully unrolled loops keep per-lane arrays in registers (g++ for the CPU simulation ignores it).
#ifdef CUDA_CPU_SIM
#define L3_UNROLL
#else
#define L3_UNROLL _Pragma("unroll")
#endif

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

// f32 -> IEEE binary16 bits, round to nearest even (no cuda_fp16.h: NVRTC needs no include path). On
// the device one `cvt.rn.f16.f32`, the same rounding; the CPU simulation runs the arithmetic below.
__device__ __forceinline__ u16 l3_f32_to_f16(float f) {
#ifndef CUDA_CPU_SIM
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
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

// Eight values, from four binary16 pairs (a value v is 0x6400 | v: bytes 0 and 2 of a pair), to eight
// adjacent elements at q, aligned to all eight: one vector store of 8 or 16 bytes, or two of 16 (f32).
__device__ __forceinline__ u32 l3_pair_value(const u32* p, u32 j) {
    return (p[j / 2u] >> (16u * (j % 2u))) & 255u;  // value j of pairs p
}
#ifdef CUDA_CPU_SIM
template <typename Out>
inline void l3_store8(Out* q, const u32* p, const float* sb) {
    if ((u64)q % sizeof(Out[8]) != 0u) {  // a device's vector store would fault
        fprintf(stderr, "l3 kernel: vector store to %p, not aligned to %zu bytes\n", (void*)q, sizeof(Out[8]));
        abort();
    }
    Out v[8];
    for (u32 j = 0; j < 8u; j++) l3_store(v, j, l3_pair_value(p, j), sb);
    memcpy(q, v, sizeof v);
}
#else
struct __align__(16) L3Vec4 { u32 x, y, z, w; };
// Value j of pairs p as a float: one I2F of the pair's byte (ptxas selects the byte; written as a shift
// and mask it extracts it first).
__device__ __forceinline__ float l3_pair_float(const u32* p, u32 j) {
    float f;
    asm("cvt.rn.f32.u8 %0, %1;" : "=f"(f) : "r"(p[j / 2u] >> (16u * (j % 2u))));
    return f;
}
__device__ __forceinline__ void l3_store8(u8* q, const u32* p, const float*) {
    *(u64*)q = __byte_perm(p[0], p[1], 0x6420u) | (u64)__byte_perm(p[2], p[3], 0x6420u) << 32;
}
__device__ __forceinline__ void l3_store8(float* q, const u32* p, const float* sb) {
    u32 f[8];
L3_UNROLL
    for (u32 j = 0; j < 8u; j++) f[j] = __float_as_uint(fmaf(l3_pair_float(p, j), sb[0], sb[1]));
    ((L3Vec4*)q)[0] = L3Vec4{f[0], f[1], f[2], f[3]};
    ((L3Vec4*)q)[1] = L3Vec4{f[4], f[5], f[6], f[7]};
}
__device__ __forceinline__ void l3_store8(u16* q, const u32* p, const float* sb) {
    u32 h[4];
L3_UNROLL
    for (u32 j = 0; j < 4u; j++) {
        u32 lo = l3_f32_to_f16(fmaf(l3_pair_float(p, 2u * j), sb[0], sb[1]));
        u32 hi = l3_f32_to_f16(fmaf(l3_pair_float(p, 2u * j + 1u), sb[0], sb[1]));
        h[j] = lo | hi << 16;
    }
    *(L3Vec4*)q = L3Vec4{h[0], h[1], h[2], h[3]};
}
#endif

// ==== Version 1: a team of lanes per patch, L3_VALS columns per lane, rows in registers. ====
//
// A block of B threads decodes B / T patches, T = the power of two >= B / L3_VALS lanes per patch, at
// least 4 (a team: T divides the warp, and T * L3_VALS >= B >= the widest patch). Lane g of a team owns
// the L3_VALS columns from c0 = g * L3_VALS: by SPEC.md 3.3 each 8 of them have 8 * nbit whole bits of
// deltas starting at bit 4 of byte 1 + (c0 / 8 + i) * nbit of the row, so one 64-bit window of the row
// gives eight. The previous row stays in the lane's registers, two columns a register as binary16 numbers
// so that the predictor runs on two columns an instruction (the pairs, below); the two neighbours Paeth
// needs from other lanes (columns c0 - 1 and c0 + L3_VALS) come by shuffle.
//
// Stores: where a lane's columns are adjacent, aligned elements of the output (NCHW whole images whose
// patches fill their teams, L3_ROWS_OWN) each lane stores them in one vector store, and a team's lanes
// store side by side: 8 lanes write 64 adjacent bytes of u8 an instruction. Elsewhere (NHWC, where a
// column's elements are C apart, samples, other patch widths) each element is a store of its own, and
// were lane g to store its own columns, the lanes of a warp would write addresses L3_VALS columns apart
// at each store (a quarter of each 32-byte sector used, as Nsight Compute measured). So each lane puts its decoded row's L3_VALS bytes into the warp's stage in shared memory (the team's columns in
// order), the warp syncs, and lane g stores columns k * T + g (k = 0..L3_VALS-1): the lanes of a team write
// T adjacent columns at once. Shared memory rather than a transpose through shuffles: one 8-byte shared
// store per lane and row and one byte load per value, against log2 T rounds of shuffles and selects over
// eight registers each. Teams are padded apart (T bytes, to 8-byte alignment) so that the byte loads of
// a warp's teams fall in distinct banks. Two warp barriers a row (after the stores, and before the next
// row's); no block barrier, and occupancy stays bounded by registers (the stage is 2,560 bytes a block).
#ifndef L3_VALS
#define L3_VALS 8
#endif
#define L3_WINDOWS (L3_VALS / 8)
// Stage bytes per team of T lanes (T * L3_VALS columns, T bytes of padding, rounded to 8) and per warp: the
// most is eight teams of 4 lanes (320 bytes for 8 columns a lane); a block has at most 8 warps.
#define L3_STAGE_TEAM(t) (((t) * (L3_VALS + 1u) + 7u) & ~7u)
#define L3_STAGE_WARP (8u * L3_STAGE_TEAM(4u))
#define L3_STAGE_BYTES (8u * L3_STAGE_WARP)
// At most 256 threads a block (layout.rs), and registers for N such blocks an SM: the most blocks for
// which the row loops do not spill (sm_90: 64 registers a thread for whole images, 80 for samples,
// whose writes keep more per patch: 50 % and 37.5 % occupancy).
#ifdef CUDA_CPU_SIM
#define L3_BOUNDS(n)
#else
#define L3_BOUNDS(n) __launch_bounds__(256, n)
#endif
#define L3_FULL 0xffffffffu
// The column of a patch row that lane g of a team stores k-th: k * team + g, so that adjacent lanes
// store adjacent columns. L3_STAGE_OWN_COLUMNS (an experiment, set through L3_NVRTC_OPTIONS) has every
// lane store its own columns g * L3_VALS + k, read back from its own stage bytes, as before the stage.
#ifdef L3_STAGE_OWN_COLUMNS
#define L3_COL(k, team, g) ((g) * L3_VALS + (k))
#define L3_COL_STEP(team) 1u
#else
#define L3_COL(k, team, g) ((k) * (team) + (g))
#define L3_COL_STEP(team) (team)
#endif

// Lanes per team for a block of `threads` (a multiple of 32): mirrored by `layout::v1_team_lanes`.
__device__ __forceinline__ u32 l3_team_lanes(u32 threads) {
    u32 t = (threads + L3_VALS - 1u) / L3_VALS;
    return t <= 4u ? 4u : 1u << (32 - __clz((int)(t - 1u)));
}

// This lane's team's part of the block's stage (shared memory, static: one per kernel).
__device__ __forceinline__ u8* l3_v1_stage(u32 team) {
    __shared__ u64 s_stage[L3_STAGE_BYTES / 8u];
    u32 lane = threadIdx.x & 31u;
    return (u8*)s_stage + (threadIdx.x >> 5) * L3_STAGE_WARP + (lane / team) * L3_STAGE_TEAM(team);
}

// Whether rows [0, rows) of a patch `w` wide fit its `len` bytes (SPEC.md 4): every row's nbit <= 8 and
// row inside the patch, and with `exact` no bytes left over. Only the 2-byte row headers are read.
__device__ bool l3_rows_fit(const u8* __restrict__ src, u32 len, u32 w, u32 rows, bool exact) {
    if (w == 0u || rows == 0u || w > 255u || rows > 255u) return false;
    u32 pos = 0u;
    for (u32 r = 0; r < rows; r++) {
        if (pos + 2u > len) return false;
        u32 nbit = src[pos] & 15u;
        if (nbit > 8u) return false;
        pos += (12u + w * nbit + 7u) >> 3;
        if (pos > len) return false;
    }
    return !exact || pos == len;
}

// The u32 at the 4-aligned `p`.
__device__ __forceinline__ u32 l3_word(const u8* p) {
#ifdef CUDA_CPU_SIM
    u32 w;
    memcpy(&w, p, 4);
    return w;
#else
    return *(const u32*)p;
#endif
}

// The 64 bits of a patch's bytes from bit 4 of byte `p` on (LSB first), from the three aligned words
// around them. The words may reach past the patch's last byte (and, for its first bytes, before its
// first): the input keeps WINDOW_SLACK zero bytes after the last patch (input.rs) and starts 4-aligned,
// so they never leave it, and bits past a row's end reach only columns past the patch, which are never
// stored. No bounds branch and no call: the H200 decoded the last row of patches wrong while a
// byte-by-byte fallback for windows near a patch's end was called from here, in divergent code between
// warp shuffles (l3-cuda README, "Measured on an H200").
__device__ __forceinline__ u64 l3_window(const u8* __restrict__ p) {
    u32 mis = (u32)(u64)p & 3u;
    const u8* q = p - mis;
    u64 w0 = l3_word(q), w1 = l3_word(q + 4), w2 = l3_word(q + 8);
    u32 sh = mis * 8u + 4u;
    u32 lo = (u32)(((w1 << 32) | w0) >> sh), hi = (u32)(((w2 << 32) | w1) >> sh);
    return ((u64)hi << 32) | lo;
}

// Two columns a register. The lane keeps the row above as binary16 pairs (columns 2k and 2k + 1 in the
// low and high halves), each value v as the number 1024 + v, whose bits are 0x6400 | v. Every number the
// predictor forms from them (values 1024..1279, differences -510..510) is an integer
// below 2048 in magnitude, exact in binary16, so the predictor runs on two columns an instruction (HADD2,
// HSET2 with |x| folded in, LOP3 selects) with integer results; a decoded pair's bytes are its bytes 0
// and 2, and adding base and delta to a pair's bits adds them to both values (no carry leaves a half).
#define L3_PAIRS (L3_VALS / 2)
#define L3_PAIR_ONE 0x64006400u  // the pair (0, 0)

#ifdef CUDA_CPU_SIM
// binary16 bits -> float, exactly (no infinities or NaNs are formed).
inline float l3_half_value(u32 h) {
    u32 e = (h >> 10) & 31u, m = h & 1023u;
    float v = e == 0u ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024u), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}
// Float -> binary16 bits. The simulation stops on anything but the exact integers the pairs promise.
inline u32 l3_half_bits(float v) {
    if (v != std::nearbyint(v) || std::fabs(v) >= 2048.0f) {
        fprintf(stderr, "l3 kernel: binary16 pair value %g is not an exact integer\n", (double)v);
        abort();
    }
    return l3_f32_to_f16(v);
}
template <typename F>
inline u32 l3_pair_map(u32 a, u32 b, F f) {
    return f(a & 0xffffu, b & 0xffffu) | f(a >> 16, b >> 16) << 16;
}
#endif

// a - b, per half.
__device__ __forceinline__ u32 l3_pair_sub(u32 a, u32 b) {
#ifdef CUDA_CPU_SIM
    return l3_pair_map(a, b, [](u32 x, u32 y) { return l3_half_bits(l3_half_value(x) - l3_half_value(y)); });
#else
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}

// |a|, per half (folded into the comparisons' operands on the device).
__device__ __forceinline__ u32 l3_pair_abs(u32 a) {
#ifdef CUDA_CPU_SIM
    return a & 0x7fff7fffu;
#else
    u32 d;
    asm("abs.f16x2 %0, %1;" : "=r"(d) : "r"(a));
    return d;
#endif
}

// 0xffff in each half where a <= b, else 0.
__device__ __forceinline__ u32 l3_pair_le(u32 a, u32 b) {
#ifdef CUDA_CPU_SIM
    return l3_pair_map(a, b, [](u32 x, u32 y) { return l3_half_value(x) <= l3_half_value(y) ? 0xffffu : 0u; });
#else
    u32 d;
    asm("set.le.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}

// The predictions of the lane's outer columns as the edges of a patch, in every lane: the low half is
// column 0's as the left edge (T against TR: l3_paeth's c == 0), the high half column L3_VALS - 1's as
// the right edge (TL against T: c == w - 1). Nine instructions and no branch: a branch for the edge lanes
// would cost the warp both sides.
__device__ __forceinline__ u32 l3_pair_edges(const u32 (&p)[L3_PAIRS]) {
    u32 a = __byte_perm(p[0], p[L3_PAIRS - 1u], 0x7610u);  // T: columns 0 and L3_VALS - 1
    u32 b = __byte_perm(p[0], p[L3_PAIRS - 1u], 0x5432u);  // the other: columns 1 and L3_VALS - 2
    u32 t = l3_pair_sub(a, L3_PAIR_ONE);                    // T as a number, 0..255
    u32 e = l3_pair_abs(l3_pair_sub(l3_pair_sub(b, a), t)); // |other - 2T|
    // Left: e <= T takes T, else TR. Right: T <= e takes TL, else T.
    u32 take_t = (l3_pair_le(e, t) & 0xffffu) | (~l3_pair_le(t, e) & 0xffff0000u);
    return (take_t & a) | (~take_t & b);
}

// Decodes rows [0, rows) of one patch `w` pixels wide and hands every pixel to `emit`'s rows, through the
// stage (a row's column c at byte c of the team's part).
// `exact`: the rows must use the patch's bytes exactly (a whole patch, as the CPU's whole-image decoder
// checks); otherwise only the rows decoded must lie inside them (as the CPU's region decoder checks).
// A patch that fails sets *err to min(*err, d) and emits nothing. Every lane of the warp must call it
// (shuffles); `active`: this lane's team has a patch. MODE (a warp-uniform choice, l3_patch_rows):
//   * L3_ROWS_ANY: any patches;
//   * L3_ROWS_FULL: every patch of the warp is as wide as its team's columns (team * L3_VALS: patches
//     32, 64 or 128 wide in blocks of their width, most patches), so every lane's columns are in the
//     patch, column w - 1 is the last of the team's last lane, and no column needs a test before its
//     store;
//   * L3_ROWS_OWN: FULL, and every patch's rows are adjacent, aligned elements of the output (NCHW
//     whole images, or samples of whole patch rows: `store_own`): each lane stores its own columns in one vector store, and a team's
//     lanes store side by side (8 lanes of u8: 64 adjacent bytes an instruction), without the stage.
#define L3_ROWS_ANY 0
#define L3_ROWS_FULL 1
#define L3_ROWS_OWN 2
template <int MODE, typename Emit>
__device__ void l3_patch_rows_w(const u8* __restrict__ data, u64 data_offset, u32 len, u32 w, u32 rows,
                                bool exact, u32 d, u32* __restrict__ err, bool active, const Emit& emit) {
    constexpr bool FULL = MODE != L3_ROWS_ANY;
    u32 team = l3_team_lanes(blockDim.x);
    u32 g = threadIdx.x & (team - 1u);
    const u8* src = data + data_offset;
    bool ok = active && l3_rows_fit(src, len, w, rows, exact);
    if (active && !ok && g == 0u) atomicMin(err, d);
    u32 my_rows = ok ? rows : 0u;
    u32 n = my_rows;  // the warp's trip count: every lane takes part in every shuffle
L3_UNROLL
    for (u32 m = 16u; m > 0u; m >>= 1) {
        u32 o = __shfl_xor_sync(L3_FULL, n, (int)m);
        n = o > n ? o : n;
    }
    u32 c0 = g * L3_VALS;
    u32 valid = w > c0 ? (w - c0 < L3_VALS ? w - c0 : L3_VALS) : 0u;  // columns of this lane in the patch
    bool left = g == 0u;                                              // holds column 0
    bool right = valid > 0u && c0 + L3_VALS >= w;                     // holds column w - 1
    u32 rj = valid - 1u;
    u8* stage = l3_v1_stage(team);
    u32 prev[L3_PAIRS];  // the row above, two columns a register
L3_UNROLL
    for (u32 k = 0; k < L3_PAIRS; k++) prev[k] = L3_PAIR_ONE;  // row 0 predicts 0: its values are stored
    // Where the edge rules replace the general predictor, per half of each pair (the same every row).
    u32 edge_left = left ? 0xffffu : 0u, edge_right = FULL && right ? 0xffff0000u : 0u;
    u32 last_mask[L3_PAIRS];
L3_UNROLL
    for (u32 k = 0; k < L3_PAIRS; k++)
        last_mask[k] = !FULL && right && rj / 2u == k ? (rj % 2u ? 0xffff0000u : 0xffffu) : 0u;
    const u8* row = src;  // the row's first byte
    for (u32 r = 0; r < n; r++) {
        bool live = r < my_rows && valid > 0u;
        u32 b0 = live ? (u32)row[0] : 0u, b1 = live ? (u32)row[1] : 0u;
        u32 nbit = b0 & 15u, mask2 = (1u << (2u * nbit)) - 1u, spread = 0x10000u - (1u << nbit);
        u32 base = (b0 >> 4) | ((b1 & 15u) << 4);
        u32 base2 = base | base << 16;
        u32 lo[L3_WINDOWS], hi[L3_WINDOWS];
L3_UNROLL
        for (u32 i = 0; i < L3_WINDOWS; i++) {
            u64 win = live ? l3_window(row + 1u + (g * L3_WINDOWS + i) * nbit) : 0u;
            lo[i] = (u32)win;
            hi[i] = (u32)(win >> (4u * nbit));
        }
        // The neighbours from other lanes: column c0 - 1 in `up`'s high half, c0 + L3_VALS in `down`'s
        // low half. odd[k] = columns (2k - 1, 2k): TL of pair k, and TR of pair k - 1.
        u32 up = __shfl_up_sync(L3_FULL, prev[L3_PAIRS - 1u], 1, (int)team);
        u32 down = __shfl_down_sync(L3_FULL, prev[0], 1, (int)team);
        u32 odd[L3_PAIRS + 1u];
        odd[0] = __byte_perm(up, prev[0], 0x5432u);
L3_UNROLL
        for (u32 k = 1; k < L3_PAIRS; k++) odd[k] = __byte_perm(prev[k - 1u], prev[k], 0x5432u);
        odd[L3_PAIRS] = __byte_perm(prev[L3_PAIRS - 1u], down, 0x5432u);
        // At the patch's edges the edge rules replace the general predictor (l3_paeth): column 0's
        // in the left lane, column w - 1's in the right lane (FULL: the lane's last column).
        u32 edges = l3_pair_edges(prev);
        u32 last = 0u;  // !FULL: column rj's prediction, both halves
        if (!FULL && right) {  // column w - 1 at the lane's column rj  (sass-count: rare)
            int t = (int)l3_pair_value(prev, 0u), tl = (int)((up >> 16) & 255u);
L3_UNROLL
            for (u32 j = 1; j < L3_VALS; j++)
                if (j == rj) tl = (int)l3_pair_value(prev, j - 1u), t = (int)l3_pair_value(prev, j);
            u32 v = w == 1u ? (u32)t : (u32)(t <= l3_abs(tl - 2 * t) ? tl : t);
            last = (v | v << 16) | L3_PAIR_ONE;
        }
        // The predictor (SPEC.md 3.2), two columns a step: p = TL + TR - T, so with dl = T - TL and
        // dr = TR - T, |p - TL| = |dr|, |p - TR| = |dl| and |p - T| = |dr - dl|; TL wins ties, then T.
        // Then value = (base + delta + pred) mod 256.
L3_UNROLL
        for (u32 k = 0; k < L3_PAIRS; k++) {
            u32 dl = l3_pair_sub(prev[k], odd[k]);       // T - TL
            u32 dr = l3_pair_sub(odd[k + 1u], prev[k]);  // TR - T
            u32 dt = l3_pair_sub(dr, dl);                // |p - T| = |dr - dl|
            u32 adl = l3_pair_abs(dl), adr = l3_pair_abs(dr), adt = l3_pair_abs(dt);
            u32 take_tl = l3_pair_le(adr, adt) & l3_pair_le(adr, adl);
            u32 take_t = l3_pair_le(adt, adl);
            u32 pred = (take_tl & odd[k]) | (~take_tl & ((take_t & prev[k]) | (~take_t & odd[k + 1u])));
            if (k == 0u) pred = (pred & ~edge_left) | (edges & edge_left);
            if (FULL && k == L3_PAIRS - 1u) pred = (pred & ~edge_right) | (edges & edge_right);
            if (!FULL) pred = (pred & ~last_mask[k]) | (last & last_mask[k]);
            // Deltas 2k and 2k + 1 of the window, into the low and high halves.
            u32 q = (2u * k) % 8u;
            u32 x = ((q < 4u ? lo[k / 4u] >> (q * nbit) : hi[k / 4u] >> ((q - 4u) * nbit))) & mask2;
            u32 sum = pred + base2 + x;  // + (x >> nbit) * spread: delta 2k + 1 moved to the high half
            // A half is now 0x6400 + (at most 765): clearing bits 8 and 9 leaves 0x6400 | (v mod 256).
            prev[k] = ((x >> nbit) * spread + sum) & 0xfcfffcffu;  // sass-count: values=L3_VALS
        }
        u64 packed[L3_WINDOWS];  // the row's bytes: bytes 0 and 2 of each pair
L3_UNROLL
        for (u32 i = 0; i < L3_WINDOWS; i++)
            packed[i] = __byte_perm(prev[4u * i], prev[4u * i + 1u], 0x6420u) |
                        (u64)__byte_perm(prev[4u * i + 2u], prev[4u * i + 3u], 0x6420u) << 32;
        if (live) row += (12u + w * nbit + 7u) >> 3;
        bool on = r < my_rows;  // the same on every lane of the team
        if constexpr (MODE == L3_ROWS_OWN) {
            if (on) emit.store_own(r, prev, g);
        } else {
            // The row through the stage: the team's lanes store its columns side by side. Columns past
            // w (lanes beyond the patch) hold junk that store_row never stores.
L3_UNROLL
            for (u32 i = 0; i < L3_WINDOWS; i++)
                if (on) ((u64*)stage)[g * L3_WINDOWS + i] = packed[i];
#ifdef L3_STAGE_FENCE
            __threadfence_block();
#endif
            __syncwarp();
            if (on) emit.template store_row<FULL>(r, stage, team, g);
#ifdef L3_STAGE_FENCE
            __threadfence_block();
#endif
            __syncwarp();  // every lane has read the stage before the next row overwrites it
        }
    }
}

// l3_patch_rows_w in the fastest mode every patch of the warp allows (a warp-uniform choice). Emits with
// `OWN` have `own_ok` and `store_own`. Experiments set through L3_NVRTC_OPTIONS: L3_NEVER_ALIGNED takes
// L3_ROWS_ANY always, L3_NEVER_OWN never takes L3_ROWS_OWN (the stage's figures beside the vector
// stores', in one run).
template <typename Emit>
__device__ void l3_patch_rows(const u8* __restrict__ data, u64 data_offset, u32 len, u32 w, u32 rows,
                              bool exact, u32 d, u32* __restrict__ err, bool active, const Emit& emit) {
#ifdef L3_NEVER_ALIGNED
    if (true) {
#else
    if (__ballot_sync(L3_FULL, active && w != l3_team_lanes(blockDim.x) * L3_VALS) != 0u) {
#endif
        l3_patch_rows_w<L3_ROWS_ANY>(data, data_offset, len, w, rows, exact, d, err, active, emit);
        return;
    }
#ifndef L3_NEVER_OWN
    if constexpr (Emit::OWN) {
        if (__ballot_sync(L3_FULL, active && !emit.own_ok(w)) == 0u) {
            l3_patch_rows_w<L3_ROWS_OWN>(data, data_offset, len, w, rows, exact, d, err, active, emit);
            return;
        }
    }
#endif
    l3_patch_rows_w<L3_ROWS_FULL>(data, data_offset, len, w, rows, exact, d, err, active, emit);
}

// ==== Version 2 (l3-format/SPEC.md, part 2): one warp per patch, every plane of it. ====
//
// A warp decodes all planes of one patch (the inverse colour transform needs G beside R - G and B - G);
// a block of B threads holds B / 32 such patches. Nothing waits on a block barrier: every step is the
// warp's own, so an SM keeps as many patches in flight as it has warps.
//   * BP: before anything is written, the warp walks every decoded plane's row heads (lanes = groups:
//     escapes ranked by ballot + popcount, group bit offsets by a prefix sum over shuffles), as v1 walks
//     its row headers; then, row by row, it parses each plane's head again (in registers) and every lane
//     reads the residual codes of its own columns at its groups' offsets + j * nbit.
//   * ANS: the warp's 32 lanes are the chunk's 32 rANS lanes (the lanes that need a word take consecutive
//     words, found with ballot + popcount). Symbol j of a row goes to lane j mod 32, so lane l codes
//     columns 32k + l: it keeps the row above's codes of those columns in registers and takes their left
//     and right neighbours by shuffle, so a context costs no memory access but P0's code at the same
//     pixel (for P1..P3), which the same lane wrote and loads once a row. A step's symbol comes from one
//     load in the common case: the context's bucket word for the slot's 16-slot bucket (l3v2_buckets
//     builds them from the tables before the launch), which holds symbol, cum and frequency when one
//     symbol fills the bucket. The codes go to the launch's scratch memory; then the final states are
//     checked.
// Reconstruction (both): lane l holds m = ceil(pw / 32) adjacent columns [l * m, l * m + m) of every
// plane. x_c = a_c * x_{c-1} + b_c (SPEC.md 2.5, a_c in {0, 1}) is composed over the lane's own columns,
// scanned across the lanes by shuffles (log2 32 steps), and finished over the lane's columns. The row of
// every plane goes to the warp's stage in shared memory, which is also where the next row finds the row
// above; from it lane l stores columns l, l + 32, ...: a warp's stores are adjacent (as v1's stage does),
// and every pixel is written in every output channel.
// A patch that fails validation sets *err to its index and writes nothing.

#define L3V2_MAX_N 224
#define L3V2_STEPS 7      // 32-column steps of a row of 224: ANS lane l codes columns 32k + l
#define L3V2_COLS 7       // the most columns a lane reconstructs: ceil(224 / 32)
#define L3V2_STAGE 224    // a plane's row in the warp's stage
#define L3V2_WARPS 8      // blocks have at most 256 threads
#define L3V2_FULL 0xffffffffu
#ifdef CUDA_CPU_SIM
#define L3V2_BOUNDS
#else
#define L3V2_BOUNDS __launch_bounds__(256, 4)  // 64 registers: 32 warps an SM, no spills (sm_90)
#endif

// Must match `V2Desc` in src/v2.rs byte for byte (104 bytes, 8-aligned).
struct V2Desc {
    u64 off[4];          // BP: plane p's entry in `data`; ANS: off[0] = the patch's chunk
    u64 out_offset;      // output element of patch pixel (col0, skip), output channel 0
    u64 scratch_offset;  // ANS: this chunk's symbol store in `scratch`
    u32 len[4];          // bytes of each entry (ANS: len[0])
    u32 table_offset;    // ANS: the image's context table in `tables` (bytes, 4-aligned)
    int row_stride;      // output elements between two written rows
    int col_stride;      // output elements between two adjacent patch columns (negative when mirrored)
    u32 chan_stride;     // output elements between two output channels
    u16 pw, ph;          // patch width and height (1..=224)
    u16 rows, skip;      // rows decoded from the top (1..=ph); leading rows decoded but not written
    u16 col0, col1;      // patch columns written: [col0, col1)
    u8 planes;           // planes in the file: 1, 3 or 4
    u8 decoded;          // planes BP decodes: `planes`, or 3 when alpha is not written (ANS decodes all)
    u8 profile;          // 0 = BP, 1 = ANS
    u8 out_channels;     // output channels per pixel: 1, 3 or 4 (whole images: C; samples: 3)
    u8 exact;            // BP: rows == ph, so every decoded entry's rows must use its bytes exactly
    u8 reserved[3];
    u32 buckets;         // ANS: the image's bucket words in the launch's bucket memory (u32 index)
};

__device__ __forceinline__ u32 l3v2_bitlen(u32 v) { return 32u - (u32)__clz(v); }  // __clz(0) = 32

// The u32 at p, little-endian, from bytes (p need not be aligned).
__device__ __forceinline__ u32 l3v2_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// A context's bucket words (v2.rs, `BUCKETS`; built by l3v2_buckets): word b covers the 16 slots from
// 16 b. With f - 1 (bits 20..31) non-zero one symbol holds the whole bucket: s (bits 0..7), cum_s (bits
// 8..19), f, all from one load. Otherwise bits 0..7 and 8..15 are the symbols of the bucket's first and
// last slot, and the cum array is searched between them.
#define L3V2_BUCKETS 256

// The symbol s with cum[s] <= slot < cum[s + 1] among [a, b) (cum[a] <= slot < cum[b]).
__device__ __forceinline__ u32 l3v2_search(const u16* cum, u32 a, u32 b, u32 slot) {
    while (b - a > 1u) {
        u32 mid = (a + b) >> 1;
        if ((u32)cum[mid] <= slot) a = mid; else b = mid;
    }
    return a;
}

// The symbol of `slot` (cum has n + 1 entries, cum[n] = 4096), its cum (`lo`) and frequency (`f`).
__device__ __forceinline__ u32 l3v2_find(const u16* cum, const u32* bucket_words, u32 slot, u32& lo,
                                         u32& f) {
    u32 w = bucket_words[slot >> 4];
    if (w >> 20) {
        lo = (w >> 8) & 4095u;
        f = (w >> 20) + 1u;
        return w & 255u;
    }
    u32 a = l3v2_search(cum, w & 255u, ((w >> 8) & 255u) + 1u, slot);
    lo = cum[a];
    f = (u32)cum[a + 1u] - lo;
    return a;
}

// Builds the bucket words of every ANS table of a launch, before its version-2 decode: block b takes
// descriptor b's table when b is the first descriptor of its run with that table (an image's patches
// are consecutive), thread t bucket t of every used context. Blocks of L3V2_BUCKETS threads.
extern "C" __global__ void l3v2_buckets(const V2Desc* v2, u32 n_v2, const u8* tables, u32* buckets) {
    u32 b = blockIdx.x;
    if (b >= n_v2 || v2[b].profile == 0u) return;
    u32 at = v2[b].table_offset;
    if (b > 0u && v2[b - 1u].profile != 0u && v2[b - 1u].table_offset == at) return;
    const u8* tab = tables + at;
    u32* out = buckets + v2[b].buckets;
    u32 k = v2[b].planes == 4u ? 148u : 102u, t = threadIdx.x;
    for (u32 ctx = 0; ctx < k; ctx++) {
        u32 e = ((const u32*)tab)[ctx];
        u32 n = e & 511u;
        if (n == 0u) continue;  // never read: a symbol in an unused context fails before its lookup
        const u16* cum = (const u16*)tab + (e >> 9);
        u32 lo = l3v2_search(cum, 0u, n, 16u * t), hi = l3v2_search(cum, lo, n, 16u * t + 15u);
        u32 f = (u32)cum[lo + 1u] - cum[lo];
        out[ctx * L3V2_BUCKETS + t] = lo == hi ? lo | (u32)cum[lo] << 8 | (f - 1u) << 20 : lo | hi << 8;
    }
}

// One rANS symbol per lane (`active` lanes code one), `e` its context's entry in `tab`, `bw` its bucket
// words. Every lane of the warp must call it.
// `tab`: the image's table, u32 per context ((index of its cum array in u16 units) << 9 | n, n = 0 when
// the context is unused) followed by each used context's bucket words and cum array.
__device__ __forceinline__ u32 l3v2_symbol(bool active, u32 e, const u32* __restrict__ bw,
                                           const u8* __restrict__ tab, u32& x, u32& pos,
                                           const u8* __restrict__ words, u32 nwords, u32 lane, u32& bad) {
    u32 s = 0u;
    bool need = false;
    if (active) {
        u32 n = e & 511u;
        if (n == 0u) {
            bad = 1u;  // a symbol in a context without a table
        } else {
            const u16* cum = (const u16*)tab + (e >> 9);
            u32 slot = x & 4095u, lo, f;
            s = l3v2_find(cum, bw, slot, lo, f);
            x = f * (x >> 12) + slot - lo;
            need = x < 65536u;
        }
    }
    u32 m = __ballot_sync(L3V2_FULL, need);
    if (need) {
        u32 i = pos + (u32)__popc(m & ((1u << lane) - 1u));
        u32 w = 0u;
        if (i < nwords) w = (u32)words[2u * i] | ((u32)words[2u * i + 1u] << 8);
        else bad = 1u;  // the lanes need more words than the chunk holds
        x = (x << 16) | w;
    }
    pos += (u32)__popc(m);
    return s;
}

// Byte k of a lane's N packed words (0 past them). Every caller's k is a constant once its loop is
// unrolled, so the words stay in registers.
template <u32 N>
__device__ __forceinline__ u32 l3v2_byte(const u32 (&w)[N], u32 k) {
    return k >= 4u * N ? 0u : (w[k >> 2] >> (8u * (k & 3u))) & 255u;
}

// The warp decodes every symbol of an ANS chunk into `zs`: plane p's row r of codes at (p*ph + r)*pw,
// its selectors at planes*ph*pw + (p*ph + r)*8 (rows >= 1). Returns, on every lane, whether the chunk is
// valid (every state in range at the start and back at 2^16 at the end, every context used, every word
// used).
__device__ bool l3v2_ans_chunk(const u8* __restrict__ chunk, u32 len, const u8* __restrict__ tab,
                               const u32* __restrict__ bw, u32 planes, u32 pw, u32 ph, u8* __restrict__ zs,
                               u32 lane) {
    u32 bad = (len < 128u || ((len - 128u) & 1u)) ? 1u : 0u;
    u32 x = bad ? 0u : l3v2_u32(chunk + 4u * lane);
    if (x < 65536u) bad = 1u;
    if (__ballot_sync(L3V2_FULL, bad != 0u)) return false;
    const u8* words = chunk + 128;
    u32 nwords = (len - 128u) >> 1;
    u32 pos = 0u;
    u32 runs = (pw + 31u) >> 5;  // selector runs of a row, and 32-column steps of a row
    u8* sel = zs + planes * ph * pw;
    for (u32 p = 0; p < planes; p++) {
        u32 sel_ctx = p < 3u ? 99u + p : 147u;
        u32 sel_e = ((const u32*)tab)[sel_ctx];
        u32 n = (ph - 1u) * runs;
        for (u32 j0 = 0; j0 < n; j0 += 32u) {
            u32 j = j0 + lane;
            bool active = j < n;
            u32 s = l3v2_symbol(active, sel_e, bw + sel_ctx * L3V2_BUCKETS, tab, x, pos, words, nwords, lane,
                                bad);
            if (active) sel[(p * ph + 1u + j / runs) * 8u + j % runs] = (u8)s;
        }
        u32 zp[2] = {0u, 0u};  // row r - 1's codes at columns 32k + lane, byte k (0 past the row)
        for (u32 r = 0; r < ph; r++) {
            u8* zr = zs + (p * ph + r) * pw;
            // P0's codes of row r at this lane's columns, loaded at once (column c was written by lane
            // c mod 32, this one), so that no step of the chain waits on memory for its context.
            u32 z0[2] = {0u, 0u};
            if (p > 0u) {
                const u8* z0r = zs + r * pw;
L3_UNROLL
                for (u32 k = 0; k < L3V2_STEPS; k++) {
                    u32 c = 32u * k + lane;
                    if (k < runs && c < pw) z0[k >> 2] |= (u32)z0r[c] << (8u * (k & 3u));
                }
            }
            // Every step's context before the chain starts (they depend on the rows above and P0
            // only), packed as zp; each step's table entry is loaded one step ahead.
            u32 ctxs[2] = {0u, 0u};
L3_UNROLL
            for (u32 k = 0; k < L3V2_STEPS; k++) {
                if (k >= runs) break;
                u32 c = 32u * k + lane;
                // Row r - 1 at c - 1 (lane - 1, or lane 31 of step k - 1) and c + 1 (lane + 1, or lane 0
                // of step k + 1); absent ones at the patch's edges count as zT.
                u32 t = l3v2_byte(zp, k);
                u32 up = __shfl_up_sync(L3V2_FULL, t, 1);
                u32 dn = __shfl_down_sync(L3V2_FULL, t, 1);
                u32 wrap_l = __shfl_sync(L3V2_FULL, k > 0u ? l3v2_byte(zp, k - 1u) : 0u, 31);
                u32 wrap_r = __shfl_sync(L3V2_FULL, l3v2_byte(zp, k + 1u), 0);
                u32 tl = c == 0u ? t : (lane > 0u ? up : wrap_l);
                u32 tr = c + 1u >= pw ? t : (lane < 31u ? dn : wrap_r);
                u32 bucket = r > 0u ? min(l3v2_bitlen((tl + 2u * t + tr + 2u) >> 2), 7u) : 8u;
                u32 ctx = bucket;
                if (p > 0u) {
                    u32 kz = min(l3v2_bitlen(l3v2_byte(z0, k)), 4u);
                    ctx = p < 3u ? 9u + 45u * (p - 1u) + 5u * bucket + kz : 102u + 5u * bucket + kz;
                }
                ctxs[k >> 2] |= ctx << (8u * (k & 3u));
            }
            u32 zn[2] = {0u, 0u};
            u32 e = lane < pw ? ((const u32*)tab)[l3v2_byte(ctxs, 0u)] : 0u;
L3_UNROLL
            for (u32 k = 0; k < L3V2_STEPS; k++) {
                if (k >= runs) break;
                u32 c = 32u * k + lane;
                bool active = c < pw;
                u32 e_next = k + 1u < runs && c + 32u < pw ? ((const u32*)tab)[l3v2_byte(ctxs, k + 1u)] : 0u;
                u32 s = l3v2_symbol(active, e, bw + l3v2_byte(ctxs, k) * L3V2_BUCKETS, tab, x, pos, words,
                                    nwords, lane, bad);
                e = e_next;
                if (active) {
                    zr[c] = (u8)s;  // sass-count: v2-ans values=L3V2_STEPS
                    zn[k >> 2] |= s << (8u * (k & 3u));
                }
            }
            zp[0] = zn[0];
            zp[1] = zn[1];
        }
    }
    if (x != 65536u || pos != nwords) bad = 1u;
    return __ballot_sync(L3V2_FULL, bad != 0u) == 0u;
}

// The head of row r of a BP entry (e, len), parsed by the warp in registers. On entry `pos` is the byte
// where the row starts (the same on every lane) and lane g's `nb` group g's width in row r - 1; on return
// `pos` is the next row's start, lane g's `nb` and `goff` group g's width and first bit, lane j's `sel`
// run j's selector. Returns (on every lane) whether the row is valid and inside the entry.
__device__ __forceinline__ bool l3v2_bp_head(const u8* __restrict__ e, u32 len, u32 r, u32 pw, u32 lane,
                                             u32& pos, u32& nb, u32& goff, u32& sel) {
    u32 ng = (pw + 7u) >> 3, nsel = (pw + 31u) >> 5;
    u32 rest = len - pos;
    u32 base = pos * 8u;
    u32 bad = (r == 0u ? 4u * ng : 2u * nsel + 2u * ng) > 8u * rest ? 1u : 0u;
    bool mine = lane < ng;
    u32 w = 0u, head;
    if (r == 0u) {
        if (mine) w = l3_bits(e, len, base + 4u * lane, 4u);
        head = 4u * ng;
    } else {
        sel = lane < nsel ? l3_bits(e, len, base + 2u * lane, 2u) : 0u;
        u32 code = mine ? l3_bits(e, len, base + 2u * nsel + 2u * lane, 2u) : 0u;
        bool esc = mine && code == 3u;
        u32 em = __ballot_sync(L3V2_FULL, esc);
        if (esc) {
            u32 rank = (u32)__popc(em & ((1u << lane) - 1u));
            w = l3_bits(e, len, base + 2u * nsel + 2u * ng + 4u * rank, 4u);
        } else if (mine) {
            int v = (int)nb + (code == 1u ? 1 : 0) - (code == 2u ? 1 : 0);
            if (v < 0) { bad = 1u; v = 0; }
            w = (u32)v;
        }
        head = 2u * nsel + 2u * ng + 4u * (u32)__popc(em);
    }
    if (w > 8u) bad = 1u;
    // Each group's bits, then an inclusive prefix sum over the lanes.
    u32 gbits = mine ? min(8u, pw - 8u * lane) * w : 0u;
    u32 sum = gbits;
L3_UNROLL
    for (u32 d = 1u; d < 32u; d <<= 1) {
        u32 t = __shfl_up_sync(L3V2_FULL, sum, d);
        if (lane >= d) sum += t;
    }
    u32 end = head + __shfl_sync(L3V2_FULL, sum, 31);
    if (end > 8u * rest) bad = 1u;
    if (mine) {
        nb = w;
        goff = base + head + sum - gbits;
    }
    pos += (end + 7u) >> 3;
    return __ballot_sync(L3V2_FULL, bad != 0u) == 0u;
}

// BP: plane p's entry (its first byte in `data`) and its length. Selects, not d.off[p]: an array
// indexed at run time would live in local memory.
__device__ __forceinline__ const u8* l3v2_entry(const u8* data, const V2Desc& d, u32 p, u32& len) {
    len = p == 0u ? d.len[0] : p == 1u ? d.len[1] : p == 2u ? d.len[2] : d.len[3];
    return data + (p == 0u ? d.off[0] : p == 1u ? d.off[1] : p == 2u ? d.off[2] : d.off[3]);
}

// Walks the heads of rows [0, rows) of every decoded plane. Returns (on every lane) whether every row is
// valid (and, with `exact`, every entry used exactly).
__device__ bool l3v2_bp_validate(const u8* __restrict__ data, const V2Desc& d, u32 lane) {
    for (u32 p = 0; p < d.decoded; p++) {
        u32 pos = 0u, nb = 0u, goff = 0u, sel = 0u, len;
        const u8* e = l3v2_entry(data, d, p, len);
        for (u32 r = 0; r < d.rows; r++) {
            if (!l3v2_bp_head(e, len, r, d.pw, lane, pos, nb, goff, sel)) return false;
        }
        if (d.exact && pos != len) return false;
    }
    return true;
}

// Row r of one plane at this lane's columns [c0, c0 + m): `z` their codes (byte k = column c0 + k),
// `s_lo` / `s_hi` the selectors of the runs of c0 and c0 + m - 1. `row` is the plane's row in the
// warp's stage: row r - 1 on entry (read only when r > 0), row r on return. Every lane must call it.
__device__ __forceinline__ void l3v2_row(u32 r, u32 pw, u32 c0, u32 m, const u32 (&z)[2], u32 s_lo,
                                         u32 s_hi, u8* __restrict__ row, u32 lane) {
    u32 amask = 0u;
    u32 b[2] = {0u, 0u};  // b_c of the lane's columns, packed as `z`
    u32 A = 1u, B = 0u;   // the lane's columns composed: x_{c0+m-1} = A * x_{c0-1} + B
    // Row r - 1 at columns c0 - 1 .. c0 + m, byte k = column c0 - 1 + k, read once: columns outside the
    // patch read as its edge column, which is the edge rule (TL = T at column 0, TR = T at pw - 1).
    u32 above[3] = {0u, 0u, 0u};
    if (r > 0u && c0 < pw) {
L3_UNROLL
        for (u32 k = 0; k < L3V2_COLS + 2u; k++) {
            if (k < m + 2u) {
                int c = min((int)(c0 + k) - 1, (int)pw - 1);
                above[k >> 2] |= (u32)row[c < 0 ? 0 : c] << (8u * (k & 3u));
            }
        }
    }
L3_UNROLL
    for (u32 k = 0; k < L3V2_COLS; k++) {
        u32 c = c0 + k;
        if (k < m && c < pw) {
            u32 zk = l3v2_byte(z, k);
            u32 res = (zk >> 1) ^ (0u - (zk & 1u));
            u32 a, bk;
            if (r == 0u) {
                a = c > 0u ? 1u : 0u;
                bk = res;
            } else {
                u32 tl = l3v2_byte(above, k), t = l3v2_byte(above, k + 1u), tr = l3v2_byte(above, k + 2u);
                u32 s = ((c >> 5) == (c0 >> 5)) ? s_lo : s_hi;
                if (s <= 1u && c > 0u) {
                    a = 1u;
                    bk = s == 0u ? t - tl + res : res;         // GRAD, LEFT
                } else if (s == 3u) {
                    a = 0u;
                    bk = ((tl + 2u * t + tr + 2u) >> 2) + res;  // AVG3
                } else {
                    a = 0u;
                    bk = t + res;                              // TOP; GRAD and LEFT at column 0
                }
            }
            b[k >> 2] |= (bk & 255u) << (8u * (k & 3u));
            amask |= a << k;
            B = a ? B + bk : bk;
            A &= a;
        }
    }
    __syncwarp();  // every lane has read row r - 1 before any lane writes row r
    // Inclusive scan of the lanes' maps: (A', B') then (A, B) is (A * A', A * B' + B).
L3_UNROLL
    for (u32 d = 1u; d < 32u; d <<= 1) {
        u32 pa = __shfl_up_sync(L3V2_FULL, A, d);
        u32 pb = __shfl_up_sync(L3V2_FULL, B, d);
        if (lane >= d) {
            B = A ? pb + B : B;
            A &= pa;
        }
    }
    u32 x = __shfl_up_sync(L3V2_FULL, B, 1);  // x at c0 - 1 (column 0 has a = 0, so lane 0's is unused)
L3_UNROLL
    for (u32 k = 0; k < L3V2_COLS; k++) {
        u32 c = c0 + k;
        if (k < m && c < pw) {
            u32 bk = l3v2_byte(b, k);
            x = (((amask >> k) & 1u) ? x + bk : bk) & 255u;
            row[c] = (u8)x;  // sass-count: v2-row values=L3V2_COLS
        }
    }
}

// Decodes one v2 patch (descriptor d, error index `id`) with the calling warp and hands each written
// pixel's output channels to the store. Every lane of the warp must call it.
template <typename Out>
__device__ void l3v2_patch(const u8* __restrict__ data, const V2Desc& d, Out* __restrict__ out,
                           const float* __restrict__ sb, u32* __restrict__ err, u32 id,
                           const u8* __restrict__ tables, const u32* __restrict__ buckets,
                           u8* __restrict__ scratch) {
    __shared__ u8 s_stage[L3V2_WARPS][4][L3V2_STAGE];
    u32 lane = threadIdx.x & 31u;
    u8 (*stage)[L3V2_STAGE] = s_stage[threadIdx.x >> 5];
    u32 pw = d.pw, ph = d.ph, planes = d.planes;
    bool ans = d.profile != 0u;
    u32 decoded = ans ? planes : (u32)d.decoded;
    if (pw == 0u || ph == 0u || pw > L3V2_MAX_N || ph > L3V2_MAX_N || d.rows == 0u || d.rows > ph ||
        decoded == 0u || decoded > 4u || planes > 4u) {
        if (lane == 0u) atomicMin(err, id);
        return;
    }
    u8* zs = scratch + d.scratch_offset;
    bool ok = ans ? l3v2_ans_chunk(data + d.off[0], d.len[0], tables + d.table_offset, buckets + d.buckets,
                                   planes, pw, ph, zs, lane)
                  : l3v2_bp_validate(data, d, lane);
    if (!ok) {
        if (lane == 0u) atomicMin(err, id);
        return;
    }
    __syncwarp();  // ANS: every lane's codes are in scratch before any lane reads another's
    const u8* sels = zs + planes * ph * pw;
    u32 m = (pw + 31u) >> 5, c0 = lane * m;
    u32 g_lo = min(c0 >> 3, 31u), g_hi = min((c0 + m - 1u) >> 3, 31u);  // BP groups of the lane's columns
    u32 r_lo = min(c0 >> 5, 7u), r_hi = min((c0 + m - 1u) >> 5, 7u);    // and their selector runs
    // BP, per plane p: lane p holds where its next row starts, byte p of lane g group g's width.
    u32 bp_pos = 0u, bp_nb = 0u;
    for (u32 r = 0; r < d.rows; r++) {
        for (u32 p = 0; p < decoded; p++) {
            u32 z[2] = {0u, 0u};  // the codes of the lane's columns, byte k = column c0 + k
            u32 s_lo = 1u, s_hi = 1u;
            if (ans) {
                const u8* zr = zs + (p * ph + r) * pw;
L3_UNROLL
                for (u32 k = 0; k < L3V2_COLS; k++) {
                    if (k < m && c0 + k < pw) z[k >> 2] |= (u32)zr[c0 + k] << (8u * (k & 3u));
                }
                if (r > 0u && c0 < pw) {
                    s_lo = sels[(p * ph + r) * 8u + r_lo];
                    s_hi = sels[(p * ph + r) * 8u + r_hi];
                }
            } else {
                // Valid by the walk above, so the heads parse again exactly as they did there.
                u32 len, goff = 0u, sel = 0u;
                const u8* e = l3v2_entry(data, d, p, len);
                u32 pos = __shfl_sync(L3V2_FULL, bp_pos, p);
                u32 nb = (bp_nb >> (8u * p)) & 255u;
                l3v2_bp_head(e, len, r, pw, lane, pos, nb, goff, sel);
                if (lane == p) bp_pos = pos;
                bp_nb = (bp_nb & ~(255u << (8u * p))) | (nb << (8u * p));
                u32 nb_lo = __shfl_sync(L3V2_FULL, nb, g_lo), go_lo = __shfl_sync(L3V2_FULL, goff, g_lo);
                u32 nb_hi = __shfl_sync(L3V2_FULL, nb, g_hi), go_hi = __shfl_sync(L3V2_FULL, goff, g_hi);
                s_lo = __shfl_sync(L3V2_FULL, sel, r_lo);
                s_hi = __shfl_sync(L3V2_FULL, sel, r_hi);
L3_UNROLL
                for (u32 k = 0; k < L3V2_COLS; k++) {
                    u32 c = c0 + k;
                    if (k < m && c < pw) {
                        bool lo = (c >> 3) == g_lo;
                        u32 w = lo ? nb_lo : nb_hi;
                        u32 zk = l3_bits(e, len, (lo ? go_lo : go_hi) + (c & 7u) * w, w);
                        z[k >> 2] |= zk << (8u * (k & 3u));
                    }
                }
            }
            l3v2_row(r, pw, c0, m, z, s_lo, s_hi, stage[p], lane);
        }
        __syncwarp();  // the rows of every plane are in the stage
        if (r >= d.skip) {
            for (u32 c = d.col0 + lane; c < d.col1; c += 32u) {
                u32 v0 = stage[0][c];
                u32 v[4] = {v0, v0, v0, v0};
                if (planes > 1u) {
                    v[0] = (stage[1][c] + v0) & 255u;   // R = P1 + G
                    v[2] = (stage[2][c] + v0) & 255u;   // B = P2 + G
                    if (decoded > 3u) v[3] = stage[3][c];
                }
                long long at = (long long)d.out_offset + (long long)(r - d.skip) * d.row_stride +
                               (long long)(c - d.col0) * d.col_stride;
L3_UNROLL
                for (u32 ch = 0; ch < 4u; ch++) {
                    if (ch < d.out_channels) l3_store(out, (u64)at + (u64)ch * d.chan_stride, v[ch], sb + 2u * ch);
                }
            }
        }
        __syncwarp();  // every lane has read the stage before the next row overwrites it
    }
}

// The version-2 launch: warp w of block b decodes patch b * (blockDim.x / 32) + w of the `n_v2`
// descriptors, into the batch's output (whole images or samples alike: the descriptor has the strides).
// A patch that fails sets *err to first_index + its index (first_index: the v1 descriptors of the batch,
// so one error word names either kind). A block of at most L3V2_WARPS warps.
#define L3V2_DECODE_KERNEL(name, Out)                                                                      \
    extern "C" __global__ void L3V2_BOUNDS name(const u8* data, const V2Desc* v2, u32 n_v2, Out* out,      \
                                                const float* scale_bias, u32* err, u32 first_index,        \
                                                const u8* tables, const u32* buckets, u8* scratch) {       \
        u32 i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                                       \
        if (i >= n_v2) return;                                                                            \
        V2Desc vd = v2[i];                                                                                \
        l3v2_patch(data, vd, out, scale_bias, err, first_index + i, tables, buckets, scratch);            \
    }
L3V2_DECODE_KERNEL(l3v2_decode_u8, u8)
L3V2_DECODE_KERNEL(l3v2_decode_f32, float)
L3V2_DECODE_KERNEL(l3v2_decode_f16, u16)

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
    u32 row_stride, pixel_stride, w;
    float sb[2];  // scale and bias, in registers: `out` cannot alias them
    // Row r of the patch, from the stage (column c at stage[c]); lane g of the team writes columns
    // k * team + g that are in the patch.
    static constexpr bool OWN = true;
    // Whether the patch's rows can take store_own: adjacent columns in the output (NCHW), and every
    // lane's L3_VALS elements aligned for one vector store.
    __device__ __forceinline__ bool own_ok(u32) const {
        return pixel_stride == 1u && row_stride % L3_VALS == 0u &&
               (u64)(out + base) % (L3_VALS * sizeof(Out)) == 0u;
    }
    // Row r's columns [g * L3_VALS, g * L3_VALS + L3_VALS), from their binary16 pairs.
    __device__ __forceinline__ void store_own(u32 r, const u32 (&pairs)[L3_PAIRS], u32 g) const {
        Out* q = out + base + (u64)r * row_stride + g * L3_VALS;
L3_UNROLL
        for (u32 i = 0; i < L3_WINDOWS; i++) l3_store8(q + 8u * i, pairs + 4u * i, sb);
    }
    // FULL: every column of the team is in the patch.
    template <bool FULL>
    __device__ __forceinline__ void store_row(u32 r, const u8* stage, u32 team, u32 g) const {
        Out* q = out + base + (u64)r * row_stride + L3_COL(0u, team, g) * pixel_stride;
        u32 step = L3_COL_STEP(team) * pixel_stride;
L3_UNROLL
        for (u32 k = 0; k < L3_VALS; k++) {
            u32 c = L3_COL(k, team, g);
            if (FULL || c < w) l3_store(q, (u64)(k * step), stage[c], sb);
        }
    }
};

// The v1 blocks of a launch of `n_descs` v1 patches: blockDim / l3_team_lanes teams each.
__device__ __forceinline__ u32 l3_v1_blocks(u32 n_descs) {
    u32 per = blockDim.x / l3_team_lanes(blockDim.x);
    return (n_descs + per - 1u) / per;
}

// This lane's v1 patch: block b's teams take patches [b * per, b * per + per).
__device__ __forceinline__ u32 l3_v1_patch() {
    u32 team = l3_team_lanes(blockDim.x);
    return blockIdx.x * (blockDim.x / team) + threadIdx.x / team;
}

// scale_bias: 2 floats (scale, bias) per channel index, out = v * scale + bias (unused for u8).
// Every block decodes v1 patches (a team of lanes each); version-2 patches take their own launch
// (l3v2_decode_*).
template <typename Out>
__device__ void l3_decode_patches(const u8* __restrict__ data, const PatchDesc* __restrict__ descs,
                                  u32 n_descs, Out* __restrict__ out, const float* __restrict__ scale_bias,
                                  u32* __restrict__ err) {
    u32 d = l3_v1_patch();
    bool active = d < n_descs;
    PatchDesc pd = {};
    if (active) pd = descs[d];
    L3WholeEmit<Out> emit{out, pd.out_offset, pd.row_stride, pd.pixel_stride, pd.w, {0.0f, 0.0f}};
    if (active) emit.sb[0] = scale_bias[2u * pd.channel], emit.sb[1] = scale_bias[2u * pd.channel + 1u];
    l3_patch_rows(data, pd.data_offset, pd.data_len, pd.w, pd.h, true, d, err, active, emit);
}

#define L3_DECODE_KERNEL(name, Out)                                                                      \
    extern "C" __global__ void L3_BOUNDS(4) name(const u8* data, const PatchDesc* descs, u32 n_descs,      \
                                                 Out* out, const float* scale_bias, u32* err,              \
                                                 u32 stage_cap) {                                          \
        (void)stage_cap;                                                                                  \
        l3_decode_patches<Out>(data, descs, n_descs, out, scale_bias, err);                               \
    }
L3_DECODE_KERNEL(l3_decode_u8, u8)
L3_DECODE_KERNEL(l3_decode_f32, float)
L3_DECODE_KERNEL(l3_decode_f16, u16)

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
    u8 exact;          // 1 when `rows` reaches the patch's last row: no bytes may be left over
    u8 reserved[3];
};

// Must match `FillDesc` in src/sample.rs (40 bytes).
struct FillDesc {
    u64 out_offset;    // first element of the sample
    u32 y0, y1;        // sample rows this block pads
    u32 dx, dy, w, h;  // the window, which is not padded
    u32 fill;          // the padding's pixel value (0..=255), normalised like any pixel
    u32 reserved;
};

// COPIES: 1 when every patch of the warp has one copy (RGB, the common case), else 0: `copies` (1, or 3
// for a gray image, copied to R, G, B) read at run time.
template <typename Out, u32 COPIES>
struct L3SampleEmit {
    Out* out;
    u64 base;
    int row_stride, col_stride;
    u32 copy_stride, skip, col0, col1, copies;
    float sb[2u * (COPIES ? COPIES : 3u)];  // scale and bias per copy, in registers: `out` cannot alias them
    static constexpr bool OWN = COPIES == 1u;
    // Whether the patch's rows (`w` wide) can take store_own: every column in the window, unflipped,
    // adjacent elements (NCHW), and every lane's L3_VALS elements aligned for one vector store (whole
    // images as samples; crops where the window's left edge falls on a multiple of L3_VALS).
    __device__ __forceinline__ bool own_ok(u32 w) const {
        return col_stride == 1 && col0 == 0u && col1 == w && row_stride % (int)L3_VALS == 0 &&
               (u64)(out + base) % (L3_VALS * sizeof(Out)) == 0u;
    }
    // Row r's columns [g * L3_VALS, g * L3_VALS + L3_VALS), from their binary16 pairs, when the row is
    // at or below `skip`.
    __device__ __forceinline__ void store_own(u32 r, const u32 (&pairs)[L3_PAIRS], u32 g) const {
        if (r < skip) return;
        Out* q = out + ((long long)base + (long long)(r - skip) * row_stride) + g * L3_VALS;
L3_UNROLL
        for (u32 i = 0; i < L3_WINDOWS; i++) l3_store8(q + 8u * i, pairs + 4u * i, sb);
    }
    // Row r of the patch, from the stage (column c at stage[c]); lane g of the team writes columns
    // k * team + g that are in [col0, col1), when the row is at or below `skip`. The window decides the
    // columns, not the patch (FULL unused).
    template <bool FULL>
    __device__ __forceinline__ void store_row(u32 r, const u8* stage, u32 team, u32 g) const {
        if (r < skip) return;
        Out* p = out + ((long long)base + (long long)(r - skip) * row_stride);  // column col0
        u32 n = col1 - col0;
        u32 u = L3_COL(0u, team, g) - col0;  // column L3_COL(k, ..) less col0; wraps past n below col0
        Out* q = p + (int)u * col_stride;    // where it goes: stepped, not recomputed (no 64-bit product
        int step = (int)L3_COL_STEP(team) * col_stride;  // per value); outside the window never used
L3_UNROLL
        for (u32 k = 0; k < L3_VALS; k++) {
            if (u < n) {
                u32 v = stage[L3_COL(k, team, g)];
L3_UNROLL
                for (u32 i = 0; i < (COPIES ? COPIES : 3u); i++)
                    if (COPIES || i < copies) l3_store(q, (u64)i * copy_stride, v, sb + 2u * i);
            }
            u += L3_COL_STEP(team);
            q += step;
        }
    }
};

// One v1 patch of a sample batch per team (every lane of the warp calls it; `active`: the team has one).
template <typename Out>
__device__ void l3_sample_rows(const u8* __restrict__ data, const SampleDesc& sd, u32 d,
                               u32* __restrict__ err, bool active, Out* __restrict__ out,
                               const float* __restrict__ scale_bias) {
    const float* sb = scale_bias + 2u * sd.channel;
    if (__ballot_sync(L3_FULL, active && sd.copies != 1u) == 0u) {
        L3SampleEmit<Out, 1> emit{out, sd.out_offset, sd.row_stride, sd.col_stride, sd.copy_stride,
                                  sd.skip, sd.col0, sd.col1, 1u, {}};
        if (active) emit.sb[0] = sb[0], emit.sb[1] = sb[1];
        l3_patch_rows(data, sd.data_offset, sd.data_len, sd.w, sd.rows, sd.exact != 0, d, err, active, emit);
    } else {
        L3SampleEmit<Out, 0> emit{out, sd.out_offset, sd.row_stride, sd.col_stride, sd.copy_stride,
                                  sd.skip, sd.col0, sd.col1, sd.copies, {}};
L3_UNROLL
        for (u32 i = 0; i < 6u; i++)
            if (active && i < 2u * sd.copies) emit.sb[i] = sb[i];
        l3_patch_rows(data, sd.data_offset, sd.data_len, sd.w, sd.rows, sd.exact != 0, d, err, active, emit);
    }
}

// width/height: the sample's; nchw: 1 for planar output, 0 for interleaved. The first
// l3_v1_blocks(n_descs) blocks decode v1 patches, the next n_fills blocks padding; version-2 patches take
// their own launch (l3v2_decode_*).
template <typename Out>
__device__ void l3_decode_samples(const u8* __restrict__ data, const SampleDesc* __restrict__ descs,
                                  u32 n_descs, const FillDesc* __restrict__ fills, u32 n_fills,
                                  Out* __restrict__ out, const float* __restrict__ scale_bias,
                                  u32* __restrict__ err, u32 width, u32 height, u32 nchw) {
    u32 nb1 = l3_v1_blocks(n_descs);
    u32 b = blockIdx.x;
    if (b < nb1) {
        u32 d = l3_v1_patch();
        bool active = d < n_descs;
        SampleDesc sd = {};
        if (active) sd = descs[d];
        l3_sample_rows(data, sd, d, err, active, out, scale_bias);
        return;
    }
    b -= nb1;
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
                l3_store(out, row + e, f.fill, scale_bias + 2u * ch);
            }
        }
    }
}

#define L3_SAMPLES_KERNEL(name, Out)                                                                       \
    extern "C" __global__ void L3_BOUNDS(3) name(const u8* data, const SampleDesc* descs, u32 n_descs,      \
                                    const FillDesc* fills, u32 n_fills, Out* out, const float* scale_bias, \
                                    u32* err, u32 stage_cap, u32 width, u32 height, u32 nchw) {            \
        (void)stage_cap;                                                                                  \
        l3_decode_samples<Out>(data, descs, n_descs, fills, n_fills, out, scale_bias, err, width, height,  \
                               nchw);                                                                      \
    }
L3_SAMPLES_KERNEL(l3_samples_u8, u8)
L3_SAMPLES_KERNEL(l3_samples_f32, float)
L3_SAMPLES_KERNEL(l3_samples_f16, u16)

// ---- Resampled samples: the separable passes over the decoded source rectangles (NHWC u8, 1, 3 or 4
// ---- channels), from the host's integer tables; Pillow's arithmetic, as the CPU loader's
// ---- transform/resample.rs. Per axis, at `tab + offset`: bilinear = first[n] (source index), taps[n],
// weights[n * k] (22-bit fixed point); nearest = index[n]. Output value = clamp((2^21 + sum v * w) >> 22,
// 0, 255) per pass.
//
// Channels are converted where the CPU converts them: a luma sample (out_ch 1) takes Pillow's `L` of
// each intermediate pixel as it is read, before any resampling (gray is stored as R = G = B, whose luma
// is the gray value itself); an RGBA sample (out_ch 4) resamples alpha like any channel when the image
// has one, and is 255 (never resampled) when it has none.

#define L3_PRECISION_BITS 22

// Must match `ResampleDesc` in src/resample.rs (80 bytes).
struct ResampleDesc {
    u64 in_offset;     // first element of the sample's decoded rectangle in the intermediate
    u64 tmp_offset;    // first element of its horizontally resampled rows
    u32 in_stride;     // elements between two rows of the intermediate
    u32 tmp_stride;    // elements between two rows of the horizontal pass's output
    u32 rx, ry;        // the rectangle's origin in the image (the tables index the image)
    u32 rows;          // rows of the rectangle
    u32 w, h;          // kept outputs
    u32 dx, dy;        // where they land in the sample
    u32 flip;          // 1: mirrored
    u32 nearest;       // 1: index tables, one pass
    u32 kx, ky;        // weights per output, per axis (bilinear)
    u32 x_tab, y_tab;  // the axes' tables in `tab`
    u8 in_ch;          // channels per pixel of the intermediate: 1, 3 or 4
    u8 out_ch;         // channels per pixel of the batch (and of the horizontal pass's rows): 1, 3 or 4
    u8 alpha;          // 1: the image has alpha (channel 3 of the intermediate); 0: alpha is 255
    u8 reserved;
};

// Pillow's RGB -> L (`L24` in Convert.c), as vocab's Channels.
__device__ __forceinline__ u32 l3_luma(const u8* p) {
    return ((u32)p[0] * 19595u + (u32)p[1] * 38470u + (u32)p[2] * 7471u + 0x8000u) >> 16;
}

// Channel c of the intermediate pixel at p, as the batch's channels see it (luma for one channel).
__device__ __forceinline__ u32 l3_pick(const u8* p, u32 c, u32 in_ch, u32 out_ch) {
    return out_ch == 1u && in_ch >= 3u ? l3_luma(p) : (u32)p[c];
}

__device__ __forceinline__ u32 l3_clip8(int acc) {
    int v = acc >> L3_PRECISION_BITS;
    return v < 0 ? 0u : (v > 255 ? 255u : (u32)v);
}

// The horizontal pass: block = (sample, row of its rectangle); every kept column of every channel.
extern "C" __global__ void l3_resample_h(const u8* __restrict__ inter, u8* __restrict__ tmp,
                                         const ResampleDesc* __restrict__ rd, u32 n, u32 rows,
                                         const int* __restrict__ tab) {
    u32 s = blockIdx.x / rows, row = blockIdx.x % rows;
    if (s >= n) return;
    ResampleDesc d = rd[s];
    if (d.nearest || row >= d.rows) return;
    const u8* src = inter + d.in_offset + (u64)row * d.in_stride;
    u8* dst = tmp + d.tmp_offset + (u64)row * d.tmp_stride;
    const int* first = tab + d.x_tab;
    const int* taps = first + d.w;
    const int* wts = taps + d.w;
    u32 ci = d.in_ch, co = d.out_ch;
    for (u32 e = threadIdx.x; e < d.w * co; e += blockDim.x) {
        u32 j = e / co, c = e - j * co;
        if (c == 3u && !d.alpha) {
            dst[e] = 255u;
            continue;
        }
        const u8* p = src + (u64)(first[j] - (int)d.rx) * ci;
        const int* k = wts + (u64)j * d.kx;
        int acc = 1 << (L3_PRECISION_BITS - 1);
        for (int t = 0; t < taps[j]; t++) acc += (int)l3_pick(p + (u64)t * ci, c, ci, co) * k[t];
        dst[e] = (u8)l3_clip8(acc);
    }
}

// The vertical pass (or the nearest pick) and the placement: block = (sample, output row); every element
// of the row, in the batch's layout and element type: kept outputs where they land (mirrored when
// flipped), `fill` everywhere else.
template <typename Out>
__device__ void l3_resample_v(const u8* __restrict__ inter, const u8* __restrict__ tmp,
                              const ResampleDesc* __restrict__ rd, u32 n, const int* __restrict__ tab,
                              Out* __restrict__ out, const float* __restrict__ sb, u32 width, u32 height,
                              u32 nchw, u32 fill) {
    u32 s = blockIdx.x / height, y = blockIdx.x % height;
    if (s >= n) return;
    ResampleDesc d = rd[s];
    u32 ci = d.in_ch, co = d.out_ch;
    u64 plane = (u64)width * height;
    u64 base = (u64)s * plane * co;
    bool row_in = y >= d.dy && y - d.dy < d.h;
    u32 i = y - d.dy;
    for (u32 e = threadIdx.x; e < width * co; e += blockDim.x) {
        u32 x = nchw ? e % width : e / co;
        u32 c = nchw ? e / width : e % co;
        u32 v = fill;
        if (row_in && x >= d.dx && x - d.dx < d.w) {
            u32 jj = x - d.dx;
            u32 j = d.flip ? d.w - 1u - jj : jj;
            if (c == 3u && !d.alpha) {
                v = 255u;
            } else if (d.nearest) {
                int sy = tab[d.y_tab + i] - (int)d.ry, sx = tab[d.x_tab + j] - (int)d.rx;
                v = l3_pick(inter + d.in_offset + (u64)sy * d.in_stride + (u64)sx * ci, c, ci, co);
            } else {
                const int* first = tab + d.y_tab;
                const int* taps = first + d.h;
                const int* k = taps + d.h + (u64)i * d.ky;
                const u8* p = tmp + d.tmp_offset + (u64)(first[i] - (int)d.ry) * d.tmp_stride + j * co + c;
                int acc = 1 << (L3_PRECISION_BITS - 1);
                for (int t = 0; t < taps[i]; t++) acc += (int)p[(u64)t * d.tmp_stride] * k[t];
                v = l3_clip8(acc);
            }
        }
        u64 at = nchw ? base + (u64)c * plane + (u64)y * width + x : base + ((u64)y * width + x) * co + c;
        l3_store(out, at, v, sb + 2u * c);
    }
}

#define L3_RESAMPLE_KERNEL(name, Out)                                                                      \
    extern "C" __global__ void name(const u8* inter, const u8* tmp, const ResampleDesc* rd, u32 n,          \
                                    const int* tab, Out* out, const float* sb, u32 width, u32 height,      \
                                    u32 nchw, u32 fill) {                                                  \
        l3_resample_v<Out>(inter, tmp, rd, n, tab, out, sb, width, height, nchw, fill);                    \
    }
L3_RESAMPLE_KERNEL(l3_resample_u8, u8)
L3_RESAMPLE_KERNEL(l3_resample_f32, float)
L3_RESAMPLE_KERNEL(l3_resample_f16, u16)
