//! The offline profiler: measures load and decode throughput at a mixing ratio, searches the 11 ratios
//! 10:0 .. 0:10 as the paper does, refines the answer with two fitted lines, and writes the dataset.

use crate::direct::{AlignedBuf, DirectFile};
use crate::error::{Error, Result, io, read_file};
use crate::manifest::{Dataset, Dims, FormatKind, FormatSpec, Manifest, Ratio};
use crate::pack::DatasetWriter;
use crate::stream;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use stdx::SplitMix64;
use stdx::fs::DirLock;

/// Source images larger than this are refused before being read.
const MAX_SOURCE_BYTES: u64 = 2 << 30;
/// The probe sample's folders in [`ProfileConfig::scratch`]: `liquid-probe-PID-N`.
const PROBE_PREFIX: &str = "liquid-probe-";

/// A caller-supplied decoder for a compressed format: stored bytes in, interleaved pixels out.
pub trait Decoder: Send + Sync {
    /// Decodes `bytes` into `out` (resized as needed) and returns the image's dimensions.
    fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> std::result::Result<Dims, String>;
    /// The dimensions alone; by default a full decode, override where a header read is cheaper.
    fn dims(&self, bytes: &[u8]) -> std::result::Result<Dims, String> {
        let mut out = Vec::new();
        self.decode(bytes, &mut out)
    }
}

impl<F> Decoder for F
where
    F: Fn(&[u8], &mut Vec<u8>) -> std::result::Result<Dims, String> + Send + Sync,
{
    fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> std::result::Result<Dims, String> {
        self(bytes, out)
    }
}

/// The raw format's "decode": a checked copy into the caller's pixel buffer.
pub fn decode_raw(bytes: &[u8], dims: Dims, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    if bytes.len() as u64 != dims.decoded_len() {
        return Err(format!(
            "raw item holds {} bytes, {}x{}x{} needs {}",
            bytes.len(),
            dims.width,
            dims.height,
            dims.channels,
            dims.decoded_len()
        ));
    }
    out.clear();
    out.extend_from_slice(bytes);
    Ok(())
}

/// One source image of the dataset to profile and convert, stored compressed (`tag`: png, jpeg, l3, ...).
#[derive(Clone, Debug)]
pub struct SourceItem {
    pub id: u64,
    pub label: u32,
    pub path: PathBuf,
    pub tag: String,
}

/// How the profiler measures.
#[derive(Clone, Debug)]
pub struct ProfileConfig {
    /// Decode threads the training job will grant the pipeline.
    pub threads: usize,
    /// Threads reading from disk.
    pub io_threads: usize,
    pub seed: u64,
    /// Items in the probe sample (each stored in both formats in a scratch folder).
    pub probe_items: usize,
    /// Each measurement repeats until it has run this long (at most 20 passes).
    pub min_time: Duration,
    /// Where the probe sample is written (removed afterwards); it must be on the dataset's file system.
    pub scratch: PathBuf,
    /// The storage's read bandwidth in bytes per second, when the training job reads through a cap
    /// (`stdx::Bandwidth`, the loader's model of network storage): the probes' loads go through the same
    /// token bucket, so the ratio chosen follows the bandwidth the job will see. `None`: the disk as is.
    pub bandwidth: Option<u64>,
}

/// One probe: throughput of both stages with `raw_share` of the items stored raw.
#[derive(Clone, Debug)]
pub struct Probe {
    pub ratio: Ratio,
    pub load_ips: f64,
    pub decode_ips: f64,
    /// Megabytes per second the load stage moved.
    pub load_mbps: f64,
}

impl Probe {
    /// The pipeline runs at its slower stage.
    pub fn pipeline_ips(&self) -> f64 {
        self.load_ips.min(self.decode_ips)
    }
    pub fn load_bound(&self) -> bool {
        self.load_ips < self.decode_ips
    }
}

