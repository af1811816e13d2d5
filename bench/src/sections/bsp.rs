//! `cargo xtask bench bsp`: BSP tiling for CNN inference (bsp-cnn-cikm17) on the candy_nc8 TransformerNet,
//! on the CPU and — where one is lent — on a CUDA GPU, beside the paper's 10,000² figures and PyTorch.
//!
//! Every (size, device, mode) runs in a child process (this same binary re-executed with `L3_BSP_CHILD`
//! set) so that its peak RSS (`VmHWM`) and device memory are its own. Children write their f32 output to a
//! scratch folder; the parent compares outputs against the same device's whole-image one (and the GPU's
//! whole image against the CPU's) and measures seams.
//!
//! Environment: `L3_BENCH_QUICK=1` (512² and 1024² only), `L3_BSP_MAX_SIDE` (default 16384),
//! `L3_BSP_SIZES` / `L3_BSP_MODES` (comma-separated sides / modes, override the lists), `L3_BSP_MAX_SECS`
//! (default 300: a run predicted to take longer than this is skipped), `L3_BSP_WHOLE_MAX` (largest side
//! run without tiling on the CPU, default 4096), `L3_BSP_DEVICES` (`cpu,cuda` by default; cuda rows say
//! "no GPU" without one), `L3_BSP_GPU_TILE` (default 2048), `L3_BSP_GPU_MEMORY` (device budget of the
//! tiled GPU modes in bytes, default 8 GiB; whole-image runs may use the whole device),
//! `L3_BSP_COMPARE_MAX` (largest side whose GPU outputs are compared, default 16384), `L3_BSP_TORCH`
//! (`0` skips the PyTorch peer), `L3_BSP_TORCH_PEER` (the peer script, default
//! `bsp-tiling/benches/torch_peer.py`), `L3_BSP_SCRATCH` (scratch folder, default under `target/`),
//! `L3_BSP_ONNX` (`0` skips the ONNX models, which `onnx.rs` measures after the TransformerNet),
//! `L3_BSP_ALL_MODES_MAX` (largest side at which sampled, naive and recompute run; above it whole and exact
//! only), `L3_BSP_DEADLINE_SECS` (seconds into the sweep after which no run starts, nor one predicted from
//! its mode's last wall time to end later, and a running child is stopped: for a step with a time limit).
//!
//! Every row is also written, as soon as it is known, as one JSON line (header: cell) to
//! `target/bench/bsp-runs.jsonl`, so that a sweep cut short still leaves every case it finished.

