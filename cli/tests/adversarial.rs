//! The cases an adversarial run found, each run against the real binary: special files and symlink loops,
//! absurd sizes, concurrent writers, killed writers' leftovers, lossy conversions nobody asked for, and
//! messages that must be one clean line naming the file.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_l3"));
    c.args(args);
    c
}

/// Runs `c`, killing it (and failing the test) after `secs`: a hang is a defect, not a slow test.
/// Returns the output and the program's peak resident memory in KiB (sampled every 2 ms).
#[allow(clippy::zombie_processes)] // reaped with wait4, which also gives its resource usage
fn run_limited(mut c: Command, secs: u64) -> (Output, u64) {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run l3");
    let pid = child.id() as libc::pid_t;
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let t0 = Instant::now();
    let mut status = 0;
    // Peak RSS of the program itself (VmHWM belongs to its address space, which exec made new; the
    // rusage figure would also count the test process it was forked from).
    let mut peak = 0u64;
    let hwm = |pid: libc::pid_t| -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    // SAFETY: plain POSIX calls on our own child's pid; the rusage struct is ours.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        if let Some(k) = hwm(pid) {
            peak = peak.max(k);
        }
        // SAFETY: `pid` is our own child, not yet reaped; `status` and `ru` are writable locals.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            // SAFETY: a signal to our own child, not yet reaped, so its pid cannot name another process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: reaps that same child into our own locals.
            unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            panic!(
                "l3 {:?} hung for {secs} s",
                c.get_args().collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    use std::os::unix::process::ExitStatusExt;
    let out = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    };
    (out, peak)
}

fn run(args: &[&str]) -> Output {
    run_limited(cmd(args), 120).0
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "l3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A failure (exit code 1, not a signal) with one line on stderr containing every `needle`.
fn fails_with(out: &Output, needles: &[&str]) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("l3: warning"))
        .collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(lines[0].starts_with("l3: error: "), "{err:?}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from {err:?}");
    }
    assert!(
        !err.contains("Error {") && !err.contains("kind:"),
        "Debug text: {err:?}"
    );
    // No cause printed twice ("X: msg: X: msg").
    let parts: Vec<&str> = lines[0].split(": ").collect();
    for w in parts.windows(2) {
        assert_ne!(w[0], w[1], "repeated part in {err:?}");
    }
    err
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn png(path: &Path, w: u32, h: u32, seed: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 3 + seed) as u8, (y * 5) as u8, ((x ^ y) + seed) as u8])
    });
    img.save(path).unwrap();
}

fn jpeg(path: &Path, w: u32, h: u32, exif_orientation: Option<u16>) {
    use image::ImageEncoder;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, 90]));
    let mut out = Vec::new();
    let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 92);
    if let Some(o) = exif_orientation {
        // A minimal little-endian TIFF block with one IFD entry: Orientation (0x0112), SHORT, 1 value.
        let mut tiff = b"II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0".to_vec();
        tiff.extend_from_slice(&o.to_le_bytes());
        tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        enc.set_exif_metadata(tiff).unwrap();
    }
    enc.write_image(img.as_raw(), w, h, image::ExtendedColorType::Rgb8)
        .unwrap();
    std::fs::write(path, out).unwrap();
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(s(p)).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn symlink_loops_and_fifos_are_skipped_with_a_warning_not_followed_or_read() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    png(&data.join("a/x.png"), 64, 48, 1);
    png(&data.join("b/y.png"), 64, 48, 2);
    std::os::unix::fs::symlink(".", data.join("me")).unwrap();
    std::os::unix::fs::symlink("..", data.join("a/up")).unwrap();
    std::os::unix::fs::symlink("../b", data.join("a/b-again")).unwrap();
    mkfifo(&data.join("b/z.png"));
    let out = run(&["stream", s(&data), "--size", "32", "--batch", "4"]);
    let text = ok(&out);
    assert!(text.contains("done: 1 batches, 2 images"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("z.png: skipped, not a regular file (a FIFO)"),
        "{err}"
    );
    assert!(err.contains("folder already visited"), "{err}");
    let l3 = tmp.path().join("l3");
    let text = ok(&run(&["convert", "--to", "l3", s(&data), s(&l3)]));
    assert!(text.contains("converted 2 files"), "{text}");
    // A FIFO given by name is refused at once, not waited on.
    let fifo = data.join("b/z.png");
    let out = run(&["encode", s(&fifo), s(&tmp.path().join("z.l3"))]);
    fails_with(&out, &["z.png", "FIFO"]);
    let out = run(&["info", "/dev/zero"]);
    fails_with(&out, &["/dev/zero", "not a regular file"]);
}

