//! The `.npy` header: magic, version, and the Python dict literal numpy writes and reads back with
//! `ast.literal_eval` — `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 5), }` padded with
//! spaces to a multiple of 64 bytes and ended by a newline.
//!
//! Parsed as a literal, not searched for substrings: a header numpy would refuse (a missing brace, a key
//! too many or too few, a key twice, a shape that is not a tuple of integers) is refused here too, with
//! what is wrong.

/// What a header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<usize>,
    /// Bytes from the start of the file to the first value.
    pub data_offset: usize,
}

/// The longest header read (numpy's own limit for a header it trusts is 10,000 bytes; large shapes of
/// a high rank stay far below either).
pub const MAX_HEADER: usize = 1 << 20;

/// The bytes before the dict: the magic, the version and the header's length, or why they are not.
/// `prefix` holds at least the first 12 bytes of the file where the file has them.
pub fn preamble(prefix: &[u8]) -> Result<(usize, usize), String> {
    if prefix.len() < 10 || &prefix[..6] != b"\x93NUMPY" {
        return Err("no NUMPY magic".into());
    }
    let (major, minor) = (prefix[6], prefix[7]);
    let (start, len) = match major {
        1 => (10, u16::from_le_bytes([prefix[8], prefix[9]]) as usize),
        2 | 3 => {
            if prefix.len() < 12 {
                return Err("a truncated header length".into());
            }
            (
                12,
                u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize,
            )
        }
        _ => {
            return Err(format!(
                "format version {major}.{minor}: expected 1.0, 2.0 or 3.0"
            ));
        }
    };
    if len > MAX_HEADER {
        return Err(format!("a header of {len} bytes"));
    }
    Ok((start, len))
}

/// Parses the dict of a header that starts at `start` of the file (so that [`Header::data_offset`] is
/// right).
pub fn parse(dict: &[u8], start: usize) -> Result<Header, String> {
    let text = std::str::from_utf8(dict).map_err(|_| "a header that is not text".to_string())?;
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    p.expect(b'{')?;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.expect(b':')?;
        let seen = match key.as_str() {
            "descr" => descr.replace(p.string()?).is_some(),
            "fortran_order" => fortran.replace(p.boolean()?).is_some(),
            "shape" => shape.replace(p.tuple()?).is_some(),
            other => {
                return Err(format!(
                    "header key {:?}: expected descr, fortran_order and shape only",
                    quote(other)
                ));
            }
        };
        if seen {
            return Err(format!("header key {key:?} given twice"));
        }
        p.skip_ws();
        if p.eat(b',') {
            continue;
        }
        p.expect(b'}')?;
        break;
    }
    if p.s[p.at..].iter().any(|b| !b.is_ascii_whitespace()) {
        return Err("text after the header's dict".into());
    }
    let missing = |k: &str| format!("header has no {k:?}");
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
        data_offset: start + dict.len(),
    })
}

