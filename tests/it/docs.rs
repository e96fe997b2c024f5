//! The documentation holds together: every relative link of README.md,
//! BENCHMARKS.md and `docs/*.md` names a file that exists and, with a
//! `#anchor`, a heading of that file (GitHub's slugs); every page of
//! `docs/` is reachable from the README; the README stays one page.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The longest the README may grow: a front door, not a manual.
const README_MAX_LINES: usize = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, BENCHMARKS.md and every `docs/*.md`, sorted.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of `text` outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// `line` without its inline code spans (a link inside one is not a link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the `[text](target)` and `![alt](target)` links of a line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        // `[text](target "title")`: the target is the first word.
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor of a heading: lower case, links and code marks dropped,
/// every character but letters, digits, `-`, `_` and spaces removed,
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    // `[text](target)` shows as `text`.
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings; a repeated heading gets
/// `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        let level = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = slug(line[level..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// Every broken relative link of `page`, as `page:line: target (why)`.
fn broken_links(page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let dir = page.parent().unwrap();
    let name = page.strip_prefix(root()).unwrap().display().to_string();
    let mut broken = Vec::new();
    for (n, line) in prose(&text) {
        for target in link_targets(line) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.to_path_buf()
            } else {
                dir.join(path)
            };
            if !file.exists() {
                broken.push(format!("{name}:{n}: {target} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let Ok(linked) = std::fs::read_to_string(&file) else {
                broken.push(format!("{name}:{n}: {target} (an anchor into a file that is not text)"));
                continue;
            };
            if !anchors(&linked).contains(anchor) {
                broken.push(format!("{name}:{n}: {target} (no heading with that anchor)"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_documentation_resolves() {
    let broken: Vec<String> = pages().iter().flat_map(|p| broken_links(p)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_docs_is_linked_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<String> = prose(&readme)
        .into_iter()
        .flat_map(|(_, line)| link_targets(line))
        .map(|t| t.split('#').next().unwrap_or("").to_owned())
        .collect();
    let missing: Vec<String> = pages()
        .iter()
        .filter_map(|p| p.strip_prefix(root()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.starts_with("docs/") && !linked.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "pages of docs/ the README does not link: {missing:?}"
    );
}

#[test]
fn the_readme_is_one_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("5. Poolers"), "5-poolers");
    assert_eq!(
        slug("Why a per-user sequence and not `raw_logs.id`"),
        "why-a-per-user-sequence-and-not-raw_logsid"
    );
    assert_eq!(slug("Is it healthy?"), "is-it-healthy");
    assert_eq!(
        slug("The semantic part (optional, off by default)"),
        "the-semantic-part-optional-off-by-default"
    );
    assert_eq!(slug("See [the map](docs/a.md)"), "see-the-map");
    let doubled = anchors("# A\n## Run\n```\n# not a heading\n```\n## Run\n");
    assert_eq!(
        doubled,
        BTreeSet::from(["a".to_owned(), "run".to_owned(), "run-1".to_owned()])
    );
}

#[test]
fn every_error_code_is_in_the_http_api_page() {
    let page = std::fs::read_to_string(root().join("docs/http-api.md")).unwrap();
    let table = page
        .split("### Error codes")
        .nth(1)
        .expect("docs/http-api.md has a section \"Error codes\"");
    let documented: BTreeSet<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `")?.split_once('`').map(|(code, _)| code))
        .collect();
    let codes: BTreeSet<&str> = maas::app::Code::NAMES.into_iter().collect();
    assert_eq!(documented, codes, "docs/http-api.md's error codes and `Code` differ");
}
