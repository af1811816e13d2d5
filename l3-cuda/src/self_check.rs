//! A fixed batch decoded on the device and compared with the CPU decoder before the first decoder of a
//! device is handed out. The kernels are compiled by the user's driver at run time, so the code that runs
//! is not the code the tests ran: an H200 once decoded the last row of small patches wrong with a kernel
//! the CPU simulation found right (README, "Measured on an H200"). A wrong byte here is an error naming
//! the device, and no batch is decoded on it — never a silently wrong batch.
//!
//! The batch holds every patch size 1 to 64 on small images of 1, 3 and 4 channels with partial and
//! one-pixel edge patches (two launches: blocks of 32 threads, where several patches share a warp, and of
//! 64, each with images whose patches fill their teams: the kernel's full modes), then version-2 images of both profiles at every patch size with partial edge patches of 1 to 7
//! columns a lane (a third launch), about 230 KB of output in all: a few milliseconds once per device
//! and process.

use std::sync::Mutex;

/// Devices (ordinals) whose kernels passed in this process.
static PASSED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// One test image: its L3 v1 file and a label for the error.
pub(crate) struct Probe {
    pub(crate) file: Vec<u8>,
    pub(crate) label: String,
}

/// The three launches' images: version 1 with patch sizes 1..=32 and 33..=64, then version 2.
pub(crate) fn batches() -> Result<Vec<Vec<Probe>>, l3_format::Error> {
    let mut rng = stdx::SplitMix64::new(0x2545_f491_4f6c_dd1d);
    let mut v1 = v1_batches(&mut rng)?;
    v1.push(v2_batch(&mut rng)?);
    Ok(v1)
}

/// Pixels of a `w`×`h`×`c` probe: a ramp with a little noise, or noise.
fn probe_pixels(w: u32, h: u32, c: u8, smooth: bool, rng: &mut stdx::SplitMix64) -> Vec<u8> {
    (0..(w * h) as usize * c as usize)
        .map(|i| {
            let p = i / c as usize;
            let (x, y) = ((p % w as usize) as u64, (p / w as usize) as u64);
            let noise = rng.next_u64();
            if smooth {
                ((x * 3 + y * 2 + (i % c as usize) as u64 * 40 + noise % 5) % 256) as u8
            } else {
                noise as u8
            }
        })
        .collect()
}

/// Version 2: every patch size, both profiles, each image a whole patch beside a partial one whose
/// width takes 1 to 7 columns a lane.
fn v2_batch(rng: &mut stdx::SplitMix64) -> Result<Vec<Probe>, l3_format::Error> {
    use l3_format::Profile::{Ans, Bp};
    let mut out = Vec::new();
    for (i, n) in [32u32, 64, 96, 128, 160, 192, 224].into_iter().enumerate() {
        for (j, profile) in [Bp, Ans].into_iter().enumerate() {
            let c = [1u8, 3, 4][(i + j) % 3];
            let w = n + [1, n / 2 + 3, n - 1, 31, 33, n, 5][(i + 3 * j) % 7];
            let h = 3 + ((i + j) % 4) as u32;
            let px = probe_pixels(w, h, c, (i + j) % 2 == 0, rng);
            let opts = l3_format::EncodeOptions {
                format: l3_format::Format::V2(profile),
                patch_size: Some(n as u8),
                ..l3_format::EncodeOptions::default()
            };
            out.push(Probe {
                file: l3_format::encode_with(&px, w, h, c, &opts)?,
                label: format!("{w}x{h}x{c}, version 2 {profile:?}, patches of {n}"),
            });
        }
    }
    Ok(out)
}

/// Version 1: every patch size from 1 to 64, in two launches, each between patches as wide as the
/// launch's teams (32 and 64): first at aligned offsets (rows in one vector store a lane), last after
/// the odd sizes (through the stage).
fn v1_batches(rng: &mut stdx::SplitMix64) -> Result<Vec<Vec<Probe>>, l3_format::Error> {
    [(1u32, 32u32), (33, 64)]
        .into_iter()
        .map(|(lo, hi)| {
            let full = |w: u32,
                        h: u32,
                        c: u8,
                        rng: &mut stdx::SplitMix64|
             -> Result<Probe, l3_format::Error> {
                let px = probe_pixels(w, h, c, h.is_multiple_of(2), rng);
                Ok(Probe {
                    file: l3_format::encode(&px, w, h, c, hi as u8)?,
                    label: format!("{w}x{h}x{c}, patches of {hi}"),
                })
            };
            let mut probes = vec![full(2 * hi, 6, 3, rng)?, full(hi, 5, 1, rng)?];
            for n in lo..=hi {
                let c = [1u8, 3, 4][n as usize % 3];
                // A 1-pixel-wide edge patch, or partial ones, beside whole patches.
                let w = match n % 3 {
                    0 => n + 1,
                    1 => 2 * n - 1,
                    _ => n / 2 + 1,
                };
                let h = 2 + (n * 7) % 11;
                let px = probe_pixels(w, h, c, n % 2 == 0, rng);
                probes.push(Probe {
                    file: l3_format::encode(&px, w, h, c, n as u8)?,
                    label: format!("{w}x{h}x{c}, patches of {n}"),
                });
            }
            probes.push(full(3 * hi, 4, 4, rng)?);
            Ok(probes)
        })
        .collect()
}

/// Where the device's bytes `got` (the batch decoded as u8 NCHW, images at `offsets`) differ from the CPU
/// decoder's: the first differing image and byte, or `None`.
pub(crate) fn first_difference(probes: &[Probe], got: &[u8], offsets: &[usize]) -> Option<String> {
    for (p, &at) in probes.iter().zip(offsets) {
        let want = match cpu_decode(&p.file) {
            Ok(w) => w,
            Err(e) => return Some(format!("{}: the CPU decoder: {e}", p.label)),
        };
        let Some(have) = got.get(at..at + want.len()) else {
            return Some(format!("{}: the output ends before it", p.label));
        };
        if let Some(k) = have.iter().zip(&want).position(|(a, b)| a != b) {
            let bad = have.iter().zip(&want).filter(|(a, b)| a != b).count();
            return Some(format!(
                "{}: byte {k} is {}, the CPU decoder's {} ({bad} of {} bytes differ)",
                p.label,
                have[k],
                want[k],
                want.len()
            ));
        }
    }
    None
}

/// The CPU decoder's bytes of `file` as u8 NCHW.
fn cpu_decode(file: &[u8]) -> Result<Vec<u8>, l3_format::Error> {
    let f = l3_format::L3File::parse(file)?;
    let mut out = vec![0u8; f.decoded_len()];
    f.decode_chw(&mut out)?;
    Ok(out)
}

/// Whether the kernels on device `ordinal` passed in this process.
pub(crate) fn passed(ordinal: usize) -> bool {
    PASSED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&ordinal)
}

/// Records that the kernels on device `ordinal` passed.
pub(crate) fn mark_passed(ordinal: usize) {
    PASSED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(ordinal);
}
