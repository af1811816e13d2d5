//! Each tidy check over a small synthetic tree or metadata: it passes on a clean one and fails on a
//! deliberately added circle, forbidden dependency, unlisted `unsafe` file or undocumented `unsafe` block.

use std::path::{Path, PathBuf};
use xtask::tidy::{deps, docs, imports, unsafety};

/// A fresh folder under the system's temporary folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A crate whose `lib.rs` re-exports from every module and whose modules use each other one way only.
fn clean_crate(s: &Scratch) -> PathBuf {
    s.write(
        "src/lib.rs",
        "//! A crate.\nmod tensor;\npub mod graph;\nmod tests_only;\npub use tensor::Tensor;\npub use graph::{Graph, ops::Win};\n",
    );
    s.write("src/tensor.rs", "/// A tensor; `crate::graph::Graph` in a comment is no import.\npub struct Tensor;\nconst S: &str = \"crate::graph::Graph\";\n");
    s.write(
        "src/graph/mod.rs",
        "pub mod ops;\nuse crate::Tensor;\npub struct Graph(Tensor);\nimpl Graph { fn w(&self) -> ops::Win { ops::Win } }\n",
    );
    s.write(
        "src/graph/ops.rs",
        "use crate::{tensor::Tensor};\npub struct Win;\n#[cfg(test)]\nmod tests {\n    use crate::graph::Graph;\n}\n",
    );
    s.write(
        "src/tests_only.rs",
        "pub fn f() -> super::Tensor { super::Tensor }\n",
    );
    s.0.join("src/lib.rs")
}

#[test]
fn imports_pass_on_a_clean_crate() {
    let s = Scratch::new("clean");
    let root = clean_crate(&s);
    let found = imports::circles(&s.0, &[root]).unwrap();
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn imports_find_an_added_circle_through_a_re_export() {
    let s = Scratch::new("circle");
    let root = clean_crate(&s);
    // tensor.rs now names `crate::Win`, which lib.rs re-exports from graph/ops.rs; ops.rs uses tensor.rs.
    s.write("src/tensor.rs", "pub struct Tensor(crate::Win);\n");
    let found = imports::circles(&s.0, &[root]).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].files,
        [
            PathBuf::from("src/graph/ops.rs"),
            PathBuf::from("src/tensor.rs")
        ]
    );
    assert_eq!(
        found[0].cycle,
        [
            PathBuf::from("src/graph/ops.rs"),
            PathBuf::from("src/tensor.rs")
        ]
    );
    let shown = found[0].to_string();
    assert!(
        shown.contains("src/graph/ops.rs -> src/tensor.rs -> src/graph/ops.rs"),
        "{shown}"
    );
    assert!(shown.contains("src/tensor.rs:1: crate::Win"), "{shown}");
}

#[test]
fn imports_find_a_circle_through_super_and_nested_groups() {
    let s = Scratch::new("super");
    let root = s.write("src/lib.rs", "//! A crate.\nmod io;\n");
    s.write("src/io/mod.rs", "mod levels;\nmod read;\n");
    s.write(
        "src/io/levels.rs",
        "use super::{read::{Dec, other}};\npub struct Level;\n",
    );
    s.write("src/io/read.rs", "pub struct Dec;\npub fn other() {}\nfn f() { let _ = self::Dec; let _: super::levels::Level; }\n");
    let found = imports::circles(&s.0, &[root]).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].files,
        [
            PathBuf::from("src/io/levels.rs"),
            PathBuf::from("src/io/read.rs")
        ]
    );
}

#[test]
fn tarjan_finds_every_component() {
    // 0 -> 1 -> 2 -> 0, 3 -> 4 -> 3, 5 alone
    let graph = vec![vec![1], vec![2], vec![0, 3], vec![4], vec![3], vec![]];
    let mut components: Vec<Vec<usize>> = imports::strongly_connected(&graph)
        .into_iter()
        .map(|mut c| {
            c.sort();
            c
        })
        .collect();
    components.sort();
    assert_eq!(components, vec![vec![0, 1, 2], vec![3, 4], vec![5]]);
}

fn metadata(packages: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "packages": packages })
}

