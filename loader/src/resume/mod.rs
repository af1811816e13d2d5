//! Resuming: the saved position ([`LoaderState`]), its checks against the options and the dataset, and
//! the arithmetic of an elastic resume — where a run starts when the world size or the batch size
//! changed since the state was saved (the part of its epoch no rank delivered, shared anew; under the
//! Liquid order found by replaying each saved rank's schedule without I/O).

mod check;
mod fingerprint;
mod state;

pub(crate) use check::check_state;
pub use check::{MAX_EPOCH, check_contents};
pub use state::LoaderState;

use crate::error::{Error, Result};
use crate::options::LoaderOptions;
use crate::pipeline::schedule::{Part, ShardedOrder};
use std::ops::Range;
use std::sync::Arc;

/// Where a run starts: the position of its first batch, and the part of an epoch it finishes first
/// (an epoch resumed at another shape, or from a state that holds a part).
pub(crate) struct Start {
    pub next: LoaderState,
    pub part: Option<Part>,
}

/// Batches of `per` items at `batch_size` (the last one short, or dropped with `drop_last`).
pub(crate) fn batches_for(o: &LoaderOptions, per: usize, batch_size: usize) -> usize {
    if o.drop_last {
        per / batch_size.max(1)
    } else {
        per.div_ceil(batch_size.max(1))
    }
}

/// Where a run of `o` over `order` (with `batches_per_epoch` per epoch; `liquid`: the Liquid dataset
/// and its budget under that order) starts from `state`: the state's position at the state's shape,
/// or — at another world size or batch size — the part of its epoch no rank delivered, shared anew.
pub(crate) fn start(
    order: &ShardedOrder,
    o: &LoaderOptions,
    state: LoaderState,
    liquid: Option<(&liquid_sampler::Dataset, u64)>,
    batches_per_epoch: usize,
) -> Result<Start> {
    let count = |r: &[Range<usize>]| r.iter().map(|r| r.len()).sum::<usize>();
    let saved = ShardedOrder {
        world_size: state.world_size.max(1),
        rank: 0,
        ..order.clone()
    };
    let saved_batches = match &state.remaining {
        None => batches_for(o, saved.per_rank(), state.batch_size),
        Some(r) => batches_for(o, saved.per_rank_of(count(r)), state.batch_size),
    };
    if state.batch > saved_batches {
        return Err(Error::Resume(format!(
            "batch {} is past the {saved_batches} batches of an epoch",
            state.batch
        )));
    }
    let reshaped = state.world_size != o.world_size || state.batch_size != o.batch_size;
    let (mut next, mut part) = if reshaped && state.batch < saved_batches {
        let left = match liquid {
            None => saved.left_after(state.remaining.as_deref(), state.batch, state.batch_size),
            Some((l, budget)) => liquid_left(l, o, budget, &state)?,
        };
        let batches = batches_for(o, order.per_rank_of(count(&left)), o.batch_size);
        let next = LoaderState {
            batch: 0,
            rank: o.rank,
            world_size: o.world_size,
            batch_size: o.batch_size,
            remaining: Some(left.clone()),
            ..state
        };
        (
            next,
            Some(Part {
                epoch: state.epoch,
                remaining: left,
                batches,
            }),
        )
    } else if reshaped {
        let next = LoaderState {
            epoch: state.epoch + 1,
            batch: 0,
            rank: o.rank,
            world_size: o.world_size,
            batch_size: o.batch_size,
            remaining: None,
            ..state
        };
        (next, None)
    } else {
        let part = state.remaining.clone().map(|r| Part {
            epoch: state.epoch,
            batches: saved_batches,
            remaining: r,
        });
        (
            LoaderState {
                rank: o.rank,
                ..state
            },
            part,
        )
    };
    next.contents = Some(LoaderState::contents_of(o));
    let this_epoch = part.as_ref().map_or(batches_per_epoch, |p| p.batches);
    if next.batch >= this_epoch {
        next.epoch += 1;
        next.batch = 0;
        next.remaining = None;
        part = None;
    }
    Ok(Start { next, part })
}

/// The sampler configuration of rank `rank` of `world_size` at `batch_size`; `items`: the part of an
/// epoch they share out (`None`: the whole dataset).
pub(crate) fn liquid_config(
    o: &LoaderOptions,
    budget: u64,
    rank: usize,
    world_size: usize,
    batch_size: usize,
    items: Option<Arc<[u32]>>,
) -> liquid_sampler::SamplerConfig {
    liquid_sampler::SamplerConfig {
        budget,
        batch: batch_size,
        seed: o.seed,
        rank,
        world_size,
        shard_policy: o.shard_tail,
        io_threads: o.io_threads,
        items,
    }
}

/// Item indices (the manifest's) of a state's `remaining` ranges: under the Liquid order they name
/// items, not positions in a global permutation (it has none).
pub(crate) fn liquid_items(remaining: &[Range<usize>]) -> Arc<[u32]> {
    remaining
        .iter()
        .flat_map(|r| r.clone())
        .map(|i| i as u32)
        .collect()
}

pub(crate) fn liquid_error(ds: &liquid_sampler::Dataset, e: liquid_sampler::Error) -> Error {
    match e {
        liquid_sampler::Error::BudgetTooSmall { .. } | liquid_sampler::Error::BadSetting(_) => {
            Error::Options(format!("Liquid order on {}: {e}", ds.dir.display()))
        }
        e => Error::dataset(&ds.dir, e),
    }
}

/// The items of a Liquid state's epoch (or part of one) that no rank of the saved shape delivered:
/// each saved rank's schedule is replayed, without I/O, to the saved batch.
fn liquid_left(
    ds: &liquid_sampler::Dataset,
    o: &LoaderOptions,
    budget: u64,
    state: &LoaderState,
) -> Result<Vec<Range<usize>>> {
    let items = state.remaining.as_deref().map(liquid_items);
    // A part is sampled as an epoch of its own, its epoch 0.
    let epoch = if items.is_some() { 0 } else { state.epoch };
    let n = ds.manifest.items.len();
    let mut delivered = vec![false; n];
    for rank in 0..state.world_size {
        let cfg = liquid_config(
            o,
            budget,
            rank,
            state.world_size,
            state.batch_size,
            items.clone(),
        );
        for i in liquid_sampler::delivered(ds, &cfg, epoch, state.batch)
            .map_err(|e| liquid_error(ds, e))?
        {
            delivered[i as usize] = true;
        }
    }
    let universe: Vec<usize> = match &items {
        None => (0..n).collect(),
        Some(i) => i.iter().map(|&i| i as usize).collect(),
    };
    let mut out: Vec<Range<usize>> = Vec::new();
    for i in universe.into_iter().filter(|&i| !delivered[i]) {
        match out.last_mut() {
            Some(r) if r.end == i => r.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    Ok(out)
}
