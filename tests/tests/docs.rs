//! Every file or folder of the repository a doc names exists. The docs are
//! every `*.md` of the repository (not under `fixtures/`, a hidden folder
//! or a folder git ignores); the names are of two kinds:
//!
//! - a word of an inline code span (fenced blocks are commands and their
//!   output, not names) that is a repository path: segments of letters,
//!   digits, `_`, `-` and `.`, at least one `/`, whose first segment after
//!   any `./` or `../` is an entry of the repository's root
//!   (`gateway-edge/…`, `.ci/run`) or whose last has a file extension
//!   (`src/rules.rs`). It is looked up from the repository's root, or else
//!   from the doc's own folder (`tests/README.md` names the kit's
//!   `src/client.rs`); a trailing `/` claims a folder. `#anchor` and
//!   `:line` suffixes are dropped and `{a,b}` is both. Not paths: flags,
//!   variables, URLs and URL paths (`/readyz`), gRPC methods
//!   (`SessionStore/CreateRun`), placeholders (`<backend>`), globs, and
//!   what git ignores (`target/…`, `*.redb`): outputs, not files of the
//!   repository.
//! - a Markdown link to a relative target, looked up from the doc's own
//!   folder.
//!
//! The repository stands alone, so a name that climbs out of it fails, and
//! nothing outside it is read: no symbolic link is followed.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit is a folder of the repository")
}

/// What the repository's `.gitignore` files ignore, in the two forms they
/// use: a folder or file (`/target`, `/logs/`), and `*.<ext>` anywhere.
#[derive(Debug, Default)]
struct Ignored {
    /// Relative to the repository's root.
    paths: Vec<PathBuf>,
    suffixes: Vec<String>,
}

impl Ignored {
    /// Adds the patterns of the `.gitignore` in `folder` (relative).
    fn add(&mut self, folder: &Path, gitignore: &str) {
        for line in gitignore.lines().map(str::trim) {
            if line.is_empty() || line.starts_with(['#', '!']) {
                continue;
            }
            if let Some(ext) = line.strip_prefix("*.").filter(|e| !has_glob(e)) {
                self.suffixes.push(format!(".{ext}"));
            } else if !has_glob(line) {
                self.paths.push(folder.join(line.trim_matches('/')));
            }
        }
    }

    fn ignores(&self, path: &Path) -> bool {
        self.paths.iter().any(|p| path.starts_with(p))
            || path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| self.suffixes.iter().any(|s| n.ends_with(s.as_str())))
    }
}

fn has_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// The docs (relative paths) and what git ignores, from one walk of the
/// repository that follows no symbolic link.
fn walk(root: &Path) -> (Vec<PathBuf>, Ignored) {
    let mut docs = Vec::new();
    let mut ignored = Ignored::default();
    let mut folders = vec![PathBuf::new()];
    while let Some(folder) = folders.pop() {
        let gitignore = root.join(&folder).join(".gitignore");
        if let Ok(text) = std::fs::read_to_string(&gitignore) {
            ignored.add(&folder, &text);
        }
        let entries = std::fs::read_dir(root.join(&folder)).expect("a folder of the repository");
        for entry in entries.map(|e| e.expect("a folder entry")) {
            let kind = entry.file_type().expect("an entry's type");
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = folder.join(&name);
            if kind.is_symlink() || ignored.ignores(&path) {
                continue;
            }
            let skipped = name.starts_with('.') || path == Path::new("fixtures");
            if kind.is_dir() && !skipped {
                folders.push(path);
            } else if kind.is_file() && name.ends_with(".md") {
                docs.push(path);
            }
        }
    }
    docs.sort();
    (docs, ignored)
}

/// A name a doc gives, where it gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Named {
    /// A word of an inline code span.
    Code { line: usize, word: String },
    /// The target of a Markdown link.
    Link { line: usize, target: String },
}

/// The words of `text`'s inline code spans and its link targets. A span
/// may break across lines but not across paragraphs, so an unpaired
/// backtick spoils one paragraph at most.
fn names(text: &str) -> Vec<Named> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~");
        if fence || fenced || line.trim().is_empty() {
            paragraph_names(&paragraph, &mut found);
            paragraph.clear();
            fenced ^= fence;
            continue;
        }
        paragraph.push((index + 1, line));
    }
    paragraph_names(&paragraph, &mut found);
    found
}