/// At most 40 characters of what a file said, for an error message.
fn quote(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The header (version 1.0, padded to a multiple of 64 bytes) of a float32 C-order array of `shape`.
pub fn write(shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    let len = (dict.len() + 1 + 10).div_ceil(64) * 64 - 10;
    h.extend_from_slice(&(len as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(10 + len - 1, b' ');
    h.push(b'\n');
    h
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_ws();
        let hit = self.s.get(self.at) == Some(&b);
        if hit {
            self.at += 1;
        }
        hit
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.eat(b) {
            return Ok(());
        }
        Err(match self.s.get(self.at) {
            None => format!("the header ends where {:?} was expected", b as char),
            Some(&c) => format!(
                "{:?} at byte {} of the header where {:?} was expected",
                c as char, self.at, b as char
            ),
        })
    }

    /// A string literal in single or double quotes, without escapes (numpy writes none in these keys).
    fn string(&mut self) -> Result<String, String> {
        self.skip_ws();
        let q = match self.s.get(self.at) {
            Some(&q @ (b'\'' | b'"')) => q,
            None => return Err("the header ends where a string was expected".into()),
            _ => {
                return Err(format!(
                    "a string expected at byte {} of the header",
                    self.at
                ));
            }
        };
        let from = self.at + 1;
        let len = self.s[from..]
            .iter()
            .position(|&c| c == q || c == b'\\')
            .ok_or("an unterminated string in the header")?;
        if self.s[from + len] == b'\\' {
            return Err("an escape sequence in a header string".into());
        }
        self.at = from + len + 1;
        Ok(String::from_utf8_lossy(&self.s[from..from + len]).into_owned())
    }

    fn boolean(&mut self) -> Result<bool, String> {
        self.skip_ws();
        for (word, v) in [(&b"True"[..], true), (b"False", false)] {
            if self.s[self.at..].starts_with(word) {
                self.at += word.len();
                return Ok(v);
            }
        }
        Err(format!(
            "True or False expected at byte {} of the header",
            self.at
        ))
    }

    /// A tuple of non-negative integers: `()`, `(n,)`, `(n, m)`, `(n, m,)` — not `(n)`, which is an
    /// integer in Python.
    fn tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        let mut comma = false;
        while !self.eat(b')') {
            let from = self.at;
            while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
                self.at += 1;
            }
            let digits = std::str::from_utf8(&self.s[from..self.at]).unwrap_or("");
            let dim: usize = digits
                .parse()
                .map_err(|_| format!("a shape entry at byte {from} of the header is not a size"))?;
            dims.push(dim);
            comma = self.eat(b',');
            if !comma {
                self.expect(b')')?;
                break;
            }
        }
        if dims.len() == 1 && !comma {
            return Err("a shape that is an integer in parentheses, not a tuple".into());
        }
        Ok(dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict(s: &str) -> Result<Header, String> {
        parse(s.as_bytes(), 10)
    }

    #[test]
    fn what_numpy_writes_is_read() {
        let h = write(&[3, 40, 50]);
        let (start, len) = preamble(&h).unwrap();
        assert_eq!((start, start + len), (10, h.len()));
        assert_eq!(h.len() % 64, 0);
        let got = parse(&h[start..], start).unwrap();
        assert_eq!(got.shape, [3, 40, 50]);
        assert_eq!(
            (got.descr.as_str(), got.fortran_order, got.data_offset),
            ("<f4", false, h.len())
        );
        // numpy 2's spelling of a 1-D shape, double quotes, no trailing comma.
        let h = dict("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (7,)}\n").unwrap();
        assert_eq!(h.shape, [7]);
        assert_eq!(
            dict("{'shape': (), 'fortran_order': True, 'descr': '<f8', }  \n")
                .unwrap()
                .shape,
            Vec::<usize>::new()
        );
    }

    #[test]
    fn headers_numpy_refuses_are_refused() {
        for (text, says) in [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 5), \n",
                "ends",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 5), 'x': 1}",
                "expected descr, fortran_order and shape only",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", "no \"shape\""),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
                "twice",
            ),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
                "True or False",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, -2)}",
                "not a size",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (5)}",
                "not a tuple",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
                "not a size",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
                "text after",
            ),
            (
                "{'descr': '<f4\\'', 'fortran_order': False, 'shape': (1,)}",
                "escape",
            ),
        ] {
            let e = dict(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(
            preamble(b"\x93NUMPY\x09\x00\x10\x00")
                .unwrap_err()
                .contains("version 9.0")
        );
        assert!(
            preamble(b"NUMPY\x93\x01\x00\x10\x00")
                .unwrap_err()
                .contains("magic")
        );
        assert!(
            preamble(b"\x93NUMPY\x02\x00\xff\xff\xff\xff")
                .unwrap_err()
                .contains("4294967295")
        );
        // A 50 MB key is quoted, not printed whole.
        let long = format!("{{'{}': 1}}", "k".repeat(5_000_000));
        assert!(dict(&long).unwrap_err().len() < 200);
    }
}
