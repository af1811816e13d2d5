//! Crash consistency: `l3` writers killed with SIGKILL at points spread over their run, then re-run. No
//! reader may ever accept a partial file, and the re-run must give exactly what an uninterrupted run gives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn l3(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_l3"));
    c.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

fn run_ok(args: &[&str]) -> Duration {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    t0.elapsed()
}

/// Every file under `dir` (relative path → bytes), hidden ones included.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

fn inputs(dir: &Path, n: u32) {
    for i in 0..n {
        let class = ["a", "b", "c"][i as usize % 3];
        let p = dir.join(class).join(format!("img{i:02}.png"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let img = image::RgbImage::from_fn(480, 320, |x, y| {
            image::Rgb([
                (x * 3 + i) as u8,
                (y * 7 + x / 5) as u8,
                ((x ^ y) + i * 9) as u8,
            ])
        });
        img.save(p).unwrap();
    }
}

/// Kills `args` at `n` points spread over `full` (the uninterrupted run's time); after each kill checks
/// the output with `readable`, then re-runs to completion and compares with `want`.
fn kill_and_rerun(
    args: &[&str],
    out_dir: &Path,
    full: Duration,
    want: &BTreeMap<PathBuf, Vec<u8>>,
    readable: &dyn Fn(&Path, &[u8]) -> bool,
) {
    for k in 0..8u32 {
        let _ = std::fs::remove_dir_all(out_dir);
        let mut child = l3(args).spawn().unwrap();
        std::thread::sleep(full.mul_f64(f64::from(k) / 8.0 + 0.02));
        let _ = child.kill();
        let _ = child.wait();
        // Whatever the kill left: a final name always holds a complete, valid file.
        for (rel, bytes) in snapshot(out_dir) {
            let name = rel.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue; // temporaries and the released lock, never read as data
            }
            assert!(
                readable(&rel, &bytes),
                "kill {k}: {} is partial",
                rel.display()
            );
        }
        run_ok(args);
        let got = snapshot(out_dir);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "kill {k}: the re-run left other files"
        );
        assert!(
            got == *want,
            "kill {k}: the re-run's files differ from an uninterrupted run"
        );
    }
}

#[test]
fn convert_killed_anywhere_then_rerun_equals_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    inputs(&data, 24);
    for to in ["l3", "raw"] {
        let out_dir = tmp.path().join(format!("out-{to}"));
        let args = [
            "convert",
            "--to",
            to,
            "--threads",
            "2",
            data.to_str().unwrap(),
            out_dir.to_str().unwrap(),
        ];
        let full = run_ok(&args);
        let want = snapshot(&out_dir);
        assert_eq!(want.len(), 24);
        let readable = |rel: &Path, bytes: &[u8]| match rel.extension().and_then(|e| e.to_str()) {
            Some("l3") => l3_format::L3File::parse(bytes)
                .and_then(|f| {
                    let mut px = vec![0u8; f.decoded_len()];
                    f.decode_hwc(&mut px)
                })
                .is_ok(),
            _ => loader::decode(
                loader::Format::Raw,
                bytes,
                rel,
                &mut loader::Image::default(),
            )
            .is_ok(),
        };
        kill_and_rerun(&args, &out_dir, full, &want, &readable);
    }
}

/// `(epoch, batch, item)` of each line of a `--trace` file (a file cut by a kill may end mid-line: that
/// line was never flushed whole, so it is left out).
fn trace_rows(path: &Path) -> Vec<(usize, usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            if c.len() != 5 {
                return None;
            }
            Some((c[0].parse().ok()?, c[1].parse().ok()?, c[2].to_string()))
        })
        .collect()
}