fn paragraph_names(lines: &[(usize, &str)], found: &mut Vec<Named>) {
    let mut in_code = false;
    for &(line, text) in lines {
        let pieces: Vec<&str> = text.split('`').collect();
        for (index, piece) in pieces.iter().enumerate() {
            if index > 0 {
                in_code = !in_code;
            }
            if in_code {
                found.extend(piece.split_whitespace().map(|w| Named::Code {
                    line,
                    word: w.to_owned(),
                }));
            } else {
                found.extend(link_targets(piece).map(|t| Named::Link {
                    line,
                    target: t.to_owned(),
                }));
            }
        }
        if let Some(target) = reference_definition(text) {
            found.push(Named::Link {
                line,
                target: target.to_owned(),
            });
        }
    }
}

/// The targets of `[text](target)` and `![alt](target "title")`.
fn link_targets(text: &str) -> impl Iterator<Item = &str> {
    text.split("](").skip(1).filter_map(|rest| {
        let inside = &rest[..rest.find(')')?];
        inside.split_whitespace().next()
    })
}

/// The target of a reference definition, `[label]: target`.
fn reference_definition(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (_, target) = rest.split_once("]:")?;
    target.split_whitespace().next()
}

/// The link target as a path relative to its doc, or none when it is a
/// URL, an anchor in the same doc or an address (`mailto:`).
fn link_path(target: &str) -> Option<&str> {
    let target = target.trim_start_matches('<').trim_end_matches('>');
    let path = target.split(['#', '?']).next().unwrap_or_default();
    (!path.is_empty() && !path.contains(':')).then_some(path)
}

/// The repository paths a word of code names (two or more for `{a,b}`),
/// or none when it is not a path (see the module's documentation).
fn code_paths(word: &str, root_entries: &BTreeSet<String>) -> Vec<String> {
    let word = word
        .trim_start_matches(['"', '\'', '('])
        .trim_end_matches(['"', '\'', ')', ',', ';', '.']);
    let word = word.split('#').next().unwrap_or_default();
    let word = strip_line_suffix(word);
    if !word.contains('/') || word.starts_with(['/', '-', '~']) {
        return Vec::new();
    }
    let expanded = expand_braces(word);
    let is_path = |path: &String| {
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        let plain = segments.iter().all(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        });
        // `../x` and `./x` are paths when what follows them is.
        let named = segments.iter().find(|s| !matches!(**s, "." | ".."));
        plain
            && named.is_some_and(|first| {
                root_entries.contains(*first) || has_extension(segments[segments.len() - 1])
            })
    };
    if expanded.iter().all(is_path) {
        expanded
    } else {
        Vec::new()
    }
}

/// `src/x.rs:42` and `src/x.rs:42:7` name `src/x.rs`.
fn strip_line_suffix(word: &str) -> &str {
    let mut word = word;
    for _ in 0..2 {
        match word.rsplit_once(':') {
            Some((head, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
                word = head
            }
            _ => break,
        }
    }
    word
}

/// A file name's extension: a dot after its first character, then one to
/// eight letters and digits, at least one a letter (`2026.9.6` has none).
fn has_extension(name: &str) -> bool {
    match name.rfind('.') {
        Some(dot) if dot > 0 => {
            let ext = &name[dot + 1..];
            (1..=8).contains(&ext.len())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
                && ext.chars().any(|c| c.is_ascii_alphabetic())
        }
        _ => false,
    }
}

/// `a/{b,c}/d` is `a/b/d` and `a/c/d`; unbalanced braces are left as they
/// are (and then are not a path).
fn expand_braces(word: &str) -> Vec<String> {
    let Some(open) = word.find('{') else {
        return vec![word.to_owned()];
    };
    let Some(close) = word[open..].find('}').map(|c| open + c) else {
        return vec![word.to_owned()];
    };
    word[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &word[..open], &word[close + 1..])))
        .collect()
}

/// `relative` joined to `base` (both inside the repository), `.` and `..`
/// resolved by name; none when it climbs out of the repository.
fn resolve(base: &Path, relative: &str) -> Option<PathBuf> {
    let mut path = base.to_owned();
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(name) => path.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(path)
}

