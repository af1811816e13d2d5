//! No function longer than [`MAX_FN_LINES`] lines in a crate's `src/`, test-only items left out: a longer
//! one is doing several jobs, and its parts want names.

use super::source::{
    Token, blank_comments_and_literals, matching_close, tokens, without_test_items,
};
use std::path::Path;

/// The longest a function may be, from its `fn` line to its closing brace.
pub const MAX_FN_LINES: usize = 150;

/// Every function in `text` longer than `limit` lines: `(name, first line, lines)`. Test-only items
/// (`#[cfg(test)]`) are left out; a function nested in another is measured on its own as well.
pub fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let code = blank_comments_and_literals(text);
    let all = tokens(&code);
    let (t, _) = without_test_items(&all);
    let mut out = Vec::new();
    for (i, tok) in t.iter().enumerate() {
        if tok.text != "fn" {
            continue;
        }
        let Some(name) = t.get(i + 1).filter(|n| is_ident(n)) else {
            continue;
        };
        if let Some(open) = body_start(&t, i + 2) {
            let close = matching_close(&t, open);
            let lines = t[close].line - tok.line + 1;
            if lines > limit {
                out.push((name.text.to_string(), tok.line, lines));
            }
        }
    }
    out
}

fn is_ident(t: &Token) -> bool {
    t.text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// The `{` opening the body of a function whose signature starts at `from`, or `None` for a declaration
/// without one (`fn f();` in a trait or an `extern` block).
fn body_start(t: &[Token], from: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (j, tok) in t.iter().enumerate().skip(from) {
        match tok.text {
            "(" | "[" => depth += 1,
            ")" | "]" => depth -= 1,
            "{" if depth == 0 => return Some(j),
            ";" if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// `length`'s violations for `files` (paths relative to `root`): those under a crate's `src/`, skipping
/// test-only files (`tests.rs`, a `tests/` folder inside `src/`).
pub fn check(root: &Path, files: &[std::path::PathBuf]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for f in files {
        let comps: Vec<String> = f
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let Some(src) = comps.iter().position(|c| c == "src") else {
            continue;
        };
        let inner = &comps[src + 1..];
        if inner
            .iter()
            .any(|c| c == "tests" || c == "tests.rs" || c == "testing.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(root.join(f))?;
        for (name, line, lines) in long_functions(&text, MAX_FN_LINES) {
            out.push(format!(
                "{}:{line}: fn {name} is {lines} lines (at most {MAX_FN_LINES}): split it by concept",
                f.display()
            ));
        }
    }
    Ok(out)
}
