//! `maasctl prompts`: prompts are versioned, activated atomically, rolled
//! back by version, and every change is in the audit trail.

use std::path::Path;

use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::cli::maasctl;
use crate::support::count;
use crate::support::daemon::Maasd;
use crate::support::db::TestDb;
use crate::support::ops::{fast, json};

/// The default prompts are listed, the responder's shown by its short name.
fn assert_default_prompts_shown(url: &str) {
    let (code, out, err) = maasctl(url, &["prompts", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("FinalResponder"), "{out}");
    let (code, out, _) = maasctl(url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");
}

/// Sets the responder's prompt from `file` as version 2: it is active, the
/// first is kept, and one version alone is active.
async fn assert_a_new_version_is_active_and_the_old_kept(url: &str, c: &Client, file: &Path) {
    std::fs::write(file, "You are terse. Answer in one sentence.").unwrap();
    let (code, out, err) = maasctl(
        url,
        &[
            "prompts",
            "set",
            "FinalResponder",
            file.to_str().unwrap(),
            "--reason",
            "shorter answers",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("version 2 is active") && out.contains("version 1 kept"),
        "{out}"
    );
    let (code, out, _) = maasctl(url, &["prompts", "show", "finalresponder"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "You are terse. Answer in one sentence.");
    let (code, out, _) = maasctl(url, &["prompts", "show", "responder", "--version", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "the old one is kept: {out}");
    assert_eq!(
        count(
            c,
            "SELECT count(*) FROM system_prompts WHERE role_name = 'FinalResponder' AND is_active"
        )
        .await,
        1
    );
}

/// Roll back to version 1; an unknown version changes nothing.
fn assert_rollback_by_version(url: &str) {
    let (code, _, err) = maasctl(url, &["prompts", "activate", "responder", "9"]);
    assert_eq!(code, 1);
    assert!(err.contains("no version 9"), "{err}");
    let (code, out, _) = maasctl(url, &["--json", "prompts", "list"]);
    assert_eq!(code, 0);
    let v = json(&out);
    let fr = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "FinalResponder")
        .unwrap();
    assert_eq!(
        (fr["active_version"].as_i64(), fr["versions"].as_i64()),
        (Some(2), Some(2))
    );
    let (code, out, err) = maasctl(url, &["prompts", "activate", "responder", "1", "--reason", "rollback"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("version 1 is active"), "{out}");
    let (code, out, _) = maasctl(url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");
}

/// An unknown role and an empty prompt (written to `file`) are refused.
fn assert_bad_input_refused(url: &str, file: &Path) {
    let (code, _, err) = maasctl(url, &["prompts", "show", "Poet"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown role"), "{err}");
    std::fs::write(file, "  \n").unwrap();
    let (code, _, err) = maasctl(url, &["prompts", "set", "Analyzer", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("empty"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_versioned_and_activated_atomically() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, fast());
    assert_default_prompts_shown(&db.url);
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prompt-{}.txt", Uuid::new_v4()));
    assert_a_new_version_is_active_and_the_old_kept(&db.url, &c, &file).await;
    assert_rollback_by_version(&db.url);
    assert_bad_input_refused(&db.url, &file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM operator_actions WHERE action IN ('prompt_set', 'prompt_activate')"
        )
        .await,
        2
    );
}
