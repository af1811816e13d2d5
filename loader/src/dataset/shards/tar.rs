//! The parts of the tar format (POSIX ustar, with PAX and GNU long names) that shards need: writing one
//! regular member's header, and reading back the header in front of a member's data.
//!
//! A member is a 512-byte header block and its data padded to a whole block; the archive ends with two
//! zero blocks. A name that does not fit ustar's 100-byte name field (or its 155-byte prefix plus name)
//! is carried by a PAX extended header (`x`) before the member, as Python's `tarfile` writes it; GNU's
//! `L` long-name members are read too.

/// Tar's block size: every header and every member's data start at a multiple of it.
pub const BLOCK: u64 = 512;

/// Bytes of the end-of-archive marker (two zero blocks).
pub const END: usize = 2 * BLOCK as usize;

/// Largest member size a header's 11 octal digits hold (8 GiB - 1); larger members are refused.
const MAX_OCTAL_SIZE: u64 = 0o77777777777;

/// `n` rounded up to a whole number of blocks.
pub fn padded(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// What a header block says (names joined from ustar's prefix and name fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub size: u64,
    /// `0` (or NUL) regular file, `x` PAX extended header, `g` global PAX, `L` GNU long name, ...
    pub kind: u8,
}

impl Header {
    /// Whether this is a regular file's header (the members a dataset is made of).
    pub fn is_file(&self) -> bool {
        matches!(self.kind, b'0' | 0 | b'7')
    }
}

/// The header blocks (a PAX header and its records first where the name needs one) for a regular
/// file `name` of `size` bytes: what goes before its data.
pub fn file_header(name: &str, size: u64) -> Result<Vec<u8>, String> {
    if size > MAX_OCTAL_SIZE {
        return Err(format!(
            "{name}: {size} bytes, over tar's 8 GiB member limit"
        ));
    }
    if name.is_empty() || name.contains('\0') {
        return Err(format!("{name:?}: not a member name"));
    }
    let mut out = Vec::with_capacity(BLOCK as usize);
    let fields = match ustar_fields(name) {
        Some(f) => f,
        None => {
            let record = pax_record("path", name);
            let short: String = format!("PaxHeaders/{}", truncated(name, 80));
            out.extend_from_slice(&block(&short, "", record.len() as u64, b'x'));
            out.extend_from_slice(record.as_bytes());
            out.resize(padded(out.len() as u64) as usize, 0);
            (String::new(), truncated(name, 100).to_string())
        }
    };
    out.extend_from_slice(&block(&fields.1, &fields.0, size, b'0'));
    Ok(out)
}

/// ustar's (prefix, name) for `name`, if it fits them.
fn ustar_fields(name: &str) -> Option<(String, String)> {
    if name.len() <= 100 {
        return Some((String::new(), name.to_string()));
    }
    // Split at a `/` so that the prefix holds at most 155 bytes and the rest at most 100.
    name.match_indices('/')
        .map(|(i, _)| i)
        .find(|&i| i <= 155 && name.len() - i - 1 <= 100 && i > 0)
        .map(|i| (name[..i].to_string(), name[i + 1..].to_string()))
}

/// The first at most `max` bytes of `s`, cut at a character boundary.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One PAX record, `LEN key=value\n`, whose length counts its own digits.
fn pax_record(key: &str, value: &str) -> String {
    let body = key.len() + value.len() + 3; // space, '=', newline
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    format!("{len} {key}={value}\n")
}

/// One header block. Times, owners and modes are fixed, so that one input gives one byte-identical shard.
fn block(name: &str, prefix: &str, size: u64, kind: u8) -> [u8; BLOCK as usize] {
    let mut b = [0u8; BLOCK as usize];
    b[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut b[100..108], 0o644);
    octal(&mut b[108..116], 0);
    octal(&mut b[116..124], 0);
    octal(&mut b[124..136], size);
    octal(&mut b[136..148], 0);
    b[156] = kind;
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    b[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    let sum = checksum(&b);
    let digits = format!("{sum:06o}\0 ");
    b[148..156].copy_from_slice(digits.as_bytes());
    b
}

/// `n` in octal, zero-padded to fill `field` but its last byte (a NUL).
fn octal(field: &mut [u8], n: u64) {
    let w = field.len() - 1;
    let s = format!("{n:0w$o}");
    field[..w].copy_from_slice(&s.as_bytes()[s.len() - w..]);
    field[w] = 0;
}

/// The header checksum: the sum of its bytes with the checksum field read as spaces.
fn checksum(b: &[u8]) -> u64 {
    b.iter()
        .enumerate()
        .map(|(i, &c)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(c)
            }
        })
        .sum()
}

/// Whether `b` is a zero block (the end-of-archive marker).
pub fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&c| c == 0)
}

