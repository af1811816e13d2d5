//! Encoding, the entry points: each checks its arguments, then hands the pixels to version 1's encoder
//! (`v1/encode.rs`) or version 2's (`v2/encode.rs`), which write a complete file.

use crate::error::{Error, Limits};
use crate::format::{DEFAULT_FORMAT, Format, valid_v2_patch_size};
use crate::v1;
use crate::v2;
use crate::v2::encode::Choices;

/// What [`encode_with`] writes. `Default` is [`crate::DEFAULT_FORMAT`] at that format's default patch size,
/// the default encoder choices ([`Choices::FastDecode`]), one thread, entry CRCs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncodeOptions {
    pub format: Format,
    /// Patch size N; `None` = [`Format::default_patch_size`] (v1: 32 or 64 by image size; v2: 128).
    /// Version 2 needs a multiple of 32.
    pub patch_size: Option<u8>,
    /// Threads for the patch-parallel stages: 1 = this thread only, 0 = every core. The output does not
    /// depend on it.
    pub threads: usize,
    /// How a v2 encoder makes the choices the format leaves free (ignored by v1).
    pub choices: Choices,
    /// Version 2: write a CRC-32C of every offset-table entry and one of the prefix (header flag
    /// [`crate::FLAG_ENTRY_CRCS`], SPEC.md §2.11), so that region reads verify what they decode. Default
    /// `true`; `false` writes the files of the design's conformance vectors (ignored by v1).
    pub entry_crcs: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            format: DEFAULT_FORMAT,
            patch_size: None,
            threads: 1,
            choices: Choices::FastDecode,
            entry_crcs: true,
        }
    }
}

/// Encodes interleaved HWC pixels (`channels` = 1, 3 or 4) as `opts` says.
pub fn encode_with(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    opts: &EncodeOptions,
) -> Result<Vec<u8>, Error> {
    let n = opts
        .patch_size
        .unwrap_or_else(|| opts.format.default_patch_size(width, height));
    match opts.format {
        Format::V1 => encode_parallel(pixels, width, height, channels, n, opts.threads),
        Format::V2(profile) => {
            check_input(pixels, width, height, channels, n)?;
            if !valid_v2_patch_size(n) {
                return Err(Error::BadPatchSize { found: n });
            }
            v2::encode::encode(
                pixels,
                width,
                height,
                channels,
                n,
                profile,
                opts.choices,
                opts.entry_crcs,
                opts.threads,
            )
        }
    }
}

/// The argument checks every encoder makes.
fn check_input(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
) -> Result<(), Error> {
    let samples = check_shape(width, height, channels, patch_size)?;
    if pixels.len() != samples {
        return Err(Error::BufferSize {
            expected: samples,
            got: pixels.len(),
        });
    }
    Ok(())
}

/// The checks of the image's shape every encoder makes, the streaming one too: dimensions, channels,
/// patch size, and the sample count within [`Limits::default`]. Returns the sample count.
pub(crate) fn check_shape(
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
) -> Result<usize, Error> {
    if width == 0 || height == 0 {
        return Err(Error::ZeroDimension { width, height });
    }
    if !matches!(channels, 1 | 3 | 4) {
        return Err(Error::BadChannels { found: channels });
    }
    if patch_size == 0 {
        return Err(Error::ZeroPatchSize);
    }
    let too_large = Error::TooLarge {
        width,
        height,
        channels,
        limit: Limits::default().max_pixels,
    };
    (width as u64)
        .checked_mul(height as u64)
        .and_then(|p| p.checked_mul(channels as u64))
        .filter(|&s| s <= Limits::default().max_pixels)
        .and_then(|s| usize::try_from(s).ok())
        .ok_or(too_large)
}

/// Encodes interleaved HWC pixels (`channels` = 1, 3 or 4) into a complete **version 1** L3 file with patch
/// size `patch_size` (see [`crate::default_patch_size`]); [`encode_with`] writes either version.
pub fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
) -> Result<Vec<u8>, Error> {
    encode_parallel(pixels, width, height, channels, patch_size, 1)
}

/// [`encode`] (version 1) with rows of patches spread over `threads` threads (0 = every core). Output is
/// identical.
pub fn encode_parallel(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
    threads: usize,
) -> Result<Vec<u8>, Error> {
    check_input(pixels, width, height, channels, patch_size)?;
    v1::encode::encode(pixels, width, height, channels, patch_size, threads)
}
