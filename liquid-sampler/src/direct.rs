//! Reads that bypass the page cache. Liquid's shuffle buffers are the cache: if the kernel also kept the
//! pages, the disk traffic per batch would depend on what it happened to keep, which is what Liquid removes.
//!
//! `O_DIRECT` with [`ALIGN`]-aligned offsets, lengths and buffers where the file system allows it; where it
//! refuses (tmpfs, some overlay set-ups) a buffered read followed by `posix_fadvise(DONTNEED)` on the range.

use crate::error::{Error, Result, io};
use crate::manifest::ALIGN;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A heap buffer aligned to [`ALIGN`] with a capacity that is a multiple of it, as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer able to hold `len` bytes (rounded up to [`ALIGN`]).
    pub fn with_capacity(len: usize) -> Self {
        let cap = round_up(len.max(1) as u64) as usize;
        let layout = Layout::from_size_align(cap, ALIGN as usize).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to cap initialised (zeroed) bytes we own.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: len <= cap bytes, initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN as usize).expect("valid layout");
        // SAFETY: allocated with this layout in with_capacity.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

pub(crate) fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// How a [`DirectFile`] keeps its reads out of the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bypass {
    /// `O_DIRECT`: the kernel copies straight from the device into our buffer.
    Direct,
    /// Buffered read, then `posix_fadvise(POSIX_FADV_DONTNEED)` drops the range again.
    Fadvise,
}

/// A data file opened for page-cache-bypassing reads.
pub struct DirectFile {
    file: File,
    path: PathBuf,
    bypass: Bypass,
}

impl DirectFile {
    /// Opens `path` with `O_DIRECT`, falling back to fadvise where the file system refuses it. Anything
    /// but a regular file (a folder, a FIFO that would block the open) is refused first.
    pub fn open(path: &Path) -> Result<Self> {
        let fail = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingDataFile {
                path: path.to_path_buf(),
            },
            std::io::ErrorKind::InvalidInput => Error::NotAFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            },
            _ => io(path)(e),
        };
        let buffered = stdx::fs::open_regular(path).map_err(fail)?;
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        if let Ok(file) = direct {
            // Some file systems accept the flag at open and refuse the reads: probe one block.
            let mut probe = AlignedBuf::with_capacity(ALIGN as usize);
            match file.read_at(probe.full_mut(), 0) {
                Ok(_) => {
                    return Ok(DirectFile {
                        file,
                        path: path.to_path_buf(),
                        bypass: Bypass::Direct,
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(fail(e)),
            }
        } else if let Err(e) = direct
            && e.raw_os_error() != Some(libc::EINVAL)
        {
            return Err(fail(e));
        }
        Ok(DirectFile {
            file: buffered,
            path: path.to_path_buf(),
            bypass: Bypass::Fadvise,
        })
    }

    pub fn bypass(&self) -> Bypass {
        self.bypass
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads `length` bytes at `offset` into `buf` (grown if too small), bypassing the page cache.
    pub fn read_into(&self, offset: u64, length: u64, buf: &mut AlignedBuf) -> Result<()> {
        let aligned = self.bypass == Bypass::Direct && offset.is_multiple_of(ALIGN);
        let want = if aligned { round_up(length) } else { length } as usize;
        if buf.cap < want {
            *buf = AlignedBuf::with_capacity(want);
        }
        let mut done = 0usize;
        let dst = &mut buf.full_mut()[..want];
        while done < want {
            let n = if aligned || self.bypass == Bypass::Fadvise {
                self.file.read_at(&mut dst[done..], offset + done as u64)
            } else {
                // An unaligned item in a Direct file: read it through a buffered handle instead.
                File::open(&self.path)
                    .and_then(|f| f.read_at(&mut dst[done..], offset + done as u64))
            };
            match n {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(&self.path)(e)),
            }
        }
        if (done as u64) < length {
            return Err(Error::TruncatedDataFile {
                path: self.path.clone(),
                needed: offset + length,
                actual: offset + done as u64,
            });
        }
        buf.len = length as usize;
        if !aligned {
            drop_range(&self.file, offset, length);
        }
        Ok(())
    }
}

fn drop_range(file: &File, offset: u64, length: u64) {
    // SAFETY: plain syscall on a valid descriptor; failure only means the pages stay cached.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            length as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// Asks the kernel to drop `path`'s clean cached pages (`posix_fadvise(DONTNEED)` on the whole file).
pub fn drop_page_cache(path: &Path) -> Result<()> {
    let file = File::open(path).map_err(io(path))?;
    drop_range(&file, 0, 0);
    Ok(())
}

/// How many of `path`'s pages are in the page cache, and how many it has: `mmap` + `mincore`.
/// `Ok(None)` where this cannot be measured (empty file, `mmap` or `mincore` refused).
pub fn cached_pages(path: &Path) -> Result<Option<(usize, usize)>> {
    let file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len() as usize;
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let pages = len.div_ceil(page);
    // SAFETY: a fresh read-only shared mapping of a file we hold open; unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Ok(None);
    }
    let mut vec = vec![0u8; pages];
    // SAFETY: addr/len is the mapping made above, vec holds one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    // SAFETY: unmapping exactly what we mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Ok(None);
    }
    Ok(Some((vec.iter().filter(|&&b| b & 1 == 1).count(), pages)))
}
