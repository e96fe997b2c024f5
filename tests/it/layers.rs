//! The shape of the crate, as `src/lib.rs` states it, checked against the
//! source so a change that breaks the map fails here rather than in review:
//!
//! - the layers are read from the numbered list of the "# Map" section of
//!   `src/lib.rs` (one source of truth): every module sits in exactly one
//!   layer and uses only modules of lower layers, so there are no import
//!   circles; the map's "`a` never uses `b`" sentences are rules too;
//! - SQL runs only in `repo` and `db`;
//! - a function is at most [`MAX_FN_LINES`] lines.
//!
//! Code is read without comments, string contents and `#[cfg(test)] mod`
//! blocks (found by brace matching, so code after a test module is still
//! read); every `crate::` path counts, grouped (`use crate::{a, b::{c}}`)
//! or in code, and so does a `super::` path that reaches the crate root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest function allowed, in lines from `fn` to its closing brace.
const MAX_FN_LINES: usize = 80;

/// Calls that run SQL on a connection.
const SQL_CALLS: &[&str] = &[
    ".query(",
    ".query_one(",
    ".query_opt(",
    ".query_raw(",
    ".query_typed(",
    ".execute(&",
    ".batch_execute(",
    ".simple_query(",
    ".prepare(",
    ".prepare_cached(",
    ".copy_in(",
];

/// What `src/lib.rs`'s map says: the layers, lowest first, and the pairs
/// (`a`, `b`) of "`a` never uses `b`".
struct Map {
    layers: Vec<Vec<String>>,
    never: Vec<(String, String)>,
}

impl Map {
    fn layer_of(&self, module: &str) -> Option<usize> {
        self.layers.iter().position(|l| l.iter().any(|m| m == module))
    }
}

/// The text of the "# Map" section of a crate root's docs, one string per
/// paragraph (a numbered item starts a paragraph of its own).
fn map_paragraphs(lib: &str) -> Vec<String> {
    let docs = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim());
    let mut paragraphs: Vec<String> = Vec::new();
    let mut open = false;
    let mut in_map = false;
    for line in docs {
        if let Some(heading) = line.strip_prefix('#') {
            in_map = heading.trim() == "Map";
            open = false;
            continue;
        }
        if !in_map {
            continue;
        }
        let numbered = line.split_once(". ").is_some_and(|(n, _)| n.parse::<usize>().is_ok());
        if line.is_empty() {
            open = false;
        } else if open && !numbered {
            let last = paragraphs.last_mut().unwrap();
            last.push(' ');
            last.push_str(line);
        } else {
            paragraphs.push(line.to_owned());
            open = true;
        }
    }
    paragraphs
}

/// The map of a crate root: a layer is a numbered item of the "# Map"
/// section (numbered from 0, in order) and holds the modules it links as
/// [`name`] (a link to a path, like [`db::tls`], names no layer member).
fn read_map(lib: &str) -> Map {
    let mut layers = Vec::new();
    let mut never = Vec::new();
    for p in map_paragraphs(lib) {
        if let Some((n, item)) = p.split_once(". ")
            && let Ok(n) = n.parse::<usize>()
        {
            assert_eq!(
                n,
                layers.len(),
                "the layers of src/lib.rs's map are numbered 0, 1, 2, …"
            );
            let modules = item
                .split("[`")
                .skip(1)
                .filter_map(|s| s.split_once("`]"))
                .filter(|(name, rest)| is_ident(name) && !rest.starts_with('('))
                .map(|(name, _)| name.to_owned())
                .collect();
            layers.push(modules);
        }
        for (before, after) in p
            .match_indices(" never uses ")
            .map(|(i, m)| (&p[..i], &p[i + m.len()..]))
        {
            let last = before
                .trim_end_matches(['`', ']'])
                .rsplit(['`'])
                .next()
                .unwrap_or_default();
            let first = after
                .trim_start_matches(['[', '`'])
                .split('`')
                .next()
                .unwrap_or_default();
            assert!(is_ident(last) && is_ident(first), "cannot read a rule of the map: {p}");
            never.push((last.to_owned(), first.to_owned()));
        }
    }
    Map { layers, never }
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn the_map() -> Map {
    read_map(&std::fs::read_to_string(src_dir().join("lib.rs")).unwrap())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One source file but `lib.rs`: its module path (`["repo", "memory"]`),
/// its path under `src/` and its code as [`code`] reads it.
struct Source {
    module: Vec<String>,
    path: PathBuf,
    code: String,
}

impl Source {
    fn top(&self) -> &str {
        &self.module[0]
    }
}

fn sources() -> Vec<Source> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|p| p != &src.join("lib.rs") && !is_test_module(p))
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().to_path_buf();
            let mut module: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned())
                .collect();
            if module.len() > 1 && module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            let code = code(&std::fs::read_to_string(&p).unwrap());
            Source {
                module,
                path: rel,
                code,
            }
        })
        .collect()
}

