//! What a rank does with the tail of an epoch that does not split evenly.

use crate::Invalid;

/// What happens to the items left over when an epoch does not divide evenly across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ShardPolicy {
    /// Repeat items from the start of the permutation so that every rank gets as many (PyTorch's
    /// `DistributedSampler(drop_last=False)`).
    #[default]
    Pad,
    /// Drop the tail so that every rank gets as many (`DistributedSampler(drop_last=True)`).
    #[cfg_attr(feature = "clap", value(name = "drop"))]
    DropTail,
}

impl ShardPolicy {
    /// `pad` or `drop`.
    pub fn name(self) -> &'static str {
        match self {
            ShardPolicy::Pad => "pad",
            ShardPolicy::DropTail => "drop",
        }
    }
}

impl std::fmt::Display for ShardPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ShardPolicy {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<ShardPolicy, Invalid> {
        match s {
            "pad" => Ok(ShardPolicy::Pad),
            "drop" => Ok(ShardPolicy::DropTail),
            _ => Err(Invalid::new("shard_tail", s, "pad or drop")),
        }
    }
}
