//! Where the index of a shard that came without one is kept once built, so that only the first open
//! reads its headers: beside a local shard (`NAME.tar.idx`, found there as any index is) when its folder
//! is writable, else in the user's cache folder; for a remote shard in the loader's disk cache folder
//! (`StorageOptions::cache`) when there is one, else in the user's cache folder. A kept index is found
//! by the shard's location, size and version (modification time, or the object's ETag), so a shard that
//! changes gets a new one; a kept index that does not read or check is built again. A built index records
//! that version too, so the L3 heads it holds are used (see [`super::version`]).

use super::index::{SUFFIX, ShardIndex};
use super::version::Seen;
use crate::error::Result;
use crate::storage::Storage;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The sub-folder of a cache folder that holds built shard indexes.
const FOLDER: &str = "shard-index";

/// Shard `key`'s index (`size` bytes as listed), from where an earlier open kept it, else built and
/// kept. Also says whether it was built now.
pub(super) fn built_index(storage: &Storage, key: &str, size: u64) -> Result<(ShardIndex, bool)> {
    let seen = Seen::of(storage, key);
    let kept = kept_path(storage, key, size, &seen);
    if let Some(path) = &kept
        && let Ok(bytes) = stdx::fs::read_regular(path, super::index::MAX_INDEX_BYTES)
        && let Ok(index) = ShardIndex::parse(&bytes, path)
        && index.check(path, size).is_ok()
    {
        return Ok((index, false));
    }
    let file = storage.open_key(key)?;
    let shard = key.rsplit('/').next().unwrap_or(key);
    let mut index = ShardIndex::build(&file, size, shard)?;
    index.shard_version = Some(seen.recorded());
    let bytes = index.to_bytes();
    // Keeping it is best effort: a shard set on read-only storage without a cache folder is scanned at
    // every open, and still read.
    let beside = storage
        .local_root()
        .map(|root| root.join(crate::storage::path_of(&format!("{key}{SUFFIX}"))));
    let written = beside.is_some_and(|p| stdx::fs::write_atomic(&p, &bytes).is_ok());
    if !written && let Some(path) = kept {
        let _ = stdx::fs::write_atomic(&path, &bytes);
    }
    Ok((index, true))
}

/// Where shard `key`'s built index is kept in a cache folder (`None`: no cache folder to keep it in).
fn kept_path(storage: &Storage, key: &str, size: u64, seen: &Seen) -> Option<PathBuf> {
    let dir = match storage.cache_dir() {
        Some(d) if storage.is_remote() => d.to_path_buf(),
        _ => user_cache()?,
    };
    let name = storage.name(key);
    let version = seen.tag(storage, key);
    let place = std::fs::canonicalize(&name).unwrap_or(name);
    let mut h = Sha256::new();
    let place = place.to_string_lossy();
    let parts: [&[u8]; 3] = [place.as_bytes(), &size.to_le_bytes(), version.as_bytes()];
    for part in parts {
        h.update(part);
        h.update([0]);
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Some(dir.join(FOLDER).join(format!("{hex}{SUFFIX}")))
}

/// The user's cache folder for the toolkit: `$XDG_CACHE_HOME/l3toolkit`, else `~/.cache/l3toolkit`.
fn user_cache() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("l3toolkit"))
}