#[test]
fn absurd_sizes_are_refused_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    png(&tmp.path().join("a.png"), 40, 30, 1);
    // Beyond the options' own limits: refused naming the option and its range.
    for (args, needles) in [
        (
            vec!["--size", "100000"],
            ["crop \"100000x100000\"", "1 to 65536"],
        ),
        (
            vec!["--batch", "1000000000"],
            ["batch_size \"1000000000\"", "1 to 1048576"],
        ),
        (
            vec!["--size", "4000000000x4000000000"],
            ["crop \"4000000000x4000000000\"", "1 to 65536"],
        ),
    ] {
        let mut all = vec!["stream", s(tmp.path())];
        all.extend(args);
        fails_with(&run(&all), &needles);
    }
    // Within them, but more than the machine can hold: refused by the memory limit before allocating.
    for args in [vec!["--size", "60000"], vec!["--batch", "1000000"]] {
        let mut all = vec!["stream", s(tmp.path())];
        all.extend(args);
        fails_with(&run(&all), &["memory limit", "L3_MEMORY_LIMIT"]);
    }
}

#[test]
fn a_second_writer_of_a_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    png(&data.join("x.png"), 40, 30, 1);
    let out_dir = tmp.path().join("out");
    // Another process holds the folder: this test process, through the same lock l3 takes.
    let held = stdx::fs::DirLock::acquire(&out_dir).unwrap();
    let out = run(&["convert", "--to", "l3", s(&data), s(&out_dir)]);
    fails_with(&out, &["out", "is writing this folder"]);
    drop(held);
    ok(&run(&["convert", "--to", "l3", s(&data), s(&out_dir)]));
}

#[test]
fn killed_runs_leftovers_are_cleared_and_only_valid_outputs_count_as_done() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    png(&data.join("c/x.png"), 40, 30, 1);
    png(&data.join("c/y.png"), 40, 30, 2);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir_all(out_dir.join("c")).unwrap();
    // What kill -9 leaves: a temporary of a dead process, and an empty file under a final name.
    let stale = out_dir.join("c/.x.l3.l3tmp.4000000000.0");
    std::fs::write(&stale, b"partial").unwrap();
    std::fs::write(out_dir.join("c/y.l3"), b"").unwrap();
    let text = ok(&run(&["convert", "--to", "l3", s(&data), s(&out_dir)]));
    assert!(
        text.contains("converted 2 files (0 already done)"),
        "{text}"
    );
    assert!(!stale.exists());
    let files = files_under(&out_dir);
    assert_eq!(files.len(), 2, "{files:?}");
    for f in files {
        l3_format::L3File::parse(&std::fs::read(&f).unwrap()).unwrap();
    }
    let text = ok(&run(&["convert", "--to", "l3", s(&data), s(&out_dir)]));
    assert!(
        text.contains("converted 0 files (2 already done)"),
        "{text}"
    );
}

#[test]
fn imports_follow_one_set_of_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Gray+alpha: accepted by encode and convert alike, kept losslessly as RGBA.
    let la = image::GrayAlphaImage::from_fn(20, 10, |x, y| {
        image::LumaA([(x * 9) as u8, (y * 20) as u8])
    });
    la.save(data.join("la.png")).unwrap();
    let enc = tmp.path().join("la.l3");
    ok(&run(&["encode", s(&data.join("la.png")), s(&enc)]));
    let out_dir = tmp.path().join("l3");
    ok(&run(&["convert", "--to", "l3", s(&data), s(&out_dir)]));
    let a = std::fs::read(&enc).unwrap();
    assert_eq!(a, std::fs::read(out_dir.join("la.l3")).unwrap());
    assert_eq!(l3_format::L3File::parse(&a).unwrap().channels(), 4);
    // 16-bit gray: refused by both without --to-8bit (no silent lossy conversion to 8-bit RGB).
    let g16 = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::from_fn(8, 8, |x, _| {
        image::Luma([x as u16 * 8000])
    });
    let data16 = tmp.path().join("d16");
    std::fs::create_dir_all(&data16).unwrap();
    g16.save(data16.join("g.png")).unwrap();
    fails_with(
        &run(&[
            "encode",
            s(&data16.join("g.png")),
            s(&tmp.path().join("g.l3")),
        ]),
        &["g.png", "--to-8bit"],
    );
    fails_with(
        &run(&[
            "convert",
            "--to",
            "l3",
            s(&data16),
            s(&tmp.path().join("o16")),
        ]),
        &["g.png", "--to-8bit"],
    );
    ok(&run(&[
        "convert",
        "--to",
        "l3",
        "--to-8bit",
        s(&data16),
        s(&tmp.path().join("o16")),
    ]));
    let g = std::fs::read(tmp.path().join("o16/g.l3")).unwrap();
    assert_eq!(
        l3_format::L3File::parse(&g).unwrap().channels(),
        1,
        "gray stays gray"
    );
    // An output that is the input is refused, and the input survives.
    let before = std::fs::read(data.join("la.png")).unwrap();
    fails_with(
        &run(&["encode", s(&data.join("la.png")), s(&data.join("la.png"))]),
        &["la.png", "input"],
    );
    assert_eq!(std::fs::read(data.join("la.png")).unwrap(), before);
}

