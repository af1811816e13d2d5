//! SplitMix64 (Steele, Lea and Flood, 2014): tiny, fast, statistically sound for shuffles and crops, and
//! the same stream on every machine, which exact resume and cross-rank agreement rely on.
//!
//! It implements `rand`'s [`TryRng`](rand::TryRng) (so [`rand::Rng`] and [`rand::RngExt`]) and
//! [`SeedableRng`](rand::SeedableRng), so that everything drawn from it — shuffles, ranges, floats — uses
//! `rand`'s maintained algorithms instead of copies of them. `rand` changes the values its algorithms give
//! only in a new minor (pre-1.0: breaking) release, so the workspace pins `rand` to one; a test pins the
//! values the streams give, so that an update that changed them (and so the samples a resumed run would
//! see) cannot land unnoticed.

use rand::RngExt;
use rand::seq::SliceRandom;
use std::convert::Infallible;

/// A seeded 64-bit generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// An independent stream for one (seed, a, b) triple — e.g. (seed, epoch, item) — so threads draw
    /// without sharing state and a result never depends on which thread got there first.
    pub fn keyed(seed: u64, a: u64, b: u64) -> Self {
        let mut g = SplitMix64(seed ^ 0x6A09_E667_F3BC_C908);
        let k1 = g.next_u64() ^ a.wrapping_mul(GOLDEN);
        let mut g = SplitMix64(k1);
        let k2 = g.next_u64() ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        SplitMix64(k2)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` without bias (`rand`'s `random_range`). `n == 0` returns 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.random_range(0..n)
    }

    /// [`below`](Self::below) for indices.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// A uniform float in `[0, 1)` with 53 random bits (`rand`'s `StandardUniform`).
    pub fn unit_f64(&mut self) -> f64 {
        self.random::<f64>()
    }

    /// A uniform permutation (`rand`'s Fisher–Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        v.shuffle(self);
    }
}

impl rand::TryRng for SplitMix64 {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((SplitMix64::next_u64(self) >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(SplitMix64::next_u64(self))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        rand::rand_core::utils::fill_bytes_via_next_word(dst, || self.try_next_u64())
    }
}

impl rand::SeedableRng for SplitMix64 {
    type Seed = [u8; 8];

    fn from_seed(seed: [u8; 8]) -> Self {
        SplitMix64::new(u64::from_le_bytes(seed))
    }

    fn seed_from_u64(seed: u64) -> Self {
        SplitMix64::new(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // The published SplitMix64 test vector (seed 1234567).
        let mut g = SplitMix64::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(g.next_u64(), w);
        }
    }

    #[test]
    fn below_is_in_range_and_unbiased_enough() {
        let mut g = SplitMix64::new(7);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            let v = g.below(6);
            counts[v as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(g.below(0), 0);
        assert_eq!(g.below(1), 0);
    }

    #[test]
    fn keyed_streams_differ_and_repeat() {
        let a = SplitMix64::keyed(1, 2, 3).next_u64();
        assert_eq!(a, SplitMix64::keyed(1, 2, 3).next_u64());
        assert_ne!(a, SplitMix64::keyed(1, 2, 4).next_u64());
        assert_ne!(a, SplitMix64::keyed(1, 3, 3).next_u64());
        assert_ne!(a, SplitMix64::keyed(2, 2, 3).next_u64());
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..1000).collect();
        SplitMix64::new(3).shuffle(&mut v);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
        let u = SplitMix64::new(9).unit_f64();
        assert!((0.0..1.0).contains(&u));
    }
}

#[cfg(test)]
mod pinned {
    use super::*;
    use rand::RngExt;

    /// What one keyed stream gives through every helper: a shuffle, ranges, a float, `rand`'s own range
    /// and float sampling. Resumed runs and other ranks must see exactly these, on every release.
    fn draws() -> (Vec<u32>, Vec<u64>, f64, u32, f32) {
        let mut g = SplitMix64::keyed(42, 3, 7);
        let mut v: Vec<u32> = (0..12).collect();
        g.shuffle(&mut v);
        let below: Vec<u64> = [1000, 7, 1 << 40].iter().map(|&n| g.below(n)).collect();
        let unit = g.unit_f64();
        let range = g.random_range(10..=20u32);
        let float = g.random_range(0.75f32..1.333);
        (v, below, unit, range, float)
    }

    #[test]
    fn streams_give_the_pinned_values() {
        let (v, below, unit, range, float) = draws();
        assert_eq!(v, [3, 1, 4, 6, 5, 8, 2, 9, 0, 11, 10, 7]);
        assert_eq!(below, [250, 3, 1047206189049]);
        assert_eq!(unit.to_bits(), 0.7385459391956869f64.to_bits());
        assert_eq!(range, 10);
        assert_eq!(float.to_bits(), 0.77752006f32.to_bits());
    }
}
