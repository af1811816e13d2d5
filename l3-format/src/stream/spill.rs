//! [`Spill`]: bytes the streaming encoder must set aside until it can write them in file order — encoded
//! entries, and for ANS the pixels its later passes read again — kept on disk, not in memory.
//!
//! The file is unlinked as soon as it is created, so it goes away with its handle however the encoder
//! ends: finished, failed, dropped, or its process killed. Where the platform cannot unlink an open file,
//! the drop removes it. Reads are positioned (`pread`), band by band: the file is never mapped, so its
//! size never shows in the process's resident memory.

use crate::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary file written at its end and read anywhere.
pub(crate) struct Spill {
    file: File,
    path: PathBuf,
    len: u64,
    /// The name still exists (the unlink after creation failed): the drop removes it.
    linked: bool,
}

impl Spill {
    /// A new, empty spill file in `dir`, named after `stem` (the output's file name), this process and a
    /// counter.
    pub(crate) fn create(dir: &Path, stem: &str) -> Result<Spill, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".{stem}.spill-{}-{n}", std::process::id()));
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    let linked = std::fs::remove_file(&path).is_err();
                    return Ok(Spill {
                        file,
                        path,
                        len: 0,
                        linked,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&path, "creating the spill file", &e)),
            }
        }
    }

    /// Appends `bytes`; returns where they start.
    pub(crate) fn append(&mut self, bytes: &[u8]) -> Result<u64, Error> {
        let at = self.len;
        self.file
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, "writing the spill file", &e))?;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    /// Fills `buf` from `offset`.
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io(&self.path, "reading the spill file", &e))
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        if self.linked {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