#[test]
fn exif_orientation_is_applied_wherever_a_file_becomes_pixels() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Stored 40 wide, 24 high; orientation 6 = rotate 90° clockwise to view: upright it is 24x40.
    jpeg(&data.join("r.jpg"), 40, 24, Some(6));
    let enc = tmp.path().join("r.l3");
    ok(&run(&["encode", s(&data.join("r.jpg")), s(&enc)]));
    let f = std::fs::read(&enc).unwrap();
    let f = l3_format::L3File::parse(&f).unwrap();
    assert_eq!((f.width(), f.height()), (24, 40));
    let l3_dir = tmp.path().join("l3");
    ok(&run(&["convert", "--to", "l3", s(&data), s(&l3_dir)]));
    // Streaming the JPEG folder and the converted L3 folder gives the same samples (same trace, same bytes
    // would need a dump; the sizes and the padding tell: a 24x40 image centred in 48x48).
    for d in [&data, &l3_dir] {
        let text = ok(&run(&["stream", s(d), "--size", "48", "--batch", "1"]));
        assert!(text.contains("1 images"), "{text}");
    }
    let ds = loader::ImageFolder::open(&data).unwrap();
    let l3 = loader::ImageFolder::open(&l3_dir).unwrap();
    let opts = loader::LoaderOptions {
        batch_size: 1,
        sample: loader::SampleSpec {
            height: 48,
            width: 48,
            layout: loader::Layout::Nhwc,
            ..loader::SampleSpec::default()
        },
        ..Default::default()
    };
    let mut a = loader::Loader::new(std::sync::Arc::new(ds), opts.clone()).unwrap();
    let mut b = loader::Loader::new(std::sync::Arc::new(l3), opts).unwrap();
    let (a, b) = (a.next().unwrap().unwrap(), b.next().unwrap().unwrap());
    // The same pixels either way: the L3 file holds the upright JPEG decode.
    assert!(a.pixels == b.pixels);
    // Upright it is 24 wide: on the middle row, columns 0..12 are padding, column 12 is image.
    let row = &a.pixels.as_u8().unwrap()[24 * 48 * 3..25 * 48 * 3];
    assert_eq!(&row[..3 * 12], &[0u8; 36][..]);
    assert_ne!(row[3 * 12 + 2], 0, "blue is 90 everywhere in the image");
}

#[test]
fn two_conversions_into_one_folder_are_refused_and_never_double_the_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    png(&data.join("x.png"), 40, 30, 1);
    png(&data.join("y.png"), 40, 30, 2);
    let out_dir = tmp.path().join("out");
    ok(&run(&["convert", "--to", "l3", s(&data), s(&out_dir)]));
    fails_with(
        &run(&["convert", "--to", "raw", s(&data), s(&out_dir)]),
        &["out", "l3 files", "empty folder"],
    );
    // A folder mixed by hand is refused by stream rather than counted twice.
    std::fs::copy(data.join("x.png"), out_dir.join("x.png")).unwrap();
    fails_with(
        &run(&["stream", s(&out_dir)]),
        &["x.l3", "x.png", "two formats"],
    );
}

