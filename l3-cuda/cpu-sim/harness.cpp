// Runs one launch of src/kernel.cu on the CPU through the toolkit's CUDA simulator (the cuda-sim crate:
// cuda_sim.h, cuda_sim_run.h): `harness LAUNCH_IN OUT_FILE [FILL_BYTE]`.
// LAUNCH_IN (written by l3-cuda's tests from the real host plan, little-endian):
//   u32 mode (0 = whole images: l3_decode_*, 1 = samples: l3_samples_*), u32 kind (0 = u8, 1 = f32,
//   2 = f16), u32 grid, u32 block, u32 dyn_smem, u32 stage_cap, u32 n_descs, u32 n_fills, u32 width,
//   u32 height, u32 nchw (the last four: sample launches only),
//   u64 len + data bytes, u64 len + descriptor bytes, u64 len + padding-table bytes,
//   u64 len + scale/bias f32 bytes, u64 output bytes, then for version-2 patches: u32 n_v2, u32 v2_block,
//   u64 len + V2Desc bytes, u64 len + context-table bytes, u64 scratch bytes, u64 bucket words. The
//   version-1 launch (grid blocks, none when grid is 0) runs first, then the version-2 launches
//   (l3v2_buckets, a block per descriptor; l3v2_decode_*, a warp per patch in blocks of v2_block threads)
//   into the same output and error word, as on a device's stream.
//   Mode 2 (a resampled batch: l3_samples_u8 into the intermediate, then l3_resample_h and
//   l3_resample_{u8,f32,f16}) appends: u32 out_kind, u32 n, u32 rows, u32 width, u32 height, u32 nchw,
//   u32 fill, u32 h_blocks, u32 v_blocks, u64 len + ResampleDesc bytes, u64 len + scale/bias bytes,
//   u64 len + table bytes, u64 tmp bytes, u64 output bytes; the first part's output is the intermediate.
// OUT_FILE: u32 err, the bucket words l3v2_buckets built (u32 each, as many as LAUNCH_IN says; those of
// unused contexts unwritten), then the output bytes. Output starts filled with FILL_BYTE (optional third argument,
// default 0xA5) so unwritten elements show.
#include "cuda_sim.h"
#define L3_DYNAMIC_SMEM(name) u8* name = cuda_sim_dyn_smem
#include "kernel.cu"
#include "cuda_sim_run.h"

// The tables the tests write must match the kernel's structs byte for byte.
static_assert(sizeof(PatchDesc) == 40, "PatchDesc: 40 bytes, as src/plan.rs writes it");
static_assert(sizeof(SampleDesc) == 48, "SampleDesc: 48 bytes, as src/sample.rs writes it");
static_assert(sizeof(FillDesc) == 40, "FillDesc: 40 bytes, as src/sample.rs writes it");
static_assert(sizeof(V2Desc) == 104, "V2Desc: 104 bytes, as src/v2.rs writes it");
static_assert(sizeof(ResampleDesc) == 80, "ResampleDesc: 80 bytes, as src/resample.rs writes it");

// The launch main() read, for run_block.
static struct {
    u32 mode, kind, n_descs, n_fills, stage_cap, width, height, nchw, n_v2;
    u8 *data, *out, *scratch;
    void* descs;
    FillDesc* fills;
    float* sb;
    const V2Desc* v2;
    const u8* tables;
    u32* buckets;
    u32 err;
} L;

// A resampled batch's passes, for run_h and run_v.
static struct {
    u32 kind, n, rows, width, height, nchw, fill;
    const ResampleDesc* rd;
    const float* sb;
    const int* tab;
    u8 *tmp, *out;
} R;

static void run_h() { l3_resample_h(L.out, R.tmp, R.rd, R.n, R.rows, R.tab); }

static void run_v() {
    switch (R.kind) {
    case 0:
        l3_resample_u8(L.out, R.tmp, R.rd, R.n, R.tab, R.out, R.sb, R.width, R.height, R.nchw, R.fill);
        break;
    case 1:
        l3_resample_f32(L.out, R.tmp, R.rd, R.n, R.tab, (float*)R.out, R.sb, R.width, R.height, R.nchw, R.fill);
        break;
    default:
        l3_resample_f16(L.out, R.tmp, R.rd, R.n, R.tab, (u16*)R.out, R.sb, R.width, R.height, R.nchw, R.fill);
        break;
    }
}

static void run_block() {
    if (L.mode == 0) {
        const PatchDesc* d = (const PatchDesc*)L.descs;
        switch (L.kind) {
        case 0:
            l3_decode_u8(L.data, d, L.n_descs, L.out, L.sb, &L.err, L.stage_cap);
            break;
        case 1:
            l3_decode_f32(L.data, d, L.n_descs, (float*)L.out, L.sb, &L.err, L.stage_cap);
            break;
        default:
            l3_decode_f16(L.data, d, L.n_descs, (u16*)L.out, L.sb, &L.err, L.stage_cap);
            break;
        }
    } else {
        const SampleDesc* d = (const SampleDesc*)L.descs;
        switch (L.kind) {
        case 0:
            l3_samples_u8(L.data, d, L.n_descs, L.fills, L.n_fills, L.out, L.sb, &L.err, L.stage_cap, L.width,
                          L.height, L.nchw);
            break;
        case 1:
            l3_samples_f32(L.data, d, L.n_descs, L.fills, L.n_fills, (float*)L.out, L.sb, &L.err, L.stage_cap,
                           L.width, L.height, L.nchw);
            break;
        default:
            l3_samples_f16(L.data, d, L.n_descs, L.fills, L.n_fills, (u16*)L.out, L.sb, &L.err, L.stage_cap,
                           L.width, L.height, L.nchw);
            break;
        }
    }
}

