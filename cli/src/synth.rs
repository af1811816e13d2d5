//! A generator of natural-looking test images: fBm noise fields, landscapes, gradients with soft shapes,
//! and wood/marble textures, with sensor-like grain. Deterministic per (seed, index), so the demo's
//! embedded default dataset is the same on every machine without shipping a single image file.

use loader::Image;
use stdx::SplitMix64;

/// The kinds of scene the generator draws, cycled by image index.
const KINDS: usize = 4;

/// Image `index` of the default set, `width`×`height` RGB.
pub fn generate(seed: u64, index: usize, width: u32, height: u32) -> Image {
    let mut rng = SplitMix64::keyed(seed, index as u64, 0x5C3E);
    let (w, h) = (width as usize, height as usize);
    let mut px = vec![0u8; w * h * 3];
    match index % KINDS {
        0 => landscape(&mut rng, w, h, &mut px),
        1 => clouds(&mut rng, w, h, &mut px),
        2 => shapes(&mut rng, w, h, &mut px),
        _ => texture(&mut rng, w, h, &mut px),
    }
    grain(&mut rng, &mut px);
    Image {
        width,
        height,
        channels: 3,
        pixels: px,
    }
}

/// A short name for the scene kind of image `index` (used as its class label in the demo).
pub fn kind_name(index: usize) -> &'static str {
    ["landscape", "clouds", "shapes", "texture"][index % KINDS]
}

/// Fractal (fBm) value noise over a w×h grid, values in about [0, 1]: octaves of bilinearly
/// interpolated random lattices, each twice as fine and half as strong as the last.
fn fbm(rng: &mut SplitMix64, w: usize, h: usize, base_cell: f32, octaves: usize) -> Vec<f32> {
    let mut out = vec![0f32; w * h];
    let (mut cell, mut amp, mut total) = (base_cell, 1.0f32, 0.0f32);
    for _ in 0..octaves {
        let gw = (w as f32 / cell) as usize + 2;
        let gh = (h as f32 / cell) as usize + 2;
        let lattice: Vec<f32> = (0..gw * gh)
            .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
            .collect();
        let inv = 1.0 / cell;
        // Column lattice positions and smoothstep weights, shared by every row.
        let cols: Vec<(usize, f32)> = (0..w)
            .map(|x| {
                let fx = x as f32 * inv;
                let ix = fx as usize;
                let t = fx - ix as f32;
                (ix, t * t * (3.0 - 2.0 * t))
            })
            .collect();
        for y in 0..h {
            let fy = y as f32 * inv;
            let iy = fy as usize;
            let ty = fy - iy as f32;
            let ty = ty * ty * (3.0 - 2.0 * ty);
            let r0 = &lattice[iy * gw..(iy + 1) * gw];
            let r1 = &lattice[(iy + 1) * gw..(iy + 2) * gw];
            let row = &mut out[y * w..(y + 1) * w];
            for (o, &(ix, tx)) in row.iter_mut().zip(&cols) {
                let a = r0[ix] + (r0[ix + 1] - r0[ix]) * tx;
                let b = r1[ix] + (r1[ix + 1] - r1[ix]) * tx;
                *o += amp * (a + (b - a) * ty);
            }
        }
        total += amp;
        amp *= 0.5;
        cell = (cell * 0.5).max(1.5);
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|v| *v *= inv);
    out
}

fn lerp3(a: [f32; 3], b: [f32; 3], t: f32) -> [f32; 3] {
    std::array::from_fn(|c| a[c] + (b[c] - a[c]) * t)
}

fn rand_colour(rng: &mut SplitMix64) -> [f32; 3] {
    std::array::from_fn(|_| 40.0 + (rng.below(180)) as f32)
}

fn put(px: &mut [u8], i: usize, c: [f32; 3]) {
    for k in 0..3 {
        px[i * 3 + k] = c[k].clamp(0.0, 255.0) as u8;
    }
}

/// Sky gradient above an fBm mountain ridge, terrain shaded by a second noise field.
fn landscape(rng: &mut SplitMix64, w: usize, h: usize, px: &mut [u8]) {
    let sky_top = [
        60.0 + rng.below(60) as f32,
        110.0 + rng.below(60) as f32,
        200.0 + rng.below(50) as f32,
    ];
    let sky_low = [
        200.0 + rng.below(50) as f32,
        180.0 + rng.below(50) as f32,
        150.0 + rng.below(60) as f32,
    ];
    let ground =
        [[70.0, 90.0, 50.0], [120.0, 110.0, 80.0], [40.0, 60.0, 40.0]][rng.below(3) as usize];
    let ridge = fbm(rng, w, 1, w as f32 / 6.0, 7);
    let detail = fbm(rng, w, h, h as f32 / 8.0, 6);
    let horizon = 0.35 + rng.below(30) as f32 / 100.0;
    for y in 0..h {
        let fy = y as f32 / h as f32;
        for x in 0..w {
            let top = horizon + (ridge[x] - 0.5) * 0.5;
            let d = detail[y * w + x];
            let c = if fy < top {
                let sky = lerp3(sky_top, sky_low, fy / top.max(0.01));
                lerp3(sky, [255.0; 3], ((d - 0.55) * 2.5).clamp(0.0, 0.6))
            } else {
                let shade = 0.55 + d * 0.9 - (fy - top) * 0.3;
                ground.map(|v| v * shade)
            };
            put(px, y * w + x, c);
        }
    }
}

