//! Damage to an input is one error of one kind however it is found: by the checks made when the file is
//! opened, or by the window that reads it while the network runs (a version-1 L3 file has no checksum
//! to find it at open; a version-2 file changed on disk after it was opened is found by its entry CRCs).

use bsp_tiling::field::{Field, Input};
use infer_io::{Error, L3Regions};
use std::path::Path;
use stdx::SplitMix64;

fn noise(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    (0..w * h * 3).map(|_| rng.next_u64() as u8).collect()
}

/// Overwrites `n` bytes in the middle of the file with 0xFF: inside a patch's data for these sizes.
fn damage(path: &Path, n: usize) {
    let mut b = std::fs::read(path).unwrap();
    let mid = b.len() / 2;
    b[mid..mid + n].fill(0xFF);
    std::fs::write(path, b).unwrap();
}

/// Gathers every window of 32×32 over the file; the first failure, if any.
fn read_all(r: &L3Regions) -> Result<(), Error> {
    let (h, w) = (r.height(), r.width());
    let mut out = vec![0f32; r.channels() * 32 * 32];
    for y0 in (0..h).step_by(32) {
        for x0 in (0..w).step_by(32) {
            let ys: Vec<_> = (y0..y0 + 32).map(|y| (y < h).then_some(y)).collect();
            let xs: Vec<_> = (x0..x0 + 32).map(|x| (x < w).then_some(x)).collect();
            r.gather(&ys, &xs, &mut out).map_err(Error::from_run)?;
        }
    }
    Ok(())
}

fn assert_l3_damage(e: Error, path: &Path) {
    let text = e.to_string();
    assert!(matches!(e, Error::L3 { .. }), "{e:?}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn a_damaged_version_1_patch_found_by_its_window_is_an_l3_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v1.l3");
    let (w, h) = (200, 150);
    std::fs::write(
        &p,
        l3_format::encode(&noise(w, h, 1), w as u32, h as u32, 3, 32).unwrap(),
    )
    .unwrap();
    read_all(&L3Regions::open(&p).unwrap()).unwrap();
    damage(&p, 400);
    // Version 1 has no checksum: the file opens, and the window over the damage refuses it.
    let r = L3Regions::open(&p).unwrap();
    assert_l3_damage(read_all(&r).unwrap_err(), &p);
}

#[test]
fn version_2_damage_is_the_same_error_at_open_and_in_a_window() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v2.l3");
    let (w, h) = (300, 200);
    let bytes = l3_format::encode_with(
        &noise(w, h, 2),
        w as u32,
        h as u32,
        3,
        &l3_format::EncodeOptions::default(),
    )
    .unwrap();
    std::fs::write(&p, bytes).unwrap();
    // Opened whole, then damaged on disk while it is held (a file changed during a long run).
    let held = L3Regions::open(&p).unwrap();
    damage(&p, 64);
    let in_window = read_all(&held).unwrap_err();
    let at_open = L3Regions::open(&p)
        .err()
        .expect("the whole-file CRC finds the damage");
    assert_l3_damage(in_window, &p);
    assert_l3_damage(at_open, &p);
}