static void run_buckets_block() { l3v2_buckets(L.v2, L.n_v2, L.tables, L.buckets); }

static void run_v2_block() {
    switch (L.kind) {
    case 0:
        l3v2_decode_u8(L.data, L.v2, L.n_v2, L.out, L.sb, &L.err, L.n_descs, L.tables, L.buckets, L.scratch);
        break;
    case 1:
        l3v2_decode_f32(L.data, L.v2, L.n_v2, (float*)L.out, L.sb, &L.err, L.n_descs, L.tables, L.buckets,
                        L.scratch);
        break;
    default:
        l3v2_decode_f16(L.data, L.v2, L.n_v2, (u16*)L.out, L.sb, &L.err, L.n_descs, L.tables, L.buckets,
                        L.scratch);
        break;
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
    u32 n_v2 = r.get<u32>(), v2_block = r.get<u32>();
    std::vector<u8> v2_v = r.blob(), tables_v = r.blob();
    u64 scratch_bytes = r.get<u64>(), bucket_words = r.get<u64>();
    u32 h_blocks = 0, v_blocks = 0;
    u64 final_bytes = 0;
    std::vector<u8> rd_v, rsb_v, tab_v;
    if (mode == 2) {
        R.kind = r.get<u32>();
        R.n = r.get<u32>();
        R.rows = r.get<u32>();
        R.width = r.get<u32>();
        R.height = r.get<u32>();
        R.nchw = r.get<u32>();
        R.fill = r.get<u32>();
        h_blocks = r.get<u32>();
        v_blocks = r.get<u32>();
        rd_v = r.blob();
        rsb_v = r.blob();
        tab_v = r.blob();
        u64 tmp_bytes = r.get<u64>();
        final_bytes = r.get<u64>();
        R.tmp = (u8*)malloc(tmp_bytes ? tmp_bytes : 1);
        memset(R.tmp, fill_byte, tmp_bytes);
        R.out = (u8*)malloc(final_bytes ? final_bytes : 1);
        memset(R.out, fill_byte, final_bytes);
    }
    // memcpy from an empty vector's data() (null) is undefined even for 0 bytes: copy only what there is.
    auto copy = [](const std::vector<u8>& v) {
        void* p = malloc(v.empty() ? 1 : v.size());
        if (!v.empty()) memcpy(p, v.data(), v.size());
        return p;
    };
    L.mode = mode == 2 ? 1 : mode;
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
    // Exact size, and not cleared: a word read before l3v2_buckets wrote it shows under the sanitizers.
    L.buckets = (u32*)malloc(bucket_words ? 4 * bucket_words : 4);
    L.out = (u8*)malloc(out_bytes ? out_bytes : 1);
    memset(L.out, fill_byte, out_bytes);
    cuda_sim_dyn_smem = (u8*)malloc(smem ? smem : 1);
    L.err = 0xffffffffu;

    for (u32 b : {block, v2_block}) {
        if (b % 32 != 0 || b == 0 || b / 32 > CUDA_SIM_MAX_WARPS) {
            fprintf(stderr, "blocks must be 32..256 whole warps\n");
            return 2;
        }
    }
    if (grid) cuda_sim_launch(dim3{grid, 1, 1}, block, run_block);
    if (n_v2) {
        if (bucket_words) cuda_sim_launch(dim3{n_v2, 1, 1}, L3V2_BUCKETS, run_buckets_block);
        u32 per = v2_block / 32;
        cuda_sim_launch(dim3{(n_v2 + per - 1) / per, 1, 1}, v2_block, run_v2_block);
    }
    if (mode == 2) {
        // Exact-size copies, as above.
        R.rd = (const ResampleDesc*)copy(rd_v);
        R.sb = (const float*)copy(rsb_v);
        R.tab = (const int*)copy(tab_v);
        if (h_blocks) cuda_sim_launch(dim3{h_blocks, 1, 1}, 256, run_h);
        cuda_sim_launch(dim3{v_blocks, 1, 1}, 256, run_v);
    }

    FILE* f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 2; }
    fwrite(&L.err, 4, 1, f);
    fwrite(L.buckets, 4, bucket_words, f);
    if (mode == 2) {
        fwrite(R.out, 1, final_bytes, f);
        free((void*)R.rd); free((void*)R.sb); free((void*)R.tab); free(R.tmp); free(R.out);
    } else {
        fwrite(L.out, 1, out_bytes, f);
    }
    fclose(f);
    free(L.data); free(L.descs); free(L.fills); free(L.sb); free(L.out); free(cuda_sim_dyn_smem);
    free((void*)L.v2); free((void*)L.tables); free(L.scratch); free(L.buckets);
    return 0;
}
