//! The error of a bad option value: which option, what was given, what is accepted.

/// A value an option does not accept. Its text is what every surface prints — `l3 stream --layout x`
/// and `Loader(layout="x")` say the same words — so it names the option as the model knows it, the value,
/// and what would have been accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The option, by its Python keyword (the command line's flag is the same with `-` for `_`).
    pub option: &'static str,
    /// The value as given (shown quoted).
    pub value: String,
    /// What the option accepts, as a phrase: `nchw or nhwc`, `at least 1`, ...
    pub expected: String,
}

impl Invalid {
    pub fn new(option: &'static str, value: impl ToString, expected: impl Into<String>) -> Invalid {
        Invalid {
            option,
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?}: expected {}",
            self.option, self.value, self.expected
        )
    }
}

impl std::error::Error for Invalid {}
