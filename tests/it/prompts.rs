//! `maasctl prompts`: prompts are versioned, activated atomically, rolled
//! back by version, and every change is in the audit trail.

use uuid::Uuid;

use crate::support::cli::maasctl;
use crate::support::count;
use crate::support::daemon::Maasd;
use crate::support::db::TestDb;
use crate::support::ops::{fast, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_versioned_and_activated_atomically() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, fast());
    let (code, out, err) = maasctl(&db.url, &["prompts", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("FinalResponder"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");

    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prompt-{}.txt", Uuid::new_v4()));
    std::fs::write(&file, "You are terse. Answer in one sentence.").unwrap();
    let (code, out, err) = maasctl(
        &db.url,
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
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "finalresponder"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "You are terse. Answer in one sentence.");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder", "--version", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "the old one is kept: {out}");
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM system_prompts WHERE role_name = 'FinalResponder' AND is_active"
        )
        .await,
        1
    );

    // Roll back; an unknown version changes nothing.
    let (code, _, err) = maasctl(&db.url, &["prompts", "activate", "responder", "9"]);
    assert_eq!(code, 1);
    assert!(err.contains("no version 9"), "{err}");
    let (code, out, _) = maasctl(&db.url, &["--json", "prompts", "list"]);
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
    let (code, out, err) = maasctl(
        &db.url,
        &["prompts", "activate", "responder", "1", "--reason", "rollback"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("version 1 is active"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");

    let (code, _, err) = maasctl(&db.url, &["prompts", "show", "Poet"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown role"), "{err}");
    std::fs::write(&file, "  \n").unwrap();
    let (code, _, err) = maasctl(&db.url, &["prompts", "set", "Analyzer", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("empty"), "{err}");
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
