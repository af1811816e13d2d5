//! Splitting the dataset across data-parallel ranks, like PyTorch's `DistributedSampler`.
//!
//! Every rank shuffles the item indices with the same seed, so all ranks agree on the split without talking.
//! The permutation is padded by repeating its first items until its length is a multiple of `world_size`
//! ([`ShardPolicy::Pad`], PyTorch's default) or cut down to one ([`ShardPolicy::DropTail`]); rank `r` takes
//! positions `r, r + W, r + 2W, ...`. Shards are equal in size; with `Pad` they are disjoint except for the
//! at most `W - 1` repeated items and their union is the dataset; with `DropTail` they are disjoint and miss
//! at most `W - 1` items. Unlike `DistributedSampler` the split is fixed for the whole run (not reshuffled
//! per epoch): each rank's shuffle buffers cache its own shard and read it in storage order.

use crate::error::{Error, Result};
use crate::stream;
use stdx::SplitMix64;
pub use vocab::ShardPolicy;

/// The item indices (into the manifest) rank `rank` of `world_size` owns, sorted ascending.
pub fn shard(
    n: usize,
    rank: usize,
    world_size: usize,
    seed: u64,
    policy: ShardPolicy,
) -> Result<Vec<u32>> {
    if n == 0 {
        return Err(Error::EmptyDataset);
    }
    if world_size == 0 || rank >= world_size {
        return Err(Error::BadSetting(format!(
            "rank {rank} is not in a world of size {world_size}"
        )));
    }
    if world_size == 1 {
        return Ok((0..n as u32).collect());
    }
    let mut perm: Vec<u32> = (0..n as u32).collect();
    SplitMix64::keyed(seed, stream::SHARD, 0).shuffle(&mut perm);
    let per_rank = match policy {
        ShardPolicy::Pad => n.div_ceil(world_size),
        ShardPolicy::DropTail => n / world_size,
    };
    if per_rank == 0 {
        return Err(Error::BadSetting(format!(
            "{n} items cannot be split across {world_size} ranks without padding"
        )));
    }
    let mut mine: Vec<u32> = (0..per_rank)
        .map(|k| perm[(rank + k * world_size) % n])
        .collect();
    mine.sort_unstable();
    Ok(mine)
}
