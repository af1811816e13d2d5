// The CPU simulation's scheduler: runs a kernel launch (compiled through cuda_sim.h) on fibers, one per
// CUDA thread, blocks one after another; plus the little file reading every harness does. A harness
// includes cuda_sim.h, its kernels, then this, and calls `cuda_sim_launch` from its main().
#pragma once
#include "cuda_sim.h"

#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#define CUDA_SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CUDA_SIM_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_SIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CUDA_SIM_TSAN 1
#endif
#endif
#ifdef CUDA_SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef CUDA_SIM_TSAN
#include <sanitizer/tsan_interface.h>
#endif

std::atomic<SimThread*> cuda_sim_current{nullptr};
dim3 blockDim;
dim3 gridDim;
u8* cuda_sim_dyn_smem = nullptr;
SimWarpVotes cuda_sim_votes[CUDA_SIM_MAX_WARPS];

// ---- Fibers: a stack each and a hand-written register switch (x86-64), else (or with -DCUDA_SIM_UCONTEXT)
// ---- ucontext.
//
// The switch saves the callee-saved registers on the old stack and its stack pointer in *from, then loads
// `to`. It is not instrumented, so neither sanitizer intercepts it (ASan's swapcontext interceptor would
// clear the shadow of a suspended fiber's stack, and with it the redzones of the kernel's locals).
#if defined(__x86_64__) && defined(__ELF__) && !(defined(__CET__) && (__CET__ & 2)) && !defined(CUDA_SIM_UCONTEXT)
#define CUDA_SIM_ASM_SWITCH 1
extern "C" void cuda_sim_switch(void** from, void* to);
asm(R"(
    .text
    .globl cuda_sim_switch
    .type cuda_sim_switch, @function
cuda_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_sim_switch, .-cuda_sim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#else
#include <ucontext.h>
#endif

enum SimWait : unsigned { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, AT_BLOCK_END };

struct SimFiber {
    SimThread t;
    // What it waits at: written by the fiber before it switches back, read and reset by the scheduler.
    std::atomic<unsigned> wait{RUNNABLE};
    u8* stack = nullptr;  // lowest usable byte; a guard page below it
    size_t stack_size = 0;
#ifdef CUDA_SIM_ASM_SWITCH
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
    void* tsan = nullptr;
    void* asan_fake = nullptr;
};

// A barrier's happens-before edges for ThreadSanitizer: every arriving thread releases into the object
// of the barrier's generation parity, every leaving thread acquires from it. Two objects suffice: nobody
// can arrive at generation g + 2 before every thread has left generation g.
struct SimBarrierHb {
    std::atomic<unsigned> generation{0};
    char hb[2];
};

static std::vector<SimFiber> fibers;
static SimBarrierHb block_barrier, block_end, warp_barriers[CUDA_SIM_MAX_WARPS];
#ifdef CUDA_SIM_ASM_SWITCH
static void* main_sp;
#else
static ucontext_t main_ctx;
#endif
[[maybe_unused]] static void* main_tsan;
[[maybe_unused]] static const void* main_stack_bottom;
[[maybe_unused]] static size_t main_stack_size;
static void (*sim_block_fn)();  // runs the kernel for the current thread's block
// The order the blocks of a launch run in: a GPU promises none, so a kernel whose result depends on it
// (two blocks writing one element, a block reading what another wrote) is wrong. CUDA_SIM_BLOCK_ORDER =
// forward (the default), reverse, or a number: a shuffle seeded with it.
static std::vector<unsigned> sim_order;

static inline void hb_release(void* p) {
#ifdef CUDA_SIM_TSAN
    __tsan_release(p);
#else
    (void)p;
#endif
}
static inline void hb_acquire(void* p) {
#ifdef CUDA_SIM_TSAN
    __tsan_acquire(p);
#else
    (void)p;
#endif
}

// Fiber -> scheduler. No happens-before edge: the scheduler learns only where the fiber waits.
static void switch_to_main(SimFiber& f) {
#ifdef CUDA_SIM_TSAN
    __tsan_switch_to_fiber(main_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef CUDA_SIM_ASAN
    __sanitizer_start_switch_fiber(&f.asan_fake, main_stack_bottom, main_stack_size);
#endif
#ifdef CUDA_SIM_ASM_SWITCH
    cuda_sim_switch(&f.sp, main_sp);
#else
    swapcontext(&f.ctx, &main_ctx);
#endif
#ifdef CUDA_SIM_ASAN
    __sanitizer_finish_switch_fiber(f.asan_fake, nullptr, nullptr);
#endif
}

// Scheduler -> fiber. This edge orders only the scheduler's own writes (the fiber's indices, and between
// blocks everything the previous block did, which the scheduler acquired at its end) before the fiber's
// next steps; the scheduler never acquires from a fiber within a block, so it carries nothing from one
// thread of a block to another.
static void switch_to_fiber(SimFiber& f) {
    cuda_sim_current.store(&f.t, std::memory_order_relaxed);
#ifdef CUDA_SIM_TSAN
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
#ifdef CUDA_SIM_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, f.stack_size);
#endif
#ifdef CUDA_SIM_ASM_SWITCH
    cuda_sim_switch(&main_sp, f.sp);
#else
    swapcontext(&main_ctx, &f.ctx);
#endif
#ifdef CUDA_SIM_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// A kernel the simulator cannot run as CUDA would: exit at once (no destructors, which would run on a
// fiber's stack while the other fibers are suspended).
[[noreturn]] static void fail() {
    fflush(stderr);
    _exit(3);
}

static void wait_at(SimBarrierHb& b, SimWait what) {
    SimFiber& f = fibers[threadIdx.x];
    char* hb = &b.hb[b.generation.load(std::memory_order_relaxed) & 1u];
    f.wait.store(what, std::memory_order_relaxed);
    hb_release(hb);
    switch_to_main(f);
    hb_acquire(hb);
}

void cuda_sim_barrier(int warp) {
    if (warp < 0) wait_at(block_barrier, AT_BLOCK_BARRIER);
    else wait_at(warp_barriers[warp], AT_WARP_BARRIER);
}

void cuda_sim_full_mask(unsigned mask) {
    if (mask != 0xffffffffu) {
        fprintf(stderr, "warp primitive with mask %#x: only full warps are simulated\n", mask);
        fail();
    }
}

// Every simulated thread: each block of the grid in turn, then a wait at the block's end (the scheduler
// starts the next block once every thread is there, and never resumes a thread after the last one).
static void fiber_main() {
    SimFiber& f = fibers[threadIdx.x];
#ifdef CUDA_SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &main_stack_bottom, &main_stack_size);
#endif
    for (unsigned i = 0; i < gridDim.x * gridDim.y; i++) {
        const unsigned b = sim_order[i];
        f.t.block_idx.x = b % gridDim.x;
        f.t.block_idx.y = b / gridDim.x;
        sim_block_fn();
        wait_at(block_end, AT_BLOCK_END);
    }
    fprintf(stderr, "a simulated thread was resumed after the last block\n");
    abort();
}

#ifndef CUDA_SIM_ASM_SWITCH
static void fiber_entry_ucontext() { fiber_main(); }
#endif

static void deadlock(unsigned block) {
    static const char* names[] = {"runnable", "__syncthreads", "__syncwarp/ballot", "the block's end"};
    fprintf(stderr, "block %u: no barrier can open (divergent barrier, or threads that returned early):\n", block);
    for (size_t i = 0; i < fibers.size();) {
        unsigned w = fibers[i].wait.load(std::memory_order_relaxed);
        size_t j = i;
        while (j + 1 < fibers.size() && fibers[j + 1].wait.load(std::memory_order_relaxed) == w) j++;
        fprintf(stderr, "  threads %zu..=%zu at %s\n", i, j, names[w]);
        i = j + 1;
    }
    fail();
}

// Runs `fn` as a launch of `grid` (x × y) blocks of `block` threads (1 to 256; the last warp may be
// partial): `fn` is called by every simulated thread of every block, and reads its indices from
// threadIdx / blockIdx as a kernel does.
static void cuda_sim_launch(dim3 grid, unsigned block, void (*fn)()) {
    if (block == 0 || block > 32 * CUDA_SIM_MAX_WARPS) {
        fprintf(stderr, "block of %u threads: the simulation runs 1 to %u\n", block, 32 * CUDA_SIM_MAX_WARPS);
        exit(2);
    }
    gridDim = dim3{grid.x, grid.y, 1};
    blockDim = dim3{block, 1, 1};
    sim_block_fn = fn;
    // A launch's threads count their ballots from 0, so its first ballot must find every word clear;
    // an earlier launch may have left votes in any of them.
    for (SimWarpVotes& w : cuda_sim_votes) {
        for (std::atomic<unsigned>& v : w.votes) v.store(0);
    }
    const unsigned blocks = grid.x * grid.y;
    if (blocks == 0) return;
    sim_order.resize(blocks);
    for (unsigned b = 0; b < blocks; b++) sim_order[b] = b;
    if (const char* order = getenv("CUDA_SIM_BLOCK_ORDER")) {
        if (strcmp(order, "reverse") == 0) {
            for (unsigned b = 0; b < blocks; b++) sim_order[b] = blocks - 1 - b;
        } else if (strcmp(order, "forward") != 0) {
            unsigned long long x = strtoull(order, nullptr, 10) * 0x9E3779B97F4A7C15ull + 1;
            for (unsigned b = blocks; b > 1; b--) {  // Fisher-Yates with splitmix64
                x += 0x9E3779B97F4A7C15ull;
                unsigned long long z = x;
                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
                z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
                z ^= z >> 31;
                std::swap(sim_order[b - 1], sim_order[z % b]);
            }
        }
    }
    // Kernel frames are small; sanitizers make them larger. A guard page below catches an overflow.
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), stack_size = 256 * 1024;
    fibers = std::vector<SimFiber>(block);
#ifdef CUDA_SIM_TSAN
    // Once: a fiber reads it on its way out after its last release, so a later launch must not write it.
    if (!main_tsan) main_tsan = __tsan_get_current_fiber();
#endif
    for (unsigned i = 0; i < block; i++) {
        SimFiber& f = fibers[i];
        f.t.thread_idx.x = i;
        void* m = mmap(nullptr, stack_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) { perror("mmap"); exit(2); }
        mprotect(m, page, PROT_NONE);
        f.stack = (u8*)m + page;
        f.stack_size = stack_size;
#ifdef CUDA_SIM_ASM_SWITCH
        // The frame cuda_sim_switch pops: MXCSR and x87 control word, six registers, then it returns into
        // fiber_main with the stack aligned as after a call.
        uintptr_t* top = (uintptr_t*)(f.stack + stack_size);
        *--top = 0;  // fiber_main's return address: it never returns
        *--top = (uintptr_t)&fiber_main;
        for (int r = 0; r < 6; r++) *--top = 0;
        *--top = 0x037F00001F80ull;  // MXCSR 0x1F80, x87 control word 0x037F: the defaults
        f.sp = top;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = stack_size;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_entry_ucontext, 0);
        // makecontext has read the stack; ASan's swapcontext interceptor would clear its shadow at every
        // switch into the fiber (redzones of suspended frames included) if it could find it.
        f.ctx.uc_stack.ss_sp = nullptr;
        f.ctx.uc_stack.ss_size = 0;
#endif
#ifdef CUDA_SIM_TSAN
        f.tsan = __tsan_create_fiber(0);
#endif
    }
    const unsigned warps = (block + 31) / 32;
    for (unsigned b = 0; b < blocks; b++) {
        for (;;) {
            for (SimFiber& f : fibers) {
                if (f.wait.load(std::memory_order_relaxed) == RUNNABLE) switch_to_fiber(f);
            }
            // Every thread now waits somewhere: open what can open.
            unsigned at[4] = {0, 0, 0, 0};
            for (SimFiber& f : fibers) at[f.wait.load(std::memory_order_relaxed)]++;
            if (at[AT_BLOCK_END] == block) break;
            if (at[AT_BLOCK_BARRIER] == block) {
                block_barrier.generation.fetch_add(1, std::memory_order_relaxed);
                for (SimFiber& f : fibers) f.wait.store(RUNNABLE, std::memory_order_relaxed);
                continue;
            }
            bool opened = false;
            for (unsigned w = 0; w < warps; w++) {
                SimFiber* lanes = &fibers[w * 32];
                const unsigned n = std::min(32u, block - w * 32);
                bool all = true;
                for (unsigned l = 0; l < n && all; l++) {
                    all = lanes[l].wait.load(std::memory_order_relaxed) == AT_WARP_BARRIER;
                }
                if (!all) continue;
                warp_barriers[w].generation.fetch_add(1, std::memory_order_relaxed);
                for (unsigned l = 0; l < n; l++) lanes[l].wait.store(RUNNABLE, std::memory_order_relaxed);
                opened = true;
            }
            if (!opened) deadlock(b);
        }
        // The next block reuses the "shared" memory: everything this block did happens before it.
        hb_acquire(&block_end.hb[block_end.generation.load(std::memory_order_relaxed) & 1u]);
        block_end.generation.fetch_add(1, std::memory_order_relaxed);
        for (SimFiber& f : fibers) f.wait.store(RUNNABLE, std::memory_order_relaxed);
    }
    for (SimFiber& f : fibers) {
#ifdef CUDA_SIM_TSAN
        __tsan_destroy_fiber(f.tsan);
#endif
        munmap(f.stack - page, stack_size + page);
    }
    fibers.clear();
    cuda_sim_current.store(nullptr, std::memory_order_relaxed);
}

[[maybe_unused]] static std::vector<u8> read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    std::vector<u8> v;
    u8 buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    fclose(f);
    return v;
}

struct Reader {
    const std::vector<u8>& b;
    size_t pos = 0;
    template <typename T> T get() {
        if (pos + sizeof(T) > b.size()) { fprintf(stderr, "truncated launch file\n"); exit(2); }
        T v;
        memcpy(&v, b.data() + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    std::vector<u8> blob() {
        u64 n = get<u64>();
        if (pos + n > b.size()) { fprintf(stderr, "truncated blob\n"); exit(2); }
        std::vector<u8> v(b.begin() + pos, b.begin() + pos + n);
        pos += n;
        return v;
    }
};