fn package(
    name: &str,
    deps: &[(&str, &str, bool)],
    features: serde_json::Value,
) -> serde_json::Value {
    let deps: Vec<_> = deps
        .iter()
        .map(|(n, kind, optional)| {
            serde_json::json!({ "name": n, "kind": if *kind == "normal" { serde_json::Value::Null } else { (*kind).into() }, "optional": optional })
        })
        .collect();
    serde_json::json!({ "name": name, "dependencies": deps, "features": features })
}

const TABLE: &[deps::Rule] = &[
    deps::Rule {
        package: "vocab",
        role: deps::Role::Library,
        may_depend_on: &[],
    },
    deps::Rule {
        package: "loader",
        role: deps::Role::Library,
        may_depend_on: &["vocab"],
    },
    deps::Rule {
        package: "s3-loopback",
        role: deps::Role::Library,
        may_depend_on: &[],
    },
    deps::Rule {
        package: "cli",
        role: deps::Role::Binary,
        may_depend_on: &["vocab", "loader"],
    },
];

fn clean_metadata() -> serde_json::Value {
    metadata(serde_json::json!([
        package(
            "vocab",
            &[("clap", "normal", true)],
            serde_json::json!({ "clap": ["dep:clap"] })
        ),
        package(
            "loader",
            &[
                ("vocab", "normal", false),
                ("s3-loopback", "dev", false),
                ("anyhow", "dev", false)
            ],
            serde_json::json!({})
        ),
        package("s3-loopback", &[], serde_json::json!({})),
        package(
            "cli",
            &[
                ("loader", "normal", false),
                ("anyhow", "normal", false),
                ("clap", "normal", false)
            ],
            serde_json::json!({})
        ),
    ]))
}

#[test]
fn deps_pass_on_a_clean_workspace() {
    assert_eq!(
        deps::check(&clean_metadata(), TABLE).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn deps_fail_on_an_upward_dependency() {
    let mut m = clean_metadata();
    m["packages"][0] = package(
        "vocab",
        &[("loader", "normal", false)],
        serde_json::json!({}),
    );
    let found = deps::check(&m, TABLE).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("vocab depends on loader: not allowed"),
        "{found:?}"
    );
}

#[test]
fn deps_fail_on_anyhow_or_a_plain_clap_in_a_library() {
    let mut m = clean_metadata();
    m["packages"][1] = package(
        "loader",
        &[("anyhow", "normal", false), ("clap", "normal", false)],
        serde_json::json!({}),
    );
    let found = deps::check(&m, TABLE).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("loader (a library) depends on anyhow"),
        "{found:?}"
    );
    assert!(
        found[1].contains("loader (a library) depends on clap"),
        "{found:?}"
    );
}

#[test]
fn deps_fail_on_a_crate_missing_from_the_table() {
    let mut m = clean_metadata();
    m["packages"]
        .as_array_mut()
        .unwrap()
        .push(package("infer-io", &[], serde_json::json!({})));
    let found = deps::check(&m, TABLE).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("infer-io: a workspace crate missing from tidy's table"),
        "{found:?}"
    );
}

const ARCHITECTURE: &str = "## Invariants\n\n- **One of each**: `x/src/not_this.rs`.\n- **`unsafe`** lives only in: `a/src/ffi.rs` (the C calls),\n  `a/src/simd.rs`.\n- **Next**: `a/src/other.rs`.\n";

fn unsafe_tree(s: &Scratch) -> Vec<PathBuf> {
    s.write(
        "a/src/ffi.rs",
        "/// Calls C.\n///\n/// # Safety\n/// `p` points at 4 readable bytes.\npub unsafe fn read(p: *const u32) -> u32 {\n    // SAFETY: the caller's promise above.\n    unsafe { *p }\n}\n// SAFETY: the handle is only touched under its mutex.\nunsafe impl Send for Handle {}\nunsafe extern \"C\" {\n    pub unsafe fn abs(x: i32) -> i32;\n}\n",
    );
    s.write(
        "a/src/simd.rs",
        "fn f(x: &[u8]) -> u8 {\n    // SAFETY: the length was checked by the caller.\n    let v = g(\n        x,\n        unsafe { *x.get_unchecked(0) },\n    );\n    v\n}\n",
    );
    s.write(
        "a/src/other.rs",
        "// unsafe { in a comment }\nconst S: &str = \"unsafe { }\";\n",
    );
    vec![
        "a/src/ffi.rs".into(),
        "a/src/simd.rs".into(),
        "a/src/other.rs".into(),
    ]
}

