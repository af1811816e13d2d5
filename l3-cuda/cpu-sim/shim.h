// CPU shim for src/kernel.cu: runs the kernel's exact source on host threads, one host thread per CUDA
// thread of a block, blocks one after another. `__shared__` becomes `static` (one copy, shared by the
// block's threads, reused by the next block after a barrier), `__syncthreads()` a real barrier built on
// a mutex and condition variable (so ThreadSanitizer sees every happens-before edge and reports any
// shared-memory access that the kernel's barriers do not order), atomics become std::atomic_ref.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <mutex>
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
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
extern u8* l3_sim_dyn_smem;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define L3_DYNAMIC_SMEM(name) u8* name = l3_sim_dyn_smem

struct SimBarrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned count = 0, generation = 0, expected = 0;
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m);
        unsigned gen = generation;
        if (++count == expected) {
            count = 0;
            generation++;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
    }
};
extern SimBarrier l3_sim_barrier;

inline void __syncthreads() { l3_sim_barrier.arrive_and_wait(); }

inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// Warp-level primitives for the v2 kernels: each warp (32 consecutive threads; blocks are whole warps) has
// its own barrier, which `__syncwarp` waits at and `__ballot_sync` builds on. A ballot takes one barrier:
// votes go into one of three words in turn (every lane of a warp makes the same sequence of ballots, so a
// per-thread count names the word); the word for the ballot after next is cleared now, by lane 0 — its
// last reads were two ballots ago, before the barrier of the previous one.
struct SimWarp {
    SimBarrier bar;
    std::atomic<unsigned> votes[3] = {0, 0, 0};
};
constexpr unsigned L3_SIM_MAX_WARPS = 8;
extern SimWarp l3_sim_warps[L3_SIM_MAX_WARPS];
extern thread_local unsigned l3_sim_ballots;

inline void __syncwarp(unsigned = 0xffffffffu) { l3_sim_warps[threadIdx.x / 32].bar.arrive_and_wait(); }

inline unsigned __ballot_sync(unsigned, int pred) {
    SimWarp& w = l3_sim_warps[threadIdx.x / 32];
    unsigned k = l3_sim_ballots++ % 3;
    if (threadIdx.x % 32 == 0) w.votes[(k + 1) % 3].store(0);
    if (pred) w.votes[k].fetch_or(1u << (threadIdx.x % 32));
    w.bar.arrive_and_wait();
    return w.votes[k].load();
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
