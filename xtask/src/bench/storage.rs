//! `cargo xtask bench storage`: every format read from storage of a given bandwidth — 100, 200, 400 and
//! 1000 MB/s through the read layer's cap (the token bucket that models network storage) and from the page
//! cache — images/s and bytes per epoch, with a plot. Liquid is profiled again at each bandwidth, its
//! probes reading through the same cap, so its ratio follows the storage. Where the machine allows it
//! (root, network namespaces, `tc`), one more table checks the model against a real network: an S3 server
//! in a namespace behind a veth pair throttled by the kernel (`tc tbf`), read by the same loader.

use crate::report::{Report, Series, Table, corpus_dir, line_plot};
use anyhow::Context;
use l3_cli::compare::{
    BuildPlan, FormatEntry, Measured, build_formats, build_liquid, stream_epochs,
};
use loader::convert::{ConvertOptions, Target, convert_folder};
use loader::{Crop, LoaderOptions, StorageOptions};
use std::path::Path;

/// The capped bandwidths, MB/s (10⁶ bytes).
const BANDWIDTHS: [u64; 4] = [100, 200, 400, 1000];

fn options(threads: usize, f: &FormatEntry) -> LoaderOptions {
    LoaderOptions {
        batch_size: 8,
        height: 224,
        width: 224,
        crop: Crop::Center,
        decode_threads: threads,
        io_threads: 4,
        decode: f.decode,
        ..LoaderOptions::default()
    }
}

fn capped(mbps: Option<u64>) -> StorageOptions {
    StorageOptions {
        bandwidth: mbps.map(|m| m * 1_000_000),
        cache: None,
    }
}

