// Runs one launch of src/kernel.cu on the CPU: `harness LAUNCH_IN OUT_FILE`.
// LAUNCH_IN (written by l3-cuda's tests from the real host plan, little-endian):
//   u32 kind (0 = u8, 1 = f32, 2 = f16), u32 grid, u32 block, u32 dyn_smem, u32 stage_cap, u32 n_descs,
//   u64 len + data bytes, u64 len + descriptor bytes, u64 len + scale/bias f32 bytes, u64 output bytes.
// OUT_FILE: u32 err, then the output bytes. Output starts filled with 0xA5 so unwritten elements show.
#include "shim.h"
#include "../src/kernel.cu"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim;
dim3 gridDim;
u8* l3_sim_dyn_smem = nullptr;
SimBarrier l3_sim_barrier;

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

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: harness LAUNCH_IN OUT_FILE\n"); return 2; }
    std::vector<u8> in = read_file(argv[1]);
    Reader r{in};
    u32 kind = r.get<u32>(), grid = r.get<u32>(), block = r.get<u32>(), smem = r.get<u32>();
    u32 stage_cap = r.get<u32>(), n_descs = r.get<u32>();
    // Exact-size heap copies so AddressSanitizer flags any read or write one byte outside.
    std::vector<u8> data_v = r.blob(), desc_v = r.blob(), sb_v = r.blob();
    u64 out_bytes = r.get<u64>();
    u8* data = (u8*)malloc(data_v.size() ? data_v.size() : 1);
    memcpy(data, data_v.data(), data_v.size());
    PatchDesc* descs = (PatchDesc*)malloc(desc_v.size() ? desc_v.size() : 1);
    memcpy(descs, desc_v.data(), desc_v.size());
    float* sb = (float*)malloc(sb_v.size() ? sb_v.size() : 4);
    memcpy(sb, sb_v.data(), sb_v.size());
    u8* out = (u8*)malloc(out_bytes ? out_bytes : 1);
    memset(out, 0xA5, out_bytes);
    l3_sim_dyn_smem = (u8*)malloc(smem ? smem : 1);
    u32 err = 0xffffffffu;

    gridDim.x = grid;
    blockDim.x = block;
    l3_sim_barrier.expected = block;
    std::vector<std::thread> threads;
    for (u32 t = 0; t < block; t++) {
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            for (u32 b = 0; b < grid; b++) {
                blockIdx.x = b;
                switch (kind) {
                case 0: l3_decode_u8(data, descs, n_descs, out, sb, &err, stage_cap); break;
                case 1: l3_decode_f32(data, descs, n_descs, (float*)out, sb, &err, stage_cap); break;
                default: l3_decode_f16(data, descs, n_descs, (u16*)out, sb, &err, stage_cap); break;
                }
                // Block boundary: the next block reuses the static "shared" memory.
                l3_sim_barrier.arrive_and_wait();
            }
        });
    }
    for (auto& th : threads) th.join();

    FILE* f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 2; }
    fwrite(&err, 4, 1, f);
    fwrite(out, 1, out_bytes, f);
    fclose(f);
    free(data); free(descs); free(sb); free(out); free(l3_sim_dyn_smem);
    return 0;
}