#[test]
fn unsafe_passes_on_listed_documented_code() {
    let s = Scratch::new("unsafe-clean");
    let files = unsafe_tree(&s);
    assert_eq!(
        unsafety::check(&s.0, &files, ARCHITECTURE).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn unsafe_fails_on_an_unlisted_file() {
    let s = Scratch::new("unsafe-unlisted");
    let mut files = unsafe_tree(&s);
    s.write(
        "a/src/new.rs",
        "fn f() {\n    // SAFETY: nothing is read.\n    unsafe { g() }\n}\n",
    );
    files.push("a/src/new.rs".into());
    let found = unsafety::check(&s.0, &files, ARCHITECTURE).unwrap();
    assert_eq!(
        found,
        [
            "a/src/new.rs: holds `unsafe` code but is not listed in ARCHITECTURE.md's `unsafe` invariant"
        ]
    );
}

#[test]
fn unsafe_fails_on_a_listed_file_without_unsafe() {
    let s = Scratch::new("unsafe-stale");
    let files = unsafe_tree(&s);
    s.write("a/src/simd.rs", "fn f() {}\n");
    let found = unsafety::check(&s.0, &files, ARCHITECTURE).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("a/src/simd.rs: listed in ARCHITECTURE.md"),
        "{found:?}"
    );
}

#[test]
fn unsafe_fails_on_a_block_without_safety_comment() {
    let s = Scratch::new("unsafe-undocumented");
    let files = unsafe_tree(&s);
    s.write(
        "a/src/simd.rs",
        "fn f(x: &[u8]) -> u8 {\n    // The first byte.\n    unsafe { *x.get_unchecked(0) }\n}\n",
    );
    let found = unsafety::check(&s.0, &files, ARCHITECTURE).unwrap();
    assert_eq!(
        found,
        ["a/src/simd.rs:3: an `unsafe` block without a `// SAFETY:` comment just above"]
    );
}

#[test]
fn unsafe_fails_on_an_impl_or_a_pub_fn_without_its_reason() {
    let (_, found) = unsafety::check_file(
        Path::new("x.rs"),
        "// SAFETY: ok.\nfn g() {}\nunsafe impl Sync for T {}\n/// Reads.\npub unsafe fn read() {}\n",
    );
    assert_eq!(
        found,
        [
            "x.rs:3: an `unsafe impl` without a `// SAFETY:` comment just above",
            "x.rs:5: a `pub unsafe fn` without a `# Safety` section in its doc comment",
        ]
    );
}

#[test]
fn docs_need_a_readme_and_a_table_of_contents() {
    let s = Scratch::new("docs");
    s.write("good/README.md", "# good\n");
    let good = s.write(
        "good/src/lib.rs",
        "\n//! The table of contents.\npub mod a;\n",
    );
    let bad = s.write("bad/src/lib.rs", "pub mod a;\n");
    let crates = [
        docs::Crate {
            name: "good".into(),
            dir: s.0.join("good"),
            root_file: good,
        },
        docs::Crate {
            name: "bad".into(),
            dir: s.0.join("bad"),
            root_file: bad,
        },
    ];
    assert_eq!(
        docs::check(&s.0, &crates),
        [
            "bad: no README.md in bad",
            "bad: bad/src/lib.rs does not open with a `//!` table of contents"
        ]
    );
}

#[test]
fn length_finds_a_long_function_and_ignores_tests_and_declarations() {
    use xtask::tidy::length::long_functions;
    let body = |n: usize| "    let _x = 1;\n".repeat(n);
    let text = format!(
        "trait T {{ fn declared(&self); }}\nfn short() {{\n{}}}\nfn long(a: [u8; 2]) -> Vec<u8>\nwhere\n    u8: Copy,\n{{\n{}    let s = \"}}\";\n}}\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(10),
        body(12),
        body(40)
    );
    let found = long_functions(&text, 15);
    assert_eq!(found, vec![("long".to_string(), 14, 18)], "{text}");
    assert!(long_functions(&text, 18).is_empty());
}
