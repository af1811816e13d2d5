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
#include <cmath>
#include <mutex>
using std::fmaf;

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
