//! Durable outputs: write under a temporary name in the destination's folder, fsync, rename into place,
//! fsync the folder. A crash (kill -9, power loss, full disk) leaves either the old state or the new file,
//! never a partial one under the final name; [`remove_stale_temps`] clears what a killed writer left.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What every temporary name contains: `.NAME.l3tmp.PID.N`.
pub const TEMP_MARK: &str = ".l3tmp.";

/// A file being written under a temporary name; [`commit`](Self::commit) puts it in place. Dropped without
/// a commit (an error, a panic), the temporary is removed.
#[derive(Debug)]
pub struct AtomicFile {
    file: Option<File>,
    tmp: PathBuf,
    dst: PathBuf,
}

fn temp_path(dst: &Path) -> io::Result<PathBuf> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = dst.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the output path has no file name",
        )
    })?;
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        "{TEMP_MARK}{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    Ok(dst.with_file_name(tmp))
}

impl AtomicFile {
    /// Starts writing `dst` (its folder must exist).
    pub fn create(dst: impl AsRef<Path>) -> io::Result<AtomicFile> {
        let dst = dst.as_ref().to_path_buf();
        let tmp = temp_path(&dst)?;
        let file = File::options().write(true).create_new(true).open(&tmp)?;
        Ok(AtomicFile {
            file: Some(file),
            tmp,
            dst,
        })
    }

    /// The temporary file, e.g. for `write_at` or a `BufWriter`.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("present until commit")
    }

    /// Where the file will appear.
    pub fn path(&self) -> &Path {
        &self.dst
    }

    /// Flushes the data to disk, renames the file into place and makes the rename durable.
    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("present until commit");
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dst)?;
        sync_parent(&self.dst);
        Ok(())
    }
}

impl AtomicFile {
    /// Like [`commit`](AtomicFile::commit) with one fsync instead of two: the data is flushed before the
    /// rename, but the rename itself may be lost in a crash. For files whose loss costs a refetch, not
    /// data — cache entries, which are checksummed and simply missed when absent.
    pub fn commit_replaceable(mut self) -> io::Result<()> {
        let file = self.file.take().expect("present until commit");
        file.sync_data()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dst)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Best effort: a folder fsync makes the rename durable; file systems that refuse it lose nothing else.
fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(parent) {
        let _ = d.sync_all();
    }
}

/// Writes `bytes` to `dst` durably (see [`AtomicFile`]), creating its folder if needed.
pub fn write_atomic(dst: impl AsRef<Path>, bytes: &[u8]) -> io::Result<()> {
    let dst = dst.as_ref();
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = AtomicFile::create(dst)?;
    f.write_all(bytes)?;
    f.commit()
}

/// Whether `name` is one of [`AtomicFile`]'s temporaries; returns the writer's process id.
pub fn is_temp_name(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let at = rest.rfind(TEMP_MARK)?;
    let mut parts = rest[at + TEMP_MARK.len()..].split('.');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some(pid)
}

/// Whether process `pid` may still be running (this process counts as running). Used to tell a killed
/// writer's leftovers (temporaries, scratch folders named after their pid) from a live writer's.
pub fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes, directly in `dir`, the temporaries of writers that no longer run (killed mid-write). Returns
/// how many were removed. A missing folder has none.
pub fn remove_stale_temps(dir: impl AsRef<Path>) -> io::Result<usize> {
    remove_dead_temps(dir.as_ref(), |_| true)
}

/// Removes the temporaries that writers of `dst` which no longer run left beside it (a killed run's
/// output, or state file, half written): what a new writer of the same file calls first, so that kills
/// do not pile temporaries up beside an output. Returns how many were removed.
pub fn remove_stale_temps_of(dst: impl AsRef<Path>) -> io::Result<usize> {
    let dst = dst.as_ref();
    let Some(name) = dst.file_name().and_then(|n| n.to_str()) else {
        return Ok(0);
    };
    let prefix = format!(".{name}{TEMP_MARK}");
    let dir = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    remove_dead_temps(dir, |n| n.starts_with(&prefix))
}

fn remove_dead_temps(dir: &Path, ours: impl Fn(&str) -> bool) -> io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| ours(n)).and_then(is_temp_name) else {
            continue;
        };
        if !process_alive(pid) && entry.file_type()?.is_file() {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_publishes_and_drop_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("out.bin");
        let mut f = AtomicFile::create(&dst).unwrap();
        f.write_all(b"hello").unwrap();
        assert!(!dst.exists(), "nothing under the final name before commit");
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"hello");

        let mut f = AtomicFile::create(&dst).unwrap();
        f.write_all(b"partial").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&dst).unwrap(), b"hello", "old file kept");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary removed");

        write_atomic(dir.path().join("sub/x"), b"1").unwrap();
        assert_eq!(std::fs::read(dir.path().join("sub/x")).unwrap(), b"1");
    }

    #[test]
    fn stale_temps_of_dead_writers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // A pid far above pid_max cannot be running.
        let dead = dir.path().join(format!(".a.png{TEMP_MARK}4000000000.3"));
        std::fs::write(&dead, b"x").unwrap();
        let ours = dir
            .path()
            .join(format!(".b.png{TEMP_MARK}{}.0", std::process::id()));
        std::fs::write(&ours, b"x").unwrap();
        let plain = dir.path().join("c.png");
        std::fs::write(&plain, b"x").unwrap();
        assert_eq!(remove_stale_temps(dir.path()).unwrap(), 1);
        assert!(!dead.exists() && ours.exists() && plain.exists());
        assert_eq!(is_temp_name(".x.l3tmp.12.4"), Some(12));
        assert_eq!(is_temp_name("x.l3tmp.12.4"), None);
        assert_eq!(is_temp_name(".x.l3tmp.12"), None);
        assert_eq!(remove_stale_temps(dir.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn stale_temps_of_one_output_are_removed_and_no_others() {
        let dir = tempfile::tempdir().unwrap();
        let dead_a = dir.path().join(format!(".a.png{TEMP_MARK}4000000000.3"));
        let dead_ab = dir
            .path()
            .join(format!(".a.png.png{TEMP_MARK}4000000000.1"));
        let dead_b = dir.path().join(format!(".b.png{TEMP_MARK}4000000000.0"));
        let live_a = dir
            .path()
            .join(format!(".a.png{TEMP_MARK}{}.9", std::process::id()));
        for p in [&dead_a, &dead_ab, &dead_b, &live_a] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(remove_stale_temps_of(dir.path().join("a.png")).unwrap(), 1);
        assert!(!dead_a.exists() && dead_ab.exists() && dead_b.exists() && live_a.exists());
        assert_eq!(
            remove_stale_temps_of(dir.path().join("none/x.png")).unwrap(),
            0
        );
    }
}
