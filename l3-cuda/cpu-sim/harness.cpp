// Runs one launch of src/kernel.cu on the CPU: `harness LAUNCH_IN OUT_FILE`, or one of the simulator's
// self-checks: `harness --probe NAME` (see below).
// LAUNCH_IN (written by l3-cuda's tests from the real host plan, little-endian):
//   u32 mode (0 = whole images: l3_decode_*, 1 = samples: l3_samples_*), u32 kind (0 = u8, 1 = f32,
//   2 = f16), u32 grid, u32 block, u32 dyn_smem, u32 stage_cap, u32 n_descs, u32 n_fills, u32 width,
//   u32 height, u32 nchw (the last four: sample launches only),
//   u64 len + data bytes, u64 len + descriptor bytes, u64 len + padding-table bytes,
//   u64 len + scale/bias f32 bytes, u64 output bytes, then for version-2 patches: u32 n_v2,
//   u64 len + V2Desc bytes, u64 len + context-table bytes, u64 scratch bytes.
// OUT_FILE: u32 err, then the output bytes. Output starts filled with FILL_BYTE (optional third argument,
// default 0xA5) so unwritten elements show.
#include "shim.h"
#include "../src/kernel.cu"

#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define L3_SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define L3_SIM_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define L3_SIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define L3_SIM_TSAN 1
#endif
#endif
#ifdef L3_SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef L3_SIM_TSAN
#include <sanitizer/tsan_interface.h>
#endif

// The tables the tests write must match the kernel's structs byte for byte.
static_assert(sizeof(PatchDesc) == 40, "PatchDesc: 40 bytes, as src/plan.rs writes it");
static_assert(sizeof(SampleDesc) == 48, "SampleDesc: 48 bytes, as src/sample.rs writes it");
static_assert(sizeof(FillDesc) == 32, "FillDesc: 32 bytes, as src/sample.rs writes it");
static_assert(sizeof(V2Desc) == 104, "V2Desc: 104 bytes, as src/v2.rs writes it");

std::atomic<SimThread*> l3_sim_current{nullptr};
dim3 blockDim;
dim3 gridDim;
u8* l3_sim_dyn_smem = nullptr;
SimWarpVotes l3_sim_votes[L3_SIM_MAX_WARPS];

