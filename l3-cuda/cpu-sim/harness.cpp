// Runs one launch of src/kernel.cu on the CPU: `harness LAUNCH_IN OUT_FILE`.
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
#include <thread>
#include <vector>

// The tables the tests write must match the kernel's structs byte for byte.
static_assert(sizeof(PatchDesc) == 40, "PatchDesc: 40 bytes, as src/plan.rs writes it");
static_assert(sizeof(SampleDesc) == 48, "SampleDesc: 48 bytes, as src/sample.rs writes it");
static_assert(sizeof(FillDesc) == 32, "FillDesc: 32 bytes, as src/sample.rs writes it");
static_assert(sizeof(V2Desc) == 104, "V2Desc: 104 bytes, as src/v2.rs writes it");

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim;
dim3 gridDim;
u8* l3_sim_dyn_smem = nullptr;
SimBarrier l3_sim_barrier;
SimWarp l3_sim_warps[L3_SIM_MAX_WARPS];
thread_local unsigned l3_sim_ballots = 0;

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
    u8* data = (u8*)copy(data_v);
    void* descs = copy(desc_v);
    FillDesc* fills = (FillDesc*)copy(fill_v);
    float* sb = (float*)copy(sb_v);
    const V2Desc* v2 = (const V2Desc*)copy(v2_v);
    const u8* tables = (const u8*)copy(tables_v);
    u8* scratch = (u8*)malloc(scratch_bytes ? scratch_bytes : 1);
    u8* out = (u8*)malloc(out_bytes ? out_bytes : 1);
    memset(out, fill_byte, out_bytes);
    l3_sim_dyn_smem = (u8*)malloc(smem ? smem : 1);
    u32 err = 0xffffffffu;

    gridDim.x = grid;
    blockDim.x = block;
    l3_sim_barrier.expected = block;
    if (block % 32 != 0 || block / 32 > L3_SIM_MAX_WARPS) { fprintf(stderr, "block must be 32..256 whole warps\n"); return 2; }
    for (auto& w : l3_sim_warps) w.bar.expected = 32;
    std::vector<std::thread> threads;
    for (u32 t = 0; t < block; t++) {
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            for (u32 b = 0; b < grid; b++) {
                blockIdx.x = b;
                if (mode == 0) {
                    const PatchDesc* d = (const PatchDesc*)descs;
                    switch (kind) {
                    case 0: l3_decode_u8(data, d, n_descs, out, sb, &err, stage_cap, v2, n_v2, tables, scratch); break;
                    case 1:
                        l3_decode_f32(data, d, n_descs, (float*)out, sb, &err, stage_cap, v2, n_v2, tables,
                                      scratch);
                        break;
                    default:
                        l3_decode_f16(data, d, n_descs, (u16*)out, sb, &err, stage_cap, v2, n_v2, tables,
                                      scratch);
                        break;
                    }
                } else {
                    const SampleDesc* d = (const SampleDesc*)descs;
                    switch (kind) {
                    case 0:
                        l3_samples_u8(data, d, n_descs, fills, n_fills, out, sb, &err, stage_cap, width,
                                      height, nchw, v2, n_v2, tables, scratch);
                        break;
                    case 1:
                        l3_samples_f32(data, d, n_descs, fills, n_fills, (float*)out, sb, &err, stage_cap,
                                       width, height, nchw, v2, n_v2, tables, scratch);
                        break;
                    default:
                        l3_samples_f16(data, d, n_descs, fills, n_fills, (u16*)out, sb, &err, stage_cap,
                                       width, height, nchw, v2, n_v2, tables, scratch);
                        break;
                    }
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
    free(data); free(descs); free(fills); free(sb); free(out); free(l3_sim_dyn_smem);
    free((void*)v2); free((void*)tables); free(scratch);
    return 0;
}
