// CPU shim for src/cuda/kernels.cu: the kernels' exact source compiled by g++ and run on host threads.
// A block's threads run one after another (kernels without barriers), or as one host thread per CUDA
// thread with `__syncthreads()` a real barrier (the statistics reduction); blocks run one after another.
// `__shared__` becomes `static`: one copy, shared by the block's threads, reused by the next block.
#pragma once
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#define BSP_CPU_SIM 1
typedef uint16_t u16;
typedef long long i64;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}

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
extern SimBarrier bsp_sim_barrier;
inline void __syncthreads() { bsp_sim_barrier.arrive_and_wait(); }