/// One epoch of `f` read through `storage` (best of `runs`).
fn measure(
    f: &FormatEntry,
    storage: &StorageOptions,
    threads: usize,
    runs: usize,
) -> anyhow::Result<Measured> {
    let mut best: Option<Measured> = None;
    for _ in 0..runs {
        let ds = f
            .reopen(storage)
            .with_context(|| format!("opening {}", f.name))?;
        let m = stream_epochs(ds, options(threads, f), 1)
            .with_context(|| format!("streaming {}", f.name))?;
        if best.as_ref().is_none_or(|b| m.wall < b.wall) {
            best = Some(m);
        }
    }
    Ok(best.expect("at least one run"))
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let runs = if quick { 1 } else { 2 };
    let corpus = corpus_dir();
    let work = tempfile::Builder::new()
        .prefix("l3-bench-storage-")
        .tempdir()?;
    let png = work.path().join("png");
    eprintln!("storage bench: re-encoding {} as PNG ...", corpus.display());
    let convert = ConvertOptions {
        threads,
        to_8bit: false,
    };
    convert_folder(&corpus, &png, Target::Png, &convert, &|_, _| {})
        .context("re-encoding the corpus as PNG")?;
    let plan = BuildPlan {
        threads,
        pcr_groups: vec![Some(1), Some(5), Some(10)],
        liquid: false,
        ..BuildPlan::default()
    };
    let log = |l: &str| eprintln!("{l}");
    let formats: Vec<FormatEntry> = build_formats(&png, work.path(), &plan, &log)
        .into_iter()
        .filter(|f| f.name != "L3")
        .collect();
    let images = loader::image_files(&png)?.files.len();

    let columns: Vec<Option<u64>> = std::iter::once(None).chain(BANDWIDTHS.map(Some)).collect();
    let mut headers = vec!["format".to_string(), "bytes / epoch".to_string()];
    headers.extend(columns.iter().map(|c| match c {
        None => "images/s, page cache".to_string(),
        Some(m) => format!("images/s @{m} MB/s"),
    }));
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(
        "Images/s against storage bandwidth (224×224 centre crops, batch 8)",
        &hdr,
    );
    let mut series = Vec::new();
    let mut ips_of = std::collections::HashMap::new();
    for f in &formats {
        if let Err(why) = &f.dataset {
            r.para(&format!("Note: {} not measured ({why})", f.name));
            continue;
        }
        let mut cells = vec![f.name.clone(), String::new()];
        let mut points = Vec::new();
        for &c in &columns {
            let m = measure(f, &capped(c), threads, runs)?;
            eprintln!(
                "  {:<24} {:>12}: {:.1} images/s, {} bytes",
                f.name,
                c.map_or("page cache".into(), |m| format!("{m} MB/s")),
                m.images_per_sec(),
                m.stats.bytes_read
            );
            cells[1] = m.stats.bytes_read.to_string();
            cells.push(format!("{:.1}", m.images_per_sec()));
            ips_of.insert((f.name.clone(), c), m.images_per_sec());
            if let Some(mbps) = c {
                points.push((mbps as f64, m.images_per_sec()));
            }
        }
        table.row(cells);
        series.push(Series {
            name: f.name.clone(),
            points,
        });
    }

    // Liquid, profiled at each bandwidth (its probes read through the same cap) and streamed there.
    let l3_whole = formats
        .iter()
        .find(|f| f.name.starts_with("L3, crop"))
        .map(|f| f.path.clone());
    let mut liquid_cells = vec![
        "Liquid L3+raw, profiled at each bandwidth".to_string(),
        "-".to_string(),
    ];
    let mut liquid_points = Vec::new();
    let mut paper = Table::new(
        "Liquid (paper Table 3): the profiled mix against either format alone",
        &[
            "storage",
            "ratio chosen (L3:raw)",
            "images/s",
            "vs L3 alone",
            "vs raw alone",
        ],
    );
    if let Some(l3_dir) = &l3_whole {
        for &c in &columns {
            let dir = work.path().join(format!(
                "liquid-{}",
                c.map_or("cache".into(), |m| m.to_string())
            ));
            let entry = build_liquid(l3_dir, &dir, &plan, c.map(|m| m * 1_000_000), &log);
            let ratio = entry.name.rsplit(' ').next().unwrap_or("?").to_string();
            let m = measure(&entry, &capped(c), threads, runs)?;
            let ips = m.images_per_sec();
            eprintln!("  Liquid {ratio} at {c:?} MB/s: {ips:.1} images/s");
            liquid_cells.push(format!("{ips:.1} ({ratio})"));
            if let Some(mbps) = c {
                liquid_points.push((mbps as f64, ips));
            }
            // Whole-image decodes on both sides: the mix holds whole L3 files and raw copies.
            let vs = |name: &str| {
                ips_of
                    .get(&(name.to_string(), c))
                    .map_or("n/a".into(), |b: &f64| format!("{:.2}×", ips / b))
            };
            paper.row(vec![
                c.map_or("page cache".into(), |m| format!("{m} MB/s")),
                ratio,
                format!("{ips:.1}"),
                vs("L3 (whole)"),
                vs("raw (PPM)"),
            ]);
            let _ = std::fs::remove_dir_all(&dir);
        }
        table.row(liquid_cells);
        series.push(Series {
            name: "Liquid (profiled)".into(),
            points: liquid_points,
        });
    }

    r.para(&format!(
        "{} images from {} (re-encoded as PNG, then converted; PCR from the JPEG q90 copy), one epoch per cell \
         (best of {runs}), {threads} decode threads and 4 I/O threads. Capped columns read through the read \
         layer's bandwidth cap, a token bucket shared by every reader thread that models network storage; the \
         page-cache column reads the just-written files at memory speed. Bytes / epoch is what the loader read: \
         L3 crops read only their patches, PCR only the record prefix of its scan group.",
        images,
        corpus.display()
    ));
    r.table(&table);
    r.svg(
        "images-per-sec-vs-bandwidth",
        line_plot(
            "Images/s against storage bandwidth",
            "MB/s",
            "images/s",
            &series,
        ),
    );
    r.table(&paper);
    r.para(
        "PCR (paper Fig. 5): the rows PCR k=1, 5, 10 give bytes and images/s per scan group. Where our figures \
         differ from the papers': both papers measure on many-core servers reading from disks or a network file \
         system, where decoding has cores to spare and storage is the bound; here a few cores decode, so at \
         400 MB/s and above every format is decode-bound and a smaller format wins only when its decode is also \
         cheap (PCR's progressive JPEG decode costs more per image than baseline JPEG). At 100–200 MB/s the \
         byte count decides, as in the papers.",
    );
    kernel_throttled(r, &formats, threads)
}

