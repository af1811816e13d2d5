// CPU shim for src/kernel.cu: runs the kernel's exact source on the host. Every CUDA thread of a block is
// a fiber with its own stack, and one OS thread switches between them at barriers (cpu-sim/harness.cpp):
// an OS thread per CUDA thread made every barrier cost a kernel wake-up per thread, which dominated the
// simulation. Blocks run one after another. `__shared__` becomes `static` (one copy, shared by the block's
// threads, reused by the next block), `__syncthreads()` waits until every thread of the block has arrived,
// `__syncwarp()` until every lane of the warp has, atomics become std::atomic_ref. A barrier that some
// thread can never reach (divergent barriers, a thread that returned) is reported, not waited on forever.
// Switching between fibers orders nothing between the simulated threads for ThreadSanitizer; only the
// barriers create happens-before edges, so it still reports any shared-memory access that the kernel's
// barriers do not order (harness.cpp's `--probe race` shows it).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
using std::fmaf;
using std::min;

#define L3_CPU_SIM 1
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// The simulated CUDA thread that runs now: its indices and how many ballots it has made.
struct SimThread {
    dim3 thread_idx, block_idx;
    unsigned ballots = 0;
};
// Atomic (relaxed) only so that ThreadSanitizer does not see the scheduler's writes of it as races.
extern std::atomic<SimThread*> l3_sim_current;
#define threadIdx (l3_sim_current.load(std::memory_order_relaxed)->thread_idx)
#define blockIdx (l3_sim_current.load(std::memory_order_relaxed)->block_idx)
extern dim3 blockDim;
extern dim3 gridDim;
extern u8* l3_sim_dyn_smem;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define L3_DYNAMIC_SMEM(name) u8* name = l3_sim_dyn_smem

// Suspends the calling thread at the block's barrier (warp < 0) or at warp `warp`'s barrier until it
// opens (harness.cpp).
void l3_sim_barrier(int warp);

inline void __syncthreads() { l3_sim_barrier(-1); }

inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// Warp-level primitives for the v2 kernels (blocks are whole warps; the kernel only uses full masks).
// A ballot takes one warp barrier: votes go into one of three words in turn (every lane of a warp makes
// the same sequence of ballots, so a per-thread count names the word); the word for the ballot after next
// is cleared now, by lane 0 — its last reads were two ballots ago, before the barrier of the previous one.
struct SimWarpVotes {
    std::atomic<unsigned> votes[3] = {0, 0, 0};
};
constexpr unsigned L3_SIM_MAX_WARPS = 8;
extern SimWarpVotes l3_sim_votes[L3_SIM_MAX_WARPS];
void l3_sim_full_mask(unsigned mask);

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    l3_sim_full_mask(mask);
    l3_sim_barrier((int)(threadIdx.x / 32));
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    l3_sim_full_mask(mask);
    SimThread& t = *l3_sim_current.load(std::memory_order_relaxed);
    unsigned lane = t.thread_idx.x % 32, warp = t.thread_idx.x / 32;
    SimWarpVotes& w = l3_sim_votes[warp];
    unsigned k = t.ballots++ % 3;
    if (lane == 0) w.votes[(k + 1) % 3].store(0);
    if (pred) w.votes[k].fetch_or(1u << lane);
    l3_sim_barrier((int)warp);
    return w.votes[k].load();
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
