//! How far two outputs are apart, how visible tile borders are, and how much memory a run took.

use crate::tensor::Tensor;

/// Differences between an output and a reference of the same shape.
#[derive(Clone, Copy, Debug)]
pub struct ErrorStats {
    /// On the raw f32 outputs.
    pub max_abs: f32,
    pub mean_abs: f64,
    /// On outputs clamped to 0..255 as they are saved, peak 255 (infinite when identical).
    pub psnr_db: f64,
}

pub fn compare(a: &Tensor, b: &Tensor) -> ErrorStats {
    assert_eq!((a.c, a.h, a.w), (b.c, b.h, b.w), "compare: shapes differ");
    let mut max_abs = 0.0f32;
    let mut sum = 0.0f64;
    let mut sq = 0.0f64;
    for (&x, &y) in a.data.iter().zip(&b.data) {
        let d = (x - y).abs();
        max_abs = max_abs.max(d);
        sum += d as f64;
        let e = (x.clamp(0.0, 255.0) - y.clamp(0.0, 255.0)) as f64;
        sq += e * e;
    }
    let n = a.data.len().max(1) as f64;
    let mse = sq / n;
    ErrorStats {
        max_abs,
        mean_abs: sum / n,
        psnr_db: if mse == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (255.0f64 * 255.0 / mse).log10()
        },
    }
}

/// Mean absolute jump between neighbouring pixels across tile borders, and everywhere else.
#[derive(Clone, Copy, Debug)]
pub struct Seams {
    pub across: f64,
    pub inside: f64,
}

impl Seams {
    /// `across / inside`: about 1 when borders are invisible.
    pub fn ratio(&self) -> f64 {
        self.across / self.inside.max(1e-12)
    }
}

/// The seam metric on an output (clamped to 0..255) with inner tile borders `rows`/`cols` in its
/// coordinates: a border at `b` is the jump between pixels `b-1` and `b`.
pub fn seams(t: &Tensor, rows: &[usize], cols: &[usize]) -> Seams {
    let (mut a, mut na, mut i, mut ni) = (0.0f64, 0u64, 0.0f64, 0u64);
    let v = |c, y, x| t.at(c, y, x).clamp(0.0, 255.0) as f64;
    for c in 0..t.c {
        for y in 0..t.h {
            for x in 1..t.w {
                let d = (v(c, y, x) - v(c, y, x - 1)).abs();
                if cols.contains(&x) {
                    a += d;
                    na += 1;
                } else {
                    i += d;
                    ni += 1;
                }
            }
        }
        for y in 1..t.h {
            let border = rows.contains(&y);
            for x in 0..t.w {
                let d = (v(c, y, x) - v(c, y - 1, x)).abs();
                if border {
                    a += d;
                    na += 1;
                } else {
                    i += d;
                    ni += 1;
                }
            }
        }
    }
    Seams {
        across: a / na.max(1) as f64,
        inside: i / ni.max(1) as f64,
    }
}

/// Peak and current resident set of this process in bytes (`VmHWM`, `VmRSS`); `None` off Linux.
pub fn rss() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}
