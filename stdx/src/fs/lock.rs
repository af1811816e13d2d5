//! An exclusive lock on a folder that one writer at a time may fill (a dataset being built or converted).
//! `flock` on a lock file inside it: released by the kernel when the holder exits, however it exits, so a
//! kill -9 never leaves a folder locked forever.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
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
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    "another process".to_string()
                } else {
                    format!("another process (pid {holder})")
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{who} is writing this folder; wait for it to finish"),
                ));
            }
            return Err(e);
        }
        file.set_len(0)?;
        file.seek(io::SeekFrom::Start(0))?;
        write!(file, "{}", std::process::id())?;
        Ok(DirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
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
        DirLock::acquire(&out).unwrap();
    }
}
