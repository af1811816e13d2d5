//! Which version of a shard an index describes. An index that carries its L3 members' heads (see
//! `loader/SHARDS.md`) lets a region read skip the request that would fetch them with the member's tar
//! header — and so skip the tar-header check that proves the index and the shard agree. The heads are
//! therefore used only when the index names the very version of the shard that opening the set saw: the
//! local file's modification time, or the object's ETag (its last-modified time where the store lists no
//! ETag). Sizes are checked for every index anyway.

use crate::storage::Storage;
use serde::{Deserialize, Serialize};

/// The version of a shard an index was written or built for (any field may be absent; a missing one
/// matches nothing).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardVersion {
    /// The file's modification time in nanoseconds since the Unix epoch (a local shard; for an object
    /// listed without an ETag, its last-modified time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_ns: Option<u64>,
    /// The object's ETag, without quotes (an index built from a shard on an object store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The MD5 of the shard's bytes, hex: the ETag an object store gives a single-part upload of the
    /// file the writer wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<String>,
}

/// What opening a shard set saw of one shard's version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A local file's modification time, in nanoseconds since the Unix epoch.
    Local { modified_ns: u64 },
    /// An object as listed: its ETag (quotes removed) and last-modified time in milliseconds.
    Remote {
        etag: Option<String>,
        modified_ms: i64,
    },
    /// Nothing known (no modification time, an object not listed).
    Unknown,
}

impl Seen {
    /// Shard `key`'s version under `storage` now (remote: as the listing saw it).
    pub fn of(storage: &Storage, key: &str) -> Seen {
        if storage.local_root().is_some() {
            return std::fs::metadata(storage.name(key))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .and_then(|d| u64::try_from(d.as_nanos()).ok())
                .map_or(Seen::Unknown, |modified_ns| Seen::Local { modified_ns });
        }
        match storage.listed_version(key) {
            Some((etag, modified_ms)) => Seen::Remote {
                etag: etag.map(|e| e.trim_matches('"').to_string()),
                modified_ms,
            },
            None => Seen::Unknown,
        }
    }

    /// The text that names this version in a kept index's file name (the modification time in
    /// nanoseconds, the ETag as listed, or `modified MS`).
    pub fn tag(&self, storage: &Storage, key: &str) -> String {
        match self {
            Seen::Local { modified_ns } => modified_ns.to_string(),
            _ => storage.version_tag(key).unwrap_or_default(),
        }
    }

    /// The version to record in an index built now.
    pub fn recorded(&self) -> ShardVersion {
        match self {
            Seen::Local { modified_ns } => ShardVersion {
                modified_ns: Some(*modified_ns),
                ..ShardVersion::default()
            },
            Seen::Remote {
                etag: Some(e),
                modified_ms: _,
            } => ShardVersion {
                etag: Some(e.clone()),
                ..ShardVersion::default()
            },
            Seen::Remote {
                etag: None,
                modified_ms,
            } => ShardVersion {
                modified_ns: u64::try_from(*modified_ms)
                    .ok()
                    .and_then(|ms| ms.checked_mul(1_000_000)),
                ..ShardVersion::default()
            },
            Seen::Unknown => ShardVersion::default(),
        }
    }
}

impl ShardVersion {
    /// Whether this is the version `seen`: the same modification time (to the millisecond a listing
    /// gives, for an object listed without an ETag), or the object's ETag is the recorded ETag or MD5.
    pub fn describes(&self, seen: &Seen) -> bool {
        match seen {
            Seen::Local { modified_ns } => self.modified_ns == Some(*modified_ns),
            Seen::Remote {
                etag: Some(e),
                modified_ms: _,
            } => self.etag.as_deref() == Some(e) || self.md5.as_deref() == Some(e),
            Seen::Remote {
                etag: None,
                modified_ms,
            } => self
                .modified_ns
                .is_some_and(|ns| i64::try_from(ns / 1_000_000).ok() == Some(*modified_ms)),
            Seen::Unknown => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_matches_its_own_time_etag_or_md5_only() {
        let written = ShardVersion {
            modified_ns: Some(1_700_000_000_123_456_789),
            etag: None,
            md5: Some("abc".into()),
        };
        let local = |ns| Seen::Local { modified_ns: ns };
        assert!(written.describes(&local(1_700_000_000_123_456_789)));
        assert!(!written.describes(&local(1_700_000_000_123_456_790)));
        let remote = |etag: Option<&str>, ms| Seen::Remote {
            etag: etag.map(str::to_string),
            modified_ms: ms,
        };
        assert!(written.describes(&remote(Some("abc"), 0)));
        assert!(!written.describes(&remote(Some("abd"), 1_700_000_000_123)));
        assert!(written.describes(&remote(None, 1_700_000_000_123)));
        assert!(!written.describes(&remote(None, 1_700_000_000_124)));
        assert!(!written.describes(&Seen::Unknown));
        for seen in [local(5), remote(Some("e"), 7), remote(None, 7)] {
            assert!(seen.recorded().describes(&seen), "{seen:?}");
        }
        assert!(!ShardVersion::default().describes(&local(5)));
    }
}
