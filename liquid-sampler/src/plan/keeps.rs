//! Which draws of each batch move to the next-epoch region, planned once: the format mix of every batch
//! is the same each epoch, and so is this plan. A batch reads from disk the draws it does not keep, so
//! level keeps are level disk traffic.
//!
//! Some keeps are fixed: a format that retains all its items keeps every draw, and a pinned format (its
//! buffer all retention) keeps its last draw, the only one that may fill its last slot. The rest are
//! free, each format owing its own number, and are spread in two steps:
//! - *level* ([`level`]): the ideal, fractional keeps per batch, as level as the formats' draws allow — a
//!   balanced max flow from formats to batches;
//! - *split*: batch by batch, each takes `floor` or `ceil` of its ideal (as near its rounded running total
//!   as it can), one keep at a time from the format owing the most per chance left, among those whose
//!   choice leaves the rest of the epoch placeable. Placeable is checked exactly: the rest is a
//!   transportation problem with exact supplies (what each format owes) and demand intervals (the
//!   batches'), solvable iff every set `S` of formats owes no more than the batches can take from it,
//!   `sum of min(hi_b, draws of S in b)`, and no less than they need from it, `sum of max(0, lo_b - draws
//!   of the others in b)` (Hoffman's circulation theorem). The fractional ideal is such a solution, so an
//!   integral one exists, and a greedy that keeps the rest solvable never gets stuck.

use super::mix;

/// Past this many formats the 2^formats check costs too much; the split then goes by owing alone.
const EXACT_SPLIT_FORMATS: usize = 10;

pub(super) struct KeepPlan {
    formats: usize,
    /// Batch-major: `draws[b * formats + f]`, the format mix the plan was made for.
    draws: Vec<u32>,
    /// Batch-major: `keeps[b * formats + f]`.
    keeps: Vec<u32>,
}

impl KeepPlan {
    /// `counts[f]` items of format `f`, `retain[f]` of them kept for the next epoch, `pinned[f]` as above.
    pub(super) fn new(
        counts: &[usize],
        retain: &[usize],
        pinned: &[bool],
        batch: usize,
    ) -> KeepPlan {
        let epoch = Epoch::new(counts, retain, pinned, batch);
        let shape: Vec<(usize, usize)> = (0..epoch.batches)
            .map(|b| (epoch.len(b), epoch.sum(&epoch.fixed, b)))
            .collect();
        let ideal = level(&shape, &epoch.room, &epoch.owed, batch);
        let keeps = split(&epoch, &ideal);
        KeepPlan {
            formats: epoch.nf,
            draws: epoch.draws,
            keeps,
        }
    }

    /// Draws of each format in batch `b` of an epoch.
    pub(super) fn draws(&self, b: usize) -> Vec<usize> {
        let row = &self.draws[b * self.formats..(b + 1) * self.formats];
        row.iter().map(|&x| x as usize).collect()
    }

    /// Keeps planned for format `f` in batch `b` of an epoch.
    pub(super) fn get(&self, b: usize, f: usize) -> usize {
        self.keeps[b * self.formats + f] as usize
    }
}

/// One epoch's batches as the keeps see them: the format mix of each, its fixed keeps, and the draws that
/// may take a free keep.
struct Epoch {
    nf: usize,
    n: usize,
    batch: usize,
    batches: usize,
    /// Free keeps each format owes over the epoch.
    owed: Vec<usize>,
    /// Batch-major, per batch and format: fixed keeps, and draws that may take a free one.
    fixed: Vec<usize>,
    room: Vec<usize>,
    /// Batch-major: the format mix.
    draws: Vec<u32>,
}

impl Epoch {
    fn new(counts: &[usize], retain: &[usize], pinned: &[bool], batch: usize) -> Epoch {
        let nf = counts.len();
        let n: usize = counts.iter().sum();
        let batches = n.div_ceil(batch);
        let partial = |f: usize| retain[f] > 0 && retain[f] < counts[f];
        let owed: Vec<usize> = (0..nf)
            .map(|f| {
                if partial(f) {
                    retain[f] - usize::from(pinned[f])
                } else {
                    0
                }
            })
            .collect();
        let mut fixed = vec![0usize; batches * nf];
        let mut room = vec![0usize; batches * nf];
        let mut drawn = vec![0; nf];
        let mut draws = Vec::with_capacity(batches * nf);
        for b in 0..batches {
            let s0 = b * batch;
            let m = mix(counts, &drawn, s0, (s0 + batch).min(n));
            draws.extend(m.iter().map(|&x| x as u32));
            for f in 0..nf {
                let i = b * nf + f;
                if retain[f] == counts[f] {
                    fixed[i] = m[f];
                } else if partial(f) {
                    let last = m[f] > 0 && drawn[f] + m[f] == counts[f];
                    fixed[i] = usize::from(pinned[f] && last);
                    if owed[f] > 0 {
                        room[i] = m[f] - fixed[i];
                    }
                }
                drawn[f] += m[f];
            }
        }
        Epoch {
            nf,
            n,
            batch,
            batches,
            owed,
            fixed,
            room,
            draws,
        }
    }

