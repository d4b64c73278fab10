//! The core's top-level modules import each other without a circle (issue 20): a module that a
//! lower one reaches must never reach back. The test reads the sources under `src/`, takes every
//! path that leaves its own top-level module (`crate::plan::Tier`, `super::super::x` from a
//! file deep enough, `crate::DType` through the crate root's re-exports), and fails with the
//! circle and the lines that make it when one comes back. Comments are not read: a doc link is
//! no import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One reference from a file of module `from` to module `to`, as `file:line: text`.
type Evidence = BTreeMap<(String, String), Vec<String>>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file: `src/a/b.rs` and `src/a/b/mod.rs` are `[a, b]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code of a line without its comment (a `//` outside a string literal).
fn code_of(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = '\0';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { '\0' } else { c };
    }
    line
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first segments that follow `prefix` (`crate::`) in `code`: one name, or each name of a
/// `{a, b::c}` group.
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at + prefix.len()..];
        rest = tail;
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = tail.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let item = item.trim();
                let end = item.find(|c| !is_ident(c)).unwrap_or(item.len());
                if end > 0 {
                    names.push(&item[..end]);
                }
            }
        } else {
            let end = tail.find(|c| !is_ident(c)).unwrap_or(tail.len());
            if end > 0 {
                names.push(&tail[..end]);
            }
        }
    }
    names
}

/// The names the crate root re-exports, and the module each comes from (`DType` -> `dtype`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in lib.lines().map(code_of) {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim_end_matches(';');
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.trim().rsplit(' ').next().unwrap_or("");
            if !name.is_empty() {
                map.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    map
}

/// Every edge between two top-level modules, with the lines that make it.
fn module_edges() -> (BTreeSet<String>, Evidence) {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let reexports = root_reexports(&lib);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(f.strip_prefix(&src).ok()?).first().cloned())
        .collect();
    // A name after `crate::` (or after enough `super::`) as the top-level module it reaches.
    let target = |name: &str| -> Option<String> {
        if modules.contains(name) {
            Some(name.to_owned())
        } else {
            reexports.get(name).cloned()
        }
    };
    let mut edges = Evidence::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let path = module_path(rel);
        let Some(own) = path.first().cloned() else {
            continue; // the crate root
        };
        let text = std::fs::read_to_string(file).expect("source file");
        for (n, line) in text.lines().enumerate() {
            let code = code_of(line);
            let mut reached: Vec<String> = names_after(code, "crate::")
                .into_iter()
                .filter_map(&target)
                .collect();
            // `super::` chains that climb to the crate root leave the module.
            let climbs = path.len();
            let chain = "super::".repeat(climbs);
            reached.extend(
                names_after(code, &chain)
                    .into_iter()
                    .filter(|name| *name != "super")
                    .filter_map(&target),
            );
            for to in reached {
                if to != own {
                    edges.entry((own.clone(), to)).or_default().push(format!(
                        "{}:{}: {}",
                        rel.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    (modules, edges)
}

/// The groups of modules that reach each other (strongly connected, more than one module).
fn circles(modules: &BTreeSet<String>, edges: &Evidence) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for (a, b) in edges.keys() {
                if *a == m && seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        modules.iter().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in modules {
        if done.contains(m) || !reaches[m].contains(m) {
            continue;
        }
        let group: Vec<String> = modules
            .iter()
            .filter(|o| reaches[m].contains(*o) && reaches[*o].contains(m))
            .cloned()
            .collect();
        done.extend(group.iter().cloned());
        out.push(group);
    }
    out
}

#[test]
fn no_import_circle_across_core_modules() {
    let (modules, edges) = module_edges();
    assert!(
        modules.contains("plan") && modules.contains("stream"),
        "the test did not find the core's modules under {}",
        src_dir().display()
    );
    let found = circles(&modules, &edges);
    let mut report = String::new();
    for group in &found {
        report.push_str(&format!("circle: {}\n", group.join(", ")));
        for ((from, to), lines) in &edges {
            if group.contains(from) && group.contains(to) {
                report.push_str(&format!("  {from} -> {to}:\n"));
                for l in lines {
                    report.push_str(&format!("    {l}\n"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core's top-level modules import each other in a circle:\n{report}"
    );
}

#[test]
fn the_graph_reader_sees_imports() {
    assert_eq!(names_after("use crate::plan::Tier;", "crate::"), ["plan"]);
    assert_eq!(
        names_after("use crate::{io::X, plan};", "crate::"),
        ["io", "plan"]
    );
    assert_eq!(names_after("my_crate::plan", "crate::"), Vec::<&str>::new());
    assert_eq!(code_of("let a = 1; // crate::plan"), "let a = 1; ");
    assert_eq!(code_of("let s = \"a//b\";"), "let s = \"a//b\";");
    assert_eq!(
        module_path(Path::new("sys/platform/linux.rs")),
        ["sys", "platform", "linux"]
    );
    assert_eq!(module_path(Path::new("plan/mod.rs")), ["plan"]);
    // A circle of two modules is found, with both of them.
    let modules: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let mut edges = Evidence::new();
    edges.insert(("a".into(), "b".into()), vec![]);
    edges.insert(("b".into(), "a".into()), vec![]);
    edges.insert(("b".into(), "c".into()), vec![]);
    assert_eq!(circles(&modules, &edges), vec![vec!["a", "b"]]);
}

/// The modules of the core table in `docs/architecture.md`, in the order it lists them.
fn documented_layers() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let text = std::fs::read_to_string(&doc)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc.display()));
    let section = text
        .split("## The core")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/architecture.md has a section `## The core`");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The layout page lists the core's modules from the bottom up: it names every module, and a
/// module only imports modules listed above it, so the page cannot drift from the code.
#[test]
fn the_layout_page_lists_the_modules_bottom_up() {
    let (modules, edges) = module_edges();
    let listed = documented_layers();
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        listed_set, modules,
        "docs/architecture.md's table of the core does not name exactly the modules under src/"
    );
    let place = |m: &str| listed.iter().position(|l| l == m).expect("listed");
    let mut wrong = Vec::new();
    for ((from, to), lines) in &edges {
        if place(to) > place(from) {
            wrong.push(format!(
                "{from} imports {to}, listed below it: {}",
                lines[0]
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md lists these modules in the wrong order:\n{}",
        wrong.join("\n")
    );
}
