//! The module graph of every crate in the workspace, read from the sources:
//! which file of a crate uses which other file of it (`use crate::…`,
//! `super::…`, `crate::…` paths in code, and the child modules a file names).
//!
//! Checked here:
//! - no import cycle between files of different layers, in any crate (a
//!   layer is a crate's top-level module: a folder under `src/`, or a file
//!   there);
//! - the edge's layers depend one way only, down the order of
//!   [`EDGE_LAYERS`] (state types import no handler, the fan-in imports no
//!   method);
//! - no non-test source file over [`MAX_LINES`] lines without a reason
//!   written at its top ([`LONG_FILE_MARK`]).
//!
//! `cargo test -p clawgate-system-tests --test module_graph -- --nocapture`
//! prints each crate's layer graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The gateway edge's layers, lowest first: each may use only the layers
/// before it (and itself). `lib` and `main` (the crate root) and `fuzzing`
/// (the fuzz harness, behind a feature) sit above them all.
const EDGE_LAYERS: &[&str] = &[
    "protocol",
    "config",
    "auth",
    "state",
    "events",
    "methods",
    "transport",
];

/// Source files longer than this carry a reason at their top.
const MAX_LINES: usize = 600;
/// How a long file states its reason: a line of its opening doc comment
/// that starts with this.
const LONG_FILE_MARK: &str = "//! Long file:";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

/// Every crate's `src/` folder in the workspace (the fuzz crate, outside
/// it, included).
fn crate_sources() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![repo()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !path.is_dir() || name.starts_with('.') || name == "target" || name == "fixtures" {
                continue;
            }
            if name == "src" && path.parent().is_some_and(|p| p.join("Cargo.toml").exists()) {
                found.push(path);
            } else {
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A file's module path within its crate: `src/a/b.rs` and `src/a/b/mod.rs`
/// are `["a", "b"]`; `src/lib.rs` is `[]`, `src/main.rs` is `["main"]`
/// (a crate of its own, but counted as the root's layer).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code of a file with comments, strings and character literals
/// blanked out (each kept as a space, so words do not join).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && !is_ident(chars.get(i.wrapping_sub(1)).copied())
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                j += 1;
                loop {
                    if j >= chars.len() {
                        break;
                    }
                    if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                i = j;
                out.push(' ');
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(' ');
            continue;
        }
        if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}'), not a lifetime.
            let literal_end = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = literal_end {
                i = end + 1;
                out.push(' ');
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_ident(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Bang,
    Other,
}

fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while is_ident(chars.get(i).copied()) {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(match c {
                '{' => Token::Open,
                '}' => Token::Close,
                ',' => Token::Comma,
                ';' => Token::Semi,
                '!' => Token::Bang,
                _ => Token::Other,
            });
            i += 1;
        }
    }
    out
}