use super::child::{line_of, num, run_if_child};
use crate::report::{Report, Series, Table, corpus_dir, line_plot, workspace_root};
use anyhow::Context;
use bsp_tiling::metrics::{compare, seams};
use bsp_tiling::{
    Budget, CpuBackend, CudaBackend, GraphOps, Image, Mode, Net, Options, PaddingMode, Precision,
    Tensor, stylize,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

const MODEL: &str = "candy_nc8.safetensors";
const SOURCE: &str = "Wood.jpg";
const TILE: usize = 512;
const RAM_BUDGET_MIB: u64 = 256;
/// The paper's 10,000² times on one Titan X (TensorFlow 1.0, section 4, Figure 15).
const PAPER_SAMPLED_SECS: &str = "< 50 (\"within 50 seconds\")";
const PAPER_EXACT_SECS: &str = "> 400";

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn model_path() -> PathBuf {
    corpus_dir().join("..").join("models").join(MODEL)
}

/// A `side × side` image from a corpus photo: a centre crop, or mirrored copies where the photo is smaller.
fn make_input(side: usize) -> anyhow::Result<Image> {
    let path = corpus_dir().join(SOURCE);
    let img = image::open(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let (ox, oy) = (w.saturating_sub(side) / 2, h.saturating_sub(side) / 2);
    let mirror = |i: usize, n: usize| {
        let p = 2 * n;
        let r = i % p;
        if r < n { r } else { p - 1 - r }
    };
    let raw = img.as_raw();
    let mut pixels = Vec::with_capacity(side * side * 3);
    for y in 0..side {
        let sy = mirror(oy + y, h);
        for x in 0..side {
            let sx = mirror(ox + x, w);
            pixels.extend_from_slice(&raw[(sy * w + sx) * 3..][..3]);
        }
    }
    Ok(Image::rgb8(side as u32, side as u32, pixels))
}

/// What a child measured.
struct Measured {
    secs: f64,
    tiles: usize,
    spilled: usize,
    device_peak: u64,
    copied: u64,
    out: bsp_tiling::Output,
}

fn measure<B: GraphOps>(
    net: &Net,
    backend: &B,
    input: &Image,
    opts: &Options,
    rgb8: bool,
    sync: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Measured> {
    let t0 = Instant::now();
    let (out, info) = stylize(net, backend, input, opts, rgb8)?;
    sync()?;
    Ok(Measured {
        secs: t0.elapsed().as_secs_f64(),
        tiles: info.tiles,
        spilled: info.spilled_layers,
        device_peak: info.device_peak_bytes,
        copied: info.device_copied_bytes,
        out,
    })
}

/// The child: one stylisation, one line of results on stdout.
fn child(spec: &str) -> anyhow::Result<()> {
    let kv: HashMap<&str, &str> = spec.split(';').filter_map(|p| p.split_once('=')).collect();
    let get = |k: &str| {
        kv.get(k)
            .copied()
            .with_context(|| format!("child spec lacks {k}"))
    };
    let side: usize = get("side")?.parse()?;
    let mode = Mode::parse(get("mode")?).context("mode")?;
    let threads: usize = get("threads")?.parse()?;
    let tile: usize = get("tile")?.parse()?;
    let net = Net::load_transformer(&model_path(), PaddingMode::Reflect)?;
    let input = make_input(side)?;
    let (rss_before, _) = bsp_tiling::metrics::rss().unwrap_or((0, 0));
    let opts = Options {
        mode,
        tile,
        threads,
        budget: Budget {
            ram: RAM_BUDGET_MIB << 20,
            disk: None,
            spill_dir: PathBuf::from(get("spill")?),
        },
        ranks: None,
    };
    // 8-bit output unless the parent compares it: an f32 copy of a huge image would dominate the RSS.
    let rgb8 = !kv.contains_key("out");
    let (m, init, driver) = if get("device")? == "cuda" {
        let budget = kv.get("gpu_memory").and_then(|v| v.parse().ok());
        let t0 = Instant::now();
        let precision = kv
            .get("precision")
            .map_or(Some(Precision::F32), |p| Precision::parse(p))
            .context("precision")?;
        let mut gpu = CudaBackend::new(0, budget, precision)?;
        gpu.set_keep_values(kv.get("keep") != Some(&"0"));
        if kv.get("cudnn") == Some(&"0") {
            gpu.set_cudnn(false)?;
        }
        eprintln!("bsp child: {}", gpu.name());
        // Warm-up (kernel loading, cuBLAS's first calls) outside the timed run.
        let small = make_input(256)?;
        stylize(
            &net,
            &gpu,
            &small,
            &Options {
                tile: 64,
                ..opts.clone()
            },
            true,
        )?;
        gpu.synchronize()?;
        let init = t0.elapsed().as_secs_f64();
        let m = measure(&net, &gpu, &input, &opts, rgb8, || Ok(gpu.synchronize()?))?;
        let driver = gpu.driver_used()?.saturating_sub(gpu.baseline_used);
        (m, init, driver)
    } else {
        let m = measure(&net, &CpuBackend, &input, &opts, rgb8, || Ok(()))?;
        (m, 0.0, 0)
    };
    let (peak, _) = bsp_tiling::metrics::rss().unwrap_or((0, 0));
    if let Some(p) = kv.get("out") {
        let t = m.out.into_tensor()?;
        std::fs::write(p, bytemuck_bytes(&t.data)).with_context(|| format!("writing {p}"))?;
    }
    println!(
        "BSPCHILD secs={:.3} peak={peak} before={rss_before} tiles={} spilled={} devpeak={} copied={} driver={driver} init={init:.3}",
        m.secs, m.tiles, m.spilled, m.device_peak, m.copied
    );
    Ok(())
}

fn bytemuck_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn read_output(p: &Path, side: usize) -> anyhow::Result<Tensor> {
    let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    let data: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Tensor::from_vec(3, side, side, data)?)
}

struct Run {
    secs: f64,
    peak: u64,
    before: u64,
    tiles: usize,
    spilled: usize,
    device_peak: u64,
    copied: u64,
    driver: u64,
    init: f64,
}

/// Runs one child; stops it once `limit` has passed (the sweep's deadline), an error saying so.
fn spawn(exe: &Path, spec: &str, limit: Option<std::time::Duration>) -> anyhow::Result<Run> {
    use std::process::Stdio;
    let mut child = std::process::Command::new(exe)
        .arg("bsp")
        .env("L3_BSP_CHILD", spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the child")?;
    // Its two pipes read on threads, so that a child that writes much never blocks on a full pipe.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = vec![];
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the child")? {
            break st;
        }
        if limit.is_some_and(|l| t0.elapsed() >= l) {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "stopped after {:.0} s at L3_BSP_DEADLINE_SECS",
                t0.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let o = std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    let kv = line_of(&o, "BSPCHILD ").map_err(anyhow::Error::msg)?;
    let num = |k: &str| num(&kv, k);
    Ok(Run {
        secs: num("secs"),
        peak: num("peak") as u64,
        before: num("before") as u64,
        tiles: num("tiles") as usize,
        spilled: num("spilled") as usize,
        device_peak: num("devpeak") as u64,
        copied: num("copied") as u64,
        driver: num("driver") as u64,
        init: num("init"),
    })
}

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / 1048576.0)
}

/// The PyTorch peer (bsp-tiling/benches/torch_peer.py) at one side: whole image on the GPU.
struct Peer {
    secs: Option<f64>,
    peak: Option<u64>,
    note: String,
}

fn torch_peer(script: &Path, side: usize, tf32: bool) -> Peer {
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(model_path())
        .arg(side.to_string())
        .args(tf32.then_some("--tf32"))
        .output();
    let fail = |note: String| Peer {
        secs: None,
        peak: None,
        note,
    };
    let o = match out {
        Ok(o) => o,
        Err(e) => return fail(format!("python3: {e}")),
    };
    let stdout = String::from_utf8_lossy(&o.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with("TORCHPEER ")) else {
        let err = String::from_utf8_lossy(&o.stderr);
        return fail(err.lines().last().unwrap_or("no output").to_string());
    };
    let kv: HashMap<&str, &str> = line[10..]
        .split(' ')
        .filter_map(|p| p.split_once('='))
        .collect();
    Peer {
        secs: kv
            .get("secs")
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite()),
        peak: kv.get("peak").and_then(|v| v.parse().ok()),
        note: kv.get("note").unwrap_or(&"").replace('_', " "),
    }
}