// ---- Fibers: a stack each and a hand-written register switch (x86-64), else (or with -DL3_SIM_UCONTEXT)
// ---- ucontext.
//
// The switch saves the callee-saved registers on the old stack and its stack pointer in *from, then loads
// `to`. It is not instrumented, so neither sanitizer intercepts it (ASan's swapcontext interceptor would
// clear the shadow of a suspended fiber's stack, and with it the redzones of the kernel's locals).
#if defined(__x86_64__) && defined(__ELF__) && !(defined(__CET__) && (__CET__ & 2)) && !defined(L3_SIM_UCONTEXT)
#define L3_SIM_ASM_SWITCH 1
extern "C" void l3_sim_switch(void** from, void* to);
asm(R"(
    .text
    .globl l3_sim_switch
    .type l3_sim_switch, @function
l3_sim_switch:
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
    .size l3_sim_switch, .-l3_sim_switch
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
#ifdef L3_SIM_ASM_SWITCH
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
static SimBarrierHb block_barrier, block_end, warp_barriers[L3_SIM_MAX_WARPS];
#ifdef L3_SIM_ASM_SWITCH
static void* main_sp;
#else
static ucontext_t main_ctx;
#endif
[[maybe_unused]] static void* main_tsan;
[[maybe_unused]] static const void* main_stack_bottom;
[[maybe_unused]] static size_t main_stack_size;
static void (*sim_block_fn)();  // runs the kernel for the current thread's block

static inline void hb_release(void* p) {
#ifdef L3_SIM_TSAN
    __tsan_release(p);
#else
    (void)p;
#endif
}
static inline void hb_acquire(void* p) {
#ifdef L3_SIM_TSAN
    __tsan_acquire(p);
#else
    (void)p;
#endif
}

// Fiber -> scheduler. No happens-before edge: the scheduler learns only where the fiber waits.
static void switch_to_main(SimFiber& f) {
#ifdef L3_SIM_TSAN
    __tsan_switch_to_fiber(main_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef L3_SIM_ASAN
    __sanitizer_start_switch_fiber(&f.asan_fake, main_stack_bottom, main_stack_size);
#endif
#ifdef L3_SIM_ASM_SWITCH
    l3_sim_switch(&f.sp, main_sp);
#else
    swapcontext(&f.ctx, &main_ctx);
#endif
#ifdef L3_SIM_ASAN
    __sanitizer_finish_switch_fiber(f.asan_fake, nullptr, nullptr);
#endif
}

// Scheduler -> fiber. This edge orders only the scheduler's own writes (the fiber's indices, and between
// blocks everything the previous block did, which the scheduler acquired at its end) before the fiber's
// next steps; the scheduler never acquires from a fiber within a block, so it carries nothing from one
// thread of a block to another.
static void switch_to_fiber(SimFiber& f) {
    l3_sim_current.store(&f.t, std::memory_order_relaxed);
#ifdef L3_SIM_TSAN
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
#ifdef L3_SIM_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, f.stack_size);
#endif
#ifdef L3_SIM_ASM_SWITCH
    l3_sim_switch(&main_sp, f.sp);
#else
    swapcontext(&main_ctx, &f.ctx);
#endif
#ifdef L3_SIM_ASAN
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

void l3_sim_barrier(int warp) {
    if (warp < 0) wait_at(block_barrier, AT_BLOCK_BARRIER);
    else wait_at(warp_barriers[warp], AT_WARP_BARRIER);
}

void l3_sim_full_mask(unsigned mask) {
    if (mask != 0xffffffffu) {
        fprintf(stderr, "warp primitive with mask %#x: only full warps are simulated\n", mask);
        fail();
    }
}

// Every simulated thread: each block of the grid in turn, then a wait at the block's end (the scheduler
// starts the next block once every thread is there, and never resumes a thread after the last one).
static void fiber_main() {
    SimFiber& f = fibers[threadIdx.x];
#ifdef L3_SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &main_stack_bottom, &main_stack_size);
#endif
    for (unsigned b = 0; b < gridDim.x; b++) {
        f.t.block_idx.x = b;
        sim_block_fn();
        wait_at(block_end, AT_BLOCK_END);
    }
    fprintf(stderr, "a simulated thread was resumed after the last block\n");
    abort();
}

#ifndef L3_SIM_ASM_SWITCH
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

// Runs `fn` as a launch of `grid` blocks of `block` threads (whole warps, at most 256).
static void sim_launch(unsigned grid, unsigned block, void (*fn)()) {
    gridDim.x = grid;
    blockDim.x = block;
    sim_block_fn = fn;
    if (grid == 0) return;
    // Kernel frames are small; sanitizers make them larger. A guard page below catches an overflow.
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), stack_size = 256 * 1024;
    fibers = std::vector<SimFiber>(block);
#ifdef L3_SIM_TSAN
    main_tsan = __tsan_get_current_fiber();
#endif
    for (unsigned i = 0; i < block; i++) {
        SimFiber& f = fibers[i];
        f.t.thread_idx.x = i;
        void* m = mmap(nullptr, stack_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) { perror("mmap"); exit(2); }
        mprotect(m, page, PROT_NONE);
        f.stack = (u8*)m + page;
        f.stack_size = stack_size;
#ifdef L3_SIM_ASM_SWITCH
        // The frame l3_sim_switch pops: MXCSR and x87 control word, six registers, then it returns into
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
#ifdef L3_SIM_TSAN
        f.tsan = __tsan_create_fiber(0);
#endif
    }
    const unsigned warps = block / 32;
    for (unsigned b = 0; b < grid; b++) {
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
                bool all = true;
                for (unsigned l = 0; l < 32 && all; l++) {
                    all = lanes[l].wait.load(std::memory_order_relaxed) == AT_WARP_BARRIER;
                }
                if (!all) continue;
                warp_barriers[w].generation.fetch_add(1, std::memory_order_relaxed);
                for (unsigned l = 0; l < 32; l++) lanes[l].wait.store(RUNNABLE, std::memory_order_relaxed);
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
#ifdef L3_SIM_TSAN
        __tsan_destroy_fiber(f.tsan);
#endif
        munmap(f.stack - page, stack_size + page);
    }
    fibers.clear();
    l3_sim_current.store(nullptr, std::memory_order_relaxed);
}

static std::vector<u8> read_file(const char* path) {
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

// The launch main() read, for run_block.
static struct {
    u32 mode, kind, n_descs, n_fills, stage_cap, width, height, nchw, n_v2;
    u8 *data, *out, *scratch;
    void* descs;
    FillDesc* fills;
    float* sb;
    const V2Desc* v2;
    const u8* tables;
    u32 err;
} L;

static void run_block() {
    if (L.mode == 0) {
        const PatchDesc* d = (const PatchDesc*)L.descs;
        switch (L.kind) {
        case 0:
            l3_decode_u8(L.data, d, L.n_descs, L.out, L.sb, &L.err, L.stage_cap, L.v2, L.n_v2, L.tables, L.scratch);
            break;
        case 1:
            l3_decode_f32(L.data, d, L.n_descs, (float*)L.out, L.sb, &L.err, L.stage_cap, L.v2, L.n_v2, L.tables,
                          L.scratch);
            break;
        default:
            l3_decode_f16(L.data, d, L.n_descs, (u16*)L.out, L.sb, &L.err, L.stage_cap, L.v2, L.n_v2, L.tables,
                          L.scratch);
            break;
        }
    } else {
        const SampleDesc* d = (const SampleDesc*)L.descs;
        switch (L.kind) {
        case 0:
            l3_samples_u8(L.data, d, L.n_descs, L.fills, L.n_fills, L.out, L.sb, &L.err, L.stage_cap, L.width,
                          L.height, L.nchw, L.v2, L.n_v2, L.tables, L.scratch);
            break;
        case 1:
            l3_samples_f32(L.data, d, L.n_descs, L.fills, L.n_fills, (float*)L.out, L.sb, &L.err, L.stage_cap,
                           L.width, L.height, L.nchw, L.v2, L.n_v2, L.tables, L.scratch);
            break;
        default:
            l3_samples_f16(L.data, d, L.n_descs, L.fills, L.n_fills, (u16*)L.out, L.sb, &L.err, L.stage_cap,
                           L.width, L.height, L.nchw, L.v2, L.n_v2, L.tables, L.scratch);
            break;
        }
    }
}

// Self-checks of the simulator (`harness --probe NAME`), kernels that are wrong on purpose: "race" writes
// shared memory in one thread and reads it in another warp with only warp barriers between (ThreadSanitizer
// must report it), "overflow" reads past a local array after a barrier (AddressSanitizer must report it),
// "divergent" reaches __syncthreads in only some threads (the scheduler must report it).
u32 l3_sim_probe_sink;  // not static: the read it takes cannot be optimised away
static void probe_race() {
    __shared__ u32 s;
    if (threadIdx.x == 0) s = 1;
    __syncwarp();  // orders warp 0's lanes only: thread 33 is in warp 1
    if (threadIdx.x == 33) l3_sim_probe_sink = s;
    __syncthreads();
}
static void probe_overflow() {
    volatile u32 v[4] = {0, 0, 0, 0};
    __syncthreads();  // the frame is suspended and resumed: its redzones must survive the switches
    const volatile u32* p = v;
    asm volatile("" : "+r"(p));  // hides the array's size: UBSan's bounds checks would stop it first
    l3_sim_probe_sink = p[threadIdx.x / 8];  // threads 32.. read past the end
}
static void probe_divergent() {
    if (threadIdx.x < 32) __syncthreads();
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--probe") == 0) {
        if (strcmp(argv[2], "race") == 0) sim_launch(2, 64, probe_race);
        else if (strcmp(argv[2], "overflow") == 0) sim_launch(1, 64, probe_overflow);
        else if (strcmp(argv[2], "divergent") == 0) sim_launch(1, 64, probe_divergent);
        else { fprintf(stderr, "unknown probe %s\n", argv[2]); return 2; }
        return 0;
    }
    if (argc != 3 && argc != 4) { fprintf(stderr, "usage: harness LAUNCH_IN OUT_FILE [FILL_BYTE]\n"); return 2; }
    int fill_byte = argc == 4 ? atoi(argv[3]) : 0xA5;
    std::vector<u8> in = read_file(argv[1]);
    Reader r{in};
    u32 mode = r.get<u32>(), kind = r.get<u32>(), grid = r.get<u32>(), block = r.get<u32>();
    u32 smem = r.get<u32>(), stage_cap = r.get<u32>(), n_descs = r.get<u32>(), n_fills = r.get<u32>();
    u32 width = r.get<u32>(), height = r.get<u32>(), nchw = r.get<u32>();
    // Exact-size heap copies so AddressSanitizer flags any read or write one byte outside.
    std::vector<u8> data_v = r.blob(), desc_v = r.blob(), fill_v = r.blob(), sb_v = r.blob();
    u64 out_bytes = r.get<u64>();
    u32 n_v2 = r.get<u32>();
    std::vector<u8> v2_v = r.blob(), tables_v = r.blob();
    u64 scratch_bytes = r.get<u64>();
    // memcpy from an empty vector's data() (null) is undefined even for 0 bytes: copy only what there is.
    auto copy = [](const std::vector<u8>& v) {
        void* p = malloc(v.empty() ? 1 : v.size());
        if (!v.empty()) memcpy(p, v.data(), v.size());
        return p;
    };
    L.mode = mode;
    L.kind = kind;
    L.n_descs = n_descs;
    L.n_fills = n_fills;
    L.stage_cap = stage_cap;
    L.width = width;
    L.height = height;
    L.nchw = nchw;
    L.n_v2 = n_v2;
    L.data = (u8*)copy(data_v);
    L.descs = copy(desc_v);
    L.fills = (FillDesc*)copy(fill_v);
    L.sb = (float*)copy(sb_v);
    L.v2 = (const V2Desc*)copy(v2_v);
    L.tables = (const u8*)copy(tables_v);
    L.scratch = (u8*)malloc(scratch_bytes ? scratch_bytes : 1);
    L.out = (u8*)malloc(out_bytes ? out_bytes : 1);
    memset(L.out, fill_byte, out_bytes);
    l3_sim_dyn_smem = (u8*)malloc(smem ? smem : 1);
    L.err = 0xffffffffu;

    if (block % 32 != 0 || block == 0 || block / 32 > L3_SIM_MAX_WARPS) {
        fprintf(stderr, "block must be 32..256 whole warps\n");
        return 2;
    }
    sim_launch(grid, block, run_block);

    FILE* f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 2; }
    fwrite(&L.err, 4, 1, f);
    fwrite(L.out, 1, out_bytes, f);
    fclose(f);
    free(L.data); free(L.descs); free(L.fills); free(L.sb); free(L.out); free(l3_sim_dyn_smem);
    free((void*)L.v2); free((void*)L.tables); free(L.scratch);
    return 0;
}
