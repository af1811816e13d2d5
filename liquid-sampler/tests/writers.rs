//! Writers that must not step on each other or leave half a dataset: one writer per folder (a second
//! fails at once), kill -9 at any point of a profile + write (re-running gives exactly the uninterrupted
//! result and no reader ever accepts a partial dataset), a full disk during profiling (no scratch left).

mod common;

use common::{rle_decode, rle_file, scratch};
use liquid_sampler::profile::{self, ProbeSet, ProfileConfig, SourceItem};
use liquid_sampler::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `n` run-length-coded source images of `w`x`h` in `dir`.
fn sources(dir: &Path, n: u64, w: u32, h: u32) -> Vec<SourceItem> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|id| {
            let path = dir.join(format!("{id:03}.rle"));
            std::fs::write(&path, rle_file(id, w, h)).unwrap();
            SourceItem {
                id,
                label: (id % 3) as u32,
                path,
                tag: "rle".into(),
            }
        })
        .collect()
}

fn listed(dir: &Path) -> Vec<SourceItem> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.into_iter()
        .enumerate()
        .map(|(id, path)| SourceItem {
            id: id as u64,
            label: (id % 3) as u32,
            path,
            tag: "rle".into(),
        })
        .collect()
}

fn config(scratch: &Path) -> ProfileConfig {
    ProfileConfig {
        threads: 1,
        io_threads: 1,
        seed: 1,
        probe_items: 16,
        min_time: Duration::from_millis(10),
        scratch: scratch.to_path_buf(),
        bandwidth: None,
    }
}

/// What `l3 liquid profile` does: profile with the probe sample inside the output folder, then write the
/// dataset. The ratio is fixed rather than the measured one (which depends on timing), so two runs are
/// comparable byte for byte.
fn profile_and_write(src: &Path, out: &Path, seed: u64) -> Result<Manifest> {
    let sources = listed(src);
    let dec = rle_decode;
    let decoders: [(&str, &dyn Decoder); 1] = [("rle", &dec)];
    std::fs::create_dir_all(out).map_err(|error| Error::Io {
        path: out.to_path_buf(),
        error,
    })?;
    profile::profile(&sources, &decoders, &config(out), |_| {})?;
    let ratio = Ratio {
        compressed: 1,
        raw: 1,
    };
    profile::write_dataset(&sources, &decoders, ratio, seed, out)
}

/// The dataset as a reader sees it: every visible regular file's bytes. Panics on visible folders (a
/// probe sample left behind) and on temporaries.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            stdx::fs::is_temp_name(&name).is_none() && !name.ends_with(".tmp"),
            "temporary {name} left in {}",
            dir.display()
        );
        if name.starts_with('.') {
            assert_eq!(name, stdx::fs::LOCK_NAME, "unexpected hidden file");
            continue;
        }
        assert!(
            e.file_type().unwrap().is_file(),
            "{name} left in {}",
            dir.display()
        );
        out.insert(name, std::fs::read(e.path()).unwrap());
    }
    out
}

