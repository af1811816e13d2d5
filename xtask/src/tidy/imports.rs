//! No file-import circle inside a crate: which source file refers to which other file of the same crate
//! (`use crate::a::b`, `crate::a::f()` in code, `super::x`, `self::x`, a child module's name, nested `use`
//! groups), the strongly connected components of that graph (Tarjan), and every component of two or more
//! files reported as a circle.
//!
//! A path is followed to the file that defines the item it names: `crate::Tensor` re-exported by `lib.rs`
//! from `tensor.rs` is an edge to `tensor.rs`, not to `lib.rs`, so that a crate's table of contents does not
//! make every file depend on every other. A module's references to its own submodules (a `mod x;`
//! declaration, `pub use x::Y`, `x::f()`) are not edges: a parent owns its children; a child's reference
//! to its parent is one. Test-only code (`#[cfg(test)]` items and files) is not read.

use super::source::{
    Token, blank_comments_and_literals, matching_close, tokens, without_test_items,
};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One circle: the files of a strongly connected component, one cycle through them in order (its last
/// file refers back to its first), and for each step of that cycle where the reference is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// Every file of the component, relative to the crate folder, sorted.
    pub files: Vec<PathBuf>,
    /// One cycle: `cycle[i]` refers to `cycle[i + 1]`, and the last to the first.
    pub cycle: Vec<PathBuf>,
    /// For each step of `cycle`: `file:line` and the path written there.
    pub evidence: Vec<String>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<String> = self.cycle.iter().map(|p| p.display().to_string()).collect();
        names.push(names[0].clone());
        write!(f, "{}", names.join(" -> "))?;
        if self.files.len() > self.cycle.len() {
            let all: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
            write!(f, " (component: {})", all.join(", "))?;
        }
        for e in &self.evidence {
            write!(f, "\n        {e}")?;
        }
        Ok(())
    }
}

/// A module path from the crate root: `["graph", "ops"]`.
type ModPath = Vec<String>;

struct File<'a> {
    rel: PathBuf,
    module: ModPath,
    tokens: Vec<Token<'a>>,
    /// Names the file brings in with `use` (alias → absolute path of what it names).
    imports: HashMap<String, ModPath>,
    /// Modules whose every public name the file brings in (`use x::*`).
    globs: Vec<ModPath>,
    /// Items the file defines (functions, types, traits, constants, inline modules, macros).
    defines: BTreeSet<String>,
}

