//! A decoder positioned on one image of a file: a page of the main chain, or one of its levels.
//!
//! A page's SubIFDs are the reduced resolutions that pyramidal slides (OME-TIFF, and most whole-slide
//! writers since) store under their full-resolution page instead of in the main chain of pages. Level 0
//! is the page itself, level `n` its SubIFDs tag's `n`-th directory.
//!
//! The `tiff` crate decodes only images of the main chain, so a level is opened through [`FirstIfd`]: the
//! file's bytes as they are, except that the header names the level's directory as the first one. Every
//! offset inside the file is absolute, so the directory, its tag values and its chunks read as written.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use tiff::decoder::Decoder;
use tiff::tags::{IfdPointer, Tag};

/// Every decoder reads through [`FirstIfd`], so that a page's SubIFD levels are decoders of one type.
pub(super) type Dec = Decoder<FirstIfd<BufReader<File>>>;

pub(super) fn tiff_error(path: &Path, what: &str, e: tiff::TiffError) -> Error {
    match e {
        tiff::TiffError::IoError(source) => Error::Io {
            path: path.to_path_buf(),
            source,
        },
        e => Error::Tiff {
            path: path.to_path_buf(),
            reason: format!("{what}: {e}"),
        },
    }
}

/// A TIFF byte stream whose header's first-directory offset is replaced (see the module documentation);
/// with no replacement, the file as it is.
pub struct FirstIfd<R> {
    inner: R,
    pos: u64,
    /// The header bytes that differ from the file's, from offset 0; empty: none.
    header: Vec<u8>,
}

impl<R: Read + Seek> FirstIfd<R> {
    pub fn new(inner: R) -> FirstIfd<R> {
        FirstIfd {
            inner,
            pos: 0,
            header: Vec::new(),
        }
    }

    /// `inner` with its header naming the directory at `ifd` first. Returns `None` when `inner` does not
    /// start with a TIFF or BigTIFF header (the decoder then says what is wrong).
    fn pointing_at(mut inner: R, ifd: u64) -> io::Result<Option<FirstIfd<R>>> {
        let mut h = [0u8; 16];
        inner.seek(SeekFrom::Start(0))?;
        let n = read_up_to(&mut inner, &mut h)?;
        inner.seek(SeekFrom::Start(0))?;
        let little = match &h[..2] {
            b"II" => true,
            b"MM" => false,
            _ => return Ok(None),
        };
        let magic = if little {
            u16::from_le_bytes([h[2], h[3]])
        } else {
            u16::from_be_bytes([h[2], h[3]])
        };
        let header = match (magic, n) {
            (42, 8..) => {
                let Ok(ifd) = u32::try_from(ifd) else {
                    return Ok(None);
                };
                let mut v = h[..8].to_vec();
                v[4..8].copy_from_slice(&if little {
                    ifd.to_le_bytes()
                } else {
                    ifd.to_be_bytes()
                });
                v
            }
            (43, 16) => {
                let mut v = h.to_vec();
                v[8..16].copy_from_slice(&if little {
                    ifd.to_le_bytes()
                } else {
                    ifd.to_be_bytes()
                });
                v
            }
            _ => return Ok(None),
        };
        Ok(Some(FirstIfd {
            inner,
            pos: 0,
            header,
        }))
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> Read for FirstIfd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let end = self.pos + n as u64;
        if self.pos < self.header.len() as u64 {
            let (a, b) = (self.pos as usize, (end as usize).min(self.header.len()));
            buf[..b - a].copy_from_slice(&self.header[a..b]);
        }
        self.pos = end;
        Ok(n)
    }
}

impl<R: Seek> Seek for FirstIfd<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

/// The most SubIFDs a page may list: a pyramid halving 2^64 pixels has 64 levels; more is a damaged
/// or hostile file. One rule for listing the levels and for opening one.
const MAX_LEVELS: usize = 256;

/// The SubIFDs of the page the decoder is on (none when it has no SubIFDs tag); more than
/// [`MAX_LEVELS`] is refused, whichever level is asked for.
pub(super) fn sub_ifds<R: Read + Seek>(
    dec: &mut Decoder<R>,
    path: &Path,
    page: usize,
) -> Result<Vec<IfdPointer>> {
    let err = |e| tiff_error(path, &format!("reading page {page}'s SubIFDs"), e);
    let subs = match dec.find_tag(Tag::SubIfd).map_err(err)? {
        None => Vec::new(),
        Some(v) => v.into_ifd_vec().map_err(err)?,
    };
    if subs.len() > MAX_LEVELS {
        return Err(Error::Tiff {
            path: path.to_path_buf(),
            reason: format!(
                "page {page} names {} SubIFDs, more than the {MAX_LEVELS} a pyramid has",
                subs.len()
            ),
        });
    }
    Ok(subs)
}

/// A decoder of `path` on level `level` (≥ 1) of page `page`, given a decoder already on that page.
pub(super) fn open_level(mut on_page: Dec, path: &Path, page: usize, level: usize) -> Result<Dec> {
    let subs = sub_ifds(&mut on_page, path, page)?;
    let Some(ifd) = level.checked_sub(1).and_then(|i| subs.get(i)) else {
        return Err(Error::NoSuchLevel {
            path: path.to_path_buf(),
            page,
            level,
            subifds: subs.len(),
        });
    };
    drop(on_page);
    let file = open_file(path)?;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(view) = FirstIfd::pointing_at(file, ifd.0).map_err(io)? else {
        return Err(Error::Tiff {
            path: path.to_path_buf(),
            reason: format!(
                "page {page} level {level}: its directory offset does not fit the header"
            ),
        });
    };
    Decoder::new(view)
        .map_err(|e| tiff_error(path, &format!("reading page {page} level {level}"), e))
}

pub(super) fn open_file(path: &Path) -> Result<BufReader<File>> {
    let f = stdx::fs::open_regular(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(BufReader::new(f))
}

pub(super) fn open_decoder(path: &Path) -> Result<Dec> {
    Decoder::new(FirstIfd::new(open_file(path)?))
        .map_err(|e| tiff_error(path, "not a readable TIFF", e))
}

/// A decoder of `path` positioned on level `level` of page `page` (level 0: the page itself); a page past
/// the last is [`Error::NoSuchPage`], a level past the page's SubIFDs [`Error::NoSuchLevel`].
pub(super) fn open_decoder_at(path: &Path, page: usize, level: usize) -> Result<Dec> {
    let dec = open_page_decoder(path, page)?;
    match level {
        0 => Ok(dec),
        _ => open_level(dec, path, page, level),
    }
}

pub(super) fn open_page_decoder(path: &Path, page: usize) -> Result<Dec> {
    let mut dec = open_decoder(path)?;
    if page == 0 {
        return Ok(dec);
    }
    match dec.seek_to_image(page) {
        Ok(()) => Ok(dec),
        Err(tiff::TiffError::FormatError(tiff::TiffFormatError::ImageFileDirectoryNotFound)) => {
            Err(Error::NoSuchPage {
                path: path.to_path_buf(),
                page,
                pages: page_count(path)?,
            })
        }
        Err(e) => Err(tiff_error(path, &format!("reading page {page}"), e)),
    }
}

/// How many pages (image file directories in the main chain) `path` holds.
pub(super) fn page_count(path: &Path) -> Result<usize> {
    let mut dec = open_decoder(path)?;
    let mut n = 1;
    while dec.more_images() {
        dec.next_image()
            .map_err(|e| tiff_error(path, &format!("reading page {n}"), e))?;
        n += 1;
    }
    Ok(n)
}
