// The CUDA surface a kernel source sees when g++ compiles it for the CPU simulation: include this first,
// then the kernels, then cuda_sim_run.h (the scheduler that launches them).
//
// Every CUDA thread of a block is a fiber with its own stack, and one OS thread switches between them at
// barriers (cuda_sim_run.h): an OS thread per CUDA thread made every barrier cost a kernel wake-up per
// thread, which dominated the simulation. Blocks run one after another. `__shared__` becomes `static` (one
// copy, shared by the block's threads, reused by the next block), `__syncthreads()` waits until every
// thread of the block has arrived, `__syncwarp()` until every lane of the warp has, atomics become
// std::atomic_ref. A barrier that some thread can never reach (divergent barriers, a thread that
// returned) is reported, not waited on forever. Switching between fibers orders nothing between the
// simulated threads for ThreadSanitizer; only the barriers create happens-before edges, so it still
// reports any shared-memory access that the kernel's barriers do not order.
//
// Kernels test CUDA_CPU_SIM to leave out what g++ gets from here (their typedefs, `extern __shared__`).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
using std::fmaf;
using std::min;

#define CUDA_CPU_SIM 1
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef long long i64;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// The simulated CUDA thread that runs now: its indices and how many ballots it has made.
struct SimThread {
    dim3 thread_idx, block_idx;
    unsigned ballots = 0;
    unsigned shuffles = 0;
};
// Atomic (relaxed) only so that ThreadSanitizer does not see the scheduler's writes of it as races.
extern std::atomic<SimThread*> cuda_sim_current;
#define threadIdx (cuda_sim_current.load(std::memory_order_relaxed)->thread_idx)
#define blockIdx (cuda_sim_current.load(std::memory_order_relaxed)->block_idx)
extern dim3 blockDim;
extern dim3 gridDim;
// The launch's dynamic shared memory (`extern __shared__` on a GPU), set by the harness.
extern u8* cuda_sim_dyn_smem;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __noinline__ __attribute__((noinline))

// Suspends the calling thread at the block's barrier (warp < 0) or at warp `warp`'s barrier until it
// opens (cuda_sim_run.h).
void cuda_sim_barrier(int warp);

inline void __syncthreads() { cuda_sim_barrier(-1); }

inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// Warp-level primitives (only full masks are simulated).
// A ballot takes one warp barrier: votes go into one of three words in turn (every lane of a warp makes
// the same sequence of ballots, so a per-thread count names the word); the word for the ballot after next
// is cleared now, by lane 0 — its last reads were two ballots ago, before the barrier of the previous one.
struct SimWarpVotes {
    std::atomic<unsigned> votes[3] = {0, 0, 0};
};
constexpr unsigned CUDA_SIM_MAX_WARPS = 8;
extern SimWarpVotes cuda_sim_votes[CUDA_SIM_MAX_WARPS];
void cuda_sim_full_mask(unsigned mask);

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    cuda_sim_full_mask(mask);
    cuda_sim_barrier((int)(threadIdx.x / 32));
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    cuda_sim_full_mask(mask);
    SimThread& t = *cuda_sim_current.load(std::memory_order_relaxed);
    unsigned lane = t.thread_idx.x % 32, warp = t.thread_idx.x / 32;
    SimWarpVotes& w = cuda_sim_votes[warp];
    unsigned k = t.ballots++ % 3;
    if (lane == 0) w.votes[(k + 1) % 3].store(0);
    if (pred) w.votes[k].fetch_or(1u << lane);
    cuda_sim_barrier((int)warp);
    return w.votes[k].load();
}

// A shuffle takes one warp barrier, like a ballot: every lane stores its value in its slot of one of
// three rows in turn, and after the barrier reads the source lane's slot. A row is stored again three
// shuffles later, when every lane has passed the barrier after its reads.
struct SimWarpShuffles {
    std::atomic<unsigned> slots[3][32] = {};
};
inline SimWarpShuffles cuda_sim_shuffles[CUDA_SIM_MAX_WARPS];

template <typename T>
inline T cuda_sim_shfl(unsigned mask, T v, unsigned src_lane) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    cuda_sim_full_mask(mask);
    SimThread& t = *cuda_sim_current.load(std::memory_order_relaxed);
    unsigned lane = t.thread_idx.x % 32, warp = t.thread_idx.x / 32;
    unsigned k = t.shuffles++ % 3, bits;
    memcpy(&bits, &v, 4);
    cuda_sim_shuffles[warp].slots[k][lane].store(bits, std::memory_order_relaxed);
    cuda_sim_barrier((int)warp);
    bits = cuda_sim_shuffles[warp].slots[k][src_lane % 32].load(std::memory_order_relaxed);
    memcpy(&v, &bits, 4);
    return v;
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    unsigned lane = threadIdx.x % 32;
    return cuda_sim_shfl(mask, v, (lane & ~(unsigned)(width - 1)) + ((unsigned)src & (unsigned)(width - 1)));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    unsigned lane = threadIdx.x % 32;
    return cuda_sim_shfl(mask, v, lane % (unsigned)width >= d ? lane - d : lane);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    unsigned lane = threadIdx.x % 32;
    return cuda_sim_shfl(mask, v, lane % (unsigned)width + d < (unsigned)width ? lane + d : lane);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    unsigned lane = threadIdx.x % 32, src = lane ^ (unsigned)m;
    return cuda_sim_shfl(mask, v, src / (unsigned)width == lane / (unsigned)width ? src : lane);
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }

inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}

inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Byte k of the result is byte (s >> 4k) & 7 of the eight bytes y:x (x's bytes are 0..3).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    unsigned long long xy = ((unsigned long long)y << 32) | x;
    unsigned int r = 0;
    for (int k = 0; k < 4; k++) r |= (unsigned int)((xy >> (8 * ((s >> (4 * k)) & 7u))) & 0xffu) << (8 * k);
    return r;
}
