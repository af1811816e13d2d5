//! The "raw" format: binary PPM (P6, RGB), PGM (P5, gray) and PAM (P7, gray+alpha or RGBA), 8-bit.
//!
//! Raw pixels behind a few bytes of text header: any image tool opens them, and decoding is a copy.

use std::io::Write;

/// A validated view of a raw file's pixels (interleaved, 8-bit).
#[derive(Debug)]
pub struct RawView<'a> {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub pixels: &'a [u8],
}

/// Parses a binary PPM/PGM/PAM header and checks that the pixel data is all there.
pub fn parse(bytes: &[u8]) -> Result<RawView<'_>, String> {
    let mut pos = 2;
    let magic = bytes.get(..2).ok_or("file too short")?;
    let (width, height, channels, maxval) = match magic {
        b"P5" | b"P6" => {
            let w = next_number(bytes, &mut pos)?;
            let h = next_number(bytes, &mut pos)?;
            let m = next_number(bytes, &mut pos)?;
            // Exactly one whitespace byte separates the header from the pixels.
            if !bytes.get(pos).is_some_and(|b| b.is_ascii_whitespace()) {
                return Err("header not terminated by whitespace".into());
            }
            pos += 1;
            (w, h, if magic == b"P5" { 1 } else { 3 }, m)
        }
        b"P7" => {
            let (mut w, mut h, mut d, mut m) = (None, None, None, None);
            loop {
                let word = next_word(bytes, &mut pos)?;
                match word {
                    b"WIDTH" => w = Some(next_number(bytes, &mut pos)?),
                    b"HEIGHT" => h = Some(next_number(bytes, &mut pos)?),
                    b"DEPTH" => d = Some(next_number(bytes, &mut pos)?),
                    b"MAXVAL" => m = Some(next_number(bytes, &mut pos)?),
                    b"TUPLTYPE" => {
                        next_word(bytes, &mut pos)?;
                    }
                    b"ENDHDR" => break,
                    _ => {
                        return Err(format!(
                            "unknown PAM header field {:?}",
                            String::from_utf8_lossy(word)
                        ));
                    }
                }
            }
            // ENDHDR is followed by one newline.
            if bytes.get(pos) != Some(&b'\n') {
                return Err("ENDHDR not followed by a newline".into());
            }
            pos += 1;
            let d = d.ok_or("PAM without DEPTH")?;
            if !(1..=4).contains(&d) {
                return Err(format!("PAM depth {d} (1 to 4 supported)"));
            }
            (
                w.ok_or("PAM without WIDTH")?,
                h.ok_or("PAM without HEIGHT")?,
                d as u8,
                m.ok_or("PAM without MAXVAL")?,
            )
        }
        _ => return Err("not a binary PPM/PGM/PAM file (P5, P6 or P7)".into()),
    };
    if maxval != 255 {
        return Err(format!(
            "maxval {maxval} (only 8-bit, maxval 255, supported)"
        ));
    }
    if width == 0 || height == 0 {
        return Err(format!("empty image {width}x{height}"));
    }
    let len = (width as u64) * (height as u64) * channels as u64;
    let avail = (bytes.len() - pos) as u64;
    if avail < len {
        return Err(format!("truncated: {avail} of {len} pixel bytes"));
    }
    Ok(RawView {
        width,
        height,
        channels,
        pixels: &bytes[pos..pos + len as usize],
    })
}

/// The text header of a raw file of `channels` (1 to 4) interleaved 8-bit channels: P5 (1 channel), P6 (3)
/// or P7 (2 or 4). The pixels follow it as they are, so a writer can stream them row by row.
pub fn header(width: u32, height: u32, channels: u8) -> Vec<u8> {
    match channels {
        1 => format!("P5\n{width} {height}\n255\n"),
        3 => format!("P6\n{width} {height}\n255\n"),
        _ => {
            let t = if channels == 2 {
                "GRAYSCALE_ALPHA"
            } else {
                "RGB_ALPHA"
            };
            format!(
                "P7\nWIDTH {width}\nHEIGHT {height}\nDEPTH {channels}\nMAXVAL 255\nTUPLTYPE {t}\nENDHDR\n"
            )
        }
    }
    .into_bytes()
}

/// Writes interleaved 8-bit pixels as P5 (1 channel), P6 (3) or P7 (2 or 4).
pub fn write(
    out: &mut impl Write,
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
) -> std::io::Result<()> {
    let expected = width as usize * height as usize * channels as usize;
    if pixels.len() != expected || !(1..=4).contains(&channels) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} bytes for a {width}x{height}x{channels} image",
                pixels.len()
            ),
        ));
    }
    out.write_all(&header(width, height, channels))?;
    out.write_all(pixels)
}

/// Encodes to an in-memory raw file.
pub fn encode(pixels: &[u8], width: u32, height: u32, channels: u8) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(pixels.len() + 64);
    write(&mut v, pixels, width, height, channels)?;
    Ok(v)
}

fn skip_space_and_comments(bytes: &[u8], pos: &mut usize) {
    while let Some(&b) = bytes.get(*pos) {
        if b == b'#' {
            while bytes.get(*pos).is_some_and(|&c| c != b'\n') {
                *pos += 1;
            }
        } else if b.is_ascii_whitespace() {
            *pos += 1;
        } else {
            break;
        }
    }
}

fn next_word<'a>(bytes: &'a [u8], pos: &mut usize) -> Result<&'a [u8], String> {
    skip_space_and_comments(bytes, pos);
    let start = *pos;
    while bytes.get(*pos).is_some_and(|b| !b.is_ascii_whitespace()) {
        *pos += 1;
    }
    if start == *pos {
        return Err("truncated header".into());
    }
    Ok(&bytes[start..*pos])
}

fn next_number(bytes: &[u8], pos: &mut usize) -> Result<u32, String> {
    let w = next_word(bytes, pos)?;
    std::str::from_utf8(w)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad header number {:?}", String::from_utf8_lossy(w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_channel_count() {
        for c in 1..=4u8 {
            let px: Vec<u8> = (0..5 * 3 * c as usize).map(|i| (i * 7) as u8).collect();
            let f = encode(&px, 5, 3, c).unwrap();
            let v = parse(&f).unwrap();
            assert_eq!((v.width, v.height, v.channels), (5, 3, c));
            assert_eq!(v.pixels, &px[..]);
        }
    }

    #[test]
    fn rejects_truncated_and_garbage() {
        let f = encode(&[1; 30], 5, 2, 3).unwrap();
        assert!(parse(&f[..f.len() - 1]).unwrap_err().contains("truncated"));
        assert!(parse(b"P6\n").is_err());
        assert!(parse(b"P6 1 1 65535\n\0\0\0\0\0\0").is_err());
        assert!(parse(b"XX").is_err());
        assert!(parse(b"").is_err());
    }
}