/// The circles among the files of the module trees rooted at `roots` (a crate's `lib.rs`, `main.rs`, …),
/// file paths shown relative to `crate_dir`.
pub fn circles(crate_dir: &Path, roots: &[PathBuf]) -> anyhow::Result<Vec<Circle>> {
    let mut texts: Vec<(PathBuf, ModPath, String)> = Vec::new();
    for root in roots {
        let mut seen = BTreeSet::new();
        load_tree(root, Vec::new(), &mut texts, &mut seen)?;
    }
    // A file reached from two roots (rare) is read once, under the first.
    let mut unique = BTreeSet::new();
    texts.retain(|(p, _, _)| unique.insert(p.clone()));
    let blanked: Vec<String> = texts
        .iter()
        .map(|(_, _, t)| blank_comments_and_literals(t))
        .collect();
    let mut files: Vec<File> = Vec::new();
    for ((path, module, _), code) in texts.iter().zip(&blanked) {
        let (toks, _) = without_test_items(&tokens(code));
        files.push(File {
            rel: path.strip_prefix(crate_dir).unwrap_or(path).to_path_buf(),
            module: module.clone(),
            tokens: toks,
            imports: HashMap::new(),
            globs: Vec::new(),
            defines: BTreeSet::new(),
        });
    }
    // Roots of separate trees (a crate's lib and its binary) share module paths only by accident; each
    // file resolves within its own tree.
    let tree_of: Vec<usize> = {
        let mut tree = 0;
        files
            .iter()
            .map(|f| {
                if f.module.is_empty() {
                    tree += 1;
                }
                tree
            })
            .collect()
    };
    let by_module: HashMap<(usize, ModPath), usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| ((tree_of[i], f.module.clone()), i))
        .collect();
    let is_module = |tree: usize, m: &ModPath| by_module.contains_key(&(tree, m.clone()));

    // First pass: what each file defines and imports.
    let mut refs: Vec<Vec<(ModPath, usize, String)>> = Vec::new();
    for (i, f) in files.iter_mut().enumerate() {
        let scan = scan_file(&f.tokens, &f.module, |m| is_module(tree_of[i], m));
        f.imports = scan.imports;
        f.globs = scan.globs;
        f.defines = scan.defines;
        refs.push(scan.references);
    }

    // Second pass: each reference to the file that defines what it names.
    let mut edges: BTreeMap<(usize, usize), (usize, String)> = BTreeMap::new();
    for (i, file_refs) in refs.iter().enumerate() {
        for (path, line, shown) in file_refs {
            // A module owns its submodules: calling or re-exporting them is the tree's shape, not an
            // import; only the other directions count.
            if let Some(j) = resolve(&files, &by_module, tree_of[i], path, 0)
                && j != i
                && !files[j].module.starts_with(&files[i].module)
            {
                edges.entry((i, j)).or_insert((*line, shown.clone()));
            }
        }
    }
    let mut adjacency = vec![Vec::new(); files.len()];
    for &(a, b) in edges.keys() {
        adjacency[a].push(b);
    }
    let mut out = Vec::new();
    for component in strongly_connected(&adjacency) {
        if component.len() < 2 {
            continue;
        }
        let members: BTreeSet<usize> = component.iter().copied().collect();
        let start = *members
            .iter()
            .min_by_key(|&&k| &files[k].rel)
            .expect("non-empty");
        let cycle = shortest_cycle(&adjacency, &members, start);
        let evidence = (0..cycle.len())
            .map(|k| {
                let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
                let (line, shown) = &edges[&(a, b)];
                format!("{}:{line}: {shown}", files[a].rel.display())
            })
            .collect();
        let mut all: Vec<PathBuf> = members.iter().map(|&k| files[k].rel.clone()).collect();
        all.sort();
        out.push(Circle {
            files: all,
            cycle: cycle.iter().map(|&k| files[k].rel.clone()).collect(),
            evidence,
        });
    }
    out.sort_by(|a, b| a.files.cmp(&b.files));
    Ok(out)
}

