//! `cargo xtask bench ranks`, also the end of `cargo xtask bench bsp`: one image shared among processes
//! (the paper's BSP over several workers, its Figure 16) — `python -m l3toolkit.infer` started by
//! `torchrun --nproc-per-node P` (gloo), each rank one thread, against the same run in one process — with
//! the bit-identity check in the same run: every shared run's output file must have exactly the bytes of
//! the one-process run.
//!
//! The input is the corpus photo mirrored out to the side as an L3 file (read by region by every rank),
//! the model the candy TransformerNet, the output a float32 `.npy` (the raw output, compared byte for
//! byte). Each row is one process tree, timed from its start to its exit (Python, torch and the process
//! group's start-up included: two to three seconds, which only matters at small sides), and rank 0's run
//! as it reports it (from the model's loading to the output's rename); the speed-up is the run's. Environment: `L3_RANKS_SIDE` (default
//! 8192; 1024 with `L3_BENCH_QUICK`), `L3_RANKS` (default 1,2,4,8, at most the machine's cores),
//! `L3_RANKS_TILE` (default 512, `l3 infer`'s), `L3_RANKS_PYTHON` (an interpreter that imports
//! `l3toolkit` already; default: the package installed into `target/python/venv`).

use crate::report::{Report, Table, corpus_dir, machine};
use anyhow::Context;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const MODEL: &str = "candy_nc8.safetensors";

