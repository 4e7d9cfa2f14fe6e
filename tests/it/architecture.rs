//! The crate's shape, checked from its source: no import cycles between
//! modules, the pure rules import no I/O, no function grows past a screen,
//! and no file holds more than one idea's worth of code.
//!
//! It reads every `src/**/*.rs` (the binaries aside) with comments,
//! strings and `#[cfg(test)]` items blanked out, and takes a module's
//! dependencies from its `crate::`, `super::` and `self::` paths (use trees
//! included) and, for a parent, its bare `child::` paths: a parent that
//! re-exports from a child depends on it, so a child that names its parent
//! closes a cycle. A path counts for the longest module it names.
//! No external tools: `cargo test --test it architecture::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles that exist, in modules being reworked elsewhere, each as its
/// modules' set. This list may only shrink: a new cycle is fixed, not
/// added here.
const ALLOWED_CYCLES: &[&[&str]] = &[];

/// The floors, one folder of `src/` each, from the ground up: a module
/// imports only modules of its own folder and of folders on lower floors.
/// `src/lib.rs`'s layout table is this list (`tests/it/docs.rs` checks).
const FLOORS: &[(&str, usize)] = &[
    ("rules", 1),
    ("config", 2),
    ("io", 3),
    ("gate", 4),
    ("consume", 4),
    ("front", 5),
];

/// Pure modules outside `rules/`: they import only the rules and name no
/// I/O crate, like every module in `rules/`.
const PURE_ELSEWHERE: &[&str] = &["consume::schedule"];

/// Crates that do I/O: no rule names one.
const IO_CRATES: &[&str] = &["tokio", "redis", "aws_", "hyper", "lambda_"];

/// The longest a function may be, in lines from `fn` to its closing brace.
const MAX_FN_LINES: usize = 60;

/// The most lines a file under `src/` may have outside its `#[cfg(test)]`
/// items (its docs, comments and blank lines count): a file over it is
/// usually two ideas.
const MAX_FILE_LINES: usize = 400;

/// One source file, read as one module.
struct Module {
    /// `src/...`, for messages.
    file: String,
    /// The source with comments and literals blanked out (newlines kept,
    /// so line numbers hold).
    full: String,
    /// [`Self::full`] with every `#[cfg(test)]` item blanked out too.
    code: String,
    /// The file's lines outside its `#[cfg(test)]` items.
    lines: usize,
}

/// Every file under `src/` but the binaries, by module path (`""` is the
/// crate root), and the files that are test-only modules
/// (`#[cfg(test)] mod name;`, with or without `#[path]`).
fn sources() -> (BTreeMap<String, Module>, BTreeSet<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(&root.join("src"), &mut files);
    let mut modules = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("src/bin/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let full = blank(&text);
        let stripped = strip_tests(&full, &text);
        let declared = &stripped.test_children;
        test_only.extend(declared.iter().map(|d| child_file(&rel, d)));
        let m = Module {
            file: rel,
            lines: text.lines().count() - stripped.test_lines,
            full,
            code: stripped.code,
        };
        modules.insert(module_name(&m.file), m);
    }
    (modules, test_only)
}

/// The library's modules, test-only ones left out: what the graph is of.
fn modules() -> BTreeMap<String, Module> {
    let (mut modules, test_only) = sources();
    modules.retain(|_, m| !test_only.contains(&m.file));
    modules
}