/// A reader between the kill and the re-run: an error, or exactly one of the complete states (whose
/// name is returned).
fn check_reader(out: &Path, states: &[(&'static str, &BTreeMap<String, Vec<u8>>)]) -> &'static str {
    match Dataset::open(out) {
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && !msg.contains("Error {"), "{msg}");
            "error"
        }
        Ok(ds) => {
            let manifest = std::fs::read(out.join("manifest.cbor")).unwrap();
            let (name, state) = states
                .iter()
                .find(|s| s.1.get("manifest.cbor") == Some(&manifest))
                .unwrap_or_else(|| panic!("a manifest that no complete run wrote"));
            for f in &ds.manifest.files {
                let bytes = std::fs::read(out.join(&f.name)).unwrap();
                assert!(
                    state.get(&f.name) == Some(&bytes),
                    "{} differs from its run's",
                    f.name
                );
            }
            name
        }
    }
}

const CHILD_SRC: &str = "LIQUID_CRASH_SRC";
const CHILD_OUT: &str = "LIQUID_CRASH_OUT";

fn spawn_child(test: &str, env: &[(&str, &Path)]) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

#[test]
fn kill_nine_during_profile_and_write() {
    if let (Some(src), Some(out)) = (std::env::var_os(CHILD_SRC), std::env::var_os(CHILD_OUT)) {
        // The child: the whole job, killed by the parent at some point.
        profile_and_write(Path::new(&src), Path::new(&out), 7).unwrap();
        return;
    }
    let root = scratch("crash");
    let src = root.join("src");
    sources(&src, 48, 128, 96);
    let reference = root.join("reference");
    profile_and_write(&src, &reference, 7).unwrap();
    let want = snapshot(&reference);
    let out = root.join("out");
    profile_and_write(&src, &out, 8).unwrap();
    let previous = snapshot(&out);
    assert_ne!(previous, want);

    // An uninterrupted child does the same job, and says how long it takes from spawn to exit.
    let timing = root.join("timing");
    let t0 = Instant::now();
    let status = spawn_child(
        "kill_nine_during_profile_and_write",
        &[(CHILD_SRC, &src), (CHILD_OUT, &timing)],
    )
    .wait()
    .unwrap();
    let full = t0.elapsed();
    assert!(status.success());
    assert_eq!(snapshot(&timing), want);

    // Kill points spread over start, middle and end (and just past the end), drawn from a seeded stream.
    let mut rng = stdx::SplitMix64::new(0x11C0);
    let buckets = [
        (0.0, 0.05),
        (0.1, 0.3),
        (0.3, 0.5),
        (0.5, 0.7),
        (0.7, 0.9),
        (0.9, 1.0),
        (1.0, 1.2),
    ];
    let mut outcomes = Vec::new();
    for (lo, hi) in buckets {
        let at = full.mul_f64(lo + (hi - lo) * rng.unit_f64());
        let mut child = spawn_child(
            "kill_nine_during_profile_and_write",
            &[(CHILD_SRC, &src), (CHILD_OUT, &out)],
        );
        std::thread::sleep(at);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        outcomes.push(check_reader(
            &out,
            &[("previous", &previous), ("new", &want)],
        ));
        // Re-running gives exactly the uninterrupted result, with no temporaries or probe folders left.
        profile_and_write(&src, &out, 7).unwrap();
        assert_eq!(snapshot(&out), want, "after a kill at {at:?}");
        // Back to the previous dataset for the next kill.
        profile_and_write(&src, &out, 8).unwrap();
        assert_eq!(snapshot(&out), previous);
    }
    println!("kill points over {full:?}: readers saw {outcomes:?}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_second_writer_fails_at_once_naming_the_folder() {
    let dir = scratch("lock");
    let out = dir.join("ds");
    let src = dir.join("src");
    let srcs = sources(&src, 6, 16, 16);
    let (holding_tx, holding_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let first = {
        let out = out.clone();
        std::thread::spawn(move || {
            let formats = vec![FormatSpec {
                tag: "raw".into(),
                kind: FormatKind::Raw,
            }];
            let ratio = Ratio {
                compressed: 0,
                raw: 1,
            };
            let mut w = DatasetWriter::create(&out, 0, ratio, formats).unwrap();
            let dims = Dims {
                width: 4,
                height: 4,
                channels: 3,
            };
            w.add(0, 0, 0, &[1; 48], dims).unwrap();
            holding_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            w.add(1, 0, 0, &[2; 48], dims).unwrap();
            w.finish().unwrap()
        })
    };
    holding_rx.recv().unwrap();
    // The second writer, while the first is mid-way: refused at once, naming the folder.
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    let ratio = Ratio {
        compressed: 0,
        raw: 1,
    };
    let e = DatasetWriter::create(&out, 0, ratio, formats)
        .err()
        .expect("a second writer must be refused");
    match &e {
        Error::Io { path, error } => {
            assert_eq!(path, &out);
            assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(&*out.to_string_lossy()) && msg.contains("writing this folder"),
        "{msg}"
    );
    // The converter takes the same lock.
    let dec = rle_decode;
    let decoders: [(&str, &dyn Decoder); 1] = [("rle", &dec)];
    let ratio = Ratio {
        compressed: 1,
        raw: 1,
    };
    let e = profile::write_dataset(&srcs, &decoders, ratio, 0, &out).unwrap_err();
    assert!(e.to_string().contains("writing this folder"), "{e}");
    done_tx.send(()).unwrap();
    let m = first.join().unwrap();
    // The first writer's dataset is whole.
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.manifest, m);
    assert_eq!(m.items.len(), 2);

    // The profiler's probe sample is locked while it exists.
    let probe_scratch = dir.join("scratch");
    let set = ProbeSet::build(&srcs, &decoders, &config(&probe_scratch)).unwrap();
    let probe_dir = std::fs::read_dir(&probe_scratch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("liquid-probe-")
        })
        .expect("a probe folder while the set lives");
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    let e = DatasetWriter::create(&probe_dir, 0, ratio, formats)
        .err()
        .expect("the probe folder is locked");
    assert!(e.to_string().contains("writing this folder"), "{e}");
    drop(set);
    assert!(!probe_dir.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_writer_removes_what_it_created() {
    let dir = scratch("failed");
    let out = dir.join("new");
    let formats = vec![FormatSpec {
        tag: "raw".into(),
        kind: FormatKind::Raw,
    }];
    let ratio = Ratio {
        compressed: 0,
        raw: 1,
    };
    let mut w = DatasetWriter::create(&out, 0, ratio, formats.clone()).unwrap();
    let dims = Dims {
        width: 4,
        height: 4,
        channels: 3,
    };
    w.add(0, 0, 0, &[1; 48], dims).unwrap();
    drop(w);
    assert!(
        !out.exists(),
        "an unfinished writer's new folder is removed"
    );
    // A folder that was there stays, with what it held.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let mut w = DatasetWriter::create(&out, 0, ratio, formats).unwrap();
    w.add(0, 0, 0, &[1; 48], dims).unwrap();
    drop(w);
    assert_eq!(
        std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect::<Vec<_>>(),
        ["keep.txt"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

const FSIZE_SRC: &str = "LIQUID_FSIZE_SRC";
const FSIZE_SCRATCH: &str = "LIQUID_FSIZE_SCRATCH";

/// Profiles into `scratch`, which cannot hold the probe sample: the error names a file under it and the
/// probe folder is gone.
fn profile_on_a_full_disk(src: &Path, scratch: &Path) {
    let srcs = listed(src);
    let dec = rle_decode;
    let decoders: [(&str, &dyn Decoder); 1] = [("rle", &dec)];
    let e = profile::profile(&srcs, &decoders, &config(scratch), |_| {})
        .expect_err("the probe sample cannot fit");
    let msg = e.to_string();
    assert!(msg.contains(&*scratch.to_string_lossy()), "{msg}");
    assert!(!msg.contains('\n') && !msg.contains("Error {"), "{msg}");
    let left: Vec<_> = std::fs::read_dir(scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the scratch folder: {left:?}");
    println!("full disk: {msg}");
}

/// A real full disk: a 256 KiB tmpfs (needs the right to mount; otherwise a child process with
/// `RLIMIT_FSIZE` stands in, where writes past the limit fail with EFBIG instead of ENOSPC).
#[test]
fn full_disk_while_profiling_leaves_no_probe_folder() {
    if let (Some(src), Some(scratch)) =
        (std::env::var_os(FSIZE_SRC), std::env::var_os(FSIZE_SCRATCH))
    {
        // SAFETY: plain syscalls in this single-purpose child; SIGXFSZ ignored so a write past the
        // limit returns EFBIG instead of killing the process.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: 256 << 10,
                rlim_max: 256 << 10,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        profile_on_a_full_disk(Path::new(&src), Path::new(&scratch));
        return;
    }
    let root = scratch("fulldisk");
    let src = root.join("src");
    // 16 probe items of 128x128 raw pixels (48 KiB each) cannot fit in 256 KiB.
    sources(&src, 24, 128, 128);
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = Command::new("umount").arg(&self.0).status();
            }
        }
        let _unmount = Unmount(mnt.clone());
        profile_on_a_full_disk(&src, &mnt);
    } else {
        println!(
            "cannot mount a tmpfs here: RLIMIT_FSIZE in a child process stands in for a full disk"
        );
        let status = spawn_child(
            "full_disk_while_profiling_leaves_no_probe_folder",
            &[(FSIZE_SRC, &src), (FSIZE_SCRATCH, &mnt)],
        )
        .wait()
        .unwrap();
        assert!(status.success(), "the child's checks failed");
    }
    let _ = std::fs::remove_dir_all(&root);
}
