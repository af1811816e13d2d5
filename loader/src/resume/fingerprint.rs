//! The fingerprint of a dataset a state was saved on: what tells a dataset of the same length apart.

use crate::dataset::Dataset;
use sha2::{Digest, Sha256};

/// Hex digits of a fingerprint (the first 128 bits of a SHA-256).
const DIGITS: usize = 32;

/// The fingerprint of `ds` as it is listed now: a SHA-256 over every item, in the dataset's order, of
/// its name (its id where the dataset names no items), its stored size and its label. It comes from the
/// listing the dataset already holds (an object store's names and sizes included), so it costs no read
/// of an item; and it names nothing of where the dataset is, so another spelling of its path, a copy
/// elsewhere or the same objects under another endpoint keep it.
pub(crate) fn of(ds: &dyn Dataset) -> String {
    let mut h = Sha256::new();
    for i in 0..ds.len() {
        match ds.name(i) {
            Some(name) => h.update(name.as_bytes()),
            None => h.update(format!("#{}", ds.id(i)).as_bytes()),
        }
        // A name cannot hold NUL: it ends the name, so names and numbers cannot run into each other.
        h.update([0]);
        h.update(ds.stored_len(i).unwrap_or(u64::MAX).to_le_bytes());
        h.update(ds.label(i).to_le_bytes());
    }
    let digest = h.finalize();
    let mut hex = String::with_capacity(DIGITS);
    for b in &digest[..DIGITS / 2] {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}
