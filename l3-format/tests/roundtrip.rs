//! Round trips and byte-exact agreement with a from-the-spec reference encoder.

use l3_format::{L3File, decode_patch, encode, encode_parallel};
use proptest::prelude::*;

/// A deliberately naive encoder written from SPEC.md alone (bit-by-bit writer, textbook predictor).
mod reference {
    pub fn predict(prev: &[u8], c: usize) -> u8 {
        let w = prev.len();
        let (has_tl, has_tr) = (c > 0, c + 1 < w);
        let tl = if has_tl { prev[c - 1] as i32 } else { 0 };
        let t = prev[c] as i32;
        let tr = if has_tr { prev[c + 1] as i32 } else { 0 };
        let p = tl + tr - t;
        let mut best = (i32::MAX, 0);
        for (present, v) in [(has_tl, tl), (true, t), (has_tr, tr)] {
            if present && (p - v).abs() < best.0 {
                best = ((p - v).abs(), v);
            }
        }
        best.1 as u8
    }

    struct Bits {
        bytes: Vec<u8>,
        n: usize,
    }
    impl Bits {
        fn push(&mut self, v: u32, bits: usize) {
            for i in 0..bits {
                if self.n.is_multiple_of(8) {
                    self.bytes.push(0);
                }
                if (v >> i) & 1 == 1 {
                    *self.bytes.last_mut().unwrap() |= 1 << (self.n % 8);
                }
                self.n += 1;
            }
        }
    }

    pub fn patch(plane: &[u8], stride: usize, x: usize, y: usize, w: usize, h: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for r in 0..h {
            let row = |rr: usize| &plane[(y + rr) * stride + x..(y + rr) * stride + x + w];
            let stored: Vec<i8> = (0..w)
                .map(|c| {
                    let v = row(r)[c];
                    let s = if r == 0 {
                        v
                    } else {
                        v.wrapping_sub(predict(row(r - 1), c))
                    };
                    s as i8
                })
                .collect();
            let (lo, hi) = (*stored.iter().min().unwrap(), *stored.iter().max().unwrap());
            let range = (hi as i32 - lo as i32) as u32;
            let nbit = 32 - range.leading_zeros() as usize;
            let mut b = Bits {
                bytes: Vec::new(),
                n: 0,
            };
            b.push(nbit as u32, 4);
            b.push(lo as u8 as u32, 8);
            for s in &stored {
                b.push((*s as i32 - lo as i32) as u32, nbit);
            }
            out.extend(b.bytes);
        }
        out
    }

    pub fn file(px: &[u8], w: usize, h: usize, c: usize, n: usize) -> Vec<u8> {
        let mut table = Vec::new();
        let mut data = Vec::new();
        for ch in 0..c {
            let plane: Vec<u8> = px.iter().skip(ch).step_by(c).copied().collect();
            for gy in 0..h.div_ceil(n) {
                for gx in 0..w.div_ceil(n) {
                    table.extend((data.len() as u32).to_le_bytes());
                    let (x, y) = (gx * n, gy * n);
                    data.extend(patch(&plane, w, x, y, n.min(w - x), n.min(h - y)));
                }
            }
        }
        let mut f = b"L3IM".to_vec();
        f.extend(1u16.to_le_bytes());
        f.extend((w as u32).to_le_bytes());
        f.extend((h as u32).to_le_bytes());
        f.extend([c as u8, 8, n as u8, 0, 0, 0]);
        f.extend(table);
        f.extend(data);
        f
    }
}

fn image(w: usize, h: usize, c: usize, seed: u64, smooth: bool) -> Vec<u8> {
    let mut s = seed | 1;
    (0..w * h * c)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if smooth {
                let (x, y) = ((i / c) % w, (i / c) / w);
                ((x * 3 + y * 2 + (i % c) * 40) as u64 + (s % 5)) as u8
            } else {
                s as u8
            }
        })
        .collect()
}

fn roundtrip(px: &[u8], w: u32, h: u32, c: u8, n: u8) {
    let file = encode(px, w, h, c, n).unwrap();
    assert_eq!(
        file,
        reference::file(px, w as usize, h as usize, c as usize, n as usize)
    );
    let f = L3File::parse(&file).unwrap();
    let mut hwc = vec![0u8; f.decoded_len()];
    f.decode_hwc(&mut hwc).unwrap();
    assert_eq!(hwc, px);
    let mut hwc2 = vec![0u8; f.decoded_len()];
    f.decode_hwc_parallel(&mut hwc2, 3).unwrap();
    assert_eq!(hwc2, px);
    let mut chw = vec![0u8; f.decoded_len()];
    f.decode_chw(&mut chw).unwrap();
    let plane = (w * h) as usize;
    for i in 0..plane {
        for ch in 0..c as usize {
            assert_eq!(chw[ch * plane + i], px[i * c as usize + ch]);
        }
    }
    let mut chw2 = vec![0u8; f.decoded_len()];
    f.decode_chw_parallel(&mut chw2, 2).unwrap();
    assert_eq!(chw2, chw);
    assert_eq!(encode_parallel(px, w, h, c, n, 3).unwrap(), file);
}

#[test]
fn small_cases_and_edges() {
    for &(w, h) in &[
        (1, 1),
        (1, 7),
        (7, 1),
        (2, 2),
        (33, 17),
        (64, 64),
        (65, 129),
    ] {
        for c in [1u8, 3, 4] {
            for n in [1u8, 2, 3, 8, 32, 255] {
                roundtrip(&image(w, h, c as usize, 9, true), w as u32, h as u32, c, n);
                roundtrip(&image(w, h, c as usize, 5, false), w as u32, h as u32, c, n);
            }
        }
    }
}

#[test]
fn constant_image_costs_two_bytes_per_row() {
    // Black: every row has nbit 0, so each row is exactly its 12-bit header padded to 2 bytes.
    let (w, h) = (100u32, 70u32);
    let f = encode(&vec![0u8; 100 * 70 * 3], w, h, 3, 32).unwrap();
    let f = L3File::parse(&f).unwrap();
    let rows_per_channel = 4 * 70; // 4 patch columns, each with 70 rows in total
    assert_eq!(f.patch_data().len(), 3 * rows_per_channel * 2);
}

#[test]
fn decode_patch_matches_file_decode() {
    let (w, h, c) = (70usize, 45usize, 3usize);
    let px = image(w, h, c, 3, true);
    let file = encode(&px, w as u32, h as u32, c as u8, 32).unwrap();
    let f = L3File::parse(&file).unwrap();
    for ch in 0..c {
        for p in 0..f.patches_per_channel() {
            let r = f.patch_rect(p);
            let stride = r.w as usize + 5;
            let mut out = vec![0u8; stride * r.h as usize];
            decode_patch(
                f.patch_bytes(ch, p),
                r.w as usize,
                r.h as usize,
                &mut out,
                stride,
            )
            .unwrap();
            for y in 0..r.h as usize {
                for x in 0..r.w as usize {
                    let (ix, iy) = (r.x as usize + x, r.y as usize + y);
                    assert_eq!(out[y * stride + x], px[(iy * w + ix) * c + ch]);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn prop_roundtrip(w in 1u32..300, h in 1u32..300, c in prop::sample::select(vec![1u8, 3, 4]),
                      n in 1u8..=255, seed in any::<u64>(), smooth in any::<bool>()) {
        let px = image(w as usize, h as usize, c as usize, seed, smooth);
        roundtrip(&px, w, h, c, n);
    }
}