fn torch_available() -> Result<String, String> {
    let o = std::process::Command::new("python3")
        .args([
            "-c",
            "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("torch unavailable")
            .to_string())
    }
}

/// The section's settings, from the environment (`L3_BSP_*`, `L3_BENCH_QUICK`).
struct Settings {
    quick: bool,
    max_secs: f64,
    whole_max: usize,
    compare_max: usize,
    gpu_tile: usize,
    gpu_memory: u64,
    threads: usize,
    sizes: Vec<usize>,
    devices: Vec<String>,
    /// `L3_BSP_MODES`: the modes to run (default every one).
    only: Option<String>,
    /// `L3_BSP_ALL_MODES_MAX`: the largest side at which the slow modes (sampled, naive, recompute) run;
    /// above it only whole and exact (default: every side).
    all_modes_max: usize,
    /// `L3_BSP_DEADLINE_SECS`: seconds from the start of the sweep past which no run is started (or one
    /// predicted to end past it), and a running child is stopped (default: none).
    deadline: Option<f64>,
}

impl Settings {
    fn from_env() -> Settings {
        let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
        let max_side = env_usize("L3_BSP_MAX_SIDE", if quick { 1024 } else { 16384 });
        let sizes = match std::env::var("L3_BSP_SIZES") {
            Ok(list) => list
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect(),
            Err(_) => [512, 1024, 2048, 4096, 8192, 10000, 16384]
                .into_iter()
                .filter(|&s| s <= max_side)
                .collect(),
        };
        Settings {
            quick,
            max_secs: env_usize("L3_BSP_MAX_SECS", 300) as f64,
            whole_max: env_usize("L3_BSP_WHOLE_MAX", 4096),
            compare_max: env_usize("L3_BSP_COMPARE_MAX", 16384),
            gpu_tile: env_usize("L3_BSP_GPU_TILE", 2048),
            gpu_memory: env_usize("L3_BSP_GPU_MEMORY", 8 << 30) as u64,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            sizes,
            devices: std::env::var("L3_BSP_DEVICES")
                .unwrap_or_else(|_| "cpu,cuda".into())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
            only: std::env::var("L3_BSP_MODES").ok(),
            all_modes_max: env_usize("L3_BSP_ALL_MODES_MAX", usize::MAX),
            deadline: std::env::var("L3_BSP_DEADLINE_SECS")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    fn wants(&self, mode: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|m| m == mode))
    }
}

/// The GPU's name and free memory (opened once here, then closed: children open their own), or why
/// there is none.
fn probe_gpu(cfg: &Settings) -> Result<(String, u64), String> {
    if !cfg.devices.iter().any(|d| d == "cuda") {
        return Err("not requested (L3_BSP_DEVICES)".into());
    }
    match CudaBackend::new(0, None, Precision::F32) {
        Ok(b) => Ok((b.name(), b.memory().budget())),
        Err(e) => Err(e.to_string()),
    }
}

