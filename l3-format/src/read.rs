//! Reading a container through the caller's reader: the prefix read loop ([`L3Index::read_from`]) and the
//! streamed whole-file CRC-32C check ([`L3Index::verify_crc_from`]), each with a convenience for a file read
//! by positioned reads ([`L3Index::read_at`], [`L3Index::verify_crc_at`]). A local file, a memory map, an
//! object store's ranged GETs and a storage layer that counts its bytes all read the container the same
//! way, in bounded memory, and a length that lies (a file shorter or longer than the caller said, a reader
//! that returns fewer bytes than asked) is a typed error, never a panic or an unbounded allocation.

use crate::crc32c::Crc32c;
use crate::error::{Error, Limits};
use crate::format::{HEADER_LEN, VERSION_2};
use crate::index::L3Index;
use std::ops::Range;

/// Bytes the positioned-read CRC check reads at a time: large enough for a disk's throughput, small beside
/// the images it guards.
pub const CRC_CHUNK: usize = 8 << 20;

/// Reading a container failed: the caller's reader ([`Read`](Self::Read), with the byte range it was asked
/// for) or the bytes it returned ([`Format`](Self::Format)). `E` is the reader's own error type
/// (`std::io::Error` for the positioned-read conveniences), so a storage layer keeps its typed errors.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E = std::io::Error> {
    #[error("reading bytes {}..{}: {source}", range.start, range.end)]
    Read {
        range: Range<u64>,
        #[source]
        source: E,
    },
    #[error(transparent)]
    Format(#[from] Error),
}

/// A reader that cannot fail (bytes in memory) leaves only the format's error.
impl From<ReadError<std::convert::Infallible>> for Error {
    fn from(e: ReadError<std::convert::Infallible>) -> Error {
        match e {
            ReadError::Format(e) => e,
            ReadError::Read { source, .. } => match source {},
        }
    }
}

impl L3Index {
    /// Reads and parses the prefix (header, tables, offset table) of a `file_len`-byte file through `read`,
    /// which returns the bytes of the file range it is given (a `pread`, a ranged GET): v1 and v2-BP in two
    /// reads, v2-ANS with a read-ahead until its variable-length tables are in (the loop of
    /// [`next_read`](Self::next_read)). A reader that returns fewer bytes than asked (the file is shorter
    /// than `file_len` says) ends the loop and the prefix is parsed from what came, which names what is
    /// missing ([`Error::Truncated`]); bytes beyond the range asked are ignored.
    ///
    /// ```
    /// # let file = l3_format::encode_with(&[7u8; 48], 4, 4, 3, &Default::default())?;
    /// let index = l3_format::L3Index::read_from(file.len() as u64, |r| {
    ///     Ok::<_, std::convert::Infallible>(file[r.start as usize..r.end as usize].to_vec())
    /// })?;
    /// assert_eq!(index.width(), 4);
    /// # Ok::<(), l3_format::Error>(())
    /// ```
    pub fn read_from<E>(
        file_len: u64,
        read: impl FnMut(Range<u64>) -> Result<Vec<u8>, E>,
    ) -> Result<L3Index, ReadError<E>> {
        Self::read_from_with_limits(file_len, &Limits::default(), read)
    }

    /// [`read_from`](Self::read_from) with other limits.
    pub fn read_from_with_limits<E>(
        file_len: u64,
        limits: &Limits,
        mut read: impl FnMut(Range<u64>) -> Result<Vec<u8>, E>,
    ) -> Result<L3Index, ReadError<E>> {
        let mut prefix = Vec::new();
        while let Some(r) = Self::next_read_with_limits(&prefix, file_len, limits)? {
            let want = (r.end - r.start) as usize;
            let mut part = read(r.clone()).map_err(|source| ReadError::Read {
                range: r.clone(),
                source,
            })?;
            part.truncate(want);
            prefix.extend_from_slice(&part);
            if part.len() < want {
                break;
            }
        }
        Ok(Self::parse_with_limits(&prefix, file_len, limits)?)
    }

    /// [`read_from`](Self::read_from) for a file read by positioned reads (a `File`): `file_len` is the
    /// length the caller knows (its metadata's).
    #[cfg(unix)]
    pub fn read_at(
        file: &impl std::os::unix::fs::FileExt,
        file_len: u64,
    ) -> Result<L3Index, ReadError> {
        Self::read_from(file_len, |r| read_up_to(file, r))
    }

    /// Checks the whole-file CRC-32C that ends a version-2 file (the CRC of every byte before it, SPEC.md
    /// §2.10) by streaming the file through one buffer of at most `chunk` bytes: `read(at, buf)` fills `buf`
    /// with the bytes at offset `at` (exactly, or fails). Returns the checksum, or `None` for a version-1
    /// file (which has none). A mismatch is [`Error::CrcMismatch`].
    pub fn verify_crc_from<E>(
        &self,
        chunk: usize,
        read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
    ) -> Result<Option<u32>, ReadError<E>> {
        if self.version() < VERSION_2 {
            return Ok(None);
        }
        verify_file_crc(self.file_len(), chunk, read).map(Some)
    }