    fn sum(&self, v: &[usize], b: usize) -> usize {
        v[b * self.nf..(b + 1) * self.nf].iter().sum()
    }

    fn len(&self, b: usize) -> usize {
        self.batch.min(self.n - b * self.batch)
    }
}

/// The split (see the module documentation): batch by batch, the free keeps of each format, plus the
/// fixed ones; batch-major.
fn split(epoch: &Epoch, ideal: &[f64]) -> Vec<u32> {
    let Epoch {
        nf,
        batches,
        ref fixed,
        ref room,
        ..
    } = *epoch;
    let mut owed = epoch.owed.clone();
    // Batch `b` takes between `lo` and `hi` free keeps.
    let exact = nf <= EXACT_SPLIT_FORMATS;
    let sets = if exact { 1usize << nf } else { 0 };
    let everyone = sets.saturating_sub(1);
    let bounds: Vec<(usize, usize)> = (0..batches)
        .map(|b| {
            let room_b = epoch.sum(room, b);
            let lo = ((ideal[b] + 1e-6).floor().max(0.0) as usize).min(room_b);
            let hi = ((ideal[b] - 1e-6).ceil().max(0.0) as usize).clamp(lo, room_b);
            (lo, hi)
        })
        .collect();
    let room_of = |b: usize, set: usize| -> usize {
        (0..nf)
            .filter(|&f| set >> f & 1 == 1)
            .map(|f| room[b * nf + f])
            .sum()
    };
    let take = |b: usize, set: usize| -> (usize, usize) {
        let (lo, hi) = bounds[b];
        (
            lo.saturating_sub(room_of(b, everyone & !set)),
            hi.min(room_of(b, set)),
        )
    };
    // `later[S]`: what the batches after the current one need from, and can take from, set S.
    let mut later = vec![(0usize, 0usize); sets];
    for b in 0..batches {
        for (set, l) in later.iter_mut().enumerate() {
            let (need, can) = take(b, set);
            *l = (l.0 + need, l.1 + can);
        }
    }
    let mut ahead: Vec<usize> = (0..nf)
        .map(|f| (0..batches).map(|b| room[b * nf + f]).sum())
        .collect();
    let mut keeps = vec![0u32; batches * nf];
    let (mut ideal_total, mut placed) = (0.0f64, 0usize);
    for b in 0..batches {
        for (set, l) in later.iter_mut().enumerate() {
            let (need, can) = take(b, set);
            *l = (l.0 - need, l.1 - can);
        }
        let here = &room[b * nf..(b + 1) * nf];
        let (lo, hi) = bounds[b];
        let mut k = vec![0usize; nf];
        // Whether the rest is solvable after this batch's `k`, `g` once more if given, with this
        // batch still to take between `lo_here` and `hi_here` more.
        let solvable =
            |k: &[usize], owed: &[usize], g: Option<usize>, lo_here: usize, hi_here: usize| {
                (1..sets).all(|set| {
                    let (mut owes, mut mine, mut others) = (0, 0, 0);
                    for f in 0..nf {
                        let one = usize::from(g == Some(f));
                        if set >> f & 1 == 1 {
                            owes += owed[f] - one;
                            mine += here[f] - k[f] - one;
                        } else {
                            others += here[f] - k[f] - one;
                        }
                    }
                    let need = lo_here.saturating_sub(others) + later[set].0;
                    need <= owes && owes <= hi_here.min(mine) + later[set].1
                })
            };
        // Owing the most per chance left first: owed / (ahead - k), compared without division.
        let by_pressure = |k: &[usize], owed: &[usize]| {
            let mut order: Vec<usize> =
                (0..nf).filter(|&f| k[f] < here[f] && owed[f] > 0).collect();
            order.sort_by(|&a, &b| {
                let (na, nb) = (owed[a] * (ahead[b] - k[b]), owed[b] * (ahead[a] - k[a]));
                nb.cmp(&na).then(a.cmp(&b))
            });
            order
        };
        ideal_total += ideal[b];
        let target = ((ideal_total + 1e-6).round() as usize)
            .saturating_sub(placed)
            .clamp(lo, hi);
        let mut count = 0;
        loop {
            let done = count >= target && solvable(&k, &owed, None, 0, 0);
            if done || count >= here.iter().sum::<usize>() {
                break;
            }
            let (lo_next, hi_next) = (lo.saturating_sub(count + 1), hi.saturating_sub(count + 1));
            let order = by_pressure(&k, &owed);
            // A keep that leaves the rest solvable; failing that, stop here if this batch may close
            // as it is, else (never while the plan is solvable) the most pressed format.
            let fitting = order
                .iter()
                .find(|&&g| solvable(&k, &owed, Some(g), lo_next, hi_next));
            let g = match fitting {
                Some(&g) => g,
                None if solvable(&k, &owed, None, 0, 0) => break,
                None => match order.first() {
                    Some(&g) => g,
                    None => break,
                },
            };
            k[g] += 1;
            owed[g] -= 1;
            count += 1;
        }
        placed += count;
        for f in 0..nf {
            ahead[f] -= here[f];
            keeps[b * nf + f] = (fixed[b * nf + f] + k[f]) as u32;
        }
    }
    keeps
}

