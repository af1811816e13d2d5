//! Listing a dataset folder: recursive, symlinks followed, and still finite and honest — a folder reached a
//! second time (a symlink loop such as `ln -s . me`, or two links to one folder) is not entered again, and
//! entries that are not regular files (FIFOs, sockets, devices, dangling links) are reported, not listed.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why an entry was left out of a [`Walk`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skipped {
    /// A folder already walked (through a symlink loop or a second link to it).
    Revisit,
    /// Not a regular file: what it is instead.
    NotRegular(&'static str),
    /// A symlink whose target does not exist.
    Dangling,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::Revisit => f.write_str("folder already visited (symlink loop?)"),
            Skipped::NotRegular(k) => write!(f, "not a regular file ({k})"),
            Skipped::Dangling => f.write_str("dangling symlink"),
        }
    }
}

/// The regular files under a folder, relative to it and sorted, with what was left out.
#[derive(Clone, Debug, Default)]
pub struct Walk {
    pub files: Vec<PathBuf>,
    pub skipped: Vec<(PathBuf, Skipped)>,
}

/// Walks `root` recursively. Hidden entries (names starting with `.`: temporaries, locks) are ignored
/// silently. An unreadable folder is an error naming it.
pub fn walk(root: impl AsRef<Path>) -> io::Result<Walk> {
    let root = root.as_ref();
    let meta = std::fs::metadata(root)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a folder", root.display()),
        ));
    }
    let mut seen: HashSet<(u64, u64)> = HashSet::from([(meta.dev(), meta.ino())]);
    let mut out = Walk::default();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
            let name = entry.file_name();
            if name.as_encoded_bytes().first() == Some(&b'.') {
                continue;
            }
            let child = rel.join(&name);
            // Follows symlinks: what matters is what a reader would open.
            let meta = match std::fs::metadata(entry.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    out.skipped.push((child, Skipped::Dangling));
                    continue;
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: {e}", entry.path().display()),
                    ));
                }
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                if seen.insert((meta.dev(), meta.ino())) {
                    stack.push(child);
                } else {
                    out.skipped.push((child, Skipped::Revisit));
                }
            } else if ft.is_file() {
                out.files.push(child);
            } else {
                use std::os::unix::fs::FileTypeExt;
                let kind = if ft.is_fifo() {
                    "a FIFO"
                } else if ft.is_socket() {
                    "a socket"
                } else if ft.is_char_device() {
                    "a character device"
                } else if ft.is_block_device() {
                    "a block device"
                } else {
                    "unknown type"
                };
                out.skipped.push((child, Skipped::NotRegular(kind)));
            }
        }
    }
    out.files.sort();
    out.skipped.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_fifos_and_dangling_links_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/x.png"), b"x").unwrap();
        std::fs::write(r.join("top.png"), b"x").unwrap();
        std::fs::write(r.join(".hidden.png"), b"x").unwrap();
        std::os::unix::fs::symlink(".", r.join("me")).unwrap();
        std::os::unix::fs::symlink("..", r.join("a/up")).unwrap();
        std::os::unix::fs::symlink("nowhere", r.join("gone.png")).unwrap();
        let fifo = std::ffi::CString::new(r.join("f.png").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        #[allow(unsafe_code)]
        let made = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        let w = walk(r).unwrap();
        assert_eq!(
            w.files,
            vec![PathBuf::from("a/b/x.png"), PathBuf::from("top.png")]
        );
        let skipped: Vec<_> = w
            .skipped
            .iter()
            .map(|(p, s)| (p.to_str().unwrap(), s.clone()))
            .collect();
        assert_eq!(
            skipped,
            vec![
                ("a/up", Skipped::Revisit),
                ("f.png", Skipped::NotRegular("a FIFO")),
                ("gone.png", Skipped::Dangling),
                ("me", Skipped::Revisit),
            ]
        );
        assert!(walk(r.join("top.png")).is_err());
        assert!(
            walk(r.join("missing"))
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
    }
}