#[test]
fn outputs_are_checked_before_the_work_and_failed_writes_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    png(&tmp.path().join("d/a.png"), 40, 30, 1);
    let data = tmp.path().join("d");
    // A trace path that is a folder fails at once, leaving nothing behind.
    let trace = tmp.path().join("tracedir");
    std::fs::create_dir(&trace).unwrap();
    fails_with(
        &run(&["stream", s(&data), "--trace", s(&trace)]),
        &["tracedir", "folder"],
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2);
    // A write that fails (here: past the file-size limit, like a full disk) names the output and leaves
    // no temporary.
    let l3 = tmp.path().join("a.l3");
    ok(&run(&["encode", s(&data.join("a.png")), s(&l3)]));
    let out_png = tmp.path().join("out.png");
    let mut c = cmd(&["decode", s(&l3), s(&out_png)]);
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let (out, _) = run_limited(c, 60);
    fails_with(&out, &["out.png", "File too large"]);
    assert!(!out_png.exists());
    assert_eq!(
        files_under(tmp.path()).len(),
        2,
        "{:?}",
        files_under(tmp.path())
    );
}

#[test]
fn info_reads_the_header_and_verify_decodes_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    // 6000x4000 RGB: 72 MB decoded. Verifying it must not hold the whole image.
    let (w, h) = (6000u32, 4000u32);
    let px: Vec<u8> = (0..w as usize * h as usize * 3)
        .map(|i| (i % 251) as u8 ^ (i / 7919) as u8)
        .collect();
    let file = l3_format::encode_parallel(&px, w, h, 3, 64, 0).unwrap();
    drop(px);
    let p = tmp.path().join("big.l3");
    std::fs::write(&p, &file).unwrap();
    let (out, rss_kib) = run_limited(cmd(&["info", "--verify", s(&p)]), 120);
    let text = ok(&out);
    assert!(text.contains("verified: every patch decodes"), "{text}");
    assert!(text.contains(&format!(
        "patch data bytes: {}",
        file.len() - l3_format::L3File::parse(&file).unwrap().data_offset()
    )));
    assert!(rss_kib > 1024, "the peak RSS was sampled ({rss_kib} KiB)");
    assert!(
        rss_kib < 40 * 1024,
        "info --verify peaked at {rss_kib} KiB for a 72 MB image"
    );
    // A corrupt patch deep in the file is found.
    let mut bad = file.clone();
    let at = bad.len() - 3;
    bad[at] ^= 0xFF;
    bad.truncate(bad.len() - 1);
    let q = tmp.path().join("bad.l3");
    std::fs::write(&q, &bad).unwrap();
    fails_with(&run(&["info", "--verify", s(&q)]), &["bad.l3"]);

    // Version 2: the checksum streams through a small buffer and the decode goes band by band, so memory
    // stays bounded here too; a flipped bit anywhere is caught by the checksum before any decoding.
    let px: Vec<u8> = (0..w as usize * h as usize * 3)
        .map(|i| (i % 251) as u8 ^ (i / 7919) as u8)
        .collect();
    let opts = l3_format::EncodeOptions {
        format: l3_format::Format::V2(l3_format::Profile::Ans),
        threads: 0,
        ..l3_format::EncodeOptions::default()
    };
    let file = l3_format::encode_with(&px, w, h, 3, &opts).unwrap();
    drop(px);
    let p2 = tmp.path().join("big2.l3");
    std::fs::write(&p2, &file).unwrap();
    let (out, rss_kib) = run_limited(cmd(&["info", "--verify", s(&p2)]), 120);
    let text = ok(&out);
    assert!(text.contains("verified: every patch decodes"), "{text}");
    assert!(text.contains("(verified)"), "{text}");
    assert!(
        rss_kib < 40 * 1024,
        "info --verify peaked at {rss_kib} KiB for a 72 MB version-2 image"
    );
    let mut bad = file;
    let at = bad.len() / 3;
    bad[at] ^= 0x01;
    let q2 = tmp.path().join("bad2.l3");
    std::fs::write(&q2, &bad).unwrap();
    fails_with(&run(&["info", s(&q2)]), &["bad2.l3", "CRC-32C mismatch"]);
    // The damaged entry is named too, by the entry checks (here run alone, on a file whose own CRC was
    // made right again, as a careless rewrite would).
    let end = bad.len() - 4;
    let crc = l3_format::crc32c(&bad[..end]);
    bad[end..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&q2, &bad).unwrap();
    fails_with(
        &run(&["info", s(&q2)]),
        &["bad2.l3", "CRC-32C mismatch", "patch"],
    );
}