/// Whether `relative` is an entry of the repository (a folder, when
/// `folder`), looked up one component at a time so that no symbolic link
/// leads the lookup out of the repository.
fn exists(root: &Path, relative: &Path, folder: bool) -> bool {
    let mut at = root.to_owned();
    let count = relative.components().count();
    for (index, component) in relative.components().enumerate() {
        at.push(component);
        let Ok(meta) = std::fs::symlink_metadata(&at) else {
            return false;
        };
        let last = index + 1 == count;
        if meta.is_symlink() && !last {
            return false;
        }
        if last {
            return !folder || meta.is_dir();
        }
    }
    count == 0
}

/// Every name in `doc` (relative to `root`) that is not in the repository.
fn missing_in(
    root: &Path,
    doc: &Path,
    ignored: &Ignored,
    entries: &BTreeSet<String>,
) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(doc)).expect("a doc reads as UTF-8");
    let folder = doc.parent().unwrap_or(Path::new(""));
    let mut missing = Vec::new();
    for named in names(&text) {
        match named {
            Named::Code { line, word } => {
                for path in code_paths(&word, entries) {
                    let wants_folder = path.ends_with('/');
                    // From the root, else from the doc's folder; none that
                    // stays inside the repository is a path out of it.
                    let inside: Vec<PathBuf> = [Path::new(""), folder]
                        .iter()
                        .filter_map(|base| resolve(base, &path))
                        .collect();
                    if inside.iter().any(|p| ignored.ignores(p)) {
                        continue;
                    }
                    let problem = if inside.is_empty() {
                        "climbs out of the repository"
                    } else if inside.iter().any(|p| exists(root, p, wants_folder)) {
                        continue;
                    } else if wants_folder {
                        "names no folder of the repository"
                    } else {
                        "names no file or folder of the repository"
                    };
                    missing.push(format!("{}:{line}: `{path}` {problem}", doc.display()));
                }
            }
            Named::Link { line, target } => {
                let Some(path) = link_path(&target) else {
                    continue;
                };
                let found = resolve(folder, path);
                if !found.as_deref().is_some_and(|p| exists(root, p, false)) {
                    missing.push(format!(
                        "{}:{line}: the link to {target} leads to nothing in the repository",
                        doc.display()
                    ));
                }
            }
        }
    }
    missing
}

#[test]
fn every_path_a_doc_names_exists() {
    let root = repo();
    let (docs, ignored) = walk(root);
    for expected in [
        "README.md",
        "docs/benchmarks.md",
        "deploy/README.md",
        "tests/README.md",
    ] {
        assert!(
            docs.contains(&PathBuf::from(expected)),
            "{expected} is scanned: {docs:?}"
        );
    }
    let entries: BTreeSet<String> = std::fs::read_dir(root)
        .expect("the repository's root")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| !ignored.ignores(Path::new(name)))
        .collect();
    let missing: Vec<String> = docs
        .iter()
        .flat_map(|doc| missing_in(root, doc, &ignored, &entries))
        .collect();
    assert!(
        missing.is_empty(),
        "docs name paths the repository does not have:\n{}",
        missing.join("\n")
    );
}

#[cfg(test)]
mod extractor {
    use super::*;

    fn entries() -> BTreeSet<String> {
        [
            "gateway-edge",
            "services",
            "session-store",
            "docs",
            "tests",
            ".ci",
            "target",
        ]
        .map(String::from)
        .into()
    }

    fn paths(word: &str) -> Vec<String> {
        code_paths(word, &entries())
    }

    #[test]
    fn repository_paths_are_found() {
        assert_eq!(
            paths("gateway-edge/src/server.rs"),
            ["gateway-edge/src/server.rs"]
        );
        assert_eq!(
            paths("services/bin/bench/tests/smoke.rs"),
            ["services/bin/bench/tests/smoke.rs"]
        );
        assert_eq!(
            paths("session-store/src/backend/"),
            ["session-store/src/backend/"]
        );
        assert_eq!(paths("services/shared"), ["services/shared"]);
        assert_eq!(paths(".ci/run"), [".ci/run"]);
        // Relative to a crate: a file name, so a path (looked up from the
        // root or the doc's folder).
        assert_eq!(paths("src/rules.rs"), ["src/rules.rs"]);
        assert_eq!(paths("(docs/x.md),"), ["docs/x.md"]);
        // Out of the repository, or out of the doc's folder: a path, which
        // the lookup then refuses or finds.
        assert_eq!(paths("../outside/x.rs"), ["../outside/x.rs"]);
        assert_eq!(paths("../gateway-edge/"), ["../gateway-edge/"]);
    }