const MODES: &[&str] = &["whole", "exact", "sampled", "naive", "recompute"];

/// The GPU's exact mode with its stored values on the host, each crossing the bus both ways (run up to
/// `L3_BSP_ALL_MODES_MAX`).
const EXACT_ON_HOST: &str = "exact, values on host";

/// The GPU's exact mode with its convolutions as im2col + cuBLAS sgemm instead of cuDNN (run up to
/// `L3_BSP_ALL_MODES_MAX`).
const EXACT_IM2COL: &str = "exact, im2col convolutions";

/// The GPU's exact mode with TF32 convolutions (PyTorch's default `allow_tf32`), beside the PyTorch
/// peer's TF32 row; run at every size, as exact is.
const EXACT_TF32: &str = "exact, TF32";

/// The size sweep's table and what the plots and the closing paragraphs take from it.
struct Sweep {
    t: Table,
    /// Each row as a JSON line as soon as it is known (`target/bench/bsp-runs.jsonl`), so that a run cut
    /// short still leaves every case it finished.
    lines: Option<std::fs::File>,
    start: Instant,
    /// Per `device/mode`: the last run's megapixels and its child's wall-clock seconds (set-up included).
    wall: HashMap<String, (f64, f64)>,
    last_secs: HashMap<String, f64>,
    series: HashMap<String, Vec<(f64, f64)>>,
    rss_series: HashMap<String, Vec<(f64, f64)>>,
    errs: Vec<String>,
    gpu_10k: HashMap<&'static str, f64>,
}

