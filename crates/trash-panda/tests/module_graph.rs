//! The core's top-level modules import each other without a circle: a module that a
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
/// Each circle of `found` with the lines that make it.
fn describe(found: &[Vec<String>], edges: &Evidence) -> String {
    let mut report = String::new();
    for group in found {
        report.push_str(&format!("circle: {}\n", group.join(", ")));
        for ((from, to), lines) in edges {
            if group.contains(from) && group.contains(to) {
                report.push_str(&format!("  {from} -> {to}:\n"));
                for l in lines {
                    report.push_str(&format!("    {l}\n"));
                }
            }
        }
    }
    report
}

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
    let report = describe(&found, &edges);
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

/// A file of the core as the graph of files sees it: its module path (`dtype/avx2/cast`).
type FileId = Vec<String>;

/// The arrows between files, each with the lines that make it.
type FileEdges = BTreeMap<(FileId, FileId), Vec<String>>;

/// The code of a file with comments blanked, lines kept (string and char literals are left in
/// place; the scanner below steps over them).
fn code_text(text: &str) -> String {
    text.lines().map(code_of).collect::<Vec<_>>().join("\n")
}

/// The paths of a `use` tree (or of a plain path in code) that starts at `s`: `a::{b, c::d}` is
/// `[a, b]` and `[a, c, d]`; `a::{self, b}` is `[a]` and `[a, b]`; a glob stops at its module.
fn tree_paths(s: &str) -> Vec<Vec<String>> {
    fn parse(s: &[u8], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            while *at < s.len() && (s[*at] as char).is_whitespace() {
                *at += 1;
            }
            if *at < s.len() && s[*at] == b'{' {
                *at += 1;
                loop {
                    parse(s, at, &path, out);
                    while *at < s.len() && (s[*at] as char).is_whitespace() {
                        *at += 1;
                    }
                    match s.get(*at) {
                        Some(b',') => {
                            *at += 1;
                            while *at < s.len() && (s[*at] as char).is_whitespace() {
                                *at += 1;
                            }
                            if s.get(*at) == Some(&b'}') {
                                *at += 1;
                                return;
                            }
                        }
                        Some(b'}') => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                }
            }
            let start = *at;
            while *at < s.len() && is_ident(s[*at] as char) {
                *at += 1;
            }
            let name = std::str::from_utf8(&s[start..*at]).unwrap_or("");
            if !name.is_empty() && name != "self" {
                path.push(name.to_owned());
            } else if name == "self" && path.is_empty() {
                path.push("self".to_owned());
            }
            if s[*at..].starts_with(b"::") {
                *at += 2;
                continue;
            }
            // `as alias` and the rest of the item are not part of the path.
            out.push(path);
            return;
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    parse(s.as_bytes(), &mut at, &[], &mut out);
    out
}

/// Every path in a file's code that starts with `crate::`, `super::` or `self::`, made absolute
/// from the module it is written in (inline `mod tests { .. }` blocks count), with its line.
/// With `uses`, also the relative paths of `use` statements (`use x::y`), and each comes with
/// the name it binds (the alias or last segment) when it is a `use`.
fn absolute_paths(file: &[String], code: &str) -> Vec<(usize, Vec<String>, Option<String>)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '\n' => line += 1,
            '"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    } else if bytes[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
            '\'' => {
                // A char literal (`'{'`, `'\n'`), not a lifetime.
                if bytes.get(i + 2) == Some(&b'\'') {
                    i += 2;
                } else if bytes.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < bytes.len() && bytes[i] != b'\'' {
                        i += 1;
                    }
                }
            }
            '{' => {
                depth += 1;
                let before = code[..i].trim_end();
                let name_start = before.rfind(|ch: char| !is_ident(ch)).map_or(0, |p| p + 1);
                if before[..name_start].trim_end().ends_with("mod")
                    && before[..name_start].ends_with(' ')
                {
                    inline.push((before[name_start..].to_owned(), depth));
                }
            }
            '}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if i >= bytes.len() {
            break;
        }
        let prev_ident = i > 0 && is_ident(bytes[i - 1] as char);
        let rest = &code[i..];
        let is_use = !prev_ident && rest.starts_with("use ");
        let starts_path = !prev_ident
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| rest.starts_with(p));
        if is_use || starts_path {
            let from = if is_use { i + 4 } else { i };
            let here: Vec<String> = file
                .iter()
                .cloned()
                .chain(inline.iter().map(|(n, _)| n.clone()))
                .collect();
            let end = code[from..].find(';').map_or(code.len(), |e| from + e);
            let tree = if is_use {
                &code[from..end]
            } else {
                &code[from..]
            };
            for rel in tree_paths(tree) {
                let Some(first) = rel.first() else { continue };
                let mut abs: Vec<String>;
                let mut segs = rel.iter().peekable();
                match first.as_str() {
                    "crate" => {
                        abs = Vec::new();
                        segs.next();
                    }
                    "self" | "super" => {
                        abs = here.clone();
                        if first == "self" {
                            segs.next();
                        }
                        while segs.peek().is_some_and(|s| *s == "super") {
                            segs.next();
                            abs.pop();
                        }
                    }
                    // A relative `use` names something inside the module (or another crate).
                    _ if is_use => abs = here.clone(),
                    _ => continue,
                }
                abs.extend(segs.cloned());
                let bound = is_use.then(|| {
                    let tail = tree.trim_end();
                    // `x as y` binds `y`; only a single-path `use` is read for its alias.
                    match tail.rsplit_once(" as ") {
                        Some((_, alias)) if !tail.contains('{') => alias.trim().to_owned(),
                        _ => rel.last().cloned().unwrap_or_default(),
                    }
                });
                out.push((line, abs, bound));
            }
            if is_use {
                line += code[i..end].matches('\n').count();
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The file a path ends in: the deepest file of its leading segments, then through that file's
/// `use`s (a re-export, or an import its child modules reach with `super::`) to the file that
/// defines the name.
fn file_of(
    path: &[String],
    files: &BTreeSet<FileId>,
    uses: &BTreeMap<(FileId, String), Vec<String>>,
    hops: usize,
) -> Option<FileId> {
    let n = (0..=path.len())
        .rev()
        .find(|&n| files.contains(&path[..n].to_vec()))?;
    let file = path[..n].to_vec();
    if hops < 8 {
        if let Some(next) = path.get(n) {
            if let Some(source) = uses.get(&(file.clone(), next.clone())) {
                let mut further = source.clone();
                further.extend(path[n + 1..].iter().cloned());
                if further != path {
                    return file_of(&further, files, uses, hops + 1).or(Some(file));
                }
            }
        }
    }
    Some(file)
}

/// Every arrow from one file of the core to another, with the lines that make it. A file's
/// arrows down to the files of its own child modules are not counted: a `mod.rs` (or `a.rs` with
/// an `a/` folder) declares, re-exports and dispatches to them, and they may use what it
/// defines (the module's error enum, shared helpers). Arrows follow re-exports to the file
/// that defines the name, so `super::Stores` re-exported by `avx2/mod.rs` from `stores.rs` is
/// an arrow to `stores.rs`.
fn file_edges() -> (BTreeSet<FileId>, FileEdges) {
    let src = src_dir();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let texts: Vec<(FileId, String, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).expect("under src");
            let text = std::fs::read_to_string(p).expect("source file");
            (module_path(rel), rel.display().to_string(), text)
        })
        .collect();
    let files: BTreeSet<FileId> = texts.iter().map(|(f, _, _)| f.clone()).collect();
    let mut found = Vec::new();
    let mut uses = BTreeMap::new();
    for (file, rel, text) in &texts {
        let lines: Vec<&str> = text.lines().collect();
        for (line, abs, bound) in absolute_paths(file, &code_text(text)) {
            if let Some(name) = bound {
                if name != "*" && !name.is_empty() && abs.last() != Some(&"*".to_owned()) {
                    uses.entry((file.clone(), name)).or_insert(abs.clone());
                }
            }
            let shown = lines.get(line - 1).map_or("", |l| l.trim());
            found.push((file.clone(), abs, format!("{rel}:{line}: {shown}")));
        }
    }
    let mut edges = FileEdges::new();
    for (from, abs, evidence) in found {
        let Some(to) = file_of(&abs, &files, &uses, 0) else {
            continue;
        };
        if to.starts_with(&from) {
            continue; // itself, or one of its child modules
        }
        let list = edges.entry((from, to)).or_default();
        if !list.contains(&evidence) {
            list.push(evidence);
        }
    }
    (files, edges)
}

