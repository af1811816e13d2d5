//! `cargo xtask bench onnx-device`: the graph engine on a GPU with ONNX models — bsp-tiling's test models
//! (`bsp-tiling/tests/data/onnx`: a U-Net with GroupNorm and skips, a ResNet FCN with BatchNorm and
//! strides, an ESRGAN-style 4× upscaler; the ops mix is left out, its pixel shuffles need sides these
//! are not), random weights, any input size — whole image and exact tiles at each side, then one side streamed (an L3
//! input read by region, the output written as tiles complete) with the device and the host each under a
//! budget. Nothing here needs Python or the network, so the GPU bundle runs it as it is.
//!
//! Each run is its own process (this binary re-executed as `bench onnx`'s child, what `l3 infer
//! --device cuda` runs): its time (the run, from the model's preparation to the output's rename), device
//! peak, host-device copies, values kept on the device, and peak RSS. Beside it, where `python3` imports
//! onnxruntime with its CUDA execution provider, onnxruntime on the whole image on the same GPU (the
//! run alone, after a warm-up); where it does not, the row says so.
//!
//! Environment: `L3_ONNXDEV_SIDES` (default 2048,8192), `L3_ONNXDEV_MODELS` (default
//! unet_gn,resnet_fcn,esrgan_x4), `L3_ONNXDEV_TILE` (default 2048, `l3 infer`'s on a GPU),
//! `L3_ONNXDEV_UPSCALER_MAX` (default 2048: the 4× output of 8192² is 12 GiB of float32),
//! `L3_ONNXDEV_STREAMED` (default 30000; empty to skip), `L3_ONNXDEV_GPU_MEMORY` (the streamed runs'
//! device budget, default 8 GiB), `L3_ONNXDEV_DEVICE` (default cuda; `cpu` runs the same table on the
//! CPU, which checks the plumbing on a machine without a GPU).

use super::child::{line_of, num, run_if_child};
use super::onnx::mirrored_l3;
use crate::report::{Report, Table, machine, workspace_root};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Inputs in 0..1 (8-bit pixels scaled by 1/255), as the test models were made.
const IN_SCALE: f32 = 1.0 / 255.0;

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.into())
}

