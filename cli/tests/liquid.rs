//! `l3 liquid profile` and `l3 stream --sampler liquid` end to end on real image tiles, with the
//! sampler's invariants checked from the `--trace` and `--batch-log` files alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn l3() -> Command {
    Command::new(env!("CARGO_BIN_EXE_l3"))
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus")
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-liquid-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// 36 PNG tiles cut from two corpus images, in two class folders.
fn make_images(dir: &Path) {
    for (class, file) in [("a", "Dune.jpg"), ("b", "Storm.jpg")] {
        let img = image::open(corpus().join(file))
            .expect("corpus image")
            .into_rgb8();
        let sub = dir.join(class);
        std::fs::create_dir_all(&sub).unwrap();
        for k in 0..18u32 {
            let (x, y) = (k % 6 * 200, k / 6 * 300);
            let tile = image::imageops::crop_imm(&img, x, y, 96, 64).to_image();
            tile.save(sub.join(format!("{k:02}.png"))).unwrap();
        }
    }
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{so}\n{se}");
    so.into_owned()
}

fn fail(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{cmd:?} should fail");
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(se.trim_end().lines().count(), 1, "one error line: {se}");
    se
}

fn csv(path: &Path, header: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header), "{}", path.display());
    lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// (epoch, batch) -> [(item, format, cached)]
type Batches = BTreeMap<(usize, usize), Vec<(u64, String, bool)>>;

struct Trace {
    batches: Batches,
    /// (epoch, batch) -> (disk_items, disk_bytes)
    log: BTreeMap<(usize, usize), (usize, u64)>,
}

fn read_trace(trace: &Path, log: &Path) -> Trace {
    let mut batches: Batches = BTreeMap::new();
    for r in csv(trace, "epoch,batch,item,format,cached") {
        let key = (r[0].parse().unwrap(), r[1].parse().unwrap());
        let cached = match r[4].as_str() {
            "0" => false,
            "1" => true,
            c => panic!("cached is {c}"),
        };
        batches
            .entry(key)
            .or_default()
            .push((r[2].parse().unwrap(), r[3].clone(), cached));
    }
    let mut l = BTreeMap::new();
    for r in csv(log, "epoch,batch,disk_items,disk_bytes,wait_ms") {
        let wait: f64 = r[4].parse().unwrap();
        assert!(wait >= 0.0);
        l.insert(
            (r[0].parse().unwrap(), r[1].parse().unwrap()),
            (r[2].parse().unwrap(), r[3].parse().unwrap()),
        );
    }
    Trace { batches, log: l }
}