/// A colour-mapped fBm noise field (clouds, nebulae, marble-ish blotches).
fn clouds(rng: &mut SplitMix64, w: usize, h: usize, px: &mut [u8]) {
    let a = rand_colour(rng);
    let b = rand_colour(rng);
    let c = rand_colour(rng);
    let n = fbm(rng, w, h, w.max(h) as f32 / 5.0, 8);
    for (i, &v) in n.iter().enumerate() {
        let t = ((v - 0.2) / 0.6).clamp(0.0, 1.0);
        let col = if t < 0.5 {
            lerp3(a, b, t * 2.0)
        } else {
            lerp3(b, c, t * 2.0 - 1.0)
        };
        put(px, i, col);
    }
}

/// A diagonal gradient with soft-edged discs and rectangles over it.
fn shapes(rng: &mut SplitMix64, w: usize, h: usize, px: &mut [u8]) {
    let a = rand_colour(rng);
    let b = rand_colour(rng);
    let (wf, hf) = (w as f32, h as f32);
    for y in 0..h {
        for x in 0..w {
            let t = (x as f32 / wf + y as f32 / hf) * 0.5;
            put(px, y * w + x, lerp3(a, b, t));
        }
    }
    let n = 6 + rng.below(10) as usize;
    for _ in 0..n {
        let col = rand_colour(rng);
        let cx = rng.below(w as u64) as f32;
        let cy = rng.below(h as u64) as f32;
        let r = (hf * (0.05 + rng.below(25) as f32 / 100.0)).max(2.0);
        let disc = rng.below(2) == 0;
        let alpha = 0.5 + rng.below(50) as f32 / 100.0;
        let (x0, x1) = (
            (cx - r - 2.0).max(0.0) as usize,
            ((cx + r + 2.0) as usize).min(w),
        );
        let (y0, y1) = (
            (cy - r - 2.0).max(0.0) as usize,
            ((cy + r + 2.0) as usize).min(h),
        );
        for y in y0..y1 {
            for x in x0..x1 {
                let (dx, dy) = (x as f32 - cx, y as f32 - cy);
                let dist = if disc {
                    (dx * dx + dy * dy).sqrt()
                } else {
                    dx.abs().max(dy.abs())
                };
                let cover = (r - dist + 1.0).clamp(0.0, 1.0) * alpha;
                if cover > 0.0 {
                    let i = (y * w + x) * 3;
                    let old = [px[i] as f32, px[i + 1] as f32, px[i + 2] as f32];
                    put(px, y * w + x, lerp3(old, col, cover));
                }
            }
        }
    }
}

/// Wood or marble: sine bands bent by fBm turbulence.
fn texture(rng: &mut SplitMix64, w: usize, h: usize, px: &mut [u8]) {
    let a = rand_colour(rng);
    let b = rand_colour(rng);
    let freq = 8.0 + rng.below(30) as f32;
    let turb = 4.0 + rng.below(8) as f32;
    let n = fbm(rng, w, h, w.max(h) as f32 / 4.0, 7);
    let (wf, hf) = (w as f32, h as f32);
    for y in 0..h {
        for x in 0..w {
            let v = n[y * w + x];
            let s =
                ((x as f32 / wf * 0.7 + y as f32 / hf * 0.3) * freq + v * turb).sin() * 0.5 + 0.5;
            put(px, y * w + x, lerp3(a, b, s.powf(0.7)));
        }
    }
}

/// Mild sensor-like grain (±3 levels), so that no codec sees perfectly smooth synthetic gradients.
fn grain(rng: &mut SplitMix64, px: &mut [u8]) {
    let mut bits = 0u64;
    let mut left = 0;
    for p in px.iter_mut() {
        if left == 0 {
            bits = rng.next_u64();
            left = 21;
        }
        let r = (bits & 7) as i16 - 3;
        bits >>= 3;
        left -= 1;
        *p = (*p as i16 + r).clamp(0, 255) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_varied() {
        let a = generate(1, 0, 64, 48);
        assert_eq!(a, generate(1, 0, 64, 48));
        assert_ne!(a, generate(1, 4, 64, 48));
        for k in 0..KINDS {
            let img = generate(7, k, 33, 17);
            assert_eq!(img.pixels.len(), 33 * 17 * 3);
            let distinct: std::collections::HashSet<_> = img.pixels.chunks(3).collect();
            assert!(distinct.len() > 50, "kind {k} is too flat");
        }
    }
}