fn list(k: &str, d: &str) -> Vec<String> {
    env_or(k, d)
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// One child run's line, or why it failed.
fn run_child(exe: &Path, spec: &str) -> Result<std::collections::HashMap<String, String>, String> {
    let o = Command::new(exe)
        .arg("onnx")
        .env("L3_ONNX_CHILD", spec)
        .output()
        .map_err(|e| format!("starting the child: {e}"))?;
    line_of(&o, "ONNXCHILD ")
}

/// onnxruntime's CUDA execution provider on `model` over the `side`² input, as `python3` runs it: its
/// seconds (the run alone, the second of two), or why not. TF32 off (`use_tf32=0`), as ours computes f32
/// in FMA math; an onnxruntime too old for that option runs with its default, and the cell says so.
fn ort_cuda(model: &Path, input: &Path) -> String {
    const SCRIPT: &str = r#"
import sys, time
try:
    import numpy as np, onnxruntime as rt
except Exception as e:
    print("ORT none=" + type(e).__name__); sys.exit(0)
if "CUDAExecutionProvider" not in rt.get_available_providers():
    print("ORT none=no_CUDA_provider"); sys.exit(0)
try:
    try:
        s = rt.InferenceSession(sys.argv[1], providers=[("CUDAExecutionProvider", {"use_tf32": "0"})])
        tf32 = "off"
    except Exception:
        s = rt.InferenceSession(sys.argv[1], providers=["CUDAExecutionProvider"])
        tf32 = "onnxruntime's_default"
    if "CUDAExecutionProvider" not in s.get_providers():
        print("ORT none=the_CUDA_provider_did_not_load"); sys.exit(0)
    x = np.load(sys.argv[2])[None]
    feed = {s.get_inputs()[0].name: x}
    s.run(None, feed)
    t0 = time.perf_counter(); s.run(None, feed); t = time.perf_counter() - t0
    print(f"ORT secs={t:.3f} version={rt.__version__} tf32={tf32}")
except Exception as e:
    print("ORT error=" + "_".join(f"{type(e).__name__}: {e}".split())[:200])
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(model)
        .arg(input)
        .output();
    let Ok(o) = o else {
        return "no python3 here".into();
    };
    match line_of(&o, "ORT ") {
        Ok(kv) if kv.contains_key("secs") => format!(
            "{:.2} (onnxruntime {}, TF32 {})",
            num(&kv, "secs"),
            kv.get("version").map_or("?", String::as_str),
            kv.get("tf32").map_or("?", String::as_str).replace('_', " ")
        ),
        Ok(kv) => match (kv.get("none"), kv.get("error")) {
            (Some(why), _) => format!("not available: {}", why.replace('_', " ")),
            (_, Some(e)) => format!("failed: {}", e.replace('_', " ")),
            _ => "?".into(),
        },
        Err(why) => format!("failed: {why}"),
    }
}

/// The `side`² input as a float32 `.npy` in 0..1, for onnxruntime (made once per side from the L3 file).
fn npy_input(l3: &Path, side: usize, dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("in{side}.npy"));
    if !path.exists() {
        let bytes = std::fs::read(l3).context("reading the L3 input")?;
        let file = l3_format::L3File::parse(&bytes)?;
        let mut chw = vec![0u8; file.decoded_len()];
        file.decode_chw(&mut chw)?;
        let data = chw.iter().map(|&v| f32::from(v) * IN_SCALE).collect();
        let t = bsp_tiling::Tensor::from_vec(3, side, side, data)?;
        infer_io::npy::write(&path, &t)?;
    }
    Ok(path)
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    run_if_child("L3_ONNX_CHILD", "onnx", super::onnx::child);
    let device = env_or("L3_ONNXDEV_DEVICE", "cuda");
    if device != "cpu"
        && let Err(e) = bsp_tiling::CudaBackend::new(0, None, bsp_tiling::Precision::F32)
    {
        r.para(&format!(
            "Not run: no usable GPU here ({e}). `L3_ONNXDEV_DEVICE=cpu` runs the same table on the CPU."
        ));
        return Ok(());
    }
    let sides: Vec<usize> = list("L3_ONNXDEV_SIDES", "2048,8192")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let models = list("L3_ONNXDEV_MODELS", "unet_gn,resnet_fcn,esrgan_x4");
    let tile: usize = env_or("L3_ONNXDEV_TILE", "2048").parse().context("tile")?;
    let upscaler_max: usize = env_or("L3_ONNXDEV_UPSCALER_MAX", "2048").parse()?;
    let gpu_memory: u64 = env_or("L3_ONNXDEV_GPU_MEMORY", &(8u64 << 30).to_string()).parse()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let models_dir = workspace_root().join("bsp-tiling/tests/data/onnx");
    let work = tempfile::Builder::new()
        .prefix("l3-bench-onnx-device-")
        .tempdir_in(workspace_root().join("target"))?;
    let exe = work.path().join("l3-bench-child");
    std::fs::copy(std::env::current_exe()?, &exe).context("copying the bench binary")?;
    let spill = work.path().join("spill");
    std::fs::create_dir_all(&spill)?;
    let mut table = Table::new(
        &format!(
            "ONNX test models on the device ({device}): bsp-tiling vs onnxruntime's CUDA provider"
        ),
        &[
            "model",
            "side",
            "mode",
            "seconds",
            "device peak MiB",
            "host-device copies MiB",
            "values kept",
            "peak RSS MiB",
            "onnxruntime CUDA, whole (s)",
        ],
    );
    let mut notes = vec![];
    let mib = |v: f64| format!("{:.0}", v / 1048576.0);
    for &side in &sides {
        let l3 = work.path().join(format!("in{side}.l3"));
        mirrored_l3(&l3, side).with_context(|| format!("making the {side}² input"))?;
        let npy = npy_input(&l3, side, work.path())?;
        for name in &models {
            if name == "esrgan_x4" && side > upscaler_max {
                continue;
            }
            let model = models_dir.join(format!("{name}.onnx"));
            let graph = infer_io::load_model(&model, None)?;
            let oc = match infer_io::output_shape(&graph, side, side, true) {
                Ok((oc, _, _)) => oc,
                Err(e) => {
                    notes.push(format!("{name} at {side}²: not run: {e}"));
                    continue;
                }
            };
            let (out, out_dtype) = match oc {
                1 | 3 => (work.path().join("out.png"), "uint8"),
                _ => (work.path().join("out.tif"), "float32"),
            };
            let ort = ort_cuda(&model, &npy);
            for mode in ["whole", "exact"] {
                eprintln!("  onnx-device {name} {side}² {mode} ...");
                let spec = format!(
                    "model={};in={};out={};mode={mode};tile={tile};threads={threads};spill={};\
                     in_scale={IN_SCALE};out_scale=255;out_dtype={out_dtype};device={device}",
                    model.display(),
                    l3.display(),
                    out.display(),
                    spill.display()
                );
                let row = match run_child(&exe, &spec) {
                    Ok(kv) => vec![
                        format!("{:.2}", num(&kv, "secs")),
                        mib(num(&kv, "devpeak")),
                        mib(num(&kv, "copied")),
                        format!("{}", num(&kv, "kept")),
                        mib(num(&kv, "peak")),
                    ],
                    Err(why) => {
                        notes.push(format!("{name} {side}² {mode}: {why}"));
                        vec![
                            "failed (note below)".into(),
                            "".into(),
                            "".into(),
                            "".into(),
                            "".into(),
                        ]
                    }
                };
                let mut cells = vec![name.clone(), format!("{side}²"), mode.into()];
                cells.extend(row);
                cells.push(ort.clone());
                table.row(cells);
                let _ = std::fs::remove_file(&out);
            }
        }
        let _ = std::fs::remove_file(&l3);
        let _ = std::fs::remove_file(&npy);
    }
    r.table(&table);
    streamed(
        r,
        &exe,
        &models_dir,
        work.path(),
        &device,
        gpu_memory,
        threads,
        &mut notes,
    )?;
    r.para(&format!(
        "Each row is its own process, `l3 infer`'s pipeline (an 8-bit RGB L3 input read by region, scaled to \
         0..1; a 1- or 3-channel output as a PNG, any other as a float32 tiled BigTIFF); seconds are the run \
         (the model prepared on the device, every tile, the output renamed into place), device peak the \
         backend's metered peak, copies the bytes over the bus, values kept those stored in device memory. \
         Tile {tile}, whole = one tile. The models are bsp-tiling's test models with random weights \
         (`bsp-tiling/tests/data/onnx`), so the figures are the engine's, not a trained network's. Machine: {}.",
        machine()
    ));
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    Ok(())
}