    /// [`verify_crc_from`](Self::verify_crc_from) through positioned reads of `file`, [`CRC_CHUNK`] bytes at
    /// a time.
    #[cfg(unix)]
    pub fn verify_crc_at(
        &self,
        file: &impl std::os::unix::fs::FileExt,
    ) -> Result<Option<u32>, ReadError> {
        self.verify_crc_from(CRC_CHUNK, |at, buf| file.read_exact_at(buf, at))
    }
}

/// The CRC check of [`L3Index::verify_crc_from`] for any `file_len`-byte version-2 file.
fn verify_file_crc<E>(
    file_len: u64,
    chunk: usize,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<u32, ReadError<E>> {
    let body = file_len
        .checked_sub(4)
        .filter(|&b| b >= HEADER_LEN as u64)
        .ok_or(Error::Truncated {
            what: "CRC",
            needed: HEADER_LEN + 4,
            len: usize::try_from(file_len).unwrap_or(usize::MAX),
        })?;
    let mut read = |at: u64, buf: &mut [u8]| {
        read(at, buf).map_err(|source| ReadError::Read {
            range: at..at + buf.len() as u64,
            source,
        })
    };
    let mut crc = Crc32c::new();
    let mut buf = vec![
        0u8;
        chunk
            .max(1)
            .min(usize::try_from(body).unwrap_or(usize::MAX))
    ];
    let mut at = 0u64;
    while at < body {
        let n = (body - at).min(buf.len() as u64) as usize;
        read(at, &mut buf[..n])?;
        crc.update(&buf[..n]);
        at += n as u64;
    }
    let mut tail = [0u8; 4];
    read(body, &mut tail)?;
    let (stored, computed) = (u32::from_le_bytes(tail), crc.finish());
    if stored != computed {
        return Err(Error::CrcMismatch { stored, computed }.into());
    }
    Ok(computed)
}

/// The bytes of `range` of `file`, fewer where the file ends first.
#[cfg(unix)]
fn read_up_to(
    file: &impl std::os::unix::fs::FileExt,
    range: Range<u64>,
) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    let mut have = 0;
    while have < buf.len() {
        match file.read_at(&mut buf[have..], range.start + have as u64) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(have);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EncodeOptions, Format, Profile, encode, encode_with};
    use std::convert::Infallible;

    fn image(w: u32, h: u32, c: u8) -> Vec<u8> {
        (0..w * h * c as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 23) as u8 / 3 + (i % 7) as u8)
            .collect()
    }

    /// A v1, a v2-BP and a v2-ANS file (the latter with several reads for its tables).
    fn files() -> Vec<Vec<u8>> {
        let px = image(150, 97, 3);
        let v2 = |profile| {
            let opts = EncodeOptions {
                format: Format::V2(profile),
                ..Default::default()
            };
            encode_with(&px, 150, 97, 3, &opts).unwrap()
        };
        vec![
            encode(&px, 150, 97, 3, 32).unwrap(),
            v2(Profile::Bp),
            v2(Profile::Ans),
        ]
    }

    fn reader(file: &[u8]) -> impl FnMut(Range<u64>) -> Result<Vec<u8>, Infallible> + '_ {
        |r| {
            let end = (r.end as usize).min(file.len());
            Ok(file[(r.start as usize).min(end)..end].to_vec())
        }
    }

    #[test]
    fn read_from_equals_parse_of_the_whole_prefix() {
        for file in files() {
            let len = file.len() as u64;
            let mut asked = Vec::new();
            let index = L3Index::read_from(len, |r| {
                asked.push(r.clone());
                reader(&file)(r)
            })
            .unwrap();
            assert_eq!(index, L3Index::parse(&file, len).unwrap());
            // Reads are contiguous from byte 0, and the read-ahead for ANS tables stays bounded.
            assert_eq!(asked[0].start, 0);
            assert!(asked.windows(2).all(|w| w[0].end == w[1].start));
            assert!(asked.last().unwrap().end <= index.data_offset().max(HEADER_LEN as u64) + 8192);
        }
    }

    #[test]
    fn a_reader_that_returns_more_than_asked_is_cut_to_the_range() {
        for file in files() {
            let len = file.len() as u64;
            let index = L3Index::read_from(len, |r| {
                Ok::<_, Infallible>(file[r.start as usize..].to_vec())
            })
            .unwrap();
            assert_eq!(index, L3Index::parse(&file, len).unwrap());
        }
    }

    #[test]
    fn truncated_files_and_lying_lengths_are_errors() {
        for file in files() {
            let prefix = L3Index::parse(&file, file.len() as u64)
                .unwrap()
                .data_offset() as usize;
            // The file is cut inside its header or its offset table, and says so.
            for cut in [0, 3, HEADER_LEN - 1, HEADER_LEN, prefix - 1] {
                let short = &file[..cut];
                let e = L3Index::read_from(short.len() as u64, reader(short)).unwrap_err();
                assert!(matches!(e, ReadError::Format(_)), "cut {cut}: {e}");
            }
            // The caller says the file is longer than it is: the reads come back short.
            for cut in [HEADER_LEN - 1, HEADER_LEN + 2, prefix - 1] {
                let e = L3Index::read_from(file.len() as u64, reader(&file[..cut])).unwrap_err();
                assert!(
                    matches!(e, ReadError::Format(Error::Truncated { .. })),
                    "cut {cut}: {e}"
                );
            }
            // Lengths that no file has: errors, not panics or huge allocations. (A length larger than
            // the file's that its offsets still fit is found by the patch reads, which come back short.)
            for len in [0, 1, 7, u64::MAX] {
                let r = L3Index::read_from(len, reader(&file));
                assert!(r.is_err(), "length {len}");
            }
        }
    }

    #[test]
    fn the_readers_error_is_kept_with_its_range() {
        let file = &files()[2];
        let mut calls = 0;
        let e = L3Index::read_from(file.len() as u64, |r| {
            calls += 1;
            if calls == 2 {
                Err("connection reset")
            } else {
                Ok(file[r.start as usize..r.end as usize].to_vec())
            }
        })
        .unwrap_err();
        match e {
            ReadError::Read { range, source } => {
                assert_eq!(range.start, HEADER_LEN as u64);
                assert_eq!(source, "connection reset");
            }
            other => panic!("{other}"),
        }
    }

    fn check_crc(file: &[u8], chunk: usize) -> Result<Option<u32>, ReadError<Infallible>> {
        let index = L3Index::parse(file, file.len() as u64)?;
        let mut biggest = 0;
        let r = index.verify_crc_from(chunk, |at, buf| {
            biggest = biggest.max(buf.len());
            buf.copy_from_slice(&file[at as usize..at as usize + buf.len()]);
            Ok(())
        });
        assert!(
            biggest <= chunk.max(4),
            "read {biggest} at once, chunk {chunk}"
        );
        r
    }

    #[test]
    fn crc_is_the_same_at_every_chunk_boundary() {
        for file in &files()[1..] {
            let want = u32::from_le_bytes(file[file.len() - 4..].try_into().unwrap());
            let body = file.len() - 4;
            for chunk in [0, 1, 3, 7, 8, 64, 4096, body - 1, body, body + 1, 1 << 30] {
                assert_eq!(check_crc(file, chunk).unwrap(), Some(want), "chunk {chunk}");
            }
        }
        assert_eq!(check_crc(&files()[0], 64).unwrap(), None, "version 1");
    }

    #[test]
    fn crc_mismatch_is_found_wherever_the_damage_is() {
        for file in &files()[1..] {
            // Damage in the patch data only: the prefix still parses, the whole-file CRC catches it.
            let index = L3Index::parse(file, file.len() as u64).unwrap();
            for at in [index.data_offset() as usize, file.len() - 5, file.len() - 1] {
                let mut bad = file.clone();
                bad[at] ^= 0x10;
                let e = index
                    .verify_crc_from(1000, |off, buf| {
                        buf.copy_from_slice(&bad[off as usize..off as usize + buf.len()]);
                        Ok::<_, Infallible>(())
                    })
                    .unwrap_err();
                assert!(
                    matches!(e, ReadError::Format(Error::CrcMismatch { .. })),
                    "byte {at}: {e}"
                );
            }
        }
    }

    #[test]
    fn positioned_reads_of_a_real_file() {
        use std::io::Write;
        for file in files() {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&file).unwrap();
            let index = L3Index::read_at(&f, file.len() as u64).unwrap();
            assert_eq!(index, L3Index::parse(&file, file.len() as u64).unwrap());
            let want = (index.version() >= 2)
                .then(|| u32::from_le_bytes(file[file.len() - 4..].try_into().unwrap()));
            assert_eq!(index.verify_crc_at(&f).unwrap(), want);
            // A CRC check of a file cut after its index was read fails reading, with the range.
            f.set_len(file.len() as u64 - 10).unwrap();
            if index.version() >= 2 {
                let e = index.verify_crc_at(&f).unwrap_err();
                assert!(matches!(e, ReadError::Read { .. }), "{e}");
            }
            // The file is shorter than the caller says, inside its prefix: the reads come back short.
            f.set_len(index.data_offset() - 1).unwrap();
            let e = L3Index::read_at(&f, file.len() as u64).unwrap_err();
            assert!(
                matches!(e, ReadError::Format(Error::Truncated { .. })),
                "{e}"
            );
        }
    }
}
