//! A state's checks against the options and the dataset it resumes on: every field in one place, each
//! refused by name.

use super::{LoaderState, fingerprint};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::options::LoaderOptions;
use std::path::{Path, PathBuf};

/// The last epoch a state may stand at. A loader's epochs are counted on, so a state beyond any real
/// run (a hand-edited 2^64−1) would wrap to epoch 0 at its next step; 2^32−1 epochs are more than any
/// job runs, and counting from there never wraps.
pub const MAX_EPOCH: usize = u32::MAX as usize;

/// Options recorded in a state's `contents` after its first release, with the value every state written
/// before then implies.
const ADDED_SINCE_V2: [(&str, &str); 7] = [
    ("order", "seeded"),
    ("scale", "none"),
    ("resize", "none"),
    ("jitter", "none"),
    ("interpolation", "bilinear"),
    ("fill", "0"),
    ("channels", "3"),
];

/// Checks `state` against the options `o` and the dataset `ds`; returns the dataset's fingerprint (what
/// the resumed run's states carry).
pub(crate) fn check_state(
    ds: &dyn Dataset,
    o: &LoaderOptions,
    state: &LoaderState,
) -> Result<String> {
    let check = |what: &str, a: u64, b: u64| {
        if a != b {
            Err(Error::Resume(format!(
                "state has {what} {a}, options have {b}"
            )))
        } else {
            Ok(())
        }
    };
    check("seed", state.seed, o.seed)?;
    check("dataset length", state.dataset_len as u64, ds.len() as u64)?;
    if let Some(saved) = &state.contents {
        check_contents(saved, &LoaderState::contents_of(o))?;
    }
    check_position(ds, o, state)?;
    let ours = fingerprint::of(ds);
    match &state.fingerprint {
        Some(saved) if *saved != ours => Err(Error::Resume(format!(
            "state was saved on another dataset than {}: the names, sizes or labels of its items \
             differ (state has fingerprint {}, this dataset {ours})",
            ds.describe(),
            stdx::Quoted(saved)
        ))),
        _ => Ok(ours),
    }
}

/// The position's own fields: an epoch a run can count on from, a rank of its world, a shape and
/// remaining positions that fit the dataset.
fn check_position(ds: &dyn Dataset, o: &LoaderOptions, state: &LoaderState) -> Result<()> {
    if state.epoch > MAX_EPOCH {
        return Err(Error::Resume(format!(
            "state has epoch {}, past the last epoch a loader runs ({MAX_EPOCH})",
            state.epoch
        )));
    }
    if state.world_size == 0 || state.batch_size == 0 {
        return Err(Error::Resume(
            "state has a world size or batch size of 0".into(),
        ));
    }
    if state.rank >= state.world_size {
        return Err(Error::Resume(format!(
            "state has rank {} of world size {}: no such rank",
            state.rank, state.world_size
        )));
    }
    // Finding what a saved shape left of its epoch visits every saved rank: more ranks than items (or
    // than this run has) is no state a run of this dataset wrote.
    let ranks = ds.len().max(o.world_size);
    if state.world_size > ranks {
        return Err(Error::Resume(format!(
            "state has world size {}, more ranks than the {} items of the dataset",
            state.world_size,
            ds.len()
        )));
    }
    if let Some(r) = &state.remaining
        && r.last().is_some_and(|r| r.end > ds.len())
    {
        return Err(Error::Resume(format!(
            "state's remaining positions reach past the {} items of the dataset",
            ds.len()
        )));
    }
    Ok(())
}