/// The Liquid invariants, checked from the two files alone. Returns the hit ratio of the epochs after the first.
fn check(t: &Trace, epochs: usize, batch: usize) -> f64 {
    assert_eq!(
        t.batches.keys().collect::<Vec<_>>(),
        t.log.keys().collect::<Vec<_>>(),
        "one log line per batch"
    );
    let epoch_items = |e: usize| -> Vec<&(u64, String, bool)> {
        t.batches
            .range((e, 0)..(e + 1, 0))
            .flat_map(|(_, v)| v)
            .collect()
    };
    let all: Vec<u64> = epoch_items(0).iter().map(|x| x.0).collect();
    let n = all.len();
    let ids: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(ids.len(), n, "epoch 0 repeats an item");
    let mut share: HashMap<String, usize> = HashMap::new();
    for x in epoch_items(0) {
        *share.entry(x.1.clone()).or_default() += 1;
    }
    let mut hits = Vec::new();
    for e in 0..epochs {
        let items = epoch_items(e);
        let here: HashSet<u64> = items.iter().map(|x| x.0).collect();
        assert_eq!(
            (items.len(), &here),
            (n, &ids),
            "epoch {e}: every item exactly once"
        );
        // Per-batch mix within one item of the ratio.
        for ((_, b), v) in t.batches.range((e, 0)..(e + 1, 0)) {
            assert!(
                v.len() == batch || *b == n.div_ceil(batch) - 1,
                "only the last batch is short"
            );
            for (f, &nf) in &share {
                let m = v.iter().filter(|x| &x.1 == f).count() as f64;
                let want = v.len() as f64 * nf as f64 / n as f64;
                assert!(
                    (m - want).abs() < 1.0,
                    "epoch {e} batch {b}: {m} {f} vs {want}"
                );
            }
        }
        if e == 0 {
            assert!(
                items.iter().all(|x| !x.2),
                "nothing is cached in the first epoch"
            );
            continue;
        }
        hits.push(items.iter().filter(|x| x.2).count());
        // Disk items per full batch level within one; a batch holding a format's last draw of the epoch
        // (which may fill that format's buffer for the next one) may read fewer, never more than one over
        // the fewest. The epoch reads exactly the items not cached.
        let mut left = share.clone();
        let mut full = Vec::new();
        for (k, v) in t.batches.range((e, 0)..(e + 1, 0)) {
            let mut ends = false;
            for x in v {
                let c = left.get_mut(&x.1).unwrap();
                *c -= 1;
                ends |= *c == 0;
            }
            if v.len() == batch {
                full.push((t.log[k].0, ends));
            }
        }
        let others: Vec<usize> = full.iter().filter(|b| !b.1).map(|b| b.0).collect();
        if let (Some(&lo), Some(&hi)) = (others.iter().min(), others.iter().max()) {
            assert!(
                hi - lo <= 1 && full.iter().all(|b| b.0 <= lo + 1),
                "epoch {e}: disk items per full batch (and whether it ends a format) {full:?}"
            );
        }
        let loads: usize = t.log.range((e, 0)..(e + 1, 0)).map(|(_, v)| v.0).sum();
        assert_eq!(
            loads,
            n - hits.last().unwrap(),
            "epoch {e}: loads vs misses"
        );
    }
    // The hit ratio is the same every epoch after the first.
    assert!(
        hits.windows(2).all(|w| w[0] == w[1]),
        "hits per epoch {hits:?}"
    );
    hits.first().map_or(0.0, |&h| h as f64 / n as f64)
}