#[test]
fn no_import_circle_between_the_files_of_a_module() {
    let (files, edges) = file_edges();
    let name = |f: &FileId| f.join("/");
    let names: BTreeSet<String> = files.iter().map(name).collect();
    let named: Evidence = edges
        .iter()
        .map(|((a, b), l)| ((name(a), name(b)), l.clone()))
        .collect();
    assert!(
        named.contains_key(&("dtype/avx2/fp8".into(), "dtype/avx2".into())),
        "the test did not see the dtype kernels' imports: {:?}",
        named.keys().take(20).collect::<Vec<_>>()
    );
    let found = circles(&names, &named);
    let report = describe(&found, &named);
    assert!(
        found.is_empty(),
        "files of the core import each other in a circle (a file that another reaches must not \
         reach back; move what both need into a file below them):\n{report}"
    );
}

#[test]
fn the_file_graph_reader_resolves_paths() {
    let here = |s: &str| s.split('/').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        tree_paths("super::{cast::x, simd}"),
        [vec!["super", "cast", "x"], vec!["super", "simd"]]
    );
    assert_eq!(
        tree_paths("simd::{self, convert}"),
        [vec!["simd"], vec!["simd", "convert"]]
    );
    let code = "use super::table::Fp8;\nmod tests {\n    use super::*;\n    use super::super::cast;\n}\nfn f() { crate::dtype::level::level(); let c = '{'; }\n";
    let got: Vec<(usize, String)> = absolute_paths(&here("dtype/avx2/fp8"), code)
        .into_iter()
        .map(|(l, p, _)| (l, p.join("/")))
        .collect();
    assert_eq!(
        got,
        [
            (1, "dtype/avx2/table/Fp8".to_owned()),
            (3, "dtype/avx2/fp8".to_owned()),
            (4, "dtype/avx2/cast".to_owned()),
            (6, "dtype/level/level".to_owned()),
        ]
    );
    let files: BTreeSet<FileId> = ["dtype", "dtype/avx2", "dtype/stores"]
        .iter()
        .map(|s| here(s))
        .collect();
    let mut uses = BTreeMap::new();
    uses.insert(
        (here("dtype/avx2"), "Stores".to_owned()),
        here("dtype/stores/Stores"),
    );
    assert_eq!(
        file_of(&here("dtype/avx2/Stores"), &files, &uses, 0),
        Some(here("dtype/stores"))
    );
    assert_eq!(
        file_of(&here("dtype/avx2/store"), &files, &uses, 0),
        Some(here("dtype/avx2"))
    );
}