impl Sweep {
    /// A row of the table, and at once a flushed JSON line of it (header: cell).
    fn record(&mut self, cells: Vec<String>) {
        if let Some(f) = &mut self.lines {
            use std::io::Write as _;
            let fields: Vec<String> = self
                .t
                .headers
                .iter()
                .zip(&cells)
                .filter(|(_, c)| !c.is_empty())
                .map(|(h, c)| format!("{}:{}", json_string(h), json_string(c)))
                .collect();
            let line = format!("{{{}}}\n", fields.join(","));
            if let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.flush()) {
                eprintln!("bsp: bsp-runs.jsonl: {e}");
                self.lines = None;
            }
        }
        self.t.row(cells);
    }

    /// Why a run predicted to take `predicted` seconds is not started: the sweep's deadline
    /// (`L3_BSP_DEADLINE_SECS`) reached, or to be passed by then.
    fn past_deadline(&self, cfg: &Settings, predicted: f64) -> Option<String> {
        let d = cfg.deadline?;
        let now = self.start.elapsed().as_secs_f64();
        (now + predicted > d).then(|| {
            format!(
                "not run: {now:.0} s + predicted {predicted:.0} s > L3_BSP_DEADLINE_SECS={d:.0}"
            )
        })
    }
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A table row with only its first cells: side, device, mode, and why it did not run.
fn blank(side: usize, dev: &str, mode: &str, why: String) -> Vec<String> {
    let mut v = vec![side.to_string(), dev.into(), mode.into(), "-".into(), why];
    v.resize(16, String::new());
    v
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    // Child mode: one run, and leave without touching the report.
    run_if_child("L3_BSP_CHILD", "bsp", child);
    let cfg = Settings::from_env();
    let gpu = probe_gpu(&cfg);
    let torch = match (&gpu, std::env::var("L3_BSP_TORCH").as_deref()) {
        (_, Ok("0")) => Err("disabled (L3_BSP_TORCH=0)".to_string()),
        (Err(_), _) => Err("no GPU".to_string()),
        (Ok(_), _) => torch_available(),
    };
    let scratch_root = std::env::var_os("L3_BSP_SCRATCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    std::fs::create_dir_all(&scratch_root).context("scratch folder")?;
    let scratch = tempfile::tempdir_in(&scratch_root).context("scratch folder")?;
    // Children run a private copy of this binary: a rebuild of l3-bench during the run must not pull it away.
    let exe = scratch.path().join("l3-bench-bsp-child");
    std::fs::copy(std::env::current_exe()?, &exe).context("copying the bench binary")?;
    let net = Net::load_transformer(&model_path(), PaddingMode::Reflect)?;
    describe(r, &cfg, &net, &gpu, &torch);
    let lines_path = crate::report::bench_dir().join("bsp-runs.jsonl");
    std::fs::create_dir_all(crate::report::bench_dir()).context("target/bench")?;
    let mut sweep = Sweep {
        t: time_table(),
        lines: std::fs::File::create(&lines_path)
            .map_err(|e| eprintln!("bsp: {}: {e}", lines_path.display()))
            .ok(),
        start: Instant::now(),
        wall: HashMap::new(),
        last_secs: HashMap::new(),
        series: HashMap::new(),
        rss_series: HashMap::new(),
        errs: vec![],
        gpu_10k: HashMap::new(),
    };
    for &side in &cfg.sizes {
        let mut wholes: HashMap<&str, PathBuf> = HashMap::new();
        for dev in &cfg.devices {
            let dev = dev.as_str();
            if dev == "cuda"
                && let Err(why) = &gpu
            {
                sweep.record(blank(side, dev, "all", format!("no GPU: {why}")));
                continue;
            }
            for &mode in MODES {
                let ctx = (&cfg, exe.as_path(), scratch.path());
                one_run(&mut sweep, ctx, side, dev, mode, &mut wholes)?;
            }
            if dev == "cuda" {
                // The same exact run with every stored value on the host (what keeping them saves), and
                // with im2col + cuBLAS convolutions (what cuDNN's save).
                for mode in [EXACT_TF32, EXACT_ON_HOST, EXACT_IM2COL] {
                    let ctx = (&cfg, exe.as_path(), scratch.path());
                    one_run(&mut sweep, ctx, side, dev, mode, &mut wholes)?;
                }
            }
        }
        if let Ok(v) = &torch {
            for tf32 in [false, true] {
                let mode = if tf32 { "whole, TF32" } else { "whole" };
                match sweep.past_deadline(&cfg, 0.0) {
                    Some(why) => sweep.record(blank(side, "cuda (PyTorch)", mode, why)),
                    None => sweep.record(torch_row(side, v, tf32)),
                }
            }
        }
        if side == 10000 {
            for (mode, secs) in [
                ("sampled (BSP-sample)", PAPER_SAMPLED_SECS),
                ("exact (BSP)", PAPER_EXACT_SECS),
            ] {
                let mut v = vec![
                    side.to_string(),
                    "paper: 1 Titan X, TensorFlow".into(),
                    mode.into(),
                    "–".into(),
                    secs.into(),
                ];
                v.resize(16, String::new());
                sweep.record(v);
            }
        }
        for p in wholes.values() {
            std::fs::remove_file(p).ok();
        }
    }
    r.table(&sweep.t);
    for e in &sweep.errs {
        r.para(&format!("Run failed: {e}"));
    }
    plots(r, &sweep);
    sampling_and_seams(r, &cfg, &net)?;
    paper_comparison(r, &net, &sweep);
    // The ONNX models (`cargo xtask bench onnx` alone), unless L3_BSP_ONNX=0.
    if std::env::var("L3_BSP_ONNX").as_deref() != Ok("0") {
        super::onnx::run(r)?;
    }
    // One image shared among processes (`cargo xtask bench ranks` alone), unless L3_BSP_RANKS=0.
    if std::env::var("L3_BSP_RANKS").as_deref() != Ok("0") {
        super::ranks::run(r)?;
    }
    Ok(())
}

/// The paragraphs above the tables: the model, the input, how each device runs, the peers.
fn describe(
    r: &mut Report,
    cfg: &Settings,
    net: &Net,
    gpu: &Result<(String, u64), String>,
    torch: &Result<String, String>,
) {
    let (threads, gpu_tile, gpu_memory) = (cfg.threads, cfg.gpu_tile, cfg.gpu_memory);
    let w = net.widths();
    r.para(&format!(
        "Model: `{MODEL}` (TransformerNet, widths {}/{}/{}, {} parameters; the slim one, to keep a 2-core CPU \
         run within minutes). Input: `{SOURCE}` from the corpus, centre-cropped to the square or mirrored where \
         the square is larger than the photo. CPU: tiles {TILE}², {threads} threads, exact-mode RAM budget \
         {RAM_BUDGET_MIB} MiB (beyond it activations spill to memory-mapped files in `target/`). GPU: tiles \
         {gpu_tile}², device budget {} MiB for the tiled modes (stored values stay in device memory while it \
         holds them beside the tiles' working sets, the rest in host memory, crossing the bus; the row \
         'exact, values on host' stores every one on the host; f32 convolutions through cuDNN in FMA math, \
         no TF32, where it loads, else im2col + cuBLAS sgemm, which the row 'exact, im2col convolutions' \
         uses throughout; the row 'exact, TF32' runs cuDNN and cuBLAS in TF32 tensor-op math, PyTorch's \
         default for convolutions, and its errors are against the f32 whole image), the whole device for whole-image runs; times after a warm-up run \
         (context, NVRTC and cuBLAS set-up are the 'GPU init' column). Each run is a separate process; peak RSS \
         is its `VmHWM` (it includes the decoded source photo, see 'RSS before', and the output image: f32 where \
         it is compared with whole, else 8-bit); device peak is the metered peak of the backend's own \
         allocations (activations, weights, im2col bands, cuBLAS workspace), 'driver' the device memory in use \
         after the run less before it; 'host-device copies' the bytes the run copied over the bus (the \
         windows each superstep uploads and the values it downloads). Times exclude decoding and writing. Sampled = statistics from the image \
         downsampled 2×, computed with the exact engine. Recompute = exact statistics recomputed per \
         normalising layer with no stored activations (run up to 2048²). Errors are against the same device's \
         whole-image output; the GPU whole row is against the CPU's.",
        w.0,
        w.1,
        w.2,
        net.parameters(),
        gpu_memory >> 20
    ));
    match gpu {
        Ok((name, free)) => r.para(&format!("GPU: {name}; {} MiB free at start.", free >> 20)),
        Err(why) => r.para(&format!("GPU rows: no GPU — {why}.")),
    }
    match torch {
        Ok(v) => r.para(&format!(
            "PyTorch peer: `bsp-tiling/benches/torch_peer.py` (the same TransformerNet in a few lines of torch, \
             whole image, f32 without TF32, `torch.inference_mode`; the 'whole, TF32' row with \
             `torch.backends.cudnn.allow_tf32` and `cuda.matmul.allow_tf32` on), torch {v}."
        )),
        Err(why) => r.para(&format!("PyTorch peer rows: skipped — {why}.")),
    }
}

fn time_table() -> Table {
    Table::new(
        "Time and peak memory by image size, device and mode",
        &[
            "side",
            "device",
            "mode",
            "tiles",
            "time (s)",
            "Mpx/s",
            "peak RSS (MiB)",
            "RSS before (MiB)",
            "device peak (MiB)",
            "driver (MiB)",
            "GPU init (s)",
            "spilled values",
            "host-device copies (GiB)",
            "max abs vs whole",
            "mean abs vs whole",
            "PSNR vs whole (dB)",
        ],
    )
}

/// One child run of `mode` on `dev` at `side`, its row (or why it did not run), and its output compared
/// with the whole-image reference (this device's; for the GPU's whole image, the CPU's).
fn one_run<'a>(
    sweep: &mut Sweep,
    (cfg, exe, scratch): (&Settings, &Path, &Path),
    side: usize,
    dev: &'a str,
    mode: &'static str,
    wholes: &mut HashMap<&'a str, PathBuf>,
) -> anyhow::Result<()> {
    let cuda = dev == "cuda";
    if !cfg.wants(mode) || (mode == "recompute" && side > 2048) {
        return Ok(());
    }
    if !matches!(mode, "whole" | "exact" | EXACT_TF32) && side > cfg.all_modes_max {
        let why = format!("not run: side > L3_BSP_ALL_MODES_MAX={}", cfg.all_modes_max);
        sweep.record(blank(side, dev, mode, why));
        return Ok(());
    }
    if mode == "whole" && !cuda && side > cfg.whole_max {
        let why = format!("skipped: side > L3_BSP_WHOLE_MAX={}", cfg.whole_max);
        sweep.record(blank(side, dev, mode, why));
        return Ok(());
    }
    let key = format!("{dev}/{mode}");
    if let Some(prev) = sweep.last_secs.get(&key) {
        let predicted = prev * 4.0;
        if predicted > cfg.max_secs {
            let why = format!(
                "skipped: predicted {predicted:.0} s > L3_BSP_MAX_SECS={:.0}",
                cfg.max_secs
            );
            sweep.record(blank(side, dev, mode, why));
            return Ok(());
        }
    }
    let mpx = (side * side) as f64 / 1e6;
    // The child's whole wall time (set-up, input, output included) scales with the pixels.
    let predicted = sweep.wall.get(&key).map_or(0.0, |&(m, w)| w * mpx / m);
    if let Some(why) = sweep.past_deadline(cfg, predicted) {
        sweep.record(blank(side, dev, mode, why));
        return Ok(());
    }
    eprintln!("bsp: {side}² {dev} {mode}");
    let compare_it = if cuda {
        side <= cfg.compare_max
    } else {
        side <= cfg.whole_max
    };
    let name: String = mode
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let out = scratch.join(format!("{dev}-{name}-{side}.f32"));
    let child_mode = match mode {
        EXACT_ON_HOST => "exact;keep=0",
        EXACT_IM2COL => "exact;cudnn=0",
        EXACT_TF32 => "exact;precision=tf32",
        m => m,
    };
    let mut spec = format!(
        "side={side};mode={child_mode};threads={};spill={};device={dev};tile={}",
        cfg.threads,
        scratch.display(),
        if cuda { cfg.gpu_tile } else { TILE }
    );
    if cuda && mode != "whole" {
        spec.push_str(&format!(";gpu_memory={}", cfg.gpu_memory));
    }
    if compare_it {
        spec.push_str(&format!(";out={}", out.display()));
    }
    let t0 = Instant::now();
    let left = cfg.deadline.map(|d| {
        std::time::Duration::from_secs_f64((d - sweep.start.elapsed().as_secs_f64()).max(0.0))
    });
    let run = match spawn(exe, &spec, left) {
        Ok(run) => run,
        Err(e) => {
            sweep.record(blank(side, dev, mode, format!("failed: {e:#}")));
            sweep.errs.push(format!("{side}² {dev} {mode}: {e:#}"));
            return Ok(());
        }
    };
    sweep.last_secs.insert(key.clone(), run.secs);
    sweep
        .wall
        .insert(key.clone(), (mpx, t0.elapsed().as_secs_f64()));
    sweep
        .series
        .entry(key.clone())
        .or_default()
        .push((mpx, run.secs));
    sweep
        .rss_series
        .entry(key)
        .or_default()
        .push((mpx, run.peak as f64 / 1048576.0));
    if cuda && side == 10000 {
        sweep.gpu_10k.insert(mode, run.secs);
    }
    let on_gpu = |v: String| if cuda { v } else { "–".into() };
    let mut cells = vec![
        side.to_string(),
        dev.into(),
        mode.into(),
        run.tiles.to_string(),
        format!("{:.2}", run.secs),
        format!("{:.3}", mpx / run.secs),
        mib(run.peak),
        mib(run.before),
        on_gpu(mib(run.device_peak)),
        on_gpu(mib(run.driver)),
        on_gpu(format!("{:.2}", run.init)),
        run.spilled.to_string(),
        on_gpu(format!("{:.2}", run.copied as f64 / f64::from(1u32 << 30))),
    ];
    let reference = if mode == "whole" {
        wholes.get("cpu").cloned()
    } else {
        wholes.get(dev).cloned()
    };
    match (compare_it, reference) {
        (true, Some(refp)) => {
            let a = read_output(&out, side)?;
            let b = read_output(&refp, side)?;
            let e = compare(&a, &b);
            cells.extend([
                format!("{:.2e}", e.max_abs),
                format!("{:.3}", e.mean_abs),
                format!("{:.1}", e.psnr_db),
            ]);
        }
        _ if mode == "whole" => cells.extend(["—".into(), "—".into(), "—".into()]),
        _ => cells.extend(["n/a".into(), "n/a".into(), "n/a".into()]),
    }
    if mode == "whole" && compare_it {
        wholes.insert(dev, out.clone());
    } else {
        std::fs::remove_file(&out).ok();
    }
    eprintln!(
        "bsp: {side}² {dev} {mode}: {} s, device peak {} MiB, max abs vs whole {}",
        cells[4], cells[8], cells[13]
    );
    sweep.record(cells);
    Ok(())
}

