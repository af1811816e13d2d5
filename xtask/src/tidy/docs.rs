//! Every crate introduces itself: a `README.md` in its folder, and a root source file (`lib.rs`, or
//! `main.rs` for a crate that is only a program) opening with a `//!` table of contents.

use std::path::{Path, PathBuf};

/// One crate as this check sees it.
pub struct Crate {
    pub name: String,
    pub dir: PathBuf,
    /// `lib.rs`, or the binary's root where there is no library.
    pub root_file: PathBuf,
}

/// One line per crate without a README or without a `//!` opening; paths shown relative to `root`.
pub fn check(root: &Path, crates: &[Crate]) -> Vec<String> {
    let shown = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut out = Vec::new();
    for c in crates {
        if !c.dir.join("README.md").is_file() {
            out.push(format!("{}: no README.md in {}", c.name, shown(&c.dir)));
        }
        let opens_with_contents = std::fs::read_to_string(&c.root_file)
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| l.trim_start().starts_with("//!"))
            })
            .unwrap_or(false);
        if !opens_with_contents {
            out.push(format!(
                "{}: {} does not open with a `//!` table of contents",
                c.name,
                shown(&c.root_file)
            ));
        }
    }
    out
}