/// Per-item seconds of a stage as a line in the raw share: `a + b * share`.
#[derive(Clone, Copy, Debug)]
pub struct Line {
    pub a: f64,
    pub b: f64,
}

impl Line {
    pub fn at(&self, share: f64) -> f64 {
        self.a + self.b * share
    }
    fn fit(points: &[(f64, f64)]) -> Option<Line> {
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        if sxx < 1e-12 {
            return None;
        }
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let b = sxy / sxx;
        Some(Line { a: my - b * mx, b })
    }
}

/// The profiler's answer.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Every probe, in the order the search made them.
    pub probes: Vec<Probe>,
    /// The paper's answer: the best probed ratio in tenths.
    pub chosen: Ratio,
    /// Beyond the paper: where the fitted load and decode lines cross, in hundredths.
    pub fitted: Option<Ratio>,
    /// Per-item load and decode seconds as lines in the raw share.
    pub lines: Option<(Line, Line)>,
}

/// The probe sample's folder: locked while in use and removed when dropped, so it goes on every way out
/// (an error half-way through writing it, such as a full disk, a panic, or the end of profiling).
struct Scratch {
    dir: PathBuf,
    _lock: Option<DirLock>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes probe folders in `scratch` left by profilers that were killed (their process is gone).
fn remove_stale_probes(scratch: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(scratch) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(scratch)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(scratch))?;
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(PROBE_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !stdx::fs::process_alive(pid)
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(entry.path())(e)),
            }
        }
    }
    Ok(())
}

