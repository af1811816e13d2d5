//! `cargo xtask tidy`: the invariants of ARCHITECTURE.md that a program can check, checked (in the spirit
//! of rust-analyzer's tidy). `cargo xtask test` runs it first.
//!
//! - `deps`: dependency direction between the workspace's crates, and no `clap`, `anyhow` or `indicatif`
//!   in a library (from `cargo metadata`);
//! - `imports`: no file-import circle inside a crate;
//! - `unsafety`: every file with `unsafe` code listed in ARCHITECTURE.md, every `unsafe` block and impl
//!   with a `// SAFETY:` comment, every `pub unsafe fn` with a `# Safety` section;
//! - `length`: no function over 150 lines in a crate's `src/` (tests left out);
//! - `docs`: every crate has a README and a `//!` table of contents;
//! - `source`: the comment- and literal-blind reading of Rust source the checks share.

pub mod deps;
pub mod docs;
pub mod imports;
pub mod length;
pub mod source;
pub mod unsafety;

use crate::cargo;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// What each check found: `(check, violations)`, in the order they ran.
pub struct Report {
    pub sections: Vec<(&'static str, Vec<String>)>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.sections.iter().all(|(_, v)| v.is_empty())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (check, violations) in &self.sections {
            if violations.is_empty() {
                writeln!(f, "tidy {check}: ok")?;
            } else {
                writeln!(f, "tidy {check}: {} problem(s)", violations.len())?;
                for v in violations {
                    writeln!(f, "    {v}")?;
                }
            }
        }
        Ok(())
    }
}

/// A workspace package as the checks need it.
struct Package {
    name: String,
    dir: PathBuf,
    /// The roots of its module trees under `src/` (library, binaries).
    roots: Vec<PathBuf>,
    /// `lib.rs`, or the binary's root where there is no library.
    root_file: PathBuf,
}

/// Runs every check over the workspace at `root`.
pub fn check_workspace(root: &Path) -> anyhow::Result<Report> {
    let out = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("starting cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata's output")?;
    let packages = packages(&metadata)?;

    let deps = deps::check(&metadata, deps::TABLE)?;

    let mut circles = Vec::new();
    for p in &packages {
        for c in imports::circles(&p.dir, &p.roots)? {
            let rel = p
                .dir
                .strip_prefix(root)
                .unwrap_or(&p.dir)
                .display()
                .to_string();
            circles.push(format!("{} ({rel}/): circle {c}", p.name));
        }
    }

    let mut files = Vec::new();
    for p in &packages {
        rust_files(&p.dir, &mut files)?;
    }
    let mut files: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(root).unwrap_or(f).to_path_buf())
        .collect();
    files.sort();
    let architecture =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;
    let unsafety = unsafety::check(root, &files, &architecture)?;
    let length = length::check(root, &files)?;

    let crates: Vec<docs::Crate> = packages
        .iter()
        .map(|p| docs::Crate {
            name: p.name.clone(),
            dir: p.dir.clone(),
            root_file: p.root_file.clone(),
        })
        .collect();
    let docs = docs::check(root, &crates);

    Ok(Report {
        sections: vec![
            ("deps", deps),
            ("imports", circles),
            ("unsafe", unsafety),
            ("length", length),
            ("docs", docs),
        ],
    })
}

fn packages(metadata: &serde_json::Value) -> anyhow::Result<Vec<Package>> {
    let mut out = Vec::new();
    for p in metadata["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
    {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let dir = manifest
            .parent()
            .context("a manifest without a folder")?
            .to_path_buf();
        let src = dir.join("src");
        let mut lib = None;
        let mut roots = Vec::new();
        for t in p["targets"].as_array().into_iter().flatten() {
            let path = PathBuf::from(t["src_path"].as_str().unwrap_or_default());
            let kinds: Vec<&str> = t["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            let is_lib = kinds
                .iter()
                .any(|k| matches!(*k, "lib" | "rlib" | "cdylib" | "proc-macro"));
            if is_lib {
                lib = Some(path.clone());
            }
            if (is_lib || kinds.contains(&"bin")) && path.starts_with(&src) {
                roots.push(path);
            }
        }
        let root_file = lib
            .or_else(|| roots.first().cloned())
            .unwrap_or_else(|| src.join("lib.rs"));
        out.push(Package {
            name,
            dir,
            roots,
            root_file,
        });
    }
    Ok(out)
}

/// Every `.rs` file under `dir`, leaving out build outputs (`target/`) and hidden folders.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out)?;
            }
        } else if kind.is_file() && name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `cargo xtask tidy`: prints the report; fails when a check found something.
pub fn main() -> anyhow::Result<()> {
    let report = check_workspace(&crate::workspace_root())?;
    eprint!("{report}");
    if !report.passed() {
        bail!("tidy found problems (above)");
    }
    Ok(())
}