/// Free keeps per batch, as level as the formats allow: batch `b` is `shape[b] = (len, fixed)`, format
/// `f` owes `owed[f]` and may place them in its draws `room[b * formats + f]`.
///
/// A common level `L` fills batch `b` to `L * len / batch` less its fixed keeps; what the formats can then
/// place is a max flow (formats to batches), read off its min cut: `min over sets S of formats of
/// owed(not S) + sum over batches of min(fill, room of S)`. The lowest `L` that places everything is found
/// by bisection. Its tight cut (the largest) names the formats that bind and the batches they fill to
/// exactly `L`; the formats outside it have keeps to spare for the other batches, which are levelled
/// again, lower, once what the binding formats put there is counted as fixed. That ends after at most
/// one round per format.
fn level(shape: &[(usize, usize)], room: &[usize], owed: &[usize], batch: usize) -> Vec<f64> {
    let (nf, nb) = (owed.len(), shape.len());
    let exact = nf <= EXACT_SPLIT_FORMATS;
    let room_of = |b: usize, set: &[bool]| -> f64 {
        (0..nf)
            .filter(|&f| set[f])
            .map(|f| room[b * nf + f])
            .sum::<usize>() as f64
    };
    // Per batch: keeps from formats that bound an earlier round (whole draws), and the share of the level
    // it was filled to.
    let mut whole = vec![0usize; nb];
    let mut share = vec![0.0f64; nb];
    let mut fixed: Vec<f64> = shape.iter().map(|s| s.1 as f64).collect();
    let mut open_b = vec![true; nb];
    let mut open_f: Vec<bool> = owed.iter().map(|&o| o > 0).collect();
    while open_f.iter().any(|&o| o) {
        let formats: Vec<usize> = (0..nf).filter(|&f| open_f[f]).collect();
        let owing: f64 = formats.iter().map(|&f| owed[f] as f64).sum();
        // Sets of open formats, as membership vectors: all subsets when few, else just all of them.
        let sets: Vec<Vec<bool>> = if exact {
            (1..1usize << formats.len())
                .map(|m| {
                    let mut v = vec![false; nf];
                    for (i, &f) in formats.iter().enumerate() {
                        v[f] = m >> i & 1 == 1;
                    }
                    v
                })
                .collect()
        } else {
            vec![open_f.clone()]
        };
        let fill =
            |b: usize, level: f64| (level * shape[b].0 as f64 / batch as f64 - fixed[b]).max(0.0);
        let cut = |set: &[bool], level: f64| -> f64 {
            let outside: usize = formats.iter().filter(|&&f| !set[f]).map(|&f| owed[f]).sum();
            outside as f64
                + (0..nb)
                    .filter(|&b| open_b[b])
                    .map(|b| fill(b, level).min(room_of(b, set)))
                    .sum::<f64>()
        };
        let placed = |level: f64| {
            sets.iter()
                .map(|s| cut(s, level))
                .fold(f64::INFINITY, f64::min)
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        while placed(hi) < owing && hi < 1e12 {
            hi *= 2.0;
        }
        for _ in 0..64 {
            let mid = (lo + hi) / 2.0;
            if placed(mid) < owing {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // The tight sets at `hi`; their union is tight too (cuts are submodular).
        let eps = 1e-7 * (owing + 1.0);
        let mut binding = vec![false; nf];
        for set in sets.iter().filter(|s| cut(s, hi) <= owing + eps) {
            for f in 0..nf {
                binding[f] |= set[f];
            }
        }
        if !binding.iter().any(|&b| b) {
            binding = open_f.clone();
        }
        let wants: Vec<f64> = (0..nb).map(|b| fill(b, hi)).collect();
        for b in 0..nb {
            if !open_b[b] {
                continue;
            }
            let (want, can) = (wants[b], room_of(b, &binding));
            if want <= can + eps {
                share[b] = want;
                open_b[b] = false;
            } else {
                whole[b] += can as usize;
                fixed[b] += can;
            }
        }
        for f in 0..nf {
            open_f[f] &= !binding[f];
        }
    }
    (0..nb).map(|b| whole[b] as f64 + share[b]).collect()
}