/// Checks the `contents` a state recorded (`saved`, as [`LoaderState::contents_of`] writes them, or a
/// part of them such as the targets' `;masks:…;boxes:…`) against this run's (`ours`), naming the first
/// option that differs. A masks or boxes path is compared by what it names, not by its spelling (`ds`,
/// `./ds`, `ds/` and the absolute path are one folder).
pub fn check_contents(saved: &str, ours: &str) -> Result<()> {
    let (saved, ours) = (pairs(saved), pairs(ours));
    for (k, v) in &ours {
        match saved.iter().find(|(sk, _)| sk == k) {
            Some((_, sv)) if same_value(k, sv, v) => {}
            // A state from a build that did not record this option yet had its default then.
            None if ADDED_SINCE_V2.contains(&(k.as_str(), v.as_str())) => {}
            Some((_, sv)) => {
                return Err(Error::Resume(format!(
                    "state has {k} {}, options have {k} {v}",
                    stdx::Quoted(sv)
                )));
            }
            None => {
                return Err(Error::Resume(format!(
                    "state records no {k} (options have {v}): it comes from another build"
                )));
            }
        }
    }
    // Targets are recorded only when asked for: a state with them resumes only with them.
    if let Some((k, v)) = saved
        .iter()
        .find(|(k, _)| !ours.iter().any(|(o, _)| o == k))
    {
        return Err(Error::Resume(format!(
            "state has {} {}, options have none",
            stdx::Quoted(k),
            stdx::Quoted(v)
        )));
    }
    Ok(())
}

fn pairs(s: &str) -> Vec<(String, String)> {
    s.split(';')
        .map(|p| {
            let (k, v) = p.split_once(':').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Whether the recorded value `saved` of option `key` is this run's `ours`: the same text, or for the
/// targets' files (`masks:PATH,…`, `boxes:PATH,…`) the same settings and a path naming the same file.
fn same_value(key: &str, saved: &str, ours: &str) -> bool {
    if saved == ours {
        return true;
    }
    // The fields after the path: masks have image suffix, mask suffix and ignore index; boxes the
    // minimum box size. A path may hold commas of its own, so they are split off from the end.
    let after = match key {
        "masks" => 3,
        "boxes" => 1,
        _ => return false,
    };
    let split = |v: &str| -> Option<(String, String)> {
        let mut parts = v.rsplitn(after + 1, ',');
        let rest: Vec<&str> = (0..after).filter_map(|_| parts.next()).collect();
        Some((parts.next()?.to_string(), rest.join(",")))
    };
    match (split(saved), split(ours)) {
        (Some((a, rest_a)), Some((b, rest_b))) => rest_a == rest_b && same_path(&a, &b),
        _ => false,
    }
}

/// Whether two recorded paths (whitespace written `%20`, as `contents` records it) name the same file:
/// both resolve to it, or — where either does not exist — they are one path once `.` components and
/// trailing separators are dropped. Relative paths resolve from the current folder, as the options'.
fn same_path(a: &str, b: &str) -> bool {
    if a == "none" || b == "none" {
        return false;
    }
    let path = |p: &str| PathBuf::from(p.replace("%20", " "));
    let (a, b) = (path(a), path(b));
    match (std::fs::canonicalize(&a), std::fs::canonicalize(&b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => lexical(&a) == lexical(&b),
    }
}

/// `p` made absolute against the current folder, without `.` components or trailing separators.
fn lexical(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map_or_else(|_| p.to_path_buf(), |cwd| cwd.join(p))
    };
    abs.components().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_targets_path_is_compared_by_what_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let masks = dir.path().join("masks");
        std::fs::create_dir(&masks).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let rel = pathdiff(&masks, &cwd);
        let at = |p: &str| format!(";masks:{p},,_mask,255;boxes:none,1");
        let saved = at(&rel);
        for spelling in [
            format!("./{rel}"),
            format!("{rel}/"),
            format!("{rel}/./"),
            masks.display().to_string(),
        ] {
            check_contents(&saved, &at(&spelling)).unwrap_or_else(|e| panic!("{spelling}: {e}"));
        }
        // A folder that is not there yet compares by its path.
        check_contents(&at("gone/m"), &at("./gone/m/")).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let e = check_contents(&saved, &at(&other.display().to_string())).unwrap_err();
        assert!(e.to_string().contains("state has masks"), "{e}");
        // The settings after the path still count.
        let e = check_contents(&saved, &at(&rel).replace(",255;", ",0;")).unwrap_err();
        assert!(e.to_string().contains("state has masks"), "{e}");
    }

    /// `to` relative to `from` (both absolute), as a user types it from `from`.
    fn pathdiff(to: &Path, from: &Path) -> String {
        let up = from.components().count() - 1;
        let mut rel = PathBuf::new();
        for _ in 0..up {
            rel.push("..");
        }
        rel.push(to.strip_prefix("/").unwrap());
        rel.display().to_string()
    }
}
