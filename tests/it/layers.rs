//! The shape of the crate, as `src/lib.rs` states it: every module sits in
//! one layer and uses only modules of lower layers (so no import circles);
//! SQL runs only in `repo` and `db`; a module file over 500 lines says why
//! at its top. Read from the source, so a change that breaks the map fails
//! here rather than in review.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers of `src/lib.rs`'s map, lowest first.
const LAYERS: &[&[&str]] = &[
    &[
        "model",
        "error",
        "secret",
        "backoff",
        "sys",
        "shutdown",
        "telemetry",
        "timescope",
    ],
    &["llm"],
    &["config"],
    &["db"],
    &["repo"],
    &["metrics", "stage", "service"],
    &["listener", "control", "users"],
    &["dispatcher", "archivist", "embedder", "callbacks", "retention"],
    &["http", "cli", "systemd"],
    &["daemon"],
];

/// Calls that run SQL on a connection.
const SQL_CALLS: &[&str] = &[
    ".query(",
    ".query_one(",
    ".query_opt(",
    ".query_raw(",
    ".execute(&",
    ".batch_execute(",
    ".simple_query(",
    ".prepare(",
    ".prepare_cached(",
    ".copy_in(",
];

const MAX_LINES: usize = 500;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
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

/// Every source file but `lib.rs`, with its top-level module.
fn sources() -> Vec<(String, PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "lib.rs"))
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap();
            let first = rel.components().next().unwrap().as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs").to_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            (module, rel.to_path_buf(), text)
        })
        .collect()
}

/// The code of a file without its comments and its test module.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a file's code names as `crate::x`.
fn uses(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .map(|(i, _)| {
            code[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn every_module_uses_only_lower_layers() {
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (module, path, text) in sources() {
        let Some(own) = layer_of(&module) else {
            wrong
                .entry(path.display().to_string())
                .or_default()
                .push(format!("module `{module}` is in no layer of src/lib.rs's map"));
            continue;
        };
        for used in uses(&code(&text)) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => wrong
                    .entry(path.display().to_string())
                    .or_default()
                    .push(format!("`{module}` (layer {own}) uses `{used}` (layer {l})")),
                None => wrong
                    .entry(path.display().to_string())
                    .or_default()
                    .push(format!("`{module}` uses `{used}`, which is in no layer")),
            }
        }
    }
    assert!(wrong.is_empty(), "the layer rule of src/lib.rs is broken: {wrong:#?}");
}

#[test]
fn sql_runs_only_in_repo_and_db() {
    let mut found = Vec::new();
    for (module, path, text) in sources() {
        if module == "repo" || module == "db" {
            continue;
        }
        for line in code(&text).lines() {
            if SQL_CALLS.iter().any(|c| line.contains(c)) {
                found.push(format!("{}: {}", path.display(), line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "SQL outside src/repo and src/db: {found:#?}");
}

#[test]
fn long_modules_say_why() {
    let mut silent = Vec::new();
    for (_, path, text) in sources() {
        let lines = text.lines().count();
        let says_why = text
            .lines()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .any(|l| l.starts_with("//! Size:"));
        if lines > MAX_LINES && !says_why {
            silent.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(
        silent.is_empty(),
        "modules over {MAX_LINES} lines without a `//! Size:` line in their docs: {silent:#?}"
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The scanners themselves: a use is found, a comment is not, a test
    // module is not, and a SQL call is recognised.
    let text = "use crate::repo::x;\n// crate::daemon\nfn f() { c.query(&s, &[]) }\n#[cfg(test)]\nuse crate::http;";
    assert_eq!(uses(&code(text)), vec!["repo".to_owned()]);
    assert!(SQL_CALLS.iter().any(|c| code(text).contains(c)));
    assert_eq!(layer_of("repo"), Some(4));
    assert_eq!(layer_of("nowhere"), None);
}
