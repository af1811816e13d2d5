//! Opening files that may not be what their names say: a FIFO named `x.png` must fail, not block forever,
//! and `/dev/zero` must not be read until memory runs out.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a folder"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file (after symlinks): opened non-blocking so a FIFO cannot
/// stall the open, checked with `fstat`, then switched back to blocking reads.
pub fn open_regular(path: impl AsRef<Path>) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file ({})", kind_of(ft)),
        ));
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; clearing O_NONBLOCK only changes how reads wait.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// Reads a whole regular file of at most `limit` bytes (larger files fail before anything is read).
pub fn read_regular(path: impl AsRef<Path>, limit: u64) -> io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, over the limit of {limit} bytes"),
        ));
    }
    let mut buf = Vec::with_capacity(len as usize);
    // `take` guards against a file that grows while it is read.
    file.by_ref().take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("grew past the limit of {limit} bytes while being read"),
        ));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_folders_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.png");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = read_regular("/dev/zero", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        assert!(open_regular(dir.path()).is_err());
        let f = dir.path().join("a");
        std::fs::write(&f, b"12345").unwrap();
        assert_eq!(read_regular(&f, 5).unwrap(), b"12345");
        assert!(
            read_regular(&f, 4)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
    }
}