/// The paths a file names that start in its own crate, each made absolute
/// (from the crate root): `crate::a::b`, `super::c`, `self::d`, and paths
/// through the child modules it declares; `$crate::x` in a macro is
/// `crate::x`, and a macro invoked as `crate::name!` ends in `"!"`. A `use` tree's braces are
/// expanded (`use crate::a::{b, c::d}` names `a::b` and `a::c::d`). Inside
/// an inline module (`mod tests { … }`) `super` first leaves it.
fn crate_paths(file_module: &[String], code: &str) -> Vec<Vec<String>> {
    let toks = tokens(code);
    let children: BTreeSet<String> = toks
        .windows(3)
        .filter_map(|w| match w {
            [Token::Ident(m), Token::Ident(name), Token::Semi] if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut found = Vec::new();
    // Inline modules open at these brace depths.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Token::Open => depth += 1,
            Token::Close => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some(Token::Ident(_)), Some(Token::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push(depth);
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Token::Ident(word) if toks.get(i + 1) == Some(&Token::PathSep) => {
                let previous_is_sep = i > 0 && toks[i - 1] == Token::PathSep;
                let start = match word.as_str() {
                    _ if previous_is_sep => None,
                    "crate" => Some(Vec::new()),
                    "self" => Some(file_module.to_vec()),
                    "super" => {
                        let mut base = file_module.to_vec();
                        let mut j = i;
                        let mut leave_inline = inline.len();
                        while toks.get(j) == Some(&Token::Ident("super".into()))
                            && toks.get(j + 1) == Some(&Token::PathSep)
                        {
                            if leave_inline > 0 {
                                leave_inline -= 1;
                            } else {
                                base.pop();
                            }
                            j += 2;
                        }
                        i = j - 2;
                        Some(base)
                    }
                    child if children.contains(child) && inline.is_empty() => {
                        let mut base = file_module.to_vec();
                        base.push(child.to_owned());
                        Some(base)
                    }
                    _ => None,
                };
                if let Some(base) = start {
                    let (mut paths, next) = path_tree(&toks, i + 2, base);
                    // `crate::name!`: a macro, exported at the crate root
                    // from the file that defines it (marked for `Graph`).
                    if toks.get(next) == Some(&Token::Bang)
                        && let Some(path) = paths.last_mut()
                    {
                        path.push("!".into());
                    }
                    found.extend(paths);
                    i = next;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Reads a path (or `use` tree) from `at`, after its prefix `base`; returns
/// the expanded paths and where reading stopped.
fn path_tree(toks: &[Token], mut at: usize, base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = base;
    loop {
        match toks.get(at) {
            Some(Token::Ident(name)) => {
                path.push(name.clone());
                at += 1;
                if toks.get(at) == Some(&Token::PathSep) {
                    at += 1;
                } else {
                    return (vec![path], at);
                }
            }
            Some(Token::Open) => {
                let mut all = Vec::new();
                at += 1;
                loop {
                    match toks.get(at) {
                        Some(Token::Close) => return (all, at + 1),
                        Some(Token::Comma) => at += 1,
                        None => return (all, at),
                        _ => {
                            let (paths, next) = path_tree(toks, at, path.clone());
                            all.extend(paths);
                            // Skip what follows a tree item (`as name`).
                            at = next;
                            while !matches!(toks.get(at), Some(Token::Comma | Token::Close) | None)
                            {
                                at += 1;
                            }
                        }
                    }
                }
            }
            _ => return (vec![path], at),
        }
    }
}

/// One crate's file graph: file → files it uses.
struct Graph {
    name: String,
    /// Module path of each file (indexed as `files`).
    modules: Vec<Vec<String>>,
    files: Vec<PathBuf>,
    edges: BTreeMap<usize, BTreeSet<usize>>,
}

impl Graph {
    fn read(src: &Path) -> Self {
        let files = rust_files(src);
        let modules: Vec<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
        let by_module: BTreeMap<Vec<String>, usize> = modules
            .iter()
            .enumerate()
            .filter(|(i, _)| !files[*i].ends_with("main.rs") || modules[*i] != ["main"])
            .map(|(i, m)| (m.clone(), i))
            .collect();
        let codes: Vec<String> = files
            .iter()
            .map(|f| code_only(&std::fs::read_to_string(f).unwrap()))
            .collect();
        // `#[macro_export]` macros live at the crate root, defined in a file.
        let macros: BTreeMap<String, usize> = codes
            .iter()
            .enumerate()
            .flat_map(|(index, code)| {
                tokens(code)
                    .windows(3)
                    .filter_map(|w| match w {
                        [Token::Ident(m), Token::Bang, Token::Ident(name)]
                            if m == "macro_rules" =>
                        {
                            Some((name.clone(), index))
                        }
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for (index, file) in files.iter().enumerate() {
            // main.rs is a crate root of its own: `crate::` there is main.
            let own = if file.ends_with("src/main.rs") {
                Vec::new()
            } else {
                modules[index].clone()
            };
            for path in crate_paths(&own, &codes[index]) {
                let target = match path.split_last() {
                    Some((bang, [name])) if bang == "!" => macros.get(name).copied(),
                    // The longest prefix of the path that is a file's module.
                    _ => (0..=path.len())
                        .rev()
                        .find_map(|n| by_module.get(&path[..n]).copied()),
                };
                if let Some(target) = target
                    && target != index
                {
                    edges.entry(index).or_default().insert(target);
                }
            }
        }
        let name = src
            .parent()
            .unwrap()
            .strip_prefix(repo())
            .unwrap()
            .display()
            .to_string();
        Self {
            name,
            modules,
            files,
            edges,
        }
    }

    fn file_name(&self, index: usize) -> String {
        self.files[index]
            .strip_prefix(repo())
            .unwrap()
            .display()
            .to_string()
    }

    /// A file's layer: its crate's top-level module (`lib` for the root).
    fn layer(&self, index: usize) -> String {
        if self.files[index].ends_with("src/main.rs") {
            return "main".into();
        }
        self.modules[index]
            .first()
            .cloned()
            .unwrap_or_else(|| "lib".into())
    }

    /// The strongly connected components with more than one file (Tarjan).
    fn cycles(&self) -> Vec<Vec<usize>> {
        struct State<'a> {
            graph: &'a Graph,
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on_stack: Vec<bool>,
            stack: Vec<usize>,
            next: usize,
            found: Vec<Vec<usize>>,
        }
        fn visit(s: &mut State, v: usize) {
            s.index[v] = Some(s.next);
            s.low[v] = s.next;
            s.next += 1;
            s.stack.push(v);
            s.on_stack[v] = true;
            let targets: Vec<usize> = s
                .graph
                .edges
                .get(&v)
                .map(|t| t.iter().copied().collect())
                .unwrap_or_default();
            for w in targets {
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
                loop {
                    let w = s.stack.pop().unwrap();
                    s.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    s.found.push(component);
                }
            }
        }
        let n = self.files.len();
        let mut state = State {
            graph: self,
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            next: 0,
            found: Vec::new(),
        };
        for v in 0..n {
            if state.index[v].is_none() {
                visit(&mut state, v);
            }
        }
        state.found
    }

    /// Layer → layers it uses, with one file edge that shows each.
    fn layer_edges(&self) -> BTreeMap<(String, String), (usize, usize)> {
        let mut out = BTreeMap::new();
        for (from, targets) in &self.edges {
            for to in targets {
                let (a, b) = (self.layer(*from), self.layer(*to));
                if a != b {
                    out.entry((a, b)).or_insert((*from, *to));
                }
            }
        }
        out
    }
}

fn graphs() -> Vec<Graph> {
    let graphs: Vec<Graph> = crate_sources().iter().map(|s| Graph::read(s)).collect();
    assert!(
        graphs.iter().any(|g| g.name == "gateway-edge") && graphs.len() >= 10,
        "the workspace's crates were not found under {}",
        repo().display()
    );
    graphs
}

#[test]
fn no_import_cycle_crosses_a_layer() {
    let mut failures = Vec::new();
    for graph in graphs() {
        println!("{}:", graph.name);
        for ((from, to), _) in graph.layer_edges() {
            println!("  {from} -> {to}");
        }
        for cycle in graph.cycles() {
            let layers: BTreeSet<String> = cycle.iter().map(|f| graph.layer(*f)).collect();
            if layers.len() > 1 {
                let files: Vec<String> = cycle.iter().map(|f| graph.file_name(*f)).collect();
                failures.push(format!(
                    "{}: files of layers {layers:?} import each other in a circle: {}",
                    graph.name,
                    files.join(", ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_edges_layers_go_one_way() {
    let graph = graphs()
        .into_iter()
        .find(|g| g.name == "gateway-edge")
        .unwrap();
    let rank = |layer: &str| EDGE_LAYERS.iter().position(|l| *l == layer);
    let mut failures = Vec::new();
    for index in 0..graph.files.len() {
        let layer = graph.layer(index);
        if rank(&layer).is_none() && !["lib", "main", "fuzzing"].contains(&layer.as_str()) {
            failures.push(format!(
                "{} is in no layer: put it in one of {EDGE_LAYERS:?}",
                graph.file_name(index)
            ));
        }
    }
    for ((from, to), (file, used)) in graph.layer_edges() {
        let allowed = match (rank(&from), rank(&to)) {
            (Some(a), Some(b)) => b < a,
            // The root and the fuzz harness may use every layer; no layer
            // uses them.
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if !allowed {
            failures.push(format!(
                "layer {from} uses layer {to} ({} uses {})",
                graph.file_name(file),
                graph.file_name(used)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn long_source_files_say_why() {
    let mut failures = Vec::new();
    for src in crate_sources() {
        // The test kit is test code throughout.
        if src.parent() == Some(&repo().join("tests")) {
            continue;
        }
        for file in rust_files(&src) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let lines = text.lines().count();
            let says_why = text
                .lines()
                .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
                .any(|l| l.starts_with(LONG_FILE_MARK));
            if lines > MAX_LINES && !says_why {
                failures.push(format!(
                    "{} has {lines} lines: split it, or say why at its top (`{LONG_FILE_MARK} …`)",
                    file.strip_prefix(repo()).unwrap().display()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_reader_finds_paths_in_code_and_not_in_comments() {
    let code = code_only(
        "use crate::a::{b, c::{d, e as f}};\n\
         // crate::in_comment\n\
         /* crate::in_block */\n\
         let s = \"crate::in_string\";\n\
         fn g() { super::h(); crate::i::j(); }\n\
         mod child;\n\
         child::k();\n\
         mod tests { use super::*; fn t() { super::super::up(); } }\n\
         $crate::exported!(x);",
    );
    let paths = crate_paths(&["x".into(), "y".into()], &code);
    let expect: Vec<Vec<&str>> = vec![
        vec!["a", "b"],
        vec!["a", "c", "d"],
        vec!["a", "c", "e"],
        vec!["x", "h"],
        vec!["i", "j"],
        vec!["x", "y", "child", "k"],
        // `use super::*` inside `mod tests` is the file itself.
        vec!["x", "y"],
        vec!["x", "up"],
        vec!["exported", "!"],
    ];
    let expect: Vec<Vec<String>> = expect
        .into_iter()
        .map(|p| p.into_iter().map(String::from).collect())
        .collect();
    assert_eq!(paths, expect);
}