/// The token bucket against a real throttled network: an S3 server (the `s3-loopback` crate, run by
/// re-executing this binary) in a network namespace behind a veth pair shaped by `tc tbf`.
fn kernel_throttled(r: &mut Report, formats: &[FormatEntry], threads: usize) -> anyhow::Result<()> {
    const MBPS: u64 = 100;
    let Some(png) = formats.iter().find(|f| f.name == "PNG") else {
        return Ok(());
    };
    let mut net = match Netns::create(MBPS) {
        Ok(n) => n,
        Err(e) => {
            r.para(&format!(
                "The kernel-throttled comparison did not run on this machine ({e:#}): it needs root, network \
                 namespaces and `tc`."
            ));
            return Ok(());
        }
    };
    let root = tempfile::Builder::new().prefix("l3-bench-s3-").tempdir()?;
    copy_dir(&png.path, &root.path().join("bench/png"))?;
    let mut table = Table::new(
        &format!("The bandwidth model against a network throttled by the kernel ({MBPS} MB/s)"),
        &["read path", "images/s", "MB/s moved", "bytes / epoch"],
    );
    let mut row = |name: &str, m: &Measured| {
        table.row(vec![
            name.into(),
            format!("{:.1}", m.images_per_sec()),
            format!(
                "{:.1}",
                m.stats.bytes_read as f64 / 1e6 / m.wall.as_secs_f64()
            ),
            m.stats.bytes_read.to_string(),
        ]);
    };
    // The same PNG folder served by S3 inside the namespace (through the shaped veth) and on loopback.
    let inside = net.serve(root.path())?;
    let outside = s3_loopback::Server::start(root.path(), "127.0.0.1:0".parse()?)?;
    let s3 = |endpoint: &str, mbps: Option<u64>| -> anyhow::Result<Measured> {
        // SAFETY: set before the loader's threads start; the previous loader has been joined.
        unsafe {
            for (k, v) in s3_loopback::client_env(endpoint) {
                std::env::set_var(k, v);
            }
        }
        let entry = FormatEntry {
            name: "PNG on S3".into(),
            dataset: Err(String::new()),
            decode: png.decode,
            path: "s3://bench/png".into(),
            group: None,
        };
        measure(&entry, &capped(mbps), threads, 1)
    };
    let kernel = s3(&inside, None)?;
    let model = s3(&outside.endpoint(), Some(MBPS))?;
    let free = s3(&outside.endpoint(), None)?;
    row(
        &format!("S3 in a namespace, veth shaped by tc tbf at {MBPS} MB/s"),
        &kernel,
    );
    row(
        &format!("S3 on loopback, read layer's token bucket at {MBPS} MB/s"),
        &model,
    );
    row("S3 on loopback, no cap", &free);
    r.table(&table);
    r.para(&format!(
        "The kernel's shaper and the read layer's model move the same bytes at about the same rate: {:.2}× \
         apart in images/s (the shaper also delays TCP acknowledgements and request headers, which the model \
         does not count).",
        model.images_per_sec() / kernel.images_per_sec()
    ));
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    for (rel, _) in loader::image_files(from)?.files {
        let dst = to.join(&rel);
        std::fs::create_dir_all(dst.parent().expect("a file's folder"))?;
        std::fs::copy(from.join(&rel), dst)?;
    }
    Ok(())
}

/// A network namespace joined to this one by a veth pair, both ends shaped by `tc tbf`; removed (with the
/// server in it) when dropped.
struct Netns {
    name: String,
    host_if: String,
    server: Option<std::process::Child>,
}

const NS_HOST: &str = "10.203.77.1";
const NS_PEER: &str = "10.203.77.2";

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    anyhow::ensure!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Netns {
    fn create(mbps: u64) -> anyhow::Result<Netns> {
        let id = std::process::id();
        let ns = Netns {
            name: format!("l3bench{id}"),
            host_if: format!("l3h{}", id % 100_000),
            server: None,
        };
        let peer_if = format!("l3p{}", id % 100_000);
        let rate = format!("{}mbit", mbps * 8);
        sh(&["ip", "netns", "add", &ns.name])?;
        sh(&[
            "ip",
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer_if,
            "netns",
            &ns.name,
        ])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{NS_HOST}/24"),
            "dev",
            &ns.host_if,
        ])?;
        sh(&["ip", "link", "set", &ns.host_if, "up"])?;
        sh(&[
            "ip",
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{NS_PEER}/24"),
            "dev",
            &peer_if,
        ])?;
        sh(&["ip", "-n", &ns.name, "link", "set", &peer_if, "up"])?;
        sh(&["ip", "-n", &ns.name, "link", "set", "lo", "up"])?;
        for (netns, dev) in [
            (None, ns.host_if.as_str()),
            (Some(ns.name.as_str()), peer_if.as_str()),
        ] {
            let mut cmd = vec!["tc"];
            if let Some(n) = netns {
                cmd.extend(["-n", n]);
            }
            cmd.extend([
                "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst", "1mb",
                "latency", "50ms",
            ]);
            sh(&cmd)?;
        }
        Ok(ns)
    }

    /// Starts an S3 server on `root` inside the namespace; returns its endpoint.
    fn serve(&mut self, root: &Path) -> anyhow::Result<String> {
        use std::io::BufRead;
        let addr = format!("{NS_PEER}:9000");
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(exe)
            .arg("s3-serve")
            .arg(root)
            .arg(&addr)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the S3 server in the namespace")?;
        let stdout = child.stdout.take().expect("piped");
        // Killed with the namespace, on every way out.
        self.server = Some(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        anyhow::ensure!(
            line.starts_with("listening on"),
            "the S3 server in the namespace did not start: {line:?}"
        );
        Ok(format!("http://{addr}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = sh(&["ip", "link", "del", &self.host_if]);
        let _ = sh(&["ip", "netns", "del", &self.name]);
    }
}

/// `xtask s3-serve ROOT ADDR`: the S3 server the kernel-throttled comparison runs inside its namespace.
pub fn serve(args: &[String]) -> std::process::ExitCode {
    let [root, addr] = args else {
        eprintln!("usage: xtask s3-serve ROOT ADDR");
        return std::process::ExitCode::from(2);
    };
    let server = match addr
        .parse()
        .map_err(anyhow::Error::from)
        .and_then(|a| Ok(s3_loopback::Server::start(Path::new(root), a)?))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("s3-serve: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("listening on {}", server.endpoint());
    loop {
        std::thread::park();
    }
}
