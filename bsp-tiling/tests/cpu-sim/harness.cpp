// Runs launches of src/cuda/kernels.cu on the CPU through the toolkit's CUDA simulator (the cuda-sim
// crate: cuda_sim.h, cuda_sim_run.h): `harness LAUNCHES_IN BUFFERS_OUT`.
// LAUNCHES_IN (written by tests/kernel_sim.rs, little-endian):
//   u32 n_buffers, then per buffer: u64 bytes, the bytes;
//   u32 n_launches, then per launch: u32 name length, the name, u32 grid_x, u32 grid_y, u32 block_x,
//   u32 n_args, then per argument: u32 kind (0 = buffer index, 1 = int, 2 = long long, 3 = float: its bits in the low
//   32 bits), i64 value.
// BUFFERS_OUT: every buffer after the last launch, as u64 bytes + the bytes. Buffers are exact-size heap
// allocations, so AddressSanitizer flags any access one element outside.
#include "cuda_sim.h"
#include "kernels.cu"
#include "cuda_sim_run.h"

#include <string>

struct Arg {
    uint32_t kind;
    int64_t value;
};

struct Launch {
    std::vector<uint8_t*>* bufs;
    std::vector<Arg> args;
    template <typename T> T* p(size_t i) {
        if (args.at(i).kind != 0) { fprintf(stderr, "argument %zu is not a buffer\n", i); exit(2); }
        return (T*)bufs->at((size_t)args[i].value);
    }
    int n(size_t i) { return (int)args.at(i).value; }
    i64 l(size_t i) { return (i64)args.at(i).value; }
    float f(size_t i) {
        uint32_t bits = (uint32_t)args.at(i).value;
        float v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
};

// One CUDA thread's work: calls the kernel `name` with the launch's arguments.
static void call(const std::string& name, Launch& a) {
    if (name == "bsp_to_f16")
        bsp_to_f16(a.p<const float>(0), a.l(1), a.p<u16>(2));
    else if (name == "bsp_add_f16")
        bsp_add_f16(a.p<float>(0), a.p<const u16>(1), a.l(2));
    else if (name == "bsp_fill_bias")
        bsp_fill_bias(a.p<float>(0), a.n(1), a.l(2), a.p<const float>(3));
    else if (name == "bsp_scale_shift")
        bsp_scale_shift(a.p<float>(0), a.n(1), a.l(2), a.p<const float>(3), a.p<const float>(4),
                        a.n(5));
    else if (name == "bsp_im2col_g")
        bsp_im2col_g(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.n(5), a.n(6), a.n(7),
                     a.n(8), a.n(9), a.n(10), a.n(11), a.n(12), a.n(13), a.p<float>(14));
    else if (name == "bsp_im2col_g_f16")
        bsp_im2col_g_f16(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.n(5), a.n(6),
                         a.n(7), a.n(8), a.n(9), a.n(10), a.n(11), a.n(12), a.n(13), a.p<u16>(14));
    else if (name == "bsp_col2im")
        bsp_col2im(a.p<const float>(0), a.p<const float>(1), a.n(2), a.n(3), a.n(4), a.n(5), a.n(6),
                   a.n(7), a.n(8), a.n(9), a.n(10), a.l(11), a.l(12), a.n(13), a.n(14),
                   a.p<float>(15));
    else if (name == "bsp_unary")
        bsp_unary(a.p<float>(0), a.l(1), a.l(2), a.n(3), a.f(4), a.f(5), a.p<const float>(6),
                  a.n(7));
    else if (name == "bsp_binary")
        bsp_binary(a.p<const float>(0), a.n(1), a.p<const float>(2), a.n(3), a.n(4), a.l(5), a.n(6),
                   a.p<float>(7));
    else if (name == "bsp_binary_const")
        bsp_binary_const(a.p<float>(0), a.n(1), a.l(2), a.p<const float>(3), a.n(4), a.n(5),
                         a.n(6));
    else if (name == "bsp_copy")
        bsp_copy(a.p<float>(0), a.l(1), a.p<const float>(2), a.l(3));
    else if (name == "bsp_pool")
        bsp_pool(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.n(5), a.n(6), a.n(7), a.n(8),
                 a.n(9), a.n(10), a.n(11), a.n(12), a.p<const int>(13), a.p<const int>(14),
                 a.p<const int>(15), a.p<const int>(16), a.p<float>(17));
    else if (name == "bsp_resize_linear")
        bsp_resize_linear(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.n(5),
                          a.p<const int>(6), a.p<const int>(7), a.p<const float>(8),
                          a.p<const int>(9), a.p<const int>(10), a.p<const float>(11),
                          a.p<float>(12));
    else if (name == "bsp_fill_outside")
        bsp_fill_outside(a.p<float>(0), a.n(1), a.n(2), a.n(3), a.p<const int>(4), a.p<const int>(5),
                         a.f(6));
    else if (name == "bsp_depth_to_space")
        bsp_depth_to_space(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.n(5), a.n(6),
                           a.n(7), a.p<float>(8));
    else if (name == "bsp_space_to_depth")
        bsp_space_to_depth(a.p<const float>(0), a.n(1), a.n(2), a.n(3), a.n(4), a.p<float>(5));
    else if (name == "bsp_gather_part")
        bsp_gather_part(a.p<const float>(0), a.n(1), a.n(2), a.l(3), a.p<const int>(4), a.n(5),
                        a.n(6), a.n(7), a.l(8), a.p<float>(9));
    else if (name == "bsp_channel_stats")
        bsp_channel_stats(a.p<const float>(0), a.l(1), a.l(2), a.p<double>(3));
    else {
        fprintf(stderr, "unknown kernel %s\n", name.c_str());
        exit(2);
    }
}

// The launch being run, for run_thread.
static const std::string* current_name;
static Launch* current;
static void run_thread() { call(*current_name, *current); }

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: harness LAUNCHES_IN BUFFERS_OUT\n"); return 2; }
    std::vector<uint8_t> in = read_file(argv[1]);
    Reader r{in};
    uint32_t nb = r.get<uint32_t>();
    std::vector<uint8_t*> bufs(nb);
    std::vector<uint64_t> sizes(nb);
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t n = r.get<uint64_t>();
        if (r.pos + n > in.size()) { fprintf(stderr, "truncated buffer\n"); return 2; }
        sizes[i] = n;
        bufs[i] = (uint8_t*)malloc(n ? n : 1);
        memcpy(bufs[i], in.data() + r.pos, n);
        r.pos += n;
    }
    uint32_t nl = r.get<uint32_t>();
    for (uint32_t li = 0; li < nl; li++) {
        uint32_t len = r.get<uint32_t>();
        std::string name((const char*)in.data() + r.pos, len);
        r.pos += len;
        dim3 grid{r.get<uint32_t>(), r.get<uint32_t>(), 1};
        unsigned block = r.get<uint32_t>();
        Launch a{&bufs, {}};
        uint32_t na = r.get<uint32_t>();
        for (uint32_t j = 0; j < na; j++) {
            uint32_t kind = r.get<uint32_t>();
            int64_t v = r.get<int64_t>();
            if (kind == 0 && (v < 0 || (uint64_t)v >= nb)) { fprintf(stderr, "bad buffer index\n"); return 2; }
            a.args.push_back({kind, v});
        }
        current_name = &name;
        current = &a;
        cuda_sim_launch(grid, block, run_thread);
    }
    FILE* f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 2; }
    for (uint32_t i = 0; i < nb; i++) {
        fwrite(&sizes[i], 8, 1, f);
        fwrite(bufs[i], 1, sizes[i], f);
        free(bufs[i]);
    }
    fclose(f);
    return 0;
}
