//! `cargo xtask bench liquid`: the Liquid profiler's probes and chosen ratio, and end-to-end throughput,
//! per-batch disk traffic and hit ratio of (a) one format through a budget-limited page cache, (b) a
//! CoorDL-style static cache and (c) Liquid, on datasets made from ../shared/corpus (PNG + raw, L3 + raw).
//!
//! `L3_BENCH_QUICK=1` makes fewer items and shorter measurements.

use crate::report::{Report, Series, Table, bench_dir, corpus_dir, line_plot};
use anyhow::{Context, bail};
use liquid_sampler::direct::{AlignedBuf, DirectFile, drop_page_cache};
use liquid_sampler::manifest::Location;
use liquid_sampler::profile::{self, Decoder, ProbeSet, ProfileConfig, SourceItem};
use liquid_sampler::{Dataset, Dims, FormatKind, Item, LiquidSampler, Ratio, SamplerConfig};
use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const W: u32 = 1280;
const H: u32 = 720;

/// The loader's decoder for a manifest tag (the one adapter the toolkit has).
fn decoder(tag: &str) -> &'static dyn Decoder {
    loader::convert::liquid_decoders()
        .into_iter()
        .find(|(t, _)| *t == tag)
        .map(|(_, d)| d)
        .expect("png and l3 have decoders")
}

/// Cuts `variants` 1280x720 windows (some mirrored) from each corpus image scaled to 1920 wide, and writes
/// each as PNG and as L3 (same pixels).
fn make_items(
    variants: u32,
    png_dir: &Path,
    l3_dir: &Path,
    threads: usize,
) -> anyhow::Result<usize> {
    let dir = corpus_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        bail!("no images in {}", dir.display());
    }
    std::fs::create_dir_all(png_dir)?;
    std::fs::create_dir_all(l3_dir)?;
    stdx::parallel::for_each(
        paths.iter().enumerate(),
        threads,
        |(i, p)| -> anyhow::Result<()> {
            let img = loader::import(p, &loader::ImportOptions::default())?.to_rgb();
            let img = image::RgbImage::from_raw(img.width, img.height, img.pixels)
                .context("image size")?;
            let h = (img.height() as u64 * 1920 / img.width() as u64).max(H as u64) as u32;
            let img = image::imageops::resize(&img, 1920, h, image::imageops::FilterType::Triangle);
            for v in 0..variants {
                let x = (1920 - W) * (v % 4) / 3;
                let y = (h - H) * (v / 4 % 3) / 2;
                let mut tile = image::imageops::crop_imm(&img, x, y, W, H).to_image();
                if v % 2 == 1 {
                    image::imageops::flip_horizontal_in_place(&mut tile);
                }
                let stem = format!("{:02}-{v:02}", i);
                tile.save(png_dir.join(format!("{stem}.png")))?;
                let l3 =
                    l3_format::encode(tile.as_raw(), W, H, 3, l3_format::default_patch_size(W, H))
                        .map_err(|e| anyhow::anyhow!("L3 encode: {e}"))?;
                std::fs::write(l3_dir.join(format!("{stem}.l3")), l3)?;
            }
            Ok(())
        },
    )?;
    Ok(paths.len() * variants as usize)
}

fn sources(dir: &Path, tag: &str) -> anyhow::Result<Vec<SourceItem>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    Ok(paths
        .into_iter()
        .enumerate()
        .map(|(i, path)| SourceItem {
            id: i as u64,
            label: (i % 18) as u32,
            path,
            tag: tag.into(),
        })
        .collect())
}

/// Bytes handed to the decode stage.
enum Bytes {
    Aligned(Arc<AlignedBuf>),
    Plain(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Aligned(b) => b,
            Bytes::Plain(v) => v,
        }
    }
}

struct Fetched {
    epoch: usize,
    items: Vec<(Bytes, FormatKind, Dims)>,
    disk_bytes: u64,
    hits: usize,
}

#[derive(Default)]
struct Stats {
    images: usize,
    secs: f64,
    later_images: usize,
    later_secs: f64,
    later_hits: usize,
    /// Disk bytes of every batch (all epochs), and of the batches after the first epoch.
    disk_all: Vec<u64>,
    disk_later: Vec<u64>,
}