fn env_list(k: &str, d: &str) -> Vec<usize> {
    std::env::var(k)
        .unwrap_or_else(|_| d.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// One run: its wall-clock seconds (the process tree's) and rank 0's own (from the model's loading to
/// the output's rename, as `python -m l3toolkit.infer` reports it), or why it failed (its stderr's
/// last lines).
fn timed(cmd: &mut Command) -> Result<(f64, f64), String> {
    let t0 = Instant::now();
    let out = cmd.output().map_err(|e| format!("starting it: {e}"))?;
    let secs = t0.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        return Err(tail[tail.len().saturating_sub(3)..].join(" / "));
    }
    let run = err
        .lines()
        .filter_map(|l| l.split(" written in ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .next_back()
        .ok_or_else(|| "it did not say how long the run took".to_string())?;
    Ok((secs, run))
}

/// `python -m l3toolkit.infer` on `p` ranks started by torchrun, from `input` to `out`, one thread
/// each (the flags after these are the caller's).
fn torchrun(python: &Path, p: usize, model: &Path, input: &Path, out: &Path) -> Command {
    let mut c = Command::new(python);
    c.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
    ])
    .arg(p.to_string())
    .args(["-m", "l3toolkit.infer", "--model"])
    .arg(model)
    .arg(input)
    .arg(out)
    .env("OMP_NUM_THREADS", "1");
    c
}

/// The row's cells for a run's times: the process tree's seconds, rank 0's, and the speed-up of rank 0's
/// over `base` (rank 0's seconds on one rank).
fn times(t: &Result<(f64, f64), String>, base: Option<f64>) -> [String; 3] {
    match t {
        Ok((tree, run)) => [
            format!("{tree:.2}"),
            format!("{run:.2}"),
            base.map_or("-".into(), |b| format!("{:.2}", b / run)),
        ],
        Err(e) => [format!("failed: {e}"), "-".into(), "-".into()],
    }
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let side = env_list("L3_RANKS_SIDE", if quick { "1024" } else { "8192" })
        .first()
        .copied()
        .unwrap_or(1024);
    let tile = env_list("L3_RANKS_TILE", "512")
        .first()
        .copied()
        .unwrap_or(512);
    let ranks: Vec<usize> = env_list("L3_RANKS", "1,2,4,8")
        .into_iter()
        .filter(|&p| p >= 1 && p <= cores)
        .collect();
    // The package installed into the benchmark's environment, or (`L3_RANKS_PYTHON`, the GPU bundle) an
    // interpreter that already imports it.
    let python = match std::env::var_os("L3_RANKS_PYTHON") {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let p = xtask::python::venv_python(&xtask::python::venv_dir())?;
            xtask::python::install_package(&p, xtask::python::Build::Release)?;
            p
        }
    };
    let torch = Command::new(&python)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let work = tempfile::Builder::new()
        .prefix("l3-bench-ranks-")
        .tempdir()?;
    let input = work.path().join(format!("in{side}.l3"));
    eprintln!("ranks bench: making the {side}² L3 input ...");
    super::onnx::mirrored_l3(&input, side).context("making the input")?;
    let model = corpus_dir().join("..").join("models").join(MODEL);
    let flags = |threads: usize| {
        vec![
            "--tile".to_string(),
            tile.to_string(),
            "--threads".into(),
            threads.to_string(),
        ]
    };
    let one_process = |out: &Path, threads: usize| {
        let mut c = Command::new(&python);
        c.args(["-m", "l3toolkit.infer", "--group", "none", "--model"])
            .arg(&model)
            .arg(&input)
            .arg(out)
            .args(flags(threads))
            .env_remove("WORLD_SIZE");
        timed(&mut c)
    };
    let mut table = Table::new(
        &format!(
            "One {side}² image shared among processes: candy TransformerNet, exact, tile {tile}, L3 in, \
             float32 .npy out; torchrun (gloo), one thread per rank"
        ),
        &[
            "run",
            "processes × threads",
            "seconds (process tree)",
            "seconds (the run, rank 0)",
            "speed-up over 1 rank (the run)",
            "output equals one process's",
        ],
    );
    let reference = work.path().join("one.npy");
    eprintln!("ranks bench: one process, one thread ...");
    let t1 = one_process(&reference, 1);
    let want = std::fs::read(&reference).unwrap_or_default();
    let [tree, run, _] = times(&t1, None);
    table.row(vec![
        "one process (`--group none`)".into(),
        "1 × 1".into(),
        tree,
        run,
        "-".into(),
        "(the reference)".into(),
    ]);
    if cores > 1 {
        eprintln!("ranks bench: one process, {cores} threads ...");
        let out = work.path().join("all.npy");
        let t = one_process(&out, cores);
        let same = std::fs::read(&out).is_ok_and(|b| b == want);
        let [tree, run, _] = times(&t, None);
        table.row(vec![
            "one process, every core".into(),
            format!("1 × {cores}"),
            tree,
            run,
            "-".into(),
            if same { "yes" } else { "NO" }.into(),
        ]);
        std::fs::remove_file(&out).ok();
    }
    let mut base = None;
    for &p in &ranks {
        let Some(version) = &torch else {
            table.row(vec![
                format!("torchrun, {p} ranks"),
                format!("{p} × 1"),
                "not run: torch is not installed in the benchmark's environment".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
            continue;
        };
        eprintln!("ranks bench: {p} ranks ...");
        let out = work.path().join(format!("ranks{p}.npy"));
        let t = timed(torchrun(&python, p, &model, &input, &out).args(flags(1)));
        let same = std::fs::read(&out).is_ok_and(|b| b == want);
        if p == 1 {
            base = t.as_ref().ok().map(|t| t.1);
        }
        let [tree, run, speedup] = times(&t, base);
        table.row(vec![
            format!("torchrun {version}, {p} rank(s)"),
            format!("{p} × 1"),
            tree,
            run,
            speedup,
            if same { "yes" } else { "NO" }.into(),
        ]);
        std::fs::remove_file(&out).ok();
    }
    r.para(&format!(
        "**One image across processes (BSP ranks).** Each rank computes a band of every superstep's \
         tiles; before each normalisation the ranks' per-tile statistics are all-gathered and merged in tile order, so every rank applies the \
         numbers one process would; after each stored value the parts of its tiles that another rank's \
         windows read are sent there; rank 0 writes the output. The speed-up compares rank 0's run \
         (model loading to the output's rename) with one rank's; the process tree's seconds add Python's, \
         torch's and the process group's start-up. The last column compares each output \
         file with the one-process run's, byte for byte. Machine: {}.",
        machine()
    ));
    r.table(&table);
    Ok(())
}