fn dataset_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn stream(
    out: &Path,
    budget: u64,
    batch: usize,
    epochs: usize,
    extra: &[&str],
    tag: &str,
) -> (Trace, String, PathBuf) {
    let dir = out.parent().unwrap().join(format!("logs-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (tp, lp) = (dir.join("trace.csv"), dir.join("batches.csv"));
    let so = ok(l3()
        .arg("stream")
        .arg(out)
        .args(["--sampler", "liquid", "--budget", &budget.to_string()])
        .args([
            "--batch",
            &batch.to_string(),
            "--epochs",
            &epochs.to_string(),
            "--threads",
            "2",
        ])
        .args(extra)
        .arg("--trace")
        .arg(&tp)
        .arg("--batch-log")
        .arg(&lp));
    (read_trace(&tp, &lp), so, tp)
}

#[test]
fn profile_then_stream_keeps_the_invariants() {
    let root = scratch("main");
    let input = root.join("in");
    make_images(&input);
    let out = root.join("out");
    let so = ok(l3()
        .args(["liquid", "profile"])
        .arg(&input)
        .arg(&out)
        .args(["--threads", "1", "--seed", "7", "--probe-ms", "20"]));
    assert!(so.contains("probe 1: ratio 5:5"), "{so}");
    assert!(so.contains("chosen ratio"), "{so}");
    assert!(so.contains("wrote"), "{so}");
    assert!(out.join("manifest.cbor").is_file());
    // A second profile into the same folder refuses to overwrite it.
    let se = fail(l3().args(["liquid", "profile"]).arg(&input).arg(&out));
    assert!(se.contains("already holds"), "{se}");

    let d = dataset_bytes(&out);
    // Buffers from one item to more than the dataset, odd batch sizes.
    let mut ratios = Vec::new();
    for (budget, batch) in [(d * 3 / 10, 5), (d / 5, 7), (d * 2, 3), (d / 2, 1)] {
        let (t, so, _) = stream(
            &out,
            budget,
            batch,
            3,
            &["--seed", "3"],
            &format!("{budget}-{batch}"),
        );
        let h = check(&t, 3, batch);
        assert!(
            so.contains("images/s") && so.contains("MB/s") && so.contains("hit ratio"),
            "{so}"
        );
        let n = t
            .batches
            .range((0, 0)..(1, 0))
            .map(|(_, v)| v.len())
            .sum::<usize>() as f64;
        // Never more hits than the budget holds; all of them when it holds everything.
        assert!(
            h <= (budget as f64 / d as f64).min(1.0) + batch as f64 / n,
            "{h} for budget {budget}"
        );
        if budget >= d {
            assert_eq!(h, 1.0);
        }
        ratios.push(h);
    }
    assert!(
        ratios[1] <= ratios[0] && ratios[0] < ratios[3],
        "hit ratio grows with the budget: {ratios:?}"
    );

    // Same seed, same sequence; another seed, another one.
    let (_, _, a) = stream(&out, d * 3 / 10, 5, 2, &["--seed", "3"], "same-a");
    let (_, _, b) = stream(&out, d * 3 / 10, 5, 2, &["--seed", "3"], "same-b");
    let (_, _, c) = stream(&out, d * 3 / 10, 5, 2, &["--seed", "4"], "other");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    assert_eq!(read(&a), read(&b));
    assert_ne!(read(&a), read(&c));

    // Two ranks: disjoint shards of equal size that cover the dataset.
    let mut union = HashSet::new();
    let mut sizes = Vec::new();
    for rank in 0..2 {
        let args = [
            "--seed",
            "3",
            "--rank",
            &rank.to_string(),
            "--world-size",
            "2",
        ];
        let (t, _, _) = stream(&out, d, 4, 2, &args, &format!("rank{rank}"));
        check(&t, 2, 4);
        let items: Vec<u64> = t
            .batches
            .range((0, 0)..(1, 0))
            .flat_map(|(_, v)| v.iter().map(|x| x.0))
            .collect();
        sizes.push(items.len());
        union.extend(items);
    }
    assert_eq!(sizes, vec![18, 18]);
    assert_eq!(union.len(), 36);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn bad_input_is_one_clear_line() {
    let root = scratch("bad");
    let input = root.join("in");
    make_images(&input);
    let out = root.join("out");
    ok(l3()
        .args(["liquid", "profile"])
        .arg(&input)
        .arg(&out)
        .args(["--threads", "1", "--probe-ms", "5"]));
    let stream = |budget: &str| {
        let mut c = l3();
        c.arg("stream")
            .arg(&out)
            .args(["--sampler", "liquid", "--budget", budget]);
        c
    };
    let se = fail(&mut stream("100"));
    assert!(se.contains("budget"), "{se}");
    let se = fail(l3().arg("stream").arg(&out).args(["--sampler", "liquid"]));
    assert!(se.contains("budget \"none\": expected bytes"), "{se}");
    let pack = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pack"))
        .unwrap();
    let len = std::fs::metadata(&pack).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&pack)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let se = fail(&mut stream("100000000"));
    assert!(
        se.contains("truncated") && se.contains(pack.file_name().unwrap().to_str().unwrap()),
        "{se}"
    );
    std::fs::remove_file(&pack).unwrap();
    let se = fail(&mut stream("100000000"));
    assert!(se.contains("missing"), "{se}");
    let se = fail(
        l3().args(["liquid", "profile"])
            .arg(root.join("nope"))
            .arg(root.join("x")),
    );
    assert!(se.contains("nope"), "{se}");
}

#[test]
fn l3_sources_profile_and_stream() {
    let root = scratch("l3");
    let input = root.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let img = image::open(corpus().join("Dune.jpg")).unwrap().into_rgb8();
    for k in 0..12u32 {
        let tile = image::imageops::crop_imm(&img, k * 100, k * 50, 80, 60).to_image();
        let l3 = l3_format::encode(tile.as_raw(), 80, 60, 3, 32).unwrap();
        std::fs::write(input.join(format!("{k:02}.l3")), l3).unwrap();
    }
    let out = root.join("out");
    let so = ok(l3()
        .args(["liquid", "profile"])
        .arg(&input)
        .arg(&out)
        .args(["--threads", "1", "--seed", "2", "--probe-ms", "5"]));
    assert!(so.contains("(l3:raw)"), "{so}");
    let (t, _, _) = stream(&out, dataset_bytes(&out) / 3, 5, 2, &[], "l3");
    check(&t, 2, 5);
    let _ = std::fs::remove_dir_all(&root);
}