/// `l3 stream --state-file` killed with SIGKILL at points spread over its run, then `--resume FILE`: the
/// batches before the saved state plus the resumed run deliver every item of every epoch exactly once.
#[test]
fn stream_killed_anywhere_resumes_from_its_state_file_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("in");
    inputs(&data, 30);
    let epochs = 2;
    let stream = |extra: &[&str], trace: &Path| {
        let mut args = vec![
            "stream",
            data.to_str().unwrap(),
            "--batch",
            "4",
            "--size",
            "32",
            "--threads",
            "2",
            "--seed",
            "11",
            "--epochs",
            "2",
            "--step-ms",
            "15",
            "--trace",
            trace.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        l3(&args)
    };
    let state = tmp.path().join("state.txt");
    let s = state.to_str().unwrap();
    let full = {
        let t0 = Instant::now();
        let status = stream(&["--state-file", s], &tmp.path().join("full.csv"))
            .status()
            .unwrap();
        assert!(status.success());
        t0.elapsed()
    };
    let saved = std::fs::read_to_string(&state).unwrap();
    assert!(
        saved.starts_with(&format!("{{\"epoch\":{epochs},\"batch\":0,")),
        "{saved}"
    );
    for k in 1..=4u32 {
        let _ = std::fs::remove_file(&state);
        let (first, second) = (
            tmp.path().join(format!("a{k}.csv")),
            tmp.path().join(format!("b{k}.csv")),
        );
        let mut child = stream(&["--state-file", s, "--state-every", "2"], &first)
            .spawn()
            .unwrap();
        std::thread::sleep(full * k / 5);
        let _ = child.kill();
        child.wait().unwrap();
        // The state: whole or absent (killed before the first write: resume from the start).
        let (at_epoch, at_batch, resumed) = match std::fs::read_to_string(&state) {
            Ok(text) => {
                // One line of JSON whose numbers end at a comma: `{"epoch":1,"batch":4,...}`.
                let field = |name: &str| -> usize {
                    text.split_once(&format!("\"{name}\":"))
                        .and_then(|(_, v)| v.split(',').next())
                        .unwrap_or_else(|| panic!("kill {k}: no {name} in {text:?}"))
                        .parse()
                        .unwrap()
                };
                (
                    field("epoch"),
                    field("batch"),
                    stream(&["--resume", s], &second),
                )
            }
            Err(_) => (0, 0, stream(&[], &second)),
        };
        let mut resumed = resumed;
        assert!(
            resumed.status().unwrap().success(),
            "kill {k}: the resumed run failed"
        );
        let mut seen: BTreeMap<(usize, String), usize> = BTreeMap::new();
        let before = trace_rows(&first)
            .into_iter()
            .filter(|&(e, b, _)| (e, b) < (at_epoch, at_batch));
        for (e, _, item) in before.chain(trace_rows(&second)) {
            *seen.entry((e, item)).or_default() += 1;
        }
        assert_eq!(
            seen.len(),
            30 * epochs,
            "kill {k} at epoch {at_epoch} batch {at_batch}: items missing"
        );
        assert!(
            seen.values().all(|&n| n == 1),
            "kill {k}: items delivered twice: {seen:?}"
        );
    }

    // A state resumed with options that change what the batches hold: refused, naming the option.
    let out = Command::new(env!("CARGO_BIN_EXE_l3"))
        .args([
            "stream",
            data.to_str().unwrap(),
            "--batch",
            "4",
            "--size",
            "48",
            "--seed",
            "11",
        ])
        .args(["--epochs", "2", "--max-batches", "1", "--resume", s])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("crop"), "{err}");

    // --resume names a file that is not there, or holds no state: said, not guessed.
    let out = Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(["stream", data.to_str().unwrap(), "--resume"])
        .arg(tmp.path().join("missing.txt"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("missing.txt"),
        "{err}"
    );
}

/// What a killed `--state-file` writer left (its temporary) is removed by the next run that writes the
/// same state file; a state file that cannot be written is refused before any batch, not at the first
/// checkpoint after the work.
#[test]
fn state_file_leftovers_are_removed_and_an_unwritable_one_is_refused_first() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("in");
    inputs(&data, 8);
    let state = tmp.path().join("state.txt");
    // A pid far above pid_max: a writer that no longer runs.
    let dead = tmp
        .path()
        .join(format!(".state.txt{}4000000000.0", stdx::fs::TEMP_MARK));
    std::fs::write(&dead, b"{\"epoch\":").unwrap();
    let base = [
        "stream",
        data.to_str().unwrap(),
        "--batch",
        "4",
        "--size",
        "32",
    ];
    let mut args = base.to_vec();
    args.extend(["--state-file", state.to_str().unwrap()]);
    let out = l3(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dead.exists(), "the dead writer's temporary is gone");
    assert!(std::fs::read_to_string(&state).unwrap().starts_with('{'));

    let missing = tmp.path().join("no/such/folder/state.txt");
    let mut args = base.to_vec();
    args.extend(["--state-file", missing.to_str().unwrap()]);
    let out = l3(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot be written") && err.contains("state.txt"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("images/s"),
        "refused before the run: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
