//! `stylize` runs the TransformerNet as a graph (`Graph::from_net`) through the graph engine. The stage
//! engine it replaced (separate whole, exact, sampled, recompute and naive passes over the network's
//! stages) is gone; its outputs on these cases are pinned here by SHA-256 of the output's float32 bits
//! (little-endian, channel-major), taken from its own runs on `stylize`'s grid before it was removed, so
//! the graph engine is still held to its bits, mode by mode, on the real models, the CPU and the
//! simulated device (f32 and f16).

mod common;

use bsp_tiling::{Budget, CpuBackend, Mode, Options, Precision, Tensor, stylize};
use common::*;
use sha2::{Digest, Sha256};

fn digest(t: &Tensor) -> String {
    let mut h = Sha256::new();
    for v in &t.data {
        h.update(v.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// (model, corpus image, crop width, crop height, tile, mode, the stage engine's tile count, its digest).
/// The crop is `corpus_crop(image, 6, 10, 10, width, height)`.
type CpuRun = (
    &'static str,
    &'static str,
    usize,
    usize,
    usize,
    &'static str,
    usize,
    &'static str,
);

const CPU_RUNS: [CpuRun; 48] = [
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "whole",
        1,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "exact",
        12,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "sampled",
        12,
        "0f1f5e810dd5c37364f4971ed57086a57444ce982a1c6bf5acacd5dd4cec48ac",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "sampled:1",
        12,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "recompute",
        12,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "naive",
        12,
        "2231911effa74a6d638febb7ce4a1e97f68ff0c2f8a692143e1115b10888eb8d",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "whole",
        1,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "exact",
        6,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "sampled",
        6,
        "0f1f5e810dd5c37364f4971ed57086a57444ce982a1c6bf5acacd5dd4cec48ac",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "sampled:1",
        6,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "recompute",
        6,
        "b6f5025cc2eea73f5392ff18adf0a8034e0275195bf2b5fe5e57998cdce76393",
    ),
    (
        "candy_nc8.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "naive",
        6,
        "a6f2a030aa126bdb7ecef9f497f28f5192643517dae3e243e4c0c92d681cd7a0",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "whole",
        1,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "exact",
        12,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "sampled",
        12,
        "c2a83a9b01b598746b24c07c1051fd191394045f79c11d6a2166fa72ba1a5be7",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "sampled:1",
        12,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "recompute",
        12,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "naive",
        12,
        "f27bd96d8c0d7718893b38f2f2da12896c0e472607374640cb2307fbec3403e9",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "whole",
        1,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "exact",
        6,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "sampled",
        6,
        "c2a83a9b01b598746b24c07c1051fd191394045f79c11d6a2166fa72ba1a5be7",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "sampled:1",
        6,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "recompute",
        6,
        "5ffe72b7ee15fbaaa30abccd07e1c048df1de6c55392ddaedd0d8bd2680dc198",
    ),
    (
        "candy_nc8.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "naive",
        6,
        "ea51871d6ee2e93a341da07addb187a1ec20fc823609e9d6d1bc11e840c64b22",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "whole",
        1,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "exact",
        12,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "sampled",
        12,
        "b5578834677239f0ce658d3b95800e89c4801f6138bdc20c0fd1e3b660e75f13",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "sampled:1",
        12,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "recompute",
        12,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        16,
        "naive",
        12,
        "b21f835a19e55dbe42cdd37cdd28eb0bd2ae3feca58c8300eaebd88463e02a32",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "whole",
        1,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "exact",
        6,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "sampled",
        6,
        "b5578834677239f0ce658d3b95800e89c4801f6138bdc20c0fd1e3b660e75f13",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "sampled:1",
        6,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "recompute",
        6,
        "e22bd8c1e5f45d6ba00f4072f5c443c59b8c2724e7e561f65c8dbf598867efbc",
    ),
    (
        "mosaic_nc16.safetensors",
        "Autumn.jpg",
        61,
        47,
        24,
        "naive",
        6,
        "7f08a2892e68064f1a7047ff9e564ce2c7318b14396783fb85c4a3956721b9d5",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "whole",
        1,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "exact",
        12,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "sampled",
        12,
        "0c50e998d87926b8848855b7c66817acda0f50e5c9e9d1fb9ebfca59582c7a76",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "sampled:1",
        12,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "recompute",
        12,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        24,
        "naive",
        12,
        "8dbddb8b1ee0b3c9dbf61822cb899816cda58bb6766760639c6e683fa4fe67fd",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "whole",
        1,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "exact",
        6,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "sampled",
        6,
        "0c50e998d87926b8848855b7c66817acda0f50e5c9e9d1fb9ebfca59582c7a76",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "sampled:1",
        6,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "recompute",
        6,
        "2f1944f75e0cd47f202a25d94538e9cdf9f972337e0b549232a6c0f95ec6b632",
    ),
    (
        "mosaic_nc16.safetensors",
        "Wood.jpg",
        96,
        64,
        32,
        "naive",
        6,
        "f47234ce2c5de17cca30be15cfa6539412d3c6f3002dcf6f5f58b92a3a9efe7c",
    ),
];

/// (precision, mode, digest) of mosaic_nc16 on `corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47)`, tile 24,
/// on the simulated device.
const SIM_RUNS: [(&str, &str, &str); 12] = [
    (
        "F32",
        "whole",
        "f1545adf796368c7d85a89b21dd4795f2fb57354ff2a8d117737cb88c0b8a220",
    ),
    (
        "F32",
        "exact",
        "f1545adf796368c7d85a89b21dd4795f2fb57354ff2a8d117737cb88c0b8a220",
    ),
    (
        "F32",
        "sampled",
        "74829af4cf1d06db1cf75de884b366fe4990e3b70efa1015f797c773fa64826f",
    ),
    (
        "F32",
        "sampled:1",
        "f1545adf796368c7d85a89b21dd4795f2fb57354ff2a8d117737cb88c0b8a220",
    ),
    (
        "F32",
        "recompute",
        "f1545adf796368c7d85a89b21dd4795f2fb57354ff2a8d117737cb88c0b8a220",
    ),
    (
        "F32",
        "naive",
        "21d7dbef28a3978b4b80162db451ebdcd919fc94dc4ac3da4ecc12f2fcaf6bb7",
    ),
    (
        "F16",
        "whole",
        "a1dfcf11d3f57c7d63b449f16634bf25a52ef479abafb442e2e0583eaced149f",
    ),
    (
        "F16",
        "exact",
        "a1dfcf11d3f57c7d63b449f16634bf25a52ef479abafb442e2e0583eaced149f",
    ),
    (
        "F16",
        "sampled",
        "e7d36760dc6086b9c890313ff2d901aba8161202a4d637e4e6a86e2eb4531ae5",
    ),
    (
        "F16",
        "sampled:1",
        "a1dfcf11d3f57c7d63b449f16634bf25a52ef479abafb442e2e0583eaced149f",
    ),
    (
        "F16",
        "recompute",
        "a1dfcf11d3f57c7d63b449f16634bf25a52ef479abafb442e2e0583eaced149f",
    ),
    (
        "F16",
        "naive",
        "adefb71d7df82135262903ce206d3394920b2951cf2451670cb364ca5726e4d3",
    ),
];

#[test]
fn stylize_gives_the_retired_stage_engines_bits_in_every_mode() {
    for (name, file, w, h, tile, mode, tiles, want) in CPU_RUNS {
        let net = model(name);
        let x = bsp_tiling::image_to_tensor(&corpus_crop(file, 6, 10, 10, w, h)).unwrap();
        let opts = Options {
            mode: mode.parse().unwrap(),
            tile,
            threads: 2,
            ..Options::default()
        };
        let (got, info) = stylize(&net, &CpuBackend, &x, &opts, false).unwrap();
        let tag = format!("{name} {w}x{h} tile {tile} {mode}");
        assert_eq!(
            digest(&got.into_tensor().unwrap()),
            want,
            "{tag}: outputs differ"
        );
        assert_eq!(info.tiles, tiles, "{tag}: tiles");
        assert_eq!(info.spilled_layers, 0, "{tag}");
    }
}

/// Under a RAM budget too small for every stored value the graph engine spills node values (the stage
/// engine spilled 2 of its stage outputs on 9 tiles) and still gives the same bits.
#[test]
fn spilled_runs_give_the_same_bits() {
    let net = model("candy_nc8.safetensors");
    let x = bsp_tiling::image_to_tensor(&corpus_crop("Autumn.jpg", 4, 10, 10, 96, 80)).unwrap();
    let spill = tempfile::tempdir().unwrap();
    let opts = Options {
        mode: Mode::Exact,
        tile: 32,
        threads: 2,
        budget: Budget {
            ram: 200_000,
            disk: None,
            spill_dir: spill.path().to_path_buf(),
        },
        ranks: None,
    };
    let (got, info) = stylize(&net, &CpuBackend, &x, &opts, false).unwrap();
    assert_eq!(
        digest(&got.into_tensor().unwrap()),
        "e2abd5a1e8bb4c995b7a70984a1b695740d53ab249dba523aead506d1e716bc7"
    );
    // The graph engine fits each tile's working set into the RAM budget first (a tile too large is
    // halved): under this budget it runs at least the stage engine's tiles, with the same bits.
    assert!(info.tiles >= 9, "{} tiles", info.tiles);
    assert!(info.spilled_layers > 0);
}

#[test]
fn simulated_device_f32_and_f16_give_the_stage_engines_bits() {
    let net = model("mosaic_nc16.safetensors");
    let x = bsp_tiling::image_to_tensor(&corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47)).unwrap();
    for (precision, mode, want) in SIM_RUNS {
        let precision = match precision {
            "F32" => Precision::F32,
            _ => Precision::F16,
        };
        let sim = bsp_tiling::testing::DeviceSim::new(u64::MAX, precision);
        let opts = Options {
            mode: mode.parse().unwrap(),
            tile: 24,
            threads: 2,
            ..Options::default()
        };
        let (got, info) = stylize(&net, &sim, &x, &opts, false).unwrap();
        assert_eq!(
            digest(&got.into_tensor().unwrap()),
            want,
            "{precision:?} {mode}: outputs differ"
        );
        assert!(info.device_peak_bytes > 0, "{precision:?} {mode}");
    }
}