#[test]
fn the_image_size_limit_is_one_documented_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.png");
    png(&p, 100, 100, 3);
    let mut c = cmd(&["encode", s(&p), s(&tmp.path().join("a.l3"))]);
    c.env("L3_MAX_IMAGE_BYTES", "20000");
    let (out, _) = run_limited(c, 60);
    fails_with(
        &out,
        &["a.png", "100x100", "image size limit", "L3_MAX_IMAGE_BYTES"],
    );
    // Far above the `image` crate's default 512 MiB allocation limit, the default limit still accepts
    // it: a 13,400² RGB PNG (539 MB decoded).
    let big = tmp.path().join("big.png");
    {
        let f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        let mut e = png::Encoder::new(f, 13_400, 13_400);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(png::Compression::Fast);
        let mut w = e.write_header().unwrap().into_stream_writer().unwrap();
        let row: Vec<u8> = (0..13_400 * 3).map(|i| (i % 7) as u8).collect();
        for _ in 0..13_400 {
            std::io::Write::write_all(&mut w, &row).unwrap();
        }
        w.finish().unwrap();
    }
    let out_l3 = tmp.path().join("big.l3");
    ok(&run_limited(cmd(&["encode", s(&big), s(&out_l3)]), 300).0);
    let f = std::fs::read(&out_l3).unwrap();
    assert_eq!(l3_format::L3File::parse(&f).unwrap().width(), 13_400);
}

#[test]
fn pcr_from_a_mixed_folder_keeps_jpegs_lossless_and_asks_before_anything_lossy() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    jpeg(&data.join("j/a.jpg"), 96, 64, None);
    png(&data.join("p/b.png"), 96, 64, 4);
    let out_dir = tmp.path().join("pcr");
    fails_with(
        &run(&["convert", "--to", "pcr", s(&data), s(&out_dir)]),
        &["not JPEG", "b.png", "--quality"],
    );
    ok(&run(&[
        "convert",
        "--to",
        "pcr",
        "--quality",
        "90",
        s(&data),
        s(&out_dir),
    ]));
    // The JPEG's pixels at full fidelity are exactly the original file's (transcoded, never re-encoded).
    let read = tmp.path().join("read");
    ok(&run(&[
        "pcr",
        "read",
        s(&out_dir),
        "--group",
        "10",
        "--out",
        s(&read),
    ]));
    let orig = pcr::Decoder::Libjpeg
        .decode(&std::fs::read(data.join("j/a.jpg")).unwrap())
        .unwrap();
    let got = files_under(&read)
        .into_iter()
        .find(|p| p.file_stem().unwrap() == "a")
        .expect("a.png written");
    let got = image::open(got).unwrap().to_rgb8();
    assert_eq!(got.as_raw(), &orig.pixels);
}

/// `stream` on a PCR dataset applies the checks `pcr read` applies (one validated reader): a record whose
/// first byte is overwritten, or one of whose scan bytes flipped, is refused by both, naming the record.
#[test]
fn stream_refuses_the_pcr_records_pcr_read_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for i in 0..6 {
        jpeg(&data.join(format!("c/{i}.jpg")), 64 + 8 * i, 48, None);
    }
    let ds = tmp.path().join("ds");
    ok(&run(&[
        "pcr",
        "build",
        s(&ds),
        s(&data),
        "--per-record",
        "2",
    ]));
    let stream = |ds: &Path| {
        run(&[
            "stream",
            s(ds),
            "--batch",
            "2",
            "--size",
            "32",
            "--threads",
            "1",
        ])
    };
    ok(&stream(&ds));
    let record = ds.join("record-00001.pcr");
    let good = std::fs::read(&record).unwrap();
    let mut bad = good.clone();
    bad[0] ^= 0xFF;
    std::fs::write(&record, &bad).unwrap();
    let read = |ds: &Path| {
        run(&[
            "pcr",
            "read",
            s(ds),
            "--group",
            "10",
            "--out",
            s(&tmp.path().join("out")),
        ])
    };
    fails_with(&read(&ds), &["record-00001.pcr"]);
    fails_with(&stream(&ds), &["record-00001.pcr"]);
    // A flipped byte near the end of the record: inside the last scan, caught by its CRC.
    let mut bad = good.clone();
    let at = bad.len() - 10;
    bad[at] ^= 0x01;
    std::fs::write(&record, &bad).unwrap();
    fails_with(&read(&ds), &["record-00001.pcr"]);
    fails_with(&stream(&ds), &["record-00001.pcr"]);
    // A record one byte short.
    std::fs::write(&record, &good[..good.len() - 1]).unwrap();
    fails_with(&stream(&ds), &["record-00001.pcr"]);
    std::fs::write(&record, &good).unwrap();
    ok(&stream(&ds));
}