/// The file of a child module declared in `file`: `declared` is either
/// `path:<#[path] value>` or the module's name.
fn child_file(file: &str, declared: &str) -> String {
    let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
    if let Some(path) = declared.strip_prefix("path:") {
        return format!("{dir}/{path}");
    }
    let stem = file
        .rsplit('/')
        .next()
        .unwrap_or("")
        .trim_end_matches(".rs");
    if matches!(stem, "mod" | "lib") {
        format!("{dir}/{declared}.rs")
    } else {
        format!("{dir}/{stem}/{declared}.rs")
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is `""`.
fn module_name(rel: &str) -> String {
    let path = rel.trim_start_matches("src/").trim_end_matches(".rs");
    let path = path.trim_end_matches("/mod");
    if path == "lib" || path == "mod" {
        return String::new();
    }
    path.replace('/', "::")
}

/// Blanks comments, string and char literals (keeping newlines).
fn blank(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let keep = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let end = literal_end(&c, i);
        if end > i {
            c[i..end].iter().for_each(|&ch| keep(&mut out, ch));
            i = end;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Where a comment or literal starting at `i` ends (`i` if none starts).
fn literal_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    match (at(i), at(i + 1)) {
        ('/', '/') => (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len()),
        ('/', '*') => {
            let (mut depth, mut k) = (0, i);
            while k < c.len() {
                if at(k) == '/' && at(k + 1) == '*' {
                    depth += 1;
                    k += 2;
                } else if at(k) == '*' && at(k + 1) == '/' {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        return k;
                    }
                } else {
                    k += 1;
                }
            }
            c.len()
        }
        ('"', _) => quoted_end(c, i + 1),
        ('r', '#' | '"') if starts_word(c, i) || (at(i - 1) == 'b' && starts_word(c, i - 1)) => {
            let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
            if at(i + 1 + hashes) != '"' {
                return i;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain((0..hashes).map(|_| '#'))
                .collect();
            let body = i + 2 + hashes;
            (body..c.len())
                .find(|&k| c[k..].starts_with(&close))
                .map_or(c.len(), |k| k + close.len())
        }
        ('b', '"') if starts_word(c, i) => quoted_end(c, i + 2),
        ('\'', '\\') => (i + 2..c.len())
            .find(|&k| c[k] == '\'')
            .map_or(c.len(), |k| k + 1),
        ('\'', _) if at(i + 2) == '\'' => i + 3,
        _ => i,
    }
}

/// The end of a `"…"` literal whose body starts at `k`.
fn quoted_end(c: &[char], mut k: usize) -> usize {
    while k < c.len() {
        match c[k] {
            '\\' => k += 2,
            '"' => return k + 1,
            _ => k += 1,
        }
    }
    c.len()
}

/// Whether no identifier character comes just before `i`.
fn starts_word(c: &[char], i: usize) -> bool {
    i == 0 || !is_ident(c[i - 1])
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// A file's code with its `#[cfg(test)]` items blanked out.
struct Stripped {
    code: String,
    /// The child modules declared test-only (`name`, or `path:<file>` with
    /// a `#[path]`).
    test_children: Vec<String>,
    /// The lines the items took, from the attribute to the item's end.
    test_lines: usize,
}

/// Blanks every `#[cfg(test)]` item of `code` (`text` blanked by
/// [`blank`]).
fn strip_tests(code: &str, text: &str) -> Stripped {
    const ATTR: &str = "#[cfg(test)]";
    let mut c: Vec<char> = code.chars().collect();
    let original: Vec<char> = text.chars().collect();
    let mut children = Vec::new();
    let mut test_lines = 0;
    let mut from = 0;
    while let Some(pos) = find(&c, ATTR, from) {
        let start = pos + ATTR.len();
        let stop = (start..c.len()).find(|&k| c[k] == ';' || c[k] == '{');
        let end = match stop {
            Some(k) if c[k] == ';' => {
                let item: String = c[start..k].iter().collect();
                let words: Vec<&str> = item.split_whitespace().collect();
                if let [.., "mod", name] = words.as_slice() {
                    let raw: String = original[start..k].iter().collect();
                    children.push(match raw.split_once("#[path = \"") {
                        Some((_, rest)) => format!("path:{}", rest.split('"').next().unwrap_or("")),
                        None => (*name).to_owned(),
                    });
                }
                k + 1
            }
            Some(k) => block_end(&c, k),
            None => c.len(),
        };
        for ch in &mut c[pos..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        test_lines += 1 + c[pos..end].iter().filter(|&&ch| ch == '\n').count();
        from = end;
    }
    Stripped {
        code: c.into_iter().collect(),
        test_children: children,
        test_lines,
    }
}

fn find(c: &[char], needle: &str, from: usize) -> Option<usize> {
    let n: Vec<char> = needle.chars().collect();
    (from..c.len()).find(|&k| c[k..].starts_with(&n))
}

/// The index after the `}` matching the `{` at `open`.
fn block_end(c: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &ch) in c.iter().enumerate().skip(open) {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    c.len()
}

/// Identifiers and punctuation (`::` as one token).
fn tokens(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
        } else if is_ident(c[i]) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            out.push(c[i].to_string());
            i += 1;
        }
    }
    out
}

/// The paths a use tree or path expression starting at token `i` names,
/// each as segments after its root; `i` is left after the tree.
fn paths(t: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    while *i < t.len() {
        let tok = &t[*i];
        if tok == "{" {
            *i += 1;
            while *i < t.len() && t[*i] != "}" {
                paths(t, i, path.clone(), out);
                if *i < t.len() && t[*i] == "," {
                    *i += 1;
                }
            }
            *i += 1;
            return;
        }
        if tok.chars().next().is_some_and(is_ident) && tok != "self" {
            path.push(tok.clone());
        }
        if t.get(*i + 1).is_some_and(|n| n == "::") {
            *i += 2;
        } else {
            *i += 1;
            break;
        }
    }
    out.push(path);
}

/// The modules `name` depends on.
fn dependencies(name: &str, code: &str, all: &BTreeMap<String, Module>) -> BTreeSet<String> {
    let here: Vec<String> = name
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let prefix = if name.is_empty() {
        String::new()
    } else {
        format!("{name}::")
    };
    let children: BTreeSet<&str> = all
        .keys()
        .filter_map(|m| m.strip_prefix(prefix.as_str()))
        .filter(|r| !r.is_empty() && !r.contains("::"))
        .collect();
    let t = tokens(code);
    let mut found = Vec::new();
    for i in 0..t.len() {
        let after_path = i > 0 && t[i - 1] == "::";
        if after_path || t.get(i + 1).is_none_or(|n| n != "::") {
            continue;
        }
        let base = match t[i].as_str() {
            "crate" => Vec::new(),
            "super" | "self" => {
                let mut base = here.clone();
                let mut k = i;
                if t[i] == "super" {
                    base.pop();
                }
                while t.get(k + 2).is_some_and(|s| s == "super") {
                    base.pop();
                    k += 2;
                }
                let mut j = k + 2;
                paths(&t, &mut j, base, &mut found);
                continue;
            }
            child if children.contains(child) => here.clone(),
            _ => continue,
        };
        let mut j = if base.is_empty() && t[i] == "crate" {
            i + 2
        } else {
            i
        };
        paths(&t, &mut j, base, &mut found);
    }
    found
        .into_iter()
        .filter_map(|p| longest_module(&p, all))
        .filter(|m| m != name && !m.is_empty())
        .collect()
}

fn longest_module(path: &[String], all: &BTreeMap<String, Module>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("::"))
        .find(|m| all.contains_key(m))
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(all: &BTreeMap<String, Module>) -> Graph {
    all.iter()
        .map(|(name, m)| (name.clone(), dependencies(name, &m.code, all)))
        .collect()
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(g: &Graph) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                s.low.entry(v).and_modify(|l| *l = (*l).min(lw));
            } else if s.stack.contains(&w) {
                let iw = s.index[w];
                s.low.entry(v).and_modify(|l| *l = (*l).min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().rposition(|&x| x == v).unwrap();
            let scc: BTreeSet<String> = s.stack.drain(at..).map(String::from).collect();
            if scc.len() > 1 {
                s.found.push(scc);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// No two modules import each other, directly or round a loop, but for the
/// cycles [`ALLOWED_CYCLES`] lists.
#[test]
fn no_import_cycles() {
    let all = modules();
    let g = graph(&all);
    let allowed: Vec<BTreeSet<String>> = ALLOWED_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    let mut bad = Vec::new();
    for scc in cycles(&g) {
        if !allowed.contains(&scc) {
            let edges: Vec<String> = scc
                .iter()
                .flat_map(|m| {
                    g[m].iter()
                        .filter(|d| scc.contains(*d))
                        .map(move |d| format!("{m} -> {d}"))
                })
                .collect();
            bad.push(format!("cycle {scc:?}: {}", edges.join(", ")));
        }
    }
    assert!(bad.is_empty(), "import cycles:\n{}", bad.join("\n"));
}

/// The checker sees what it must: a parent's re-export from a child and a
/// child's `super::` close a cycle; `#[cfg(test)]` code and comments do not.
#[test]
fn the_checker_sees_cycles() {
    let module = |code: &str| Module {
        file: String::new(),
        full: String::new(),
        code: strip_tests(&blank(code), code).code,
        lines: 0,
    };
    let mut all = BTreeMap::new();
    all.insert("a".to_owned(), module("pub use b::X; // c::Y"));
    all.insert("a::b".to_owned(), module("use super::{Z, c::W};"));
    all.insert(
        "a::c".to_owned(),
        module("#[cfg(test)]\nmod t { use crate::a::b; }\nlet s = \"super::b\";"),
    );
    let g = graph(&all);
    assert_eq!(g["a"], BTreeSet::from(["a::b".to_owned()]));
    assert_eq!(
        g["a::b"],
        BTreeSet::from(["a".to_owned(), "a::c".to_owned()])
    );
    assert!(g["a::c"].is_empty(), "{:?}", g["a::c"]);
    assert_eq!(
        cycles(&g),
        vec![BTreeSet::from(["a".to_owned(), "a::b".to_owned()])]
    );
}

/// The folder of a module and its floor (`None` for the crate root and
/// the simulators' `bugs`, which stand outside the floors).
fn floor_of(module: &str) -> Option<(&str, usize)> {
    let folder = module.split("::").next()?;
    FLOORS.iter().copied().find(|(f, _)| *f == folder)
}

/// Every module is in a folder of [`FLOORS`] and imports nothing from a
/// folder on its own floor or above but its own.
#[test]
fn floors_by_folder() {
    let all = modules();
    let g = graph(&all);
    let mut bad = Vec::new();
    for (name, deps) in &g {
        let Some((folder, floor)) = floor_of(name) else {
            if !matches!(name.as_str(), "" | "bugs") {
                bad.push(format!("{} is in no floor's folder", all[name].file));
            }
            continue;
        };
        for dep in deps {
            let Some((dep_folder, dep_floor)) = floor_of(dep) else {
                continue;
            };
            if dep_folder != folder && dep_floor >= floor {
                bad.push(format!(
                    "{} (floor {floor}) imports {dep} (floor {dep_floor})",
                    all[name].file
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports across the floors:\n{}",
        bad.join("\n")
    );
}

/// The rules (every module of `rules/`, and [`PURE_ELSEWHERE`]) name no
/// I/O crate and import only the rules, so they run, and are tested,
/// without a server or a runtime.
#[test]
fn rules_are_pure() {
    let all = modules();
    let g = graph(&all);
    let pure = |m: &str| m.starts_with("rules") || PURE_ELSEWHERE.contains(&m);
    let mut bad = Vec::new();
    for (name, m) in all.iter().filter(|(name, _)| pure(name)) {
        let t = tokens(&m.code);
        for (i, tok) in t.iter().enumerate() {
            let root = t.get(i + 1).is_some_and(|n| n == "::") && (i == 0 || t[i - 1] != "::");
            let io = IO_CRATES.iter().any(|c| {
                let c = c.trim_end_matches('_');
                tok == c || tok.starts_with(&format!("{c}_"))
            });
            if root && io {
                bad.push(format!("{} names {tok}", m.file));
            }
        }
        for dep in g[name].iter().filter(|d| !pure(d)) {
            bad.push(format!("{} imports {dep}", m.file));
        }
    }
    assert!(PURE_ELSEWHERE.iter().all(|m| all.contains_key(*m)));
    assert!(bad.is_empty(), "impure rules:\n{}", bad.join("\n"));
}

/// Every function with a body, as (`file:fn`, lines from `fn` to `}`).
fn functions(m: &Module) -> Vec<(String, usize)> {
    let c: Vec<char> = m.full.chars().collect();
    let line_of = |k: usize| c[..k].iter().filter(|&&ch| ch == '\n').count();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&c, "fn ", from) {
        from = at + 3;
        if at > 0 && is_ident(c[at - 1]) {
            continue;
        }
        let name: String = c[from..]
            .iter()
            .skip_while(|ch| ch.is_whitespace())
            .take_while(|&&ch| is_ident(ch))
            .collect();
        if name.is_empty() {
            continue;
        }
        let Some(k) = (from..c.len()).find(|&k| c[k] == ';' || c[k] == '{') else {
            break;
        };
        if c[k] == ';' {
            continue;
        }
        let end = block_end(&c, k);
        out.push((
            format!("{}:{name}", m.file),
            line_of(end - 1) - line_of(at) + 1,
        ));
    }
    out
}

/// No function is longer than [`MAX_FN_LINES`]: one that grows past it is
/// split, never let through.
#[test]
fn functions_fit_a_screen() {
    let (all, _) = sources();
    let bad: Vec<String> = all
        .values()
        .flat_map(functions)
        .filter(|(_, lines)| *lines > MAX_FN_LINES)
        .map(|(f, lines)| format!("{f}: {lines} lines"))
        .collect();
    assert!(
        bad.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        bad.join("\n")
    );
}

/// No file under `src/` has more than [`MAX_FILE_LINES`] lines outside its
/// tests (a test-only file has none): one that grows past it is split along
/// its ideas.
#[test]
fn files_hold_one_idea() {
    let bad: Vec<String> = modules()
        .values()
        .filter(|m| m.lines > MAX_FILE_LINES)
        .map(|m| format!("{}: {} lines", m.file, m.lines))
        .collect();
    assert!(
        bad.is_empty(),
        "files over {MAX_FILE_LINES} lines outside their tests (split them along their ideas):\n{}",
        bad.join("\n")
    );
}

/// The count leaves out every `#[cfg(test)]` item, a test module declared
/// by a line included, and keeps the docs, comments and blank lines.
#[test]
fn the_checker_counts_lines_outside_tests() {
    let text = "//! Docs.\n\nfn a() {}\n#[cfg(test)]\nmod t;\n// A comment.\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    let stripped = strip_tests(&blank(text), text);
    assert_eq!(text.lines().count() - stripped.test_lines, 4);
    assert_eq!(stripped.test_children, ["t"]);
}