/// Whether `p` is a module's unit tests kept in a file of their own: a
/// `tests.rs` whose parent declares it as `#[cfg(test)] mod tests;` (read
/// as the `#[cfg(test)] mod tests { }` blocks are: not at all).
fn is_test_module(p: &Path) -> bool {
    let Some(dir) = p.parent().filter(|_| p.file_name().is_some_and(|n| n == "tests.rs")) else {
        return false;
    };
    let parent = dir.with_extension("rs");
    std::fs::read_to_string(parent).is_ok_and(|t| t.contains("#[cfg(test)]") && t.contains("mod tests;"))
}

/// A file's code without comments, the contents of string and character
/// literals, and `#[cfg(test)] mod … { }` blocks; each removed character
/// but a newline becomes a space, so lines and columns stay where they were.
fn code(text: &str) -> String {
    without_test_modules(&blank_comments_and_strings(text))
}

fn blank_comments_and_strings(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut i = 0;
    while i < c.len() {
        // A byte literal's `b` (`b'x'`, `br"x"`) is no identifier before it.
        let byte_prefix = i > 0 && c[i - 1] == 'b' && (i < 2 || !is_ident_char(c[i - 2]));
        let prev_ident = i > 0 && is_ident_char(c[i - 1]) && !byte_prefix;
        if c[i] == '/' && at(i + 1) == '/' {
            let end = c[i..].iter().position(|&x| x == '\n').map_or(c.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && at(i + 1) == '*' {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && at(j + 1) == '*' {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && at(j + 1) == '/' {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == 'r' && (at(i + 1) == '"' || at(i + 1) == '#') && !prev_ident {
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            if at(i + 1 + hashes) != '"' {
                i += 1;
                continue;
            }
            let body = i + 2 + hashes;
            let mut j = body;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#')) {
                j += 1;
            }
            blank(&mut out, body, j);
            i = j + 1 + hashes;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if c[i] == '\'' && !prev_ident {
            if at(i + 1) == '\\' {
                let end = c[i + 3..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map_or(c.len(), |n| i + 3 + n);
                blank(&mut out, i + 1, end);
                i = end + 1;
            } else if at(i + 2) == '\'' {
                blank(&mut out, i + 1, i + 2);
                i += 3;
            } else {
                i += 1; // a lifetime or a label
            }
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// The index just past the bracket that closes the one at `open`.
fn closing(c: &[char], open: usize) -> usize {
    let (o, cl) = (c[open], if c[open] == '{' { '}' } else { ']' });
    let mut depth = 0;
    for (j, &x) in c.iter().enumerate().skip(open) {
        if x == o {
            depth += 1;
        } else if x == cl {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
    }
    c.len()
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

/// Blanks each `#[cfg(test)]` item that is a `mod name { … }` block (its
/// other attributes and visibility included); any other `#[cfg(test)]`
/// item is left to be read.
fn without_test_modules(code: &str) -> String {
    let mut c: Vec<char> = code.chars().collect();
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attr.len() <= c.len() {
        if c[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        let mut j = skip_ws(&c, i + attr.len());
        while c.get(j) == Some(&'#') && c.get(j + 1) == Some(&'[') {
            j = skip_ws(&c, closing(&c, j + 1));
        }
        let rest: String = c[j..c.len().min(j + 200)].iter().collect();
        let after_pub = rest
            .strip_prefix("pub(crate) ")
            .or_else(|| rest.strip_prefix("pub(super) "))
            .or_else(|| rest.strip_prefix("pub "))
            .unwrap_or(&rest);
        let is_mod_block = after_pub.strip_prefix("mod ").is_some_and(|m| {
            let m = m.trim_start();
            let name_len = m.chars().take_while(|&x| is_ident_char(x)).count();
            name_len > 0 && m[name_len..].trim_start().starts_with('{')
        });
        if !is_mod_block {
            i = j;
            continue;
        }
        let open = (j..c.len()).find(|&k| c[k] == '{').unwrap_or(c.len());
        let end = if open < c.len() { closing(&c, open) } else { c.len() };
        for ch in &mut c[i..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = end;
    }
    c.into_iter().collect()
}

/// The first segment of each path of the use tree that starts at `i`
/// (`a::b`, `{a, b::{c}}`), pushed to `out`; `self` and `*` name none.
fn tree_heads(c: &[char], i: usize, out: &mut Vec<String>) {
    let i = skip_ws(c, i);
    if c.get(i) == Some(&'{') {
        let end = closing(c, i) - 1;
        let mut k = i + 1;
        while k < end {
            k = skip_ws(c, k);
            tree_heads(c, k, out);
            // On to the next item of this group.
            let mut depth = 0;
            while k < end && !(depth == 0 && c[k] == ',') {
                match c[k] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                k += 1;
            }
            k += 1;
        }
        return;
    }
    let head: String = c[i..].iter().take_while(|&&x| is_ident_char(x)).collect();
    if !head.is_empty() && head != "self" {
        out.push(head);
    }
}

/// The spans of the `mod name { … }` blocks written inside a file.
fn inline_modules(c: &[char]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    for i in 0..c.len() {
        if !starts_with_at(c, i, "mod ") || (i > 0 && is_ident_char(c[i - 1])) {
            continue;
        }
        let name_at = skip_ws(c, i + 4);
        let after = name_at + c[name_at..].iter().take_while(|&&x| is_ident_char(x)).count();
        let open = skip_ws(c, after);
        if after > name_at && c.get(open) == Some(&'{') {
            spans.push((open, closing(c, open)));
        }
    }
    spans
}

/// True when the characters from `i` on start with `word`.
fn starts_with_at(c: &[char], i: usize, word: &str) -> bool {
    word.chars().enumerate().all(|(n, w)| c.get(i + n) == Some(&w))
}

/// The top-level modules a file's code names: every `crate::` path
/// (`$crate::` in a macro too), and every `super::` path that climbs to the
/// crate root from `module`.
fn uses(module: &[String], code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    // A path starts here, not inside another one (`a::crate` is no path).
    let starts = |i: usize| i == 0 || !(is_ident_char(c[i - 1]) || c[i - 1] == ':');
    let inline = inline_modules(&c);
    let depth = |i: usize| module.len() + inline.iter().filter(|(from, to)| (*from..*to).contains(&i)).count();
    for i in 0..c.len() {
        if !starts(i) {
            continue;
        }
        if starts_with_at(&c, i, "crate::") {
            tree_heads(&c, i + "crate::".len(), &mut out);
        } else if starts_with_at(&c, i, "super::") {
            let mut k = i;
            let mut climbs = 0;
            while starts_with_at(&c, k, "super::") {
                climbs += 1;
                k += "super::".len();
            }
            if climbs >= depth(i) {
                tree_heads(&c, k, &mut out);
            }
        }
    }
    out
}

/// Every function of `code` longer than `max` lines: its first line
/// (1-based), its name and its length from `fn` to the closing brace.
fn long_functions(code: &str, max: usize) -> Vec<(usize, String, usize)> {
    let c: Vec<char> = code.chars().collect();
    let line_at = |i: usize| c[..i].iter().filter(|&&x| x == '\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i + 3 < c.len() {
        let word = c[i] == 'f' && c[i + 1] == 'n' && c[i + 2].is_whitespace() && (i == 0 || !is_ident_char(c[i - 1]));
        if !word {
            i += 1;
            continue;
        }
        let name_at = skip_ws(&c, i + 2);
        let name: String = c[name_at..].iter().take_while(|&&x| is_ident_char(x)).collect();
        if name.is_empty() {
            i += 2;
            continue;
        }
        // The body is the first `{` outside the signature's brackets; a `;`
        // first means a declaration without one.
        let mut depth = 0i32;
        let mut k = name_at + name.len();
        let body = loop {
            match c.get(k) {
                None => break None,
                Some('(' | '[') => depth += 1,
                Some(')' | ']') => depth -= 1,
                Some(';') if depth == 0 => break None,
                Some('{') if depth == 0 => break Some(k),
                _ => {}
            }
            k += 1;
        };
        let next = name_at + name.len();
        if let Some(open) = body {
            let (first, last) = (line_at(i), line_at(closing(&c, open) - 1));
            let lines = last - first + 1;
            if lines > max {
                found.push((first, name, lines));
            }
        }
        i = next;
    }
    found
}

#[test]
fn the_map_names_every_module_once() {
    let map = the_map();
    assert!(map.layers.len() > 5, "src/lib.rs's map has no layers: {:?}", map.layers);
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod ")))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect();
    let mut mapped = BTreeMap::new();
    for (n, layer) in map.layers.iter().enumerate() {
        for m in layer {
            assert!(
                mapped.insert(m.clone(), n).is_none(),
                "`{m}` is in two layers of src/lib.rs's map"
            );
        }
    }
    let mapped: BTreeSet<String> = mapped.into_keys().collect();
    assert_eq!(
        declared, mapped,
        "the modules of src/lib.rs and the modules of its map differ"
    );
    for (a, b) in &map.never {
        assert!(
            mapped.contains(a) && mapped.contains(b),
            "the rule `{a}` never uses `{b}` names no module"
        );
    }
}

#[test]
fn every_module_uses_only_lower_layers() {
    let map = the_map();
    let mut wrong: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources() {
        let module = s.top();
        let mut complain = |why: String| {
            wrong.entry(s.path.display().to_string()).or_default().insert(why);
        };
        let Some(own) = map.layer_of(module) else {
            complain(format!("module `{module}` is in no layer of src/lib.rs's map"));
            continue;
        };
        for used in uses(&s.module, &s.code) {
            if used == module {
                continue;
            }
            match map.layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => complain(format!("`{module}` (layer {own}) uses `{used}` (layer {l})")),
                None => complain(format!("`{module}` uses `{used}`, which is in no layer")),
            }
            if map.never.iter().any(|(a, b)| a == module && *b == used) {
                complain(format!("`{module}` uses `{used}`, which src/lib.rs's map rules out"));
            }
        }
    }
    assert!(wrong.is_empty(), "the map of src/lib.rs is broken: {wrong:#?}");
}

/// The crates of a wire, which the application layer never names: a door
/// maps `app`'s answers to its wire, never the other way round.
const WIRE_CRATES: &[&str] = &["axum", "hyper", "rmcp", "tower", "tokio_tungstenite"];

#[test]
fn the_application_layer_knows_no_wire() {
    let mut found = Vec::new();
    for s in sources().iter().filter(|s| s.top() == "app") {
        for (n, line) in s.code.lines().enumerate() {
            let named = WIRE_CRATES
                .iter()
                .find(|c| line.contains(&format!("{c}::")) && !line.contains(&format!("_{c}::")));
            if let Some(c) = named {
                found.push(format!("{}:{}: `{c}`: {}", s.path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        sources().iter().any(|s| s.top() == "app"),
        "no source of the application layer was read"
    );
    assert!(found.is_empty(), "the application layer names a wire: {found:#?}");
}

#[test]
fn sql_runs_only_in_repo_and_db() {
    let mut found = Vec::new();
    for s in sources() {
        if s.top() == "repo" || s.top() == "db" {
            continue;
        }
        for (n, line) in s.code.lines().enumerate() {
            if SQL_CALLS.iter().any(|c| line.contains(c)) {
                found.push(format!("{}:{}: {}", s.path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "SQL outside src/repo and src/db: {found:#?}");
}

#[test]
fn functions_fit_the_budget() {
    let mut long = Vec::new();
    for s in sources() {
        for (line, name, lines) in long_functions(&s.code, MAX_FN_LINES) {
            long.push(format!("src/{}:{line}: `{name}` ({lines} lines)", s.path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them): {long:#?}"
    );
}

#[test]
fn the_scanners_see_what_they_look_for() {
    let text = r##"use crate::repo::x;
use crate::{model, llm::{embed::Embedder, Llm}, self};
// crate::daemon
/* crate::http /* nested */ crate::cli */
fn f() { c.query(&s, &[]); let s = "crate::config"; let q = '"'; let b = b'"'; let r = br#"crate::cli"#; x::<'static>(crate::db::pool()) }
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::http;
    fn g() { let s = "}"; }
}
#[cfg(test)]
fn helper() -> u8 { crate::metrics::x() }
pub use super::super::stage::Thing;
"##;
    let code = code(text);
    assert_eq!(code.lines().count(), text.lines().count(), "lines stay where they were");
    assert_eq!(
        uses(&["a".into(), "b".into()], &code),
        ["repo", "model", "llm", "db", "metrics", "stage"],
    );
    assert_eq!(
        uses(&["a".into(), "b".into(), "c".into()], "use super::super::x;"),
        Vec::<String>::new()
    );
    assert_eq!(uses(&["a".into()], "mod m { use super::b; }\nuse super::c;"), ["c"]);
    assert!(SQL_CALLS.iter().any(|c| code.contains(c)));
    assert!(!code.contains("http") && !code.contains("config") && !code.contains("daemon"));

    let long = format!(
        "fn short() {{}}\nfn long(a: [u8; 2]) -> u8 {{\n{}}}\nfn decl();\n",
        "  x;\n".repeat(80)
    );
    assert_eq!(long_functions(&long, 80), [(2, "long".to_owned(), 82)]);

    let lib = "//! # Map\n//!\n//! 0. Leaves: [`model`], [`a`](crate::b)\n//!    and [`error`].\n//! 1. [`repo`] over [`db::tls`].\n//!\n//! `repo` never uses `model`.\n//!\n//! # Other\n//! 2. [`none`]\n";
    let map = read_map(lib);
    assert_eq!(map.layers, [vec!["model", "error"], vec!["repo"]]);
    assert_eq!(map.never, [("repo".to_owned(), "model".to_owned())]);
    assert_eq!(map.layer_of("repo"), Some(1));
    assert_eq!(map.layer_of("nowhere"), None);
}
