//! `maasctl pause` and `resume`: every daemon stops claiming while paused
//! and starts again on resume, with both actions in the audit trail.

use crate::support::cli::maasctl;
use crate::support::count;
use crate::support::daemon::Maasd;
use crate::support::db::{TestDb, column};
use crate::support::ops::{GENEROUS, sweeps, wait_listening, wait_sweeps, watched};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_every_daemon_and_resume_restarts_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let a = Maasd::spawn(&db.url, watched());
    let b = Maasd::spawn(&db.url, watched());
    wait_listening(&c, 2).await;
    let (code, out, err) = maasctl(&db.url, &["pause", "--reason", "database maintenance"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    let marks = [(&a, sweeps(&a)), (&b, sweeps(&b))];
    crate::support::insert_requests(&c, 30, "while paused").await;
    // Every daemon has been rung for them and has swept twice since.
    wait_sweeps(&marks, 2).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'NEW'").await,
        30
    );
    let (code, out, _) = maasctl(&db.url, &["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("PAUSED") && out.contains("database maintenance"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["doctor"]);
    assert_eq!(code, 0, "a pause is a warning, not a failure: {out}");
    assert!(out.contains("warn  claiming"), "{out}");

    let (code, out, err) = maasctl(&db.url, &["resume", "--reason", "done"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed"), "{out}");
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    crate::support::assert_completed(&c, 30).await;
    let actions: Vec<String> = column(&c, "SELECT action FROM operator_actions ORDER BY id", &[]).await;
    assert_eq!(actions, vec!["pause".to_owned(), "resume".to_owned()]);
}
