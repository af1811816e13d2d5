//! Quoting untrusted text in error messages without letting it grow them without bound.

use std::fmt;

/// How many characters of quoted input an error message shows; the rest is counted, not printed.
pub const QUOTE_CHARS: usize = 200;

/// `text` as it goes into an error message: Rust's debug quoting (control characters escaped), at most
/// [`QUOTE_CHARS`] characters of it, and the number of characters left out. A 50 MB file name or a state file
/// that is really `/etc/passwd` then costs one short line, not the whole input.
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.char_indices();
        match chars.nth(QUOTE_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => {
                let rest = self.0[cut..].chars().count();
                write!(f, "{:?}… ({rest} more characters)", &self.0[..cut])
            }
        }
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole_and_long_text_is_cut_at_a_character() {
        assert_eq!(Quoted("a\nb").to_string(), "\"a\\nb\"");
        let long = "é".repeat(QUOTE_CHARS + 50);
        let q = Quoted(&long).to_string();
        assert!(q.ends_with("… (50 more characters)"), "{q}");
        assert_eq!(q.matches('é').count(), QUOTE_CHARS);
        let exact = "x".repeat(QUOTE_CHARS);
        assert_eq!(Quoted(&exact).to_string(), format!("\"{exact}\""));
    }
}
