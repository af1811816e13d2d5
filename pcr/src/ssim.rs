//! Mean structural similarity (MSSIM, Wang et al. 2004) on luma: the fidelity measure of the paper's Fig. 7.
//!
//! Standard parameters: 11×11 Gaussian window with σ = 1.5, K1 = 0.01, K2 = 0.03, L = 255, computed over
//! every window that fits inside the image ("valid"), on Y = 0.299 R + 0.587 G + 0.114 B.

use crate::decode::Image;
use std::convert::Infallible;

const WIN: usize = 11;
const C1: f64 = (0.01 * 255.0) * (0.01 * 255.0);
const C2: f64 = (0.03 * 255.0) * (0.03 * 255.0);

fn gaussian() -> [f64; WIN] {
    let mut g = [0.0; WIN];
    let mut sum = 0.0;
    for (i, v) in g.iter_mut().enumerate() {
        let d = i as f64 - (WIN / 2) as f64;
        *v = (-d * d / (2.0 * 1.5 * 1.5)).exp();
        sum += *v;
    }
    g.iter_mut().for_each(|v| *v /= sum);
    g
}

fn luma(img: &Image) -> Vec<f32> {
    img.pixels
        .chunks_exact(3)
        .map(|p| 0.299 * p[0] as f32 + 0.587 * p[1] as f32 + 0.114 * p[2] as f32)
        .collect()
}

/// Mean SSIM of two RGB images' luma, or `None` when their sizes differ or either side is under 11 pixels.
pub fn mssim_luma(a: &Image, b: &Image) -> Option<f64> {
    if a.width != b.width || a.height != b.height || a.width < WIN as u32 || a.height < WIN as u32 {
        return None;
    }
    let (w, h) = (a.width as usize, a.height as usize);
    let (x, y) = (luma(a), luma(b));
    let g = gaussian();
    let (ow, oh) = (w - WIN + 1, h - WIN + 1);
    // Bands of output rows, each with its own 11-row ring of horizontally filtered moments.
    const BAND: usize = 64;
    let bands: Vec<usize> = (0..oh.div_ceil(BAND)).collect();
    let band_sums = stdx::parallel::map(&bands, 0, |_, &band| {
        let (r0, r1) = (band * BAND, ((band + 1) * BAND).min(oh));
        // ring[slot][moment][col]: moments are x, y, x², y², xy.
        let mut ring = vec![
            [
                vec![0f64; ow],
                vec![0f64; ow],
                vec![0f64; ow],
                vec![0f64; ow],
                vec![0f64; ow]
            ];
            WIN
        ];
        let mut total = 0.0;
        for src in r0..r1 + WIN - 1 {
            let slot = &mut ring[src % WIN];
            let (xr, yr) = (&x[src * w..(src + 1) * w], &y[src * w..(src + 1) * w]);
            for c in 0..ow {
                let mut m = [0.0f64; 5];
                for (k, &gk) in g.iter().enumerate() {
                    let (p, q) = (xr[c + k] as f64, yr[c + k] as f64);
                    m[0] += gk * p;
                    m[1] += gk * q;
                    m[2] += gk * p * p;
                    m[3] += gk * q * q;
                    m[4] += gk * p * q;
                }
                for (s, v) in slot.iter_mut().zip(m) {
                    s[c] = v;
                }
            }
            if src + 1 < r0 + WIN {
                continue;
            }
            let top = src + 1 - WIN; // output row
            for c in 0..ow {
                let mut m = [0.0f64; 5];
                for (k, &gk) in g.iter().enumerate() {
                    let s = &ring[(top + k) % WIN];
                    for (mi, mv) in m.iter_mut().enumerate() {
                        *mv += gk * s[mi][c];
                    }
                }
                let (mx, my) = (m[0], m[1]);
                let (vx, vy, cxy) = (m[2] - mx * mx, m[3] - my * my, m[4] - mx * my);
                total += ((2.0 * mx * my + C1) * (2.0 * cxy + C2))
                    / ((mx * mx + my * my + C1) * (vx + vy + C2));
            }
        }
        Ok::<f64, Infallible>(total)
    });
    let sum: f64 = match band_sums {
        Ok(v) => v.iter().sum(),
        Err(never) => match never {},
    };
    Some(sum / (ow * oh) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gray(w: u32, h: u32, f: impl Fn(u32, u32) -> u8) -> Image {
        let mut pixels = Vec::new();
        for yy in 0..h {
            for xx in 0..w {
                let v = f(xx, yy);
                pixels.extend([v, v, v]);
            }
        }
        Image::rgb8(w, h, pixels)
    }

    /// Direct definition: SSIM at each window position, no ring buffers.
    fn brute(a: &Image, b: &Image) -> f64 {
        let (w, h) = (a.width as usize, a.height as usize);
        let (x, y) = (luma(a), luma(b));
        let g = gaussian();
        let mut total = 0.0;
        for r in 0..=h - WIN {
            for c in 0..=w - WIN {
                let mut m = [0.0f64; 5];
                for i in 0..WIN {
                    for j in 0..WIN {
                        let wt = g[i] * g[j];
                        let (p, q) = (x[(r + i) * w + c + j] as f64, y[(r + i) * w + c + j] as f64);
                        m[0] += wt * p;
                        m[1] += wt * q;
                        m[2] += wt * p * p;
                        m[3] += wt * q * q;
                        m[4] += wt * p * q;
                    }
                }
                let (mx, my) = (m[0], m[1]);
                total += ((2.0 * mx * my + C1) * (2.0 * (m[4] - mx * my) + C2))
                    / ((mx * mx + my * my + C1) * (m[2] - mx * mx + m[3] - my * my + C2));
            }
        }
        total / ((w - WIN + 1) * (h - WIN + 1)) as f64
    }

    #[test]
    fn identical_is_one_and_matches_direct_definition() {
        let a = gray(50, 77, |x, y| ((x * 7 + y * 13) % 256) as u8);
        assert!((mssim_luma(&a, &a).unwrap() - 1.0).abs() < 1e-9);
        let b = gray(50, 77, |x, y| ((x * 7 + y * 13 + (x * y) % 17) % 256) as u8);
        let fast = mssim_luma(&a, &b).unwrap();
        let slow = brute(&a, &b);
        assert!((fast - slow).abs() < 1e-9, "{fast} vs {slow}");
        assert!(fast < 0.99);
        // Inverting the image destroys structure: SSIM far below 1.
        let inv = gray(50, 77, |x, y| 255 - ((x * 7 + y * 13) % 256) as u8);
        assert!(mssim_luma(&a, &inv).unwrap() < 0.2);
        assert!(mssim_luma(&a, &gray(10, 77, |_, _| 0)).is_none());
    }
}