/// A producer thread fetches batches (reads), this thread decodes each on `threads` threads.
fn pipeline(
    batches: usize,
    batch: usize,
    threads: usize,
    compressed: &dyn Decoder,
    mut fetch: impl FnMut() -> anyhow::Result<Fetched> + Send,
) -> anyhow::Result<Stats> {
    let (tx, rx) = crossbeam_channel::bounded::<anyhow::Result<Fetched>>(2);
    let mut st = Stats::default();
    let start = Instant::now();
    let mut later_start = None;
    std::thread::scope(|s| -> anyhow::Result<()> {
        s.spawn(move || {
            for _ in 0..batches {
                let r = fetch();
                let stop = r.is_err();
                if tx.send(r).is_err() || stop {
                    break;
                }
            }
        });
        for _ in 0..batches {
            let b = rx.recv().context("fetch thread stopped")??;
            if b.epoch > 0 && later_start.is_none() {
                later_start = Some(Instant::now());
            }
            thread_local! {
                static OUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            stdx::parallel::for_each(&b.items, threads, |(bytes, kind, dims)| {
                OUT.with_borrow_mut(|out| match kind {
                    FormatKind::Raw => profile::decode_raw(bytes, *dims, out),
                    FormatKind::Compressed => compressed.decode(bytes, out).map(|_| ()),
                })
                .map_err(|e| anyhow::anyhow!("decode: {e}"))
            })?;
            st.images += b.items.len();
            st.disk_all.push(b.disk_bytes);
            if b.epoch > 0 {
                st.later_images += b.items.len();
                st.later_hits += b.hits;
                // Short last batches of an epoch would add size noise, not sampling noise.
                if b.items.len() == batch {
                    st.disk_later.push(b.disk_bytes);
                }
            }
        }
        Ok(())
    })?;
    st.secs = start.elapsed().as_secs_f64();
    st.later_secs = later_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(st)
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    stdx::SplitMix64::new(seed).shuffle(&mut v);
    v
}

/// Random-order batches over a single-format dataset, one item list per epoch.
fn epoch_batches(n: usize, batch: usize, epochs: usize) -> Vec<(usize, Vec<usize>)> {
    let mut out = Vec::new();
    for e in 0..epochs {
        let order = shuffled(n, 1000 + e as u64);
        for c in order.chunks(batch) {
            out.push((e, c.to_vec()));
        }
    }
    out
}

/// Reads `idx`'s items on two threads with `read(item) -> (bytes, disk_bytes, hit)`.
fn read_parallel(
    idx: &[usize],
    read: &(dyn Fn(usize) -> anyhow::Result<(Bytes, u64, bool)> + Sync),
) -> anyhow::Result<Vec<(Bytes, u64, bool)>> {
    stdx::parallel::map(idx, 2, |_, &i| read(i))
}

/// A dataset's data files, each dropped from the page cache, with readahead off (`POSIX_FADV_RANDOM`, so
/// that only items actually read enter the cache) and mapped read-only so that `mincore` can tell which of
/// their pages are resident; unmapped when dropped.
struct ColdFiles {
    files: Vec<std::fs::File>,
    /// Address and length of each file's mapping.
    maps: Vec<(usize, usize)>,
}

impl ColdFiles {
    fn open(ds: &Dataset) -> anyhow::Result<ColdFiles> {
        let files: Vec<std::fs::File> = (0..ds.manifest.files.len() as u32)
            .map(|f| std::fs::File::open(ds.path_of(f)))
            .collect::<Result<_, _>>()?;
        let mut cold = ColdFiles {
            files,
            maps: Vec::new(),
        };
        for (f, file) in cold.files.iter().enumerate() {
            drop_page_cache(&ds.path_of(f as u32))?;
            // SAFETY: plain syscalls on an open descriptor; the mapping is read-only and unmapped on drop.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
                let len = file.metadata()?.len() as usize;
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                );
                if p == libc::MAP_FAILED {
                    bail!("mmap {}", ds.path_of(f as u32).display());
                }
                cold.maps.push((p as usize, len));
            }
        }
        Ok(cold)
    }

    /// The bytes of `l` whose pages are in the page cache.
    fn resident_bytes(&self, l: Location) -> u64 {
        let (base, _) = self.maps[l.file as usize];
        let pages = l.length.div_ceil(4096) as usize;
        let mut v = vec![0u8; pages];
        // SAFETY: the range lies inside the mapping (the manifest was validated against the file).
        let rc = unsafe {
            libc::mincore(
                (base + l.offset as usize) as *mut libc::c_void,
                l.length as usize,
                v.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return 0;
        }
        (v.iter().filter(|&&b| b & 1 == 1).count() as u64 * 4096).min(l.length)
    }

    /// Reads `l`: its bytes, the bytes that came from disk, and whether all of it was cached.
    fn read(&self, l: Location) -> anyhow::Result<(Bytes, u64, bool)> {
        let cached = self.resident_bytes(l);
        let mut v = vec![0u8; l.length as usize];
        self.files[l.file as usize].read_exact_at(&mut v, l.offset)?;
        Ok((Bytes::Plain(v), l.length - cached, cached == l.length))
    }

    /// Drops `l`'s pages from the page cache.
    fn evict(&self, l: Location) {
        // SAFETY: plain syscall; failure only leaves pages cached.
        unsafe {
            libc::posix_fadvise(
                self.files[l.file as usize].as_raw_fd(),
                l.offset as i64,
                (l.length.div_ceil(4096) * 4096) as i64,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
}

impl Drop for ColdFiles {
    fn drop(&mut self) {
        for &(p, len) in &self.maps {
            // SAFETY: unmapping what `open` mapped.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

/// The page cache held to a byte budget: the items read, least recently read first, and the page bytes
/// each keeps cached.
struct Lru {
    budget: u64,
    order: VecDeque<usize>,
    in_cache: HashMap<usize, u64>,
    cached_bytes: u64,
}

impl Lru {
    fn new(budget: u64) -> Lru {
        Lru {
            budget,
            order: VecDeque::new(),
            in_cache: HashMap::new(),
            cached_bytes: 0,
        }
    }

    /// Marks the batch `idx` as the most recently read, then evicts the least recently read items until
    /// the cache is within the budget.
    fn read_batch(&mut self, idx: &[usize], items: &[Item], files: &ColdFiles) {
        for &i in idx {
            if let Some(pos) = self.order.iter().position(|&x| x == i) {
                self.order.remove(pos);
            } else {
                let b = items[i].location.length.div_ceil(4096) * 4096;
                self.in_cache.insert(i, b);
                self.cached_bytes += b;
            }
            self.order.push_back(i);
        }
        while self.cached_bytes > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            files.evict(items[old].location);
            self.cached_bytes -= self.in_cache.remove(&old).unwrap_or(0);
        }
    }
}

/// (a) Random order through the page cache, which is held to `budget` bytes: after each batch the least
/// recently read items beyond the budget are dropped with `posix_fadvise(DONTNEED)`; readahead is off
/// (`POSIX_FADV_RANDOM`) so only items actually read enter the cache. A read's disk bytes are the pages
/// `mincore` did not find resident just before it.
fn page_cache_run(
    ds: &Dataset,
    budget: u64,
    batch: usize,
    epochs: usize,
    threads: usize,
    dec: &dyn Decoder,
) -> anyhow::Result<Stats> {
    let m = &ds.manifest;
    let files = ColdFiles::open(ds)?;
    let read = |i: usize| files.read(m.items[i].location);
    let plan = epoch_batches(m.items.len(), batch, epochs);
    let mut lru = Lru::new(budget);
    let mut k = 0;
    pipeline(plan.len(), batch, threads, dec, || {
        let (epoch, idx) = &plan[k];
        k += 1;
        let got = read_parallel(idx, &read)?;
        lru.read_batch(idx, &m.items, &files);
        let disk_bytes = got.iter().map(|g| g.1).sum();
        let hits = got.iter().filter(|g| g.2).count();
        let kind = FormatKind::Compressed;
        let items = got
            .into_iter()
            .zip(idx.iter())
            .map(|(g, &i)| (g.0, kind, m.items[i].dims))
            .collect();
        Ok(Fetched {
            epoch: *epoch,
            items,
            disk_bytes,
            hits,
        })
    })
}

/// (b) CoorDL-style: items read with O_DIRECT in random order; the first epoch keeps items in memory, in
/// the order they arrive, until the budget is full, and never evicts them.
fn static_cache_run(
    ds: &Dataset,
    budget: u64,
    batch: usize,
    epochs: usize,
    threads: usize,
    dec: &dyn Decoder,
) -> anyhow::Result<Stats> {
    let m = &ds.manifest;
    let files: Vec<DirectFile> = (0..m.files.len() as u32)
        .map(|f| DirectFile::open(&ds.path_of(f)))
        .collect::<Result<_, _>>()?;
    let cache: std::sync::RwLock<HashMap<usize, Arc<AlignedBuf>>> = Default::default();
    let read = |i: usize| -> anyhow::Result<(Bytes, u64, bool)> {
        if let Some(b) = cache.read().unwrap().get(&i) {
            return Ok((Bytes::Aligned(Arc::clone(b)), 0, true));
        }
        let l = m.items[i].location;
        let mut buf = AlignedBuf::with_capacity(l.length as usize);
        files[l.file as usize].read_into(l.offset, l.length, &mut buf)?;
        Ok((Bytes::Aligned(Arc::new(buf)), l.length, false))
    };
    let plan = epoch_batches(m.items.len(), batch, epochs);
    let mut cached_bytes = 0u64;
    let mut k = 0;
    pipeline(plan.len(), batch, threads, dec, || {
        let (epoch, idx) = &plan[k];
        k += 1;
        let got = read_parallel(idx, &read)?;
        let mut items = Vec::with_capacity(idx.len());
        let (mut disk_bytes, mut hits) = (0, 0);
        for (g, &i) in got.into_iter().zip(idx.iter()) {
            disk_bytes += g.1;
            hits += g.2 as usize;
            if *epoch == 0
                && let Bytes::Aligned(b) = &g.0
            {
                let size = b.capacity() as u64;
                if cached_bytes + size <= budget {
                    cached_bytes += size;
                    cache.write().unwrap().insert(i, Arc::clone(b));
                }
            }
            items.push((g.0, FormatKind::Compressed, m.items[i].dims));
        }
        Ok(Fetched {
            epoch: *epoch,
            items,
            disk_bytes,
            hits,
        })
    })
}

/// (c) Liquid: two-region shuffle buffers in `budget` bytes over the multi-format dataset.
fn liquid_run(
    ds: &Dataset,
    budget: u64,
    batch: usize,
    epochs: usize,
    threads: usize,
    dec: &dyn Decoder,
) -> anyhow::Result<Stats> {
    let mut cfg = SamplerConfig::new(budget, batch);
    cfg.seed = 5;
    let mut s = LiquidSampler::new(ds.clone(), &cfg)?;
    let kinds: Vec<FormatKind> = ds.manifest.formats.iter().map(|f| f.kind).collect();
    let n = epochs * s.batches_per_epoch();
    pipeline(n, batch, threads, dec, || {
        let b = s.next_batch()?;
        let hits = b.items.iter().filter(|d| d.cached).count();
        Ok(Fetched {
            epoch: b.epoch,
            items: b
                .items
                .into_iter()
                .map(|d| (kinds[d.item.format as usize], d.item.dims, d.bytes))
                .map(|(k, dims, bytes)| (Bytes::Aligned(bytes), k, dims))
                .collect(),
            disk_bytes: b.disk_bytes,
            hits,
        })
    })
}

fn mean_std(v: &[u64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n;
    (m, var.sqrt())
}

fn mb(x: f64) -> String {
    format!("{:.2}", x / 1e6)
}

struct Setup {
    threads: usize,
    quick: bool,
    batch: usize,
    epochs: usize,
}

/// One format of the comparison: its manifest tag, its name in the tables and its decoder.
struct Format<'a> {
    tag: &'a str,
    name: &'a str,
    dec: &'a dyn Decoder,
}

impl Format<'_> {
    /// The profiler's and the dataset writer's decoder list: this format alone (raw needs none).
    fn decs(&self) -> [(&str, &dyn Decoder); 1] {
        [(self.tag, self.dec)]
    }
}

/// One format against raw: the profiler's probes and ratio, the chosen against the fitted ratio, then the
/// page cache, the static cache and Liquid end to end.
fn run_format(
    r: &mut Report,
    f: &Format,
    src: &Path,
    work: &Path,
    su: &Setup,
) -> anyhow::Result<()> {
    let srcs = sources(src, f.tag)?;
    let decs = f.decs();
    let cfg = ProfileConfig {
        threads: su.threads,
        io_threads: 2,
        seed: 1,
        probe_items: if su.quick { 12 } else { 32 },
        min_time: Duration::from_millis(if su.quick { 100 } else { 400 }),
        scratch: work.to_path_buf(),
        bandwidth: None,
    };
    let set = ProbeSet::build(&srcs, &decs, &cfg)?;
    let prof = profile::search(&set, &decs, &cfg, |_| {})?;
    let fitted = prof.fitted.unwrap_or(prof.chosen);
    report_probes(r, f.name, &set, &prof, fitted, su.threads);
    // Does the finer ratio help? Re-measure both, interleaved, three times.
    let mut acc = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (k, ratio) in [prof.chosen, fitted].into_iter().enumerate() {
            acc[k].push(set.measure(ratio, &decs, &cfg)?.pipeline_ips());
        }
    }
    drop(set);
    let dsets = Datasets::write(&srcs, f, work, prof.chosen, fitted)?;
    let budget = dsets.single.item_bytes() * 3 / 10;
    let runs = run_systems(f, &dsets, prof.chosen, fitted, budget, su)?;
    report_fitted(
        r,
        f.name,
        prof.chosen,
        fitted,
        &acc,
        &runs,
        dsets.fit.is_some(),
    );
    report_end_to_end(r, f, su, budget, &dsets, &runs);
    dsets.remove_dirs();
    Ok(())
}

/// The probes in the order the search made them, and the ratio it chose against the fitted crossing.
fn report_probes(
    r: &mut Report,
    name: &str,
    set: &ProbeSet,
    prof: &profile::Profile,
    fitted: Ratio,
    threads: usize,
) {
    let mut t = Table::new(
        &format!(
            "{name} + raw: profiler probes in search order ({} probe items, {} decode threads, 2 I/O threads, O_DIRECT)",
            set.len(),
            threads
        ),
        &[
            "#",
            &format!("ratio {name}:raw"),
            "load images/s",
            "load MB/s",
            "decode images/s",
            "pipeline images/s",
            "slower stage",
        ],
    );
    for (i, p) in prof.probes.iter().enumerate() {
        t.row(vec![
            (i + 1).to_string(),
            p.ratio.to_string(),
            format!("{:.1}", p.load_ips),
            format!("{:.0}", p.load_mbps),
            format!("{:.1}", p.decode_ips),
            format!("{:.1}", p.pipeline_ips()),
            if p.load_bound() { "load" } else { "decode" }.into(),
        ]);
    }
    r.table(&t);
    r.para(&format!(
        "Binary search chose **{} ({name}:raw)**; the lines fitted through the probes' per-item load and decode times cross at **{fitted}**{}.",
        prof.chosen,
        prof.lines.map_or(String::new(), |(l, d)| format!(
            " (load s/item = {:.2e} + {:.2e}·raw share, decode s/item = {:.2e} + {:.2e}·raw share)",
            l.a, l.b, d.a, d.b
        ))
    ));
}

/// The single-format original and the multi-format dataset(s) the systems read, in folders under `work`.
struct Datasets {
    /// The single-format, chosen-ratio and fitted-ratio folders.
    dirs: [PathBuf; 3],
    single: Dataset,
    liquid: Dataset,
    /// At the fitted ratio, when it is at least 2 % of raw share away from the chosen one.
    fit: Option<Dataset>,
}

impl Datasets {
    fn write(
        srcs: &[SourceItem],
        f: &Format,
        work: &Path,
        chosen: Ratio,
        fitted: Ratio,
    ) -> anyhow::Result<Datasets> {
        let decs = f.decs();
        let tag = f.tag;
        let single_dir = work.join(format!("{tag}-single"));
        let liquid_dir = work.join(format!("{tag}-liquid"));
        let fit_dir = work.join(format!("{tag}-fitted"));
        profile::write_dataset(
            srcs,
            &decs,
            Ratio {
                compressed: 10,
                raw: 0,
            },
            1,
            &single_dir,
        )?;
        profile::write_dataset(srcs, &decs, chosen, 1, &liquid_dir)?;
        let single = Dataset::open(&single_dir)?;
        let liquid = Dataset::open(&liquid_dir)?;
        let fit_differs = (fitted.raw_share() - chosen.raw_share()).abs() >= 0.02;
        let fit = if fit_differs {
            profile::write_dataset(srcs, &decs, fitted, 1, &fit_dir)?;
            Some(Dataset::open(&fit_dir)?)
        } else {
            None
        };
        Ok(Datasets {
            dirs: [single_dir, liquid_dir, fit_dir],
            single,
            liquid,
            fit,
        })
    }

    fn remove_dirs(&self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// One system's end-to-end run: its label, the dataset it read and what it measured.
type SystemRun<'a> = (String, &'a Dataset, Stats);

/// (a) the page cache, (b) the static cache and (c) Liquid (and (c') at the fitted ratio), each in
/// `budget` bytes.
fn run_systems<'a>(
    f: &Format,
    dsets: &'a Datasets,
    chosen: Ratio,
    fitted: Ratio,
    budget: u64,
    su: &Setup,
) -> anyhow::Result<Vec<SystemRun<'a>>> {
    let (name, dec) = (f.name, f.dec);
    let (b, e) = (su.batch, su.epochs);
    let (single, liquid) = (&dsets.single, &dsets.liquid);
    let mut v = Vec::new();
    v.push((
        format!("(a) {name} only, page cache ≤ budget (LRU via fadvise), random order"),
        single,
        page_cache_run(single, budget, b, e, su.threads, dec)?,
    ));
    v.push((
        format!("(b) {name} only, CoorDL-style static cache, O_DIRECT"),
        single,
        static_cache_run(single, budget, b, e, su.threads, dec)?,
    ));
    v.push((
        format!("(c) Liquid {chosen} ({name}:raw), O_DIRECT"),
        liquid,
        liquid_run(liquid, budget, b, e, su.threads, dec)?,
    ));
    if let Some(ds) = &dsets.fit {
        v.push((
            format!("(c') Liquid {fitted} fitted ({name}:raw), O_DIRECT"),
            ds,
            liquid_run(ds, budget, b, e, su.threads, dec)?,
        ));
    }
    Ok(v)
}

/// The paper's tenths against the fitted crossing: probe-set throughput of each (`acc`), and end to end.
fn report_fitted(
    r: &mut Report,
    name: &str,
    chosen: Ratio,
    fitted: Ratio,
    acc: &[Vec<f64>; 2],
    runs: &[SystemRun],
    fit_differs: bool,
) {
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let spread = |v: &[f64]| {
        v.iter().cloned().fold(f64::MIN, f64::max) - v.iter().cloned().fold(f64::MAX, f64::min)
    };
    let mut fit_t = Table::new(
        &format!(
            "{name} + raw: paper's tenths vs fitted crossing (probe set, mean of 3 interleaved measurements)"
        ),
        &[
            "ratio",
            "pipeline images/s (probe)",
            "spread",
            "end-to-end images/s after epoch 1",
        ],
    );
    let e2e = |label: &str| {
        runs.iter()
            .find(|r| r.0.starts_with(label))
            .map_or("same dataset as (c)".to_string(), |r| {
                format!("{:.1}", r.2.later_images as f64 / r.2.later_secs.max(1e-9))
            })
    };
    fit_t.row(vec![
        format!("{chosen} (binary search)"),
        format!("{:.1}", avg(&acc[0])),
        format!("{:.1}", spread(&acc[0])),
        e2e("(c)"),
    ]);
    fit_t.row(vec![
        format!("{fitted} (fitted)"),
        format!("{:.1}", avg(&acc[1])),
        format!("{:.1}", spread(&acc[1])),
        if fit_differs {
            e2e("(c')")
        } else {
            "within 2% of (c): not rebuilt".into()
        },
    ]);
    r.table(&fit_t);
}

/// Every system end to end: throughput, disk bytes per batch and hit ratio, and the disk bytes plotted per
/// batch.
fn report_end_to_end(
    r: &mut Report,
    f: &Format,
    su: &Setup,
    budget: u64,
    dsets: &Datasets,
    runs: &[SystemRun],
) {
    let (tag, name) = (f.tag, f.name);
    let (b, e) = (su.batch, su.epochs);
    let mut t = Table::new(
        &format!(
            "{name}: end to end, batch {b}, {e} epochs, budget {} MB = 30% of the {name} dataset ({} MB; multi-format dataset {} MB), {} decode threads",
            mb(budget as f64),
            mb(dsets.single.item_bytes() as f64),
            mb(dsets.liquid.item_bytes() as f64),
            su.threads
        ),
        &[
            "system",
            "items",
            "images/s (all epochs)",
            "images/s (after epoch 1)",
            "disk MB/batch mean (full batches after epoch 1)",
            "std",
            "std/mean",
            "hit ratio (after epoch 1)",
        ],
    );
    let mut series = Vec::new();
    for (label, ds, st) in runs {
        let (m, s) = mean_std(&st.disk_later);
        t.row(vec![
            label.clone(),
            ds.manifest.items.len().to_string(),
            format!("{:.1}", st.images as f64 / st.secs),
            format!("{:.1}", st.later_images as f64 / st.later_secs.max(1e-9)),
            mb(m),
            mb(s),
            format!("{:.2}", if m > 0.0 { s / m } else { 0.0 }),
            format!(
                "{:.3}",
                st.later_hits as f64 / st.later_images.max(1) as f64
            ),
        ]);
        series.push(Series {
            name: label.split(' ').next().unwrap_or("").to_string(),
            points: st
                .disk_all
                .iter()
                .enumerate()
                .map(|(i, &d)| (i as f64, d as f64 / 1e6))
                .collect(),
        });
    }
    r.table(&t);
    r.svg(
        &format!("{tag}-disk-per-batch"),
        line_plot(
            &format!("{name}: disk MB read per batch"),
            "batch (all epochs)",
            "MB",
            &series,
        ),
    );
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some_and(|v| v != "0");
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let su = Setup {
        threads,
        quick,
        batch: if quick { 8 } else { 16 },
        epochs: 3,
    };
    let variants = if quick { 3 } else { 6 };
    let work = bench_dir().join("liquid-work");
    let _ = std::fs::remove_dir_all(&work);
    let (png_dir, l3_dir) = (work.join("src-png"), work.join("src-l3"));
    let t0 = Instant::now();
    let n = make_items(variants, &png_dir, &l3_dir, threads)?;
    r.para(&format!(
        "Dataset: {n} items of {W}x{H} RGB, {variants} windows (alternate ones mirrored) cut from each of the 18 corpus \
         images scaled to 1920 wide — downscaled from the originals to make more items. The same pixels are stored \
         as PNG (image crate, default settings) and as L3 (default patch size); made in {:.0} s. Raw items are the \
         decoded RGB bytes (2.76 MB each).",
        t0.elapsed().as_secs_f64()
    ));
    r.para(
        "Keeping the page cache from holding the dataset: Liquid and the static cache read with O_DIRECT into \
         4096-aligned buffers (the tests check with mincore that an epoch leaves no pages cached); the probes read \
         the same way. Baseline (a) reads through the page cache but holds it to the same byte budget: \
         readahead is disabled with POSIX_FADV_RANDOM, and after each batch the least recently read items beyond \
         the budget are dropped with posix_fadvise(DONTNEED) — an LRU page cache of the budget's size; its disk \
         bytes are the pages mincore did not find resident before each read. All files start cold \
         (DONTNEED on the whole file). Every system decodes on the same threads with the same decoders; \
         reading runs on 2 I/O threads ahead of decoding (two batches of prefetch for (a) and (b), the buffers for Liquid).",
    );
    let png = Format {
        tag: "png",
        name: "PNG",
        dec: decoder("png"),
    };
    let l3 = Format {
        tag: "l3",
        name: "L3",
        dec: decoder("l3"),
    };
    run_format(r, &png, &png_dir, &work, &su)?;
    run_format(r, &l3, &l3_dir, &work, &su)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