/// Reads a header block: its checksum must hold (as unsigned or, as some old writers sum, signed bytes).
pub fn parse(b: &[u8]) -> Result<Header, String> {
    if b.len() < BLOCK as usize {
        return Err(format!(
            "a header of {} bytes (a tar block is 512)",
            b.len()
        ));
    }
    let b = &b[..BLOCK as usize];
    let stored = number(&b[148..156]).ok_or("no header checksum (not a tar header)")?;
    let signed: i64 = b
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            if (148..156).contains(&i) {
                32
            } else {
                i64::from(c as i8)
            }
        })
        .sum();
    if stored != checksum(b) && stored as i64 != signed {
        return Err(format!(
            "header checksum {stored} does not match its bytes ({}): not a tar header, or damaged",
            checksum(b)
        ));
    }
    let size = number(&b[124..136]).ok_or("unreadable member size")?;
    let field = |r: std::ops::Range<usize>| {
        let f = &b[r];
        let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
        String::from_utf8_lossy(&f[..end]).into_owned()
    };
    let mut name = field(0..100);
    let prefix = field(345..500);
    if &b[257..262] == b"ustar" && !prefix.is_empty() {
        name = format!("{prefix}/{name}");
    }
    Ok(Header {
        name,
        size,
        kind: b[156],
    })
}

/// A numeric field: octal digits (spaces and NULs around them), or GNU's base-256 (high bit set).
fn number(f: &[u8]) -> Option<u64> {
    if f.first().is_some_and(|&c| c & 0x80 != 0) {
        let mut n: u64 = u64::from(f[0] & 0x7f);
        for &c in &f[1..] {
            n = n.checked_mul(256)?.checked_add(u64::from(c))?;
        }
        return Some(n);
    }
    let text = std::str::from_utf8(f).ok()?;
    let digits = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 8).ok()
}

/// The `path` and `size` records of a PAX extended header's data.
pub fn pax_fields(data: &[u8]) -> Result<(Option<String>, Option<u64>), String> {
    let (mut path, mut size) = (None, None);
    let mut rest = data;
    while !rest.is_empty() && rest[0] != 0 {
        let space = rest
            .iter()
            .position(|&c| c == b' ')
            .ok_or("a PAX record without a length")?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l >= space + 2 && l <= rest.len())
            .ok_or("a PAX record with a bad length")?;
        let record = &rest[space + 1..len - 1];
        if let Some(eq) = record.iter().position(|&c| c == b'=') {
            let value = String::from_utf8_lossy(&record[eq + 1..]).into_owned();
            match &record[..eq] {
                b"path" => path = Some(value),
                b"size" => size = value.parse().ok(),
                _ => {}
            }
        }
        rest = &rest[len..];
    }
    Ok((path, size))
}

/// Whether the header in front of a member's data names `name`: exactly where ustar holds the name; a
/// name that needed a PAX header (over 100 bytes, or not ASCII) is in that header, and the ustar fields
/// keep only a stand-in (Python's `tarfile` writes its first 100 bytes, ASCII-replaced), so any non-empty
/// one is taken.
pub fn names(header: &Header, name: &str) -> bool {
    let needs_pax = name.len() > 100 || !name.is_ascii();
    header.name == name || (needs_pax && !header.name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_with_short_split_and_pax_names() {
        let long_dir = "d".repeat(120);
        let very_long = format!("{}/{}", "x".repeat(200), "y".repeat(150));
        let split = format!("{long_dir}/file.png");
        let cases: [&str; 3] = ["a/b.l3", &split, &very_long];
        for name in cases {
            let h = file_header(name, 12345).unwrap();
            assert_eq!(h.len() as u64 % BLOCK, 0);
            let last = parse(&h[h.len() - BLOCK as usize..]).unwrap();
            assert_eq!(last.size, 12345);
            assert!(last.is_file());
            assert!(names(&last, name), "{name}: {last:?}");
            if h.len() > BLOCK as usize {
                let pax = parse(&h[..BLOCK as usize]).unwrap();
                assert_eq!(pax.kind, b'x');
                let data = &h[BLOCK as usize..BLOCK as usize + pax.size as usize];
                assert_eq!(pax_fields(data).unwrap(), (Some(name.to_string()), None));
            }
        }
        assert_eq!(pax_record("path", "abc"), "12 path=abc\n");
        // The length counts its own digits: 98 bytes of text and 2 digits would be 100, which has 3.
        let r = pax_record("path", &"a".repeat(91));
        assert!(r.starts_with("101 ") && r.len() == 101, "{r}");
        let mut h = file_header("a.png", 1).unwrap();
        h[0] = b'b';
        assert!(parse(&h).unwrap_err().contains("checksum"));
        assert!(file_header("big", 1 << 40).is_err());
    }
}
