//! An exclusive lock on a folder that one writer at a time may fill (a dataset being built or converted).
//! An advisory lock (`File::try_lock`, `flock` on Unix) on a lock file inside it: released by the kernel when the holder exits, however it exits, so a
//! kill -9 never leaves a folder locked forever. The holder removes the lock file when it is done; a
//! process that opened the file just before that removal finds, after locking, that the name now points
//! elsewhere, and starts again — so removal is safe and a finished folder holds no lock file.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The lock file's name (hidden, so dataset readers skip it).
pub const LOCK_NAME: &str = ".l3-lock";

/// Held while a process writes a folder; dropping it releases the lock.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and locks it, without waiting: if another process holds the lock this fails
    /// at once with `ErrorKind::WouldBlock` and a message naming that process.
    pub fn acquire(dir: impl AsRef<Path>) -> io::Result<DirLock> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOCK_NAME);
        loop {
            let mut file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            Self::lock(&mut file)?;
            // Locked — but the holder before us may have removed the name in between: then this file is
            // orphaned and the lock means nothing. Only a lock on the file the name still points to counts.
            let same = match std::fs::metadata(&path) {
                Ok(m) => {
                    let f = file.metadata()?;
                    (m.dev(), m.ino()) == (f.dev(), f.ino())
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(e),
            };
            if !same {
                continue;
            }
            file.set_len(0)?;
            file.seek(io::SeekFrom::Start(0))?;
            write!(file, "{}", std::process::id())?;
            return Ok(DirLock { _file: file, path });
        }
    }

    fn lock(file: &mut File) -> io::Result<()> {
        match file.try_lock() {
            Ok(()) => Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    "another process".to_string()
                } else {
                    format!("another process (pid {holder})")
                };
                Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{who} is writing this folder; wait for it to finish"),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still locked (the descriptor closes after this): see the module comment.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_until_release() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("dataset");
        let a = DirLock::acquire(&out).unwrap();
        // flock locks belong to the open file description, so a second open in this process conflicts too.
        let e = DirLock::acquire(&out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(
            e.to_string().contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(a);
        assert!(
            !out.join(LOCK_NAME).exists(),
            "the lock file goes with the lock"
        );
        let b = DirLock::acquire(&out).unwrap();
        assert!(b.path().exists());
    }

    #[test]
    fn many_threads_never_hold_it_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let inside = AtomicUsize::new(0);
        let entries = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        if let Ok(l) = DirLock::acquire(dir.path()) {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            entries.fetch_add(1, Ordering::SeqCst);
                            inside.fetch_sub(1, Ordering::SeqCst);
                            drop(l);
                        }
                    }
                });
            }
        });
        assert!(entries.load(Ordering::SeqCst) > 0);
    }
}
