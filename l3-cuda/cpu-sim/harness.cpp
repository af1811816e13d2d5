// Runs one launch of src/kernel.cu on the CPU through the toolkit's CUDA simulator (the cuda-sim crate:
// cuda_sim.h, cuda_sim_run.h): `harness LAUNCH_IN OUT_FILE [FILL_BYTE]`.
// LAUNCH_IN (written by l3-cuda's tests from the real host plan, little-endian):
//   u32 mode (0 = whole images: l3_decode_*, 1 = samples: l3_samples_*), u32 kind (0 = u8, 1 = f32,
//   2 = f16), u32 grid, u32 block, u32 dyn_smem, u32 stage_cap, u32 n_descs, u32 n_fills, u32 width,
//   u32 height, u32 nchw (the last four: sample launches only),
//   u64 len + data bytes, u64 len + descriptor bytes, u64 len + padding-table bytes,
//   u64 len + scale/bias f32 bytes, u64 output bytes, then for version-2 patches: u32 n_v2,
//   u64 len + V2Desc bytes, u64 len + context-table bytes, u64 scratch bytes.
// OUT_FILE: u32 err, then the output bytes. Output starts filled with FILL_BYTE (optional third argument,
// default 0xA5) so unwritten elements show.
#include "cuda_sim.h"
#define L3_DYNAMIC_SMEM(name) u8* name = cuda_sim_dyn_smem
#include "kernel.cu"
#include "cuda_sim_run.h"

// The tables the tests write must match the kernel's structs byte for byte.
static_assert(sizeof(PatchDesc) == 40, "PatchDesc: 40 bytes, as src/plan.rs writes it");
static_assert(sizeof(SampleDesc) == 48, "SampleDesc: 48 bytes, as src/sample.rs writes it");
static_assert(sizeof(FillDesc) == 32, "FillDesc: 32 bytes, as src/sample.rs writes it");
static_assert(sizeof(V2Desc) == 104, "V2Desc: 104 bytes, as src/v2.rs writes it");

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
    cuda_sim_dyn_smem = (u8*)malloc(smem ? smem : 1);
    L.err = 0xffffffffu;

    if (block % 32 != 0 || block == 0 || block / 32 > CUDA_SIM_MAX_WARPS) {
        fprintf(stderr, "block must be 32..256 whole warps\n");
        return 2;
    }
    cuda_sim_launch(dim3{grid, 1, 1}, block, run_block);

    FILE* f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 2; }
    fwrite(&L.err, 4, 1, f);
    fwrite(L.out, 1, out_bytes, f);
    fclose(f);
    free(L.data); free(L.descs); free(L.fills); free(L.sb); free(L.out); free(cuda_sim_dyn_smem);
    free((void*)L.v2); free((void*)L.tables); free(L.scratch);
    return 0;
}