/// The PyTorch peer's row at `side` (torch version `v`), in f32 or with TF32 convolutions.
fn torch_row(side: usize, v: &str, tf32: bool) -> Vec<String> {
    let script = std::env::var_os("L3_BSP_TORCH_PEER")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("bsp-tiling/benches/torch_peer.py"));
    eprintln!("bsp: {side}² torch");
    let mpx = (side * side) as f64 / 1e6;
    let p = torch_peer(&script, side, tf32);
    let mut row = vec![
        side.to_string(),
        format!("cuda (PyTorch {})", v.split(' ').next().unwrap_or("")),
        if tf32 { "whole, TF32" } else { "whole" }.into(),
        "1".into(),
        p.secs.map_or_else(|| p.note.clone(), |s| format!("{s:.2}")),
        p.secs.map_or(String::new(), |s| format!("{:.3}", mpx / s)),
        String::new(),
        String::new(),
        p.peak.map_or(String::new(), mib),
    ];
    row.resize(16, String::new());
    row
}

/// Time and peak RSS against image size, one line per device and mode.
fn plots(r: &mut Report, sweep: &Sweep) {
    let to_series = |m: &HashMap<String, Vec<(f64, f64)>>| -> Vec<Series> {
        let mut v: Vec<Series> = m
            .iter()
            .map(|(n, p)| Series {
                name: n.clone(),
                points: p.clone(),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    r.svg(
        "time",
        line_plot(
            "Time vs image size (candy_nc8)",
            "megapixels",
            "seconds",
            &to_series(&sweep.series),
        ),
    );
    r.svg(
        "rss",
        line_plot(
            "Peak RSS vs image size",
            "megapixels",
            "MiB",
            &to_series(&sweep.rss_series),
        ),
    );
}

/// Sampling error and seams, in-process on the CPU at one size.
fn sampling_and_seams(r: &mut Report, cfg: &Settings, net: &Net) -> anyhow::Result<()> {
    let side = if cfg.quick { 512 } else { 1024 };
    let input = make_input(side)?;
    let threads = cfg.threads;
    let run_mode = |mode: Mode, tile: usize| -> anyhow::Result<Tensor> {
        let opts = Options {
            mode,
            tile,
            threads,
            ..Options::default()
        };
        Ok(stylize(net, &CpuBackend, &input, &opts, false)?
            .0
            .into_tensor()?)
    };
    let whole = run_mode(Mode::Whole, TILE)?;
    let mut st = Table::new(
        &format!(
            "Normalisation via sampling vs exact, {side}² (sample = image downsampled N×, processed with exact statistics)"
        ),
        &[
            "sample factor",
            "sample side",
            "mean abs (0..255)",
            "max abs",
            "PSNR (dB)",
        ],
    );
    for f in [1usize, 2, 4, 8] {
        let out = run_mode(Mode::Sampled(f), 256)?;
        let e = compare(&out, &whole);
        st.row(vec![
            f.to_string(),
            side.div_ceil(f).to_string(),
            format!("{:.3}", e.mean_abs),
            format!("{:.2}", e.max_abs),
            format!("{:.1}", e.psnr_db),
        ]);
    }
    r.table(&st);
    let tile = 128;
    let borders: Vec<usize> = (1..side.div_ceil(tile)).map(|i| i * tile).collect();
    let mut sm = Table::new(
        &format!(
            "Seam metric, {side}², tiles {tile}²: mean |jump| between neighbouring pixels across tile borders vs elsewhere (0..255 scale)"
        ),
        &["mode", "across borders", "inside tiles", "ratio"],
    );
    for (name, mode) in [
        ("whole", Mode::Whole),
        ("BSP exact", Mode::Exact),
        ("sampled (2×)", Mode::Sampled(2)),
        ("naive", Mode::Naive),
    ] {
        let out = if matches!(mode, Mode::Whole) {
            whole.clone()
        } else {
            run_mode(mode, tile)?
        };
        let s = seams(&out, &borders, &borders);
        sm.row(vec![
            name.into(),
            format!("{:.3}", s.across),
            format!("{:.3}", s.inside),
            format!("{:.3}", s.ratio()),
        ]);
    }
    r.table(&sm);
    Ok(())
}

/// Where this lands relative to the paper's 10,000² in under a minute on a Titan X.
fn paper_comparison(r: &mut Report, net: &Net, sweep: &Sweep) {
    let flops = 2.0 * macs_per_pixel(net) as f64;
    if let Some(p) = sweep.series.get("cpu/sampled").and_then(|p| p.last()) {
        let rate = p.0 / p.1;
        r.para(&format!(
            "Paper: 10,000² (100 Mpx) in under a minute on one Titan X with the sampled mode (BSP-sample, under \
             50 s; exact BSP over 400 s). CPU here: sampled mode ran {:.2} Mpx/s at its largest measured size \
             ({:.1} Mpx), so 100 Mpx would take about {:.0} s (extrapolated unless the 10,000² row ran); the \
             model is the slim candy_nc8 at {:.1} kFLOP/pixel, 100 Mpx × that ≈ {:.1} TFLOP.",
            rate,
            p.0,
            100.0 / rate,
            flops / 1e3,
            100e6 * flops / 1e12,
        ));
    }
    if !sweep.gpu_10k.is_empty() {
        let mut v: Vec<_> = sweep.gpu_10k.iter().collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        r.para(&format!(
            "GPU at 10,000²: {} (targets: exact under 10 s; the paper's Titan X: BSP-sample < 50 s, BSP > 400 s).",
            v.iter()
                .map(|(m, s)| format!("{m} {s:.2} s"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

/// Multiply-adds per input pixel of the network (each stage's output pixels per input pixel × k²·cin·cout).
fn macs_per_pixel(net: &Net) -> u64 {
    let plan = match net.plan(1024, 1024) {
        Ok(p) => p,
        Err(_) => return 0,
    };
    net.stages
        .iter()
        .zip(&plan.out)
        .map(|(s, &(_, h, w))| (s.conv.k * s.conv.k * s.conv.cin * s.conv.cout * h * w) as u64)
        .sum::<u64>()
        / (1024 * 1024)
}
