//! `unsafe` stays where ARCHITECTURE.md says and says why: every file holding `unsafe` code (a block, an
//! `unsafe fn`, `unsafe impl`, `unsafe trait` or `unsafe extern` block — not the word in a comment or a
//! string) is named, by its path from the workspace root in backticks, in the `unsafe` paragraph of
//! ARCHITECTURE.md's invariants, and that paragraph names no other file; every `unsafe { .. }` block and
//! `unsafe impl` has a `// SAFETY:` comment on its line or on the comment lines just above the statement
//! holding it; every `pub unsafe fn` has a `# Safety` section in its doc comment.

use super::source::{Token, blank_comments_and_literals, matching_close, tokens};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// How ARCHITECTURE.md's paragraph starts: a list item whose bold title is `unsafe`.
pub const PARAGRAPH_START: &str = "- **`unsafe`**";

/// The files ARCHITECTURE.md's `unsafe` paragraph names: each backticked path ending in `.rs`. The
/// paragraph runs from [`PARAGRAPH_START`] to the next top-level list item, heading or the end.
pub fn listed_files(architecture: &str) -> Option<BTreeSet<PathBuf>> {
    let start = architecture.find(PARAGRAPH_START)?;
    let rest = &architecture[start + PARAGRAPH_START.len()..];
    let end = ["\n- **", "\n#", "\n\n"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
    let paragraph = &rest[..end];
    Some(
        paragraph
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.ends_with(".rs") && s.contains('/'))
            .map(PathBuf::from)
            .collect(),
    )
}

/// What one file's `unsafe` code lacks: a line each.
pub fn check_file(rel: &Path, text: &str) -> (bool, Vec<String>) {
    let code = blank_comments_and_literals(text);
    let t = tokens(&code);
    let lines: Vec<&str> = text.lines().collect();
    let extern_blocks = extern_block_ranges(&t);
    let mut has_unsafe = false;
    let mut out = Vec::new();
    for (i, tok) in t.iter().enumerate() {
        if tok.text != "unsafe" {
            continue;
        }
        let next = t.get(i + 1).map_or("", |n| n.text);
        match next {
            "{" | "impl" => {
                has_unsafe = true;
                if !has_safety_comment(&lines, tok.line) {
                    let what = if next == "{" {
                        "an `unsafe` block"
                    } else {
                        "an `unsafe impl`"
                    };
                    out.push(format!(
                        "{}:{}: {what} without a `// SAFETY:` comment just above",
                        rel.display(),
                        tok.line
                    ));
                }
            }
            "fn" | "extern" | "trait" => {
                has_unsafe = true;
                let public = i > 0 && t[i - 1].text == "pub";
                let inside_extern = extern_blocks.iter().any(|&(a, b)| a < i && i < b);
                if next == "fn" && public && !inside_extern && !has_safety_doc(&lines, tok.line) {
                    out.push(format!(
                        "{}:{}: a `pub unsafe fn` without a `# Safety` section in its doc comment",
                        rel.display(),
                        tok.line
                    ));
                }
            }
            _ => {}
        }
    }
    (has_unsafe, out)
}

/// Token ranges of `extern "C" { .. }` blocks (their `fn`s are foreign declarations, documented by the
/// library they bind).
fn extern_block_ranges(t: &[Token]) -> Vec<(usize, usize)> {
    (0..t.len())
        .filter(|&i| t[i].text == "extern" && t.get(i + 1).map(|n| n.text) == Some("{"))
        .map(|i| (i + 1, matching_close(t, i + 1)))
        .collect()
}

fn is_comment(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("//") || l.starts_with("/*") || l.starts_with('*')
}

/// Whether line `line` (1-based) or the comment lines just above the statement it belongs to say
/// `SAFETY:`. Going up, lines that continue the statement (not ending a previous one with `;`, `{` or
/// `}`) and attributes are passed over until the first comment; the comment block then decides.
fn has_safety_comment(lines: &[&str], line: usize) -> bool {
    if lines.get(line - 1).is_some_and(|l| says_safety(l)) {
        return true;
    }
    let mut in_comment = false;
    for k in (0..line - 1).rev().take(40) {
        let l = lines[k].trim();
        if is_comment(l) {
            in_comment = true;
            if says_safety(l) {
                return true;
            }
        } else if in_comment {
            return false;
        } else if l.starts_with("#[") || l.is_empty() || l == "{" {
            // Attributes, and the bare block they apply to (`#[allow(unsafe_code)] { .. }`).
            continue;
        } else if l.ends_with(';') || l.ends_with('{') || l.ends_with('}') {
            return false;
        }
    }
    false
}

/// `// SAFETY: why`, or `// SAFETY (scope): why` for a comment covering a whole body.
fn says_safety(line: &str) -> bool {
    line.contains("SAFETY:") || line.contains("SAFETY (")
}

/// Whether the doc comment above the item on `line` has a `# Safety` section.
fn has_safety_doc(lines: &[&str], line: usize) -> bool {
    for k in (0..line - 1).rev() {
        let l = lines[k].trim();
        if l.starts_with("///") {
            if l.trim_start_matches('/').trim() == "# Safety" {
                return true;
            }
        } else if !l.starts_with("#[") {
            return false;
        }
    }
    false
}

/// The whole check over the `.rs` files `files` (paths relative to `root`) against ARCHITECTURE.md's
/// text; one line per violation.
pub fn check(root: &Path, files: &[PathBuf], architecture: &str) -> anyhow::Result<Vec<String>> {
    let Some(listed) = listed_files(architecture) else {
        return Ok(vec![format!(
            "ARCHITECTURE.md has no `unsafe` invariant (a list item starting {PARAGRAPH_START})"
        )]);
    };
    let mut out = Vec::new();
    let mut with_unsafe = BTreeSet::new();
    for rel in files {
        let text = std::fs::read_to_string(root.join(rel))
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", rel.display()))?;
        let (has, problems) = check_file(rel, &text);
        out.extend(problems);
        if has {
            with_unsafe.insert(rel.clone());
        }
    }
    for f in with_unsafe.difference(&listed) {
        out.push(format!(
            "{}: holds `unsafe` code but is not listed in ARCHITECTURE.md's `unsafe` invariant",
            f.display()
        ));
    }
    for f in listed.difference(&with_unsafe) {
        out.push(format!(
            "{}: listed in ARCHITECTURE.md's `unsafe` invariant but holds no `unsafe` code (or does not exist)",
            f.display()
        ));
    }
    Ok(out)
}
