//! Rust source as tidy reads it: the code with comments and literals blanked out (so that a word in a
//! comment or a string is never taken for code), line numbers kept, and the test-only items cut.

/// `text` with every comment, string, byte-string and character literal replaced by spaces; newlines are
/// kept, so a byte offset or a line number means the same in both.
pub fn blank_comments_and_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 2;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'r' | b'b' | b'c' if starts_raw_string(b, i) => {
                let mut j = i + 1;
                if b[i] != b'r' {
                    j += 1; // br / cr
                }
                let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
                j += hashes + 1; // past the opening quote
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let end = b[j..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| j + p + close.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let end = string_end(b, i + 1);
                blank(&mut out, i, end);
                i = end;
            }
            b'\'' => {
                // A character literal ('a', '\n', '\u{..}'), or a lifetime / label ('a), left alone.
                if let Some(end) = char_literal_end(b, i) {
                    blank(&mut out, i, end);
                    i = end;
                } else {
                    i += 1;
                }
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                // Skip the whole identifier, so that the `b` or `r` ending one never starts a literal.
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                // A byte or C string prefix directly followed by a quote: `b"..."`, `c"..."`.
                if i - start == 1 && matches!(b[start], b'b' | b'c') && b.get(i) == Some(&b'"') {
                    let end = string_end(b, i + 1);
                    blank(&mut out, start, end);
                    i = end;
                } else if i - start == 1
                    && b[start] == b'b'
                    && b.get(i) == Some(&b'\'')
                    && let Some(end) = char_literal_end(b, i)
                {
                    blank(&mut out, start, end);
                    i = end;
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Whether a raw string (`r"`, `r#"`, `br"`, `cr#"`) starts at `i`.
fn starts_raw_string(b: &[u8], i: usize) -> bool {
    let mut j = i;
    if matches!(b[j], b'b' | b'c') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return false;
    }
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return false;
    }
    j += 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    b.get(j) == Some(&b'"')
}

/// The offset just past the closing quote of a string whose contents start at `i`.
fn string_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of a character literal starting with the quote at `i`, or `None` for a lifetime.
fn char_literal_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i + 1)? {
        b'\\' => {
            let close = b[i + 2..].iter().take(12).position(|&c| c == b'\'')?;
            Some(i + 2 + close + 1)
        }
        _ => {
            // One UTF-8 character, then the closing quote.
            let s = std::str::from_utf8(&b[i + 1..(i + 6).min(b.len())])
                .or_else(|e| std::str::from_utf8(&b[i + 1..i + 1 + e.valid_up_to()]))
                .ok()?;
            let c = s.chars().next()?;
            let after = i + 1 + c.len_utf8();
            (b.get(after) == Some(&b'\'')).then_some(after + 1)
        }
    }
}

/// A token of blanked source: an identifier (or keyword) or one punctuation character; `::` is one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token<'a> {
    pub text: &'a str,
    pub line: usize,
}

/// The tokens of blanked source (see [`blank_comments_and_literals`]); numbers and whitespace dropped.
pub fn tokens(code: &str) -> Vec<Token<'_>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            let start = i;
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token {
                text: &code[start..i],
                line,
            });
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Token { text: "::", line });
            i += 2;
        } else if c.is_ascii() {
            out.push(Token {
                text: &code[i..i + 1],
                line,
            });
            i += 1;
        } else {
            // Non-ASCII outside literals (an identifier in another script): skip the character.
            i += code[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// Whether the attribute tokens `#[ ... ]` starting at `i` (the `#`) say `cfg(test)` or `cfg(all(test,
/// ...))`; returns the index just past the closing `]`.
pub fn cfg_test_attribute(t: &[Token], i: usize) -> Option<(bool, usize)> {
    if t.get(i)?.text != "#" || t.get(i + 1)?.text != "[" {
        return None;
    }
    let mut depth = 0;
    let mut j = i + 1;
    let mut words = Vec::new();
    while j < t.len() {
        match t[j].text {
            "[" => depth += 1,
            "]" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            w => words.push(w),
        }
        j += 1;
    }
    let is_test = words.first() == Some(&"cfg")
        && words.contains(&"test")
        && !words.contains(&"not")
        && !words.contains(&"any");
    Some((is_test, j + 1))
}

/// The index of the token closing the bracket opened at `open` (`{`, `(` or `[`).
pub fn matching_close(t: &[Token], open: usize) -> usize {
    let (o, c) = match t[open].text {
        "(" => ("(", ")"),
        "[" => ("[", "]"),
        _ => ("{", "}"),
    };
    let mut depth = 0;
    for (j, tok) in t.iter().enumerate().skip(open) {
        if tok.text == o {
            depth += 1;
        } else if tok.text == c {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    t.len().saturating_sub(1)
}

/// The tokens with every `#[cfg(test)]` item removed (a `mod tests { .. }`, a test-only `use`, `fn` or
/// `impl`), and the names of the `#[cfg(test)] mod x;` declarations (test-only files).
pub fn without_test_items<'a>(t: &[Token<'a>]) -> (Vec<Token<'a>>, Vec<String>) {
    let mut out = Vec::with_capacity(t.len());
    let mut test_mods = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if let Some((true, after)) = cfg_test_attribute(t, i) {
            // Skip further attributes, then the item: up to its `;` or its matching `}`.
            let mut j = after;
            while let Some((_, next)) = cfg_test_attribute(t, j) {
                j = next;
            }
            if t.get(j).map(|x| x.text) == Some("mod") && t.get(j + 2).map(|x| x.text) == Some(";")
            {
                test_mods.push(t[j + 1].text.to_string());
            }
            while j < t.len() && t[j].text != ";" && t[j].text != "{" {
                j += 1;
            }
            i = if j < t.len() && t[j].text == "{" {
                matching_close(t, j) + 1
            } else {
                j + 1
            };
            continue;
        }
        out.push(t[i].clone());
        i += 1;
    }
    (out, test_mods)
}