/// Reads `file` as module `module` and, through its `mod x;` declarations, the files of its submodules.
fn load_tree(
    file: &Path,
    module: ModPath,
    out: &mut Vec<(PathBuf, ModPath, String)>,
    seen: &mut BTreeSet<PathBuf>,
) -> anyhow::Result<()> {
    if !seen.insert(file.to_path_buf()) {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let blanked = blank_comments_and_literals(&text);
    let all = tokens(&blanked);
    let (toks, _) = without_test_items(&all);
    // Children of `lib.rs`, `main.rs` and `mod.rs` live beside them; those of `a.rs` in `a/`.
    let dir = file.parent().unwrap_or(Path::new("."));
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let child_dir = if module.is_empty() || stem == "mod" {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let path_attrs = path_attributes(&text);
    let mut children = Vec::new();
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate() {
        match t.text {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "mod" if depth == 0 => {
                if let (Some(name), Some(semi)) = (toks.get(i + 1), toks.get(i + 2))
                    && semi.text == ";"
                {
                    let child = match path_attrs.get(name.text) {
                        Some(p) => dir.join(p),
                        None if child_dir.join(format!("{}.rs", name.text)).exists() => {
                            child_dir.join(format!("{}.rs", name.text))
                        }
                        None => child_dir.join(name.text).join("mod.rs"),
                    };
                    children.push((name.text.to_string(), child));
                }
            }
            _ => {}
        }
    }
    out.push((file.to_path_buf(), module.clone(), text));
    for (name, child) in children {
        let mut m = module.clone();
        m.push(name);
        load_tree(&child, m, out, seen)?;
    }
    Ok(())
}

/// `#[path = "x"] mod name;` pairs of a file's text.
fn path_attributes(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("#[path = \"")
            && let Some(path) = rest.strip_suffix("\"]")
        {
            let decl = lines[i + 1..].iter().find(|l| !l.starts_with("#["));
            if let Some(name) = decl.and_then(|l| {
                l.trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ")
                    .strip_prefix("mod ")
                    .and_then(|r| r.strip_suffix(';'))
            }) {
                out.insert(name.trim().to_string(), path.to_string());
            }
        }
    }
    out
}

struct Scan {
    imports: HashMap<String, ModPath>,
    globs: Vec<ModPath>,
    defines: BTreeSet<String>,
    /// Absolute paths the file refers to, with the line and the text as written.
    references: Vec<(ModPath, usize, String)>,
}

/// What a file's tokens define, import and refer to. `is_module` says whether an absolute path is a
/// module file of the crate.
fn scan_file(t: &[Token], module: &ModPath, is_module: impl Fn(&ModPath) -> bool) -> Scan {
    let mut scan = Scan {
        imports: HashMap::new(),
        globs: Vec::new(),
        defines: BTreeSet::new(),
        references: Vec::new(),
    };
    // Inline modules (`mod x { .. }`): the module each token is in, with the brace depth that closes it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        let here: ModPath = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let prev = if i > 0 { t[i - 1].text } else { "" };
        match t[i].text {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
            }
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "mod" => {
                if let Some(name) = t.get(i + 1).filter(|n| is_ident(n.text)) {
                    if depth == inline.last().map_or(0, |&(_, d)| d + 1) {
                        scan.defines.insert(name.text.to_string());
                    }
                    if t[i].text == "mod" && t.get(i + 2).map(|x| x.text) == Some("{") {
                        inline.push((name.text.to_string(), depth));
                    }
                }
            }
            "macro_rules" => {
                if let Some(name) = t.get(i + 2) {
                    scan.defines.insert(name.text.to_string());
                }
            }
            "use" if prev != "::" => {
                let end = (i..t.len()).find(|&j| t[j].text == ";").unwrap_or(t.len());
                for (path, alias) in use_tree(&t[i + 1..end]) {
                    let glob = path.last().map(String::as_str) == Some("*");
                    let named: Vec<String> = path.iter().filter(|s| *s != "*").cloned().collect();
                    let Some(abs) = absolute(&named, &here, &is_module) else {
                        continue;
                    };
                    let shown = format!("use {}", path.join("::"));
                    scan.references.push((abs.clone(), t[i].line, shown));
                    if glob {
                        scan.globs.push(abs);
                    } else if let Some(alias) =
                        alias.or_else(|| named.iter().rev().find(|s| *s != "self").cloned())
                        && alias != "self"
                    {
                        scan.imports.insert(alias, abs);
                    }
                }
                i = end;
                continue;
            }
            w if (w == "crate" || w == "super" || w == "self" || is_ident(w))
                && prev != "::"
                && prev != "."
                && prev != "$"
                && t.get(i + 1).map(|x| x.text) == Some("::") =>
            {
                let mut segs = vec![w.to_string()];
                let mut j = i + 1;
                while t.get(j).map(|x| x.text) == Some("::")
                    && let Some(next) = t.get(j + 1).filter(|n| is_ident(n.text))
                {
                    segs.push(next.text.to_string());
                    j += 2;
                }
                let relative_child = !matches!(w, "crate" | "super" | "self");
                let child_is_module = {
                    let mut m = here.clone();
                    m.push(w.to_string());
                    is_module(&m)
                };
                if (!relative_child || child_is_module)
                    && let Some(abs) = absolute(&segs, &here, &is_module)
                {
                    scan.references.push((abs, t[i].line, segs.join("::")));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A written path (`crate::a::b`, `super::x`, `self::y`, `child::z`) as an absolute module path from
/// module `here`, or `None` where it names another crate.
fn absolute(
    segs: &[String],
    here: &ModPath,
    is_module: &impl Fn(&ModPath) -> bool,
) -> Option<ModPath> {
    let first = segs.first()?;
    let mut base: ModPath;
    let mut rest = &segs[1..];
    match first.as_str() {
        "crate" => base = Vec::new(),
        "self" => base = here.clone(),
        "super" => {
            base = here.clone();
            base.pop()?;
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        name => {
            let mut child = here.clone();
            child.push(name.to_string());
            if !is_module(&child) {
                return None; // another crate, a type's associated item, an enum variant
            }
            base = child;
        }
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// The paths of a `use` tree (the tokens after `use`, up to the `;`), each with its alias (`as x`).
fn use_tree(t: &[Token]) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    expand(t, Vec::new(), &mut out);
    out
}

fn expand(t: &[Token], prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    // Split at top-level commas; each part is `a::b::c [as d]`, `a::{..}` or `*`.
    let mut start = 0;
    let mut depth = 0;
    let mut parts = Vec::new();
    for (j, tok) in t.iter().enumerate() {
        match tok.text {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&t[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    parts.push(&t[start..]);
    for part in parts {
        if part.is_empty() {
            continue; // a trailing comma
        }
        let mut path = prefix.clone();
        let mut k = 0;
        // Visibility (`pub`, `pub(crate)`) before a nested `use` is not part of the path.
        while k < part.len() {
            match part[k].text {
                "::" => k += 1,
                "{" => {
                    let close = matching_close(part, k);
                    expand(&part[k + 1..close], path.clone(), out);
                    path.clear();
                    break;
                }
                "as" => {
                    let alias = part.get(k + 1).map(|a| a.text.to_string());
                    out.push((std::mem::take(&mut path), alias));
                    break;
                }
                seg => {
                    path.push(seg.to_string());
                    k += 1;
                }
            }
        }
        // `a::{b, c}` gives `a::b` and `a::c`; a group's `self` names the prefix itself.
        if !path.is_empty() {
            out.push((path, None));
        }
    }
}

/// The file that defines what `path` names, following `use` re-exports and globs.
fn resolve(
    files: &[File],
    by_module: &HashMap<(usize, ModPath), usize>,
    tree: usize,
    path: &ModPath,
    hops: usize,
) -> Option<usize> {
    let split = (0..=path.len())
        .rev()
        .find(|&k| by_module.contains_key(&(tree, path[..k].to_vec())))?;
    let file = by_module[&(tree, path[..split].to_vec())];
    let Some(name) = path.get(split) else {
        return Some(file);
    };
    if hops > 16 || files[file].defines.contains(name) {
        return Some(file);
    }
    if let Some(target) = files[file].imports.get(name) {
        let mut next = target.clone();
        next.extend(path[split + 1..].iter().cloned());
        if &next != path {
            return resolve(files, by_module, tree, &next, hops + 1).or(Some(file));
        }
    }
    for glob in &files[file].globs {
        if let Some(&g) = by_module.get(&(tree, glob.clone()))
            && g != file
            && (files[g].defines.contains(name) || files[g].imports.contains_key(name))
        {
            let mut next = glob.clone();
            next.extend(path[split..].iter().cloned());
            return resolve(files, by_module, tree, &next, hops + 1).or(Some(file));
        }
    }
    Some(file)
}

/// Tarjan's strongly connected components of a graph given as adjacency lists.
pub fn strongly_connected(adjacency: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'g> {
        adjacency: &'g [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.adjacency[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = adjacency.len();
    let mut s = State {
        adjacency,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest cycle through `start` that stays inside `members` (breadth-first).
fn shortest_cycle(adjacency: &[Vec<usize>], members: &BTreeSet<usize>, start: usize) -> Vec<usize> {
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &adjacency[v] {
            if !members.contains(&w) {
                continue;
            }
            if w == start {
                let mut cycle = vec![v];
                let mut at = v;
                while at != start {
                    at = parent[&at];
                    cycle.push(at);
                }
                cycle.reverse();
                return cycle;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}
