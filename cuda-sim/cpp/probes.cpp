// Self-checks of the simulator (`probes NAME`): "indices" is a correct kernel over a 2-D grid whose blocks
// end in a partial warp (every thread must run exactly once, with its own indices, and barriers must
// open); the others are wrong on purpose. "race" writes shared memory in one thread and reads it in
// another warp with only warp barriers between (ThreadSanitizer must report it), "overflow" reads past a
// local array after a barrier (AddressSanitizer must report it: the frames of suspended fibers keep their
// redzones), "divergent" reaches __syncthreads in only some threads (the scheduler must report it);
// "order" prints the order its blocks ran in; "byte_perm" prints __byte_perm's results.
#include "cuda_sim.h"

#include <vector>

u32 cuda_sim_probe_sink;  // not static: the read it takes cannot be optimised away

static void probe_race() {
    __shared__ u32 s;
    if (threadIdx.x == 0) s = 1;
    __syncwarp();  // orders warp 0's lanes only: thread 33 is in warp 1
    if (threadIdx.x == 33) cuda_sim_probe_sink = s;
    __syncthreads();
}

static void probe_overflow() {
    volatile u32 v[4] = {0, 0, 0, 0};
    __syncthreads();  // the frame is suspended and resumed: its redzones must survive the switches
    const volatile u32* p = v;
    asm volatile("" : "+r"(p));  // hides the array's size: UBSan's bounds checks would stop it first
    cuda_sim_probe_sink = p[threadIdx.x / 8];  // threads 32.. read past the end
}

static void probe_divergent() {
    if (threadIdx.x < 32) __syncthreads();
}

static u32 seen[3 * 2 * 40];
static void probe_indices() {
    __shared__ u32 count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    std::atomic_ref<u32>(count).fetch_add(1);
    __syncthreads();
    unsigned id = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    seen[id] += count == blockDim.x ? 1 : 100;
}

// "order": every block appends its index to a list as it starts; the list is printed (the order the
// blocks ran in, which CUDA_SIM_BLOCK_ORDER sets).
static std::vector<unsigned> order_seen;
static void probe_order() {
    if (threadIdx.x == 0) order_seen.push_back(blockIdx.y * gridDim.x + blockIdx.x);
}

// "byte_perm": __byte_perm of two words by the selectors the kernels use and two more, printed in hex.
static void print_byte_perms() {
    const unsigned x = 0x33221100u, y = 0x77665544u;
    for (unsigned s : {0x5432u, 0x6420u, 0x7610u, 0x0123u, 0x4444u}) printf("%08x ", __byte_perm(x, y, s));
    printf("\n");
}

#include "cuda_sim_run.h"

int main(int argc, char** argv) {
    if (argc != 2) { fprintf(stderr, "usage: probes race|overflow|divergent|indices|order|byte_perm\n"); return 2; }
    const char* name = argv[1];
    if (strcmp(name, "race") == 0) cuda_sim_launch(dim3{2, 1, 1}, 64, probe_race);
    else if (strcmp(name, "overflow") == 0) cuda_sim_launch(dim3{1, 1, 1}, 64, probe_overflow);
    else if (strcmp(name, "divergent") == 0) cuda_sim_launch(dim3{1, 1, 1}, 64, probe_divergent);
    else if (strcmp(name, "byte_perm") == 0) print_byte_perms();
    else if (strcmp(name, "order") == 0) {
        cuda_sim_launch(dim3{4, 2, 1}, 32, probe_order);
        for (unsigned b : order_seen) printf("%u ", b);
        printf("\n");
    } else if (strcmp(name, "indices") == 0) {
        cuda_sim_launch(dim3{3, 2, 1}, 40, probe_indices);
        for (unsigned i = 0; i < sizeof seen / sizeof seen[0]; i++) {
            if (seen[i] != 1) { fprintf(stderr, "thread %u ran %u times (or saw a short block)\n", i, seen[i]); return 1; }
        }
        printf("every thread ran once\n");
    } else {
        fprintf(stderr, "unknown probe %s\n", name);
        return 2;
    }
    return 0;
}