/// A PCR dataset of more records than the process may open files streams: records are read one request
/// each and closed, never all held open.
#[test]
fn pcr_datasets_of_more_records_than_open_files_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for i in 0..150 {
        jpeg(&data.join(format!("c/{i:03}.jpg")), 16, 16, None);
    }
    let ds = tmp.path().join("ds");
    ok(&run(&[
        "pcr",
        "build",
        s(&ds),
        s(&data),
        "--per-record",
        "1",
    ]));
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_l3"))
        .args([
            "stream",
            s(&ds),
            "--batch",
            "10",
            "--size",
            "16",
            "--group",
            "2",
        ]);
    let out = run_limited(c, 120).0;
    let stdout = ok(&out);
    assert!(stdout.contains("150 images (0 skipped)"), "{stdout}");
}

/// Corrupt JPEG data (a file cut short) is an error for `pcr build` naming the file, unless asked for.
#[test]
fn pcr_build_refuses_corrupt_jpegs_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    jpeg(&data.join("a.jpg"), 128, 96, None);
    jpeg(&data.join("b.jpg"), 128, 96, None);
    let b = std::fs::read(data.join("b.jpg")).unwrap();
    std::fs::write(data.join("b.jpg"), &b[..b.len() * 2 / 3]).unwrap();
    let ds = tmp.path().join("ds");
    fails_with(&run(&["pcr", "build", s(&ds), s(&data)]), &["b.jpg"]);
    assert!(!ds.exists(), "a failed build leaves no folder behind");
    let out = run(&["pcr", "build", s(&ds), s(&data), "--allow-corrupt"]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("b.jpg"), "the accepted file is named: {err}");
}

/// Names are bytes: files and class folders whose names are not UTF-8 stream like any other (none
/// dropped, even without `--skip-errors`), and messages show them escaped (`\xFE`), never as `�`.
#[test]
fn names_that_are_not_utf8_stream_and_are_shown_escaped() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let odd_class = data.join(std::ffi::OsStr::from_bytes(b"k\xf6ln"));
    png(
        &odd_class.join(std::ffi::OsStr::from_bytes(b"bad\xfe.png")),
        40,
        30,
        1,
    );
    png(&odd_class.join("good.png"), 40, 30, 2);
    png(
        &data
            .join("plain")
            .join(std::ffi::OsStr::from_bytes(b"x\xff\\y.png")),
        40,
        30,
        3,
    );
    png(&data.join("plain").join("ok.png"), 40, 30, 4);
    let trace = tmp.path().join("trace.csv");
    let out = run(&[
        "stream",
        s(&data),
        "--batch",
        "2",
        "--size",
        "16",
        "--threads",
        "1",
        "--trace",
        s(&trace),
    ]);
    let text = ok(&out);
    assert!(
        text.contains("done: 2 batches, 4 images (0 skipped)"),
        "{text}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains('\u{fffd}'));
    assert_eq!(std::fs::read_to_string(&trace).unwrap().lines().count(), 5);

    // A broken one fails naming the file as its key reads.
    std::fs::write(
        odd_class.join(std::ffi::OsStr::from_bytes(b"bad\xfe.png")),
        b"not a png",
    )
    .unwrap();
    let out = run(&[
        "stream",
        s(&data),
        "--batch",
        "2",
        "--size",
        "16",
        "--threads",
        "1",
    ]);
    let err = fails_with(&out, &["k\\xF6ln/bad\\xFE.png"]);
    assert!(!err.contains('\u{fffd}'), "{err}");
}

/// `--boxes` takes a local file: an `s3://` location is refused in one line saying so, not with the
/// operating system's "No such file or directory".
#[test]
fn boxes_from_a_store_are_refused_saying_they_are_read_locally() {
    let tmp = tempfile::tempdir().unwrap();
    png(&tmp.path().join("a.png"), 40, 30, 1);
    let out = run(&[
        "stream",
        s(tmp.path()),
        "--size",
        "16",
        "--boxes",
        "s3://bucket/instances.json",
    ]);
    let err = fails_with(&out, &["s3://bucket/instances.json", "local"]);
    assert!(!err.contains("No such file"), "{err}");
}