/// The streamed side: each model's exact result by the recompute mode (nothing stored between
/// normalisations) with the device under `gpu_memory` and the host under 1 GiB of activations.
#[allow(clippy::too_many_arguments)]
fn streamed(
    r: &mut Report,
    exe: &Path,
    models_dir: &Path,
    work: &Path,
    device: &str,
    gpu_memory: u64,
    threads: usize,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let sides: Vec<usize> = list("L3_ONNXDEV_STREAMED", "30000")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let models = list("L3_ONNXDEV_STREAMED_MODELS", "unet_gn");
    let tile: usize = env_or("L3_ONNXDEV_STREAMED_TILE", "2048").parse()?;
    let mut table = Table::new(
        &format!(
            "Streamed on the device ({device}): recompute (exact statistics, nothing stored), tile {tile}, \
             {}1 GiB of host activations",
            match device {
                "cpu" => String::new(),
                _ => format!("device budget {} MiB, ", gpu_memory >> 20),
            }
        ),
        &[
            "model",
            "side",
            "seconds",
            "device peak MiB",
            "peak RSS MiB",
            "output",
        ],
    );
    for &side in &sides {
        let l3 = work.join(format!("streamed{side}.l3"));
        mirrored_l3(&l3, side).with_context(|| format!("making the {side}² input"))?;
        for name in &models {
            let model = models_dir.join(format!("{name}.onnx"));
            let graph = infer_io::load_model(&model, None)?;
            let oc = match infer_io::output_shape(&graph, side, side, true) {
                Ok((oc, _, _)) => oc,
                Err(e) => {
                    notes.push(format!("streamed {name} at {side}²: not run: {e}"));
                    continue;
                }
            };
            let (out, out_dtype) = match oc {
                1 | 3 => (work.join("streamed.png"), "uint8"),
                _ => (work.join("streamed.tif"), "float32"),
            };
            eprintln!("  onnx-device streamed {name} {side}² ...");
            let budget = match device {
                "cpu" => String::new(),
                _ => format!(";gpu_memory={gpu_memory}"),
            };
            let spec = format!(
                "model={};in={};out={};mode=recompute;tile={tile};threads={threads};spill={};\
                 ram_mib=1024;in_scale={IN_SCALE};out_scale=255;out_dtype={out_dtype};device={device}{budget}",
                model.display(),
                l3.display(),
                out.display(),
                work.join("spill").display()
            );
            let cells = match run_child(exe, &spec) {
                Ok(kv) => vec![
                    format!("{:.1}", num(&kv, "secs")),
                    format!("{:.0}", num(&kv, "devpeak") / 1048576.0),
                    format!("{:.0}", num(&kv, "peak") / 1048576.0),
                    std::fs::metadata(&out).map_or("?".into(), |m| stdx::mem::human(m.len())),
                ],
                Err(why) => {
                    notes.push(format!("streamed {name} {side}²: {why}"));
                    vec![
                        "failed (note below)".into(),
                        "".into(),
                        "".into(),
                        "".into(),
                    ]
                }
            };
            let mut row = vec![name.clone(), format!("{side}²")];
            row.extend(cells);
            table.row(row);
            let _ = std::fs::remove_file(&out);
        }
        let _ = std::fs::remove_file(&l3);
    }
    if !sides.is_empty() {
        r.table(&table);
    }
    Ok(())
}