    #[test]
    fn anchors_line_numbers_and_braces_are_resolved() {
        assert_eq!(paths("docs/x.md#anchor"), ["docs/x.md"]);
        assert_eq!(
            paths("gateway-edge/src/conn.rs:42"),
            ["gateway-edge/src/conn.rs"]
        );
        assert_eq!(
            paths("gateway-edge/src/conn.rs:42:7"),
            ["gateway-edge/src/conn.rs"]
        );
        assert_eq!(
            paths("session-store/src/backend/{embedded,postgres}/mod.rs"),
            [
                "session-store/src/backend/embedded/mod.rs",
                "session-store/src/backend/postgres/mod.rs"
            ]
        );
    }

    #[test]
    fn what_is_not_a_repository_path_is_left_alone() {
        for word in [
            "--floors",
            "EDGE_TOKEN",
            "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317",
            "/readyz",
            "/metrics",
            "http://127.0.0.1:18789/#token=secret",
            "postgres://user@host:5432/db",
            "RunCoordinator/Submit",
            "clawgate.session_store.v1.SessionStore/CreateRun",
            "application/json",
            "assets/",
            "package/dist/control-ui",
            "target/tmp/lincheck/<backend>-seed<seed>.txt",
            "fuzz/seeds/*",
            "p50/p99",
            "1.5/2.0",
            "openclaw-2026.9.6.tgz",
            "Cargo.toml",
            "a/{b,c",
        ] {
            assert_eq!(paths(word), Vec::<String>::new(), "{word}");
        }
    }

    #[test]
    fn code_spans_and_links_are_read_outside_fenced_blocks() {
        let text = "See `gateway-edge/src/a.rs` and [the suite](benchmarks.md#suite),\n\
                    `cargo test -p x\n--test docs` ![shot](shot.png \"title\")\n\
                    \n\
                    ```sh\n\
                    `not/this.rs` [nor](this.md)\n\
                    ```\n\
                    [ref]: ../README.md\n\
                    an unpaired ` here\n\
                    \n\
                    `after/it.rs`\n";
        let code = |line, word: &str| Named::Code {
            line,
            word: word.into(),
        };
        let link = |line, target: &str| Named::Link {
            line,
            target: target.into(),
        };
        assert_eq!(
            names(text),
            [
                code(1, "gateway-edge/src/a.rs"),
                link(1, "benchmarks.md#suite"),
                code(2, "cargo"),
                code(2, "test"),
                code(2, "-p"),
                code(2, "x"),
                code(3, "--test"),
                code(3, "docs"),
                link(3, "shot.png"),
                link(8, "../README.md"),
                code(9, "here"),
                code(11, "after/it.rs"),
            ]
        );
    }

    #[test]
    fn link_targets_resolve_from_the_doc_and_stay_inside() {
        assert_eq!(link_path("benchmarks.md#suite"), Some("benchmarks.md"));
        assert_eq!(link_path("https://example.com/x.md"), None);
        assert_eq!(link_path("mailto:someone@example.com"), None);
        assert_eq!(link_path("#anchor"), None);
        let docs = Path::new("docs");
        assert_eq!(
            resolve(docs, "../README.md"),
            Some(PathBuf::from("README.md"))
        );
        assert_eq!(
            resolve(docs, "./benchmarks.md"),
            Some(PathBuf::from("docs/benchmarks.md"))
        );
        assert_eq!(resolve(docs, "../../outside.md"), None, "above the root");
        assert_eq!(resolve(docs, "/etc/passwd"), None, "absolute");
    }

    #[test]
    fn gitignore_patterns_mark_outputs() {
        let mut ignored = Ignored::default();
        ignored.add(Path::new(""), "/target\n*.redb\n# a comment\n");
        ignored.add(Path::new("fuzz"), "/logs/\n/corpus/\n");
        assert!(ignored.ignores(Path::new("target/tmp/x.txt")));
        assert!(ignored.ignores(Path::new("data/session-store.redb")));
        assert!(ignored.ignores(Path::new("fuzz/logs")));
        assert!(!ignored.ignores(Path::new("fuzz/seeds/frame")));
        assert!(!ignored.ignores(Path::new("targets.md")));
    }
}