thread_local! {
    /// Each decode thread's pixel buffer, reused from item to item as a decode loop would.
    static PIXELS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The probe sample: each item in both formats on disk, so any ratio can be measured.
pub struct ProbeSet {
    /// Removed (with everything in it) when the set is dropped.
    _scratch: Scratch,
    data: Dataset,
    files: Vec<DirectFile>,
    /// Manifest indices of (compressed, raw) copies of each sampled item.
    pairs: Vec<(usize, usize)>,
    /// The order in which items turn raw as the raw share grows, so probes are nested.
    turn_raw: Vec<usize>,
    decoders: Vec<Option<usize>>,
}

impl ProbeSet {
    /// Writes a seeded sample of `sources` in both formats under `cfg.scratch`.
    pub fn build(
        sources: &[SourceItem],
        decoders: &[(&str, &dyn Decoder)],
        cfg: &ProfileConfig,
    ) -> Result<ProbeSet> {
        if sources.is_empty() {
            return Err(Error::EmptyDataset);
        }
        let mut pick: Vec<usize> = (0..sources.len()).collect();
        SplitMix64::keyed(cfg.seed, stream::PROBE, 0).shuffle(&mut pick);
        pick.truncate(cfg.probe_items.max(2).min(sources.len()));
        pick.sort_unstable();
        remove_stale_probes(&cfg.scratch)?;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nth = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = cfg
            .scratch
            .join(format!("{PROBE_PREFIX}{}-{nth}", std::process::id()));
        let mut scratch = Scratch {
            dir: dir.clone(),
            _lock: None,
        };
        let mut formats: Vec<FormatSpec> = Vec::new();
        let tag_index = |tag: &str, formats: &mut Vec<FormatSpec>| -> u16 {
            if let Some(i) = formats.iter().position(|f| f.tag == tag) {
                return i as u16;
            }
            formats.push(FormatSpec {
                tag: tag.into(),
                kind: FormatKind::Compressed,
            });
            (formats.len() - 1) as u16
        };
        for &i in &pick {
            tag_index(&sources[i].tag, &mut formats);
        }
        let raw = formats.len() as u16;
        formats.push(FormatSpec {
            tag: "raw".into(),
            kind: FormatKind::Raw,
        });
        let mut w = DatasetWriter::create(
            &dir,
            cfg.seed,
            Ratio {
                compressed: 1,
                raw: 1,
            },
            formats.clone(),
        )?;
        let mut pixels = Vec::new();
        for &i in &pick {
            let s = &sources[i];
            let bytes = read_file(&s.path, MAX_SOURCE_BYTES)?;
            let dec = find_decoder(decoders, &s.tag, &s.path)?;
            let dims = dec
                .decode(&bytes, &mut pixels)
                .map_err(|reason| Error::Source {
                    path: s.path.clone(),
                    reason,
                })?;
            w.add(s.id, s.label, tag_index(&s.tag, &mut formats), &bytes, dims)?;
            w.add(s.id, s.label, raw, &pixels, dims)?;
        }
        let (manifest, lock) = w.finish_locked()?;
        scratch._lock = lock;
        let data = Dataset::open(&dir)?;
        let files: Vec<DirectFile> = (0..manifest.files.len() as u32)
            .map(|f| DirectFile::open(&data.path_of(f)))
            .collect::<Result<_>>()?;
        let pairs: Vec<(usize, usize)> = (0..pick.len()).map(|k| (2 * k, 2 * k + 1)).collect();
        let mut turn_raw: Vec<usize> = (0..pairs.len()).collect();
        SplitMix64::keyed(cfg.seed, stream::PROBE, 1).shuffle(&mut turn_raw);
        let decoders = formats
            .iter()
            .map(|f| decoders.iter().position(|(t, _)| *t == f.tag))
            .collect();
        // One untimed pass over every item, so that the first probe does not pay for whatever the storage
        // below the page cache (a device cache, a VM host's cache) has not seen yet while later probes do not.
        let mut buf = AlignedBuf::with_capacity(0);
        for it in &data.manifest.items {
            let l = it.location;
            files[l.file as usize].read_into(l.offset, l.length, &mut buf)?;
        }
        Ok(ProbeSet {
            _scratch: scratch,
            data,
            files,
            pairs,
            turn_raw,
            decoders,
        })
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Which manifest items a probe at `ratio` reads, in storage order.
    fn chosen(&self, ratio: Ratio) -> Vec<usize> {
        let n_raw = (self.pairs.len() as f64 * ratio.raw_share()).round() as usize;
        let mut is_raw = vec![false; self.pairs.len()];
        for &k in &self.turn_raw[..n_raw] {
            is_raw[k] = true;
        }
        let mut v: Vec<usize> = (0..self.pairs.len())
            .map(|k| {
                if is_raw[k] {
                    self.pairs[k].1
                } else {
                    self.pairs[k].0
                }
            })
            .collect();
        let items = &self.data.manifest.items;
        v.sort_by_key(|&i| (items[i].location.file, items[i].location.offset));
        v
    }

    /// Measures load (page cache bypassed, `io_threads`) and decode (`threads`) throughput at `ratio`.
    pub fn measure(
        &self,
        ratio: Ratio,
        decoders: &[(&str, &dyn Decoder)],
        cfg: &ProfileConfig,
    ) -> Result<Probe> {
        let chosen = self.chosen(ratio);
        let items = &self.data.manifest.items;
        let bytes: u64 = chosen.iter().map(|&i| items[i].location.length).sum();
        // Load: every pass reads the chosen items from disk, the I/O threads taking them in storage order,
        // through the bandwidth cap when there is one.
        let cap = cfg.bandwidth.map(stdx::Bandwidth::new);
        let load = |_: usize, &i: &usize| -> Result<AlignedBuf> {
            let l = items[i].location;
            let mut buf = AlignedBuf::with_capacity(l.length as usize);
            self.files[l.file as usize].read_into(l.offset, l.length, &mut buf)?;
            if let Some(cap) = &cap {
                cap.take(l.length);
            }
            Ok(buf)
        };
        let mut loaded = Vec::new();
        let (mut passes, t0) = (0u32, Instant::now());
        while passes == 0 || (t0.elapsed() < cfg.min_time && passes < 20) {
            loaded = stdx::parallel::map(&chosen, cfg.io_threads.max(1), load)?;
            passes += 1;
        }
        let load_s = t0.elapsed().as_secs_f64() / passes as f64;
        // Decode: from memory, on the granted threads; raw items are copied into a pixel buffer.
        let (mut passes, t0) = (0u32, Instant::now());
        while passes == 0 || (t0.elapsed() < cfg.min_time && passes < 20) {
            stdx::parallel::for_each(
                chosen.iter().zip(&loaded),
                cfg.threads.max(1),
                |(&i, buf)| PIXELS.with_borrow_mut(|out| self.decode(i, buf, decoders, out)),
            )?;
            passes += 1;
        }
        let decode_s = t0.elapsed().as_secs_f64() / passes as f64;
        let n = chosen.len() as f64;
        Ok(Probe {
            ratio,
            load_ips: n / load_s,
            decode_ips: n / decode_s,
            load_mbps: bytes as f64 / 1e6 / load_s,
        })
    }

    fn decode(
        &self,
        i: usize,
        bytes: &[u8],
        decoders: &[(&str, &dyn Decoder)],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let it = &self.data.manifest.items[i];
        let fmt = &self.data.manifest.formats[it.format as usize];
        let fail = |reason: String| Error::Decode {
            id: it.id,
            format: fmt.tag.clone(),
            reason,
        };
        match (fmt.kind, self.decoders[it.format as usize]) {
            (FormatKind::Raw, _) => decode_raw(bytes, it.dims, out).map_err(fail),
            (FormatKind::Compressed, Some(d)) => {
                decoders[d].1.decode(bytes, out).map(|_| ()).map_err(fail)
            }
            (FormatKind::Compressed, None) => Err(fail("no decoder for this format".into())),
        }
    }
}

fn find_decoder<'a>(
    decoders: &[(&str, &'a dyn Decoder)],
    tag: &str,
    path: &Path,
) -> Result<&'a dyn Decoder> {
    decoders
        .iter()
        .find(|(t, _)| *t == tag)
        .map(|(_, d)| *d)
        .ok_or_else(|| Error::Source {
            path: path.to_path_buf(),
            reason: format!("no decoder for format {tag:?}"),
        })
}

/// The ratio with `k` tenths compressed.
pub fn tenths(k: u32) -> Ratio {
    Ratio {
        compressed: k,
        raw: 10 - k,
    }
}

/// The paper's search, then the fitted refinement. `on_probe` sees each probe as it is made.
pub fn search(
    set: &ProbeSet,
    decoders: &[(&str, &dyn Decoder)],
    cfg: &ProfileConfig,
    mut on_probe: impl FnMut(&Probe),
) -> Result<Profile> {
    let mut probes: Vec<Probe> = Vec::new();
    let mut probe = |k: u32, probes: &mut Vec<Probe>| -> Result<f64> {
        if let Some(p) = probes.iter().find(|p| p.ratio == tenths(k)) {
            return Ok(p.pipeline_ips());
        }
        let p = set.measure(tenths(k), decoders, cfg)?;
        on_probe(&p);
        let ips = p.pipeline_ips();
        probes.push(p);
        Ok(ips)
    };
    // Find the first k (tenths compressed) at which loading is no longer the slower stage.
    let (mut lo, mut hi) = (0u32, 11u32);
    while lo < hi {
        let mid = (lo + hi) / 2;
        probe(mid, &mut probes)?;
        let p = probes
            .iter()
            .find(|p| p.ratio == tenths(mid))
            .expect("just probed");
        if p.load_bound() {
            lo = mid + 1; // loading is slower: more compressed items
        } else {
            hi = mid; // decoding is slower: more raw items
        }
    }
    // The balance point lies between lo - 1 and lo: take the better of the two.
    let mut best = (f64::MIN, 0u32);
    for k in [lo.saturating_sub(1), lo.min(10)] {
        let ips = probe(k, &mut probes)?;
        if ips > best.0 {
            best = (ips, k);
        }
    }
    let load: Vec<(f64, f64)> = probes
        .iter()
        .map(|p| (p.ratio.raw_share(), 1.0 / p.load_ips))
        .collect();
    let dec: Vec<(f64, f64)> = probes
        .iter()
        .map(|p| (p.ratio.raw_share(), 1.0 / p.decode_ips))
        .collect();
    let lines = Line::fit(&load).zip(Line::fit(&dec));
    let fitted = lines.map(|(l, d)| {
        // Pipeline seconds per item are max(l, d); minimise over a 1% grid.
        let best = (0..=100u32)
            .min_by(|&a, &b| {
                let f = |p: u32| l.at(p as f64 / 100.0).max(d.at(p as f64 / 100.0));
                f(a).total_cmp(&f(b))
            })
            .expect("non-empty grid");
        Ratio {
            compressed: 100 - best,
            raw: best,
        }
    });
    Ok(Profile {
        probes,
        chosen: tenths(best.1),
        fitted,
        lines,
    })
}

/// Runs the whole profiler: probe sample, search, and nothing written besides the scratch folder.
pub fn profile(
    sources: &[SourceItem],
    decoders: &[(&str, &dyn Decoder)],
    cfg: &ProfileConfig,
    on_probe: impl FnMut(&Probe),
) -> Result<Profile> {
    let set = ProbeSet::build(sources, decoders, cfg)?;
    search(&set, decoders, cfg, on_probe)
}

/// Writes the multi-format dataset: `ratio.raw_share()` of the items, picked at random with `seed`, are
/// decoded and stored raw; the rest keep their compressed bytes. Sources keep their order on disk.
pub fn write_dataset(
    sources: &[SourceItem],
    decoders: &[(&str, &dyn Decoder)],
    ratio: Ratio,
    seed: u64,
    out_dir: &Path,
) -> Result<Manifest> {
    if sources.is_empty() {
        return Err(Error::EmptyDataset);
    }
    let n_raw = (sources.len() as f64 * ratio.raw_share()).round() as usize;
    let mut perm: Vec<usize> = (0..sources.len()).collect();
    SplitMix64::keyed(seed, stream::CONVERT, 0).shuffle(&mut perm);
    let mut is_raw = vec![false; sources.len()];
    for &i in &perm[..n_raw] {
        is_raw[i] = true;
    }
    let mut formats: Vec<FormatSpec> = Vec::new();
    for (s, raw) in sources.iter().zip(&is_raw) {
        if !raw && !formats.iter().any(|f| f.tag == s.tag) {
            formats.push(FormatSpec {
                tag: s.tag.clone(),
                kind: FormatKind::Compressed,
            });
        }
    }
    let raw_index = formats.len() as u16;
    if n_raw > 0 {
        formats.push(FormatSpec {
            tag: "raw".into(),
            kind: FormatKind::Raw,
        });
    }
    let mut w = DatasetWriter::create(out_dir, seed, ratio, formats.clone())?;
    let mut pixels = Vec::new();
    for (s, &raw) in sources.iter().zip(&is_raw) {
        let bytes = read_file(&s.path, MAX_SOURCE_BYTES)?;
        let dec = find_decoder(decoders, &s.tag, &s.path)?;
        let src = |reason| Error::Source {
            path: s.path.clone(),
            reason,
        };
        if raw {
            let dims = dec.decode(&bytes, &mut pixels).map_err(src)?;
            w.add(s.id, s.label, raw_index, &pixels, dims)?;
        } else {
            let dims = dec.dims(&bytes).map_err(src)?;
            let f = formats
                .iter()
                .position(|f| f.tag == s.tag)
                .expect("listed above") as u16;
            w.add(s.id, s.label, f, &bytes, dims)?;
        }
    }
    w.finish()
}
