//! The console's memory page of one user (`/console/users/{id}`) and its
//! "archive now" action.
//!
//! Guarantees:
//! - The page shows what `maasctl users`/`archivist show` show: the user's
//!   records and pending turns ([`crate::users::view`]), the archive mark
//!   ([`crate::repo::archive::show_mark`]), and when the schedule will next
//!   take the user ([`eligibility`], the same conditions as
//!   `archive_candidates.sql`).
//! - The search box runs the pipeline's own retrieval: the text becomes a
//!   [`MemoryPlan`](crate::stage::memory::MemoryPlan) as the stage makes it
//!   for a request without analysis, [`crate::users::search`] runs
//!   `repo::memory::search` with the daemon's `[memory]` limits, and the
//!   plan arranges the hits; the page shows each item with its score.
//! - "Archive now" is `maasctl archivist run --user ID` (a manual run of
//!   [`Archivist`], regardless of thresholds and cooldown), after the CSRF
//!   and read-only checks and with a reason; it is recorded in
//!   `operator_actions` as `archive_run` with the run's outcome, and
//!   answers with a redirect (303) to the page. The run and its record
//!   happen in a task of their own, so a browser that leaves does not cut
//!   them short.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Duration as Span, Utc};
use minijinja::context;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::auth::{Session, check_action};
use super::pages::{ActionForm, client, db_fail, session_ctx, v};
use super::{Fail, fail, render};
use crate::archivist::{Archivist, Quiet, RunOptions, Trigger, UserOutcome};
use crate::config::Config;
use crate::http::AppState;
use crate::llm::Llm;
use crate::repo::archive::MarkView;
use crate::repo::{audit, console_views};
use crate::users::{self, Page, UserError, UserKey};

/// Records and pending turns the page lists.
const SHOWN: usize = 50;
/// Operator actions the page lists.
const ACTIONS: usize = 20;

fn parse_user(id: &str) -> Result<Uuid, Fail> {
    id.trim().parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            &format!("console: {id:?} is not a user id (a UUID)"),
        )
    })
}

fn user_fail(e: UserError) -> Fail {
    match e {
        UserError::Db(d) => db_fail("user", d),
        UserError::Erasing(_) => fail(StatusCode::CONFLICT, &format!("console: {e}")),
        other => fail(StatusCode::NOT_FOUND, &format!("console: {other}")),
    }
}

/// When the schedule will next take a user, from its archive mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Eligibility {
    /// `nothing_pending`, `inactive`, `eligible` or `waiting`.
    pub state: &'static str,
    /// From when the user is a candidate (`eligible`: now; `waiting`: later).
    pub from: Option<DateTime<Utc>>,
    /// The first scheduled run at or after `from` (none with the schedule off).
    pub next_run: Option<DateTime<Utc>>,
    /// What holds it back, in words.
    pub why: String,
}

/// The candidate conditions of `archive_candidates.sql` applied to `m` at
/// `now`: something pending, active within A, at least N pending or the
/// oldest older than T, out of the cooldown, not backing off, not leased.
pub fn eligibility(m: &MarkView, cfg: &Config, now: DateTime<Utc>) -> Eligibility {
    let a = &cfg.archivist;
    let secs = |s: u64| Span::seconds(i64::try_from(s).unwrap_or(i64::MAX / 1000));
    let next_run = |from: DateTime<Utc>| {
        if !a.enabled {
            return None;
        }
        crate::archivist::cron_schedule(&a.schedule)
            .ok()
            .and_then(|c| c.find_next_occurrence(&from.max(now), true).ok())
    };
    let none = |state, why: String| Eligibility {
        state,
        from: None,
        next_run: None,
        why,
    };
    if m.pending <= 0 {
        return none("nothing_pending", "no turn is waiting".into());
    }
    let active_until = m.last_active_at.map(|t| t + secs(a.active_within_secs));
    if active_until.is_none_or(|t| t < now) {
        return none(
            "inactive",
            format!(
                "not active within active_within_secs = {} s; the next turn (or archive now) takes it",
                a.active_within_secs
            ),
        );
    }
    let mut from = now;
    let mut why = Vec::new();
    let mut later = |t: Option<DateTime<Utc>>, what: String| {
        if let Some(t) = t.filter(|t| *t > from) {
            from = t;
            why.push(what);
        }
    };
    if u64::try_from(m.pending).unwrap_or(0) < a.min_pending {
        later(
            m.pending_since.map(|t| t + secs(a.max_pending_age_secs)),
            format!(
                "{} pending < min_pending {} until the oldest is max_pending_age_secs = {} s old",
                m.pending, a.min_pending, a.max_pending_age_secs
            ),
        );
    }
    later(
        m.last_archived_at.map(|t| t + secs(a.cooldown_secs)),
        format!("cooldown_secs = {} s after the last archive", a.cooldown_secs),
    );
    later(m.retry_after, format!("backing off after {} failures", m.failures));
    later(
        m.lease_expires_at,
        format!("leased to {}", m.lease_owner.as_deref().unwrap_or("?")),
    );
    if active_until.is_some_and(|t| t < from) {
        return none(
            "inactive",
            format!(
                "inactive (active_within_secs = {} s) before it would be due: {}",
                a.active_within_secs,
                why.join("; ")
            ),
        );
    }
    Eligibility {
        state: if from > now { "waiting" } else { "eligible" },
        from: Some(from),
        next_run: next_run(from),
        why: if why.is_empty() { "due".into() } else { why.join("; ") },
    }
}

/// The page's query: the search text, and where the lists start (the
/// `next_before` / `next_turns_before` of the page before).
#[derive(Debug, Default, Deserialize)]
pub struct UserQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    before: String,
    #[serde(default)]
    turns_before: String,
}

/// An optional keyset position of the page's query (empty: from the newest).
fn position(field: &str, v: &str) -> Result<Option<i64>, Fail> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            &format!("console: {field}: {v:?} is not a number"),
        )
    })
}

async fn user_data(app: &AppState, id: &str, uq: &UserQuery) -> Result<minijinja::Value, Fail> {
    let user = UserKey::new(parse_user(id)?);
    let c = client(app).await?;
    let page = Page {
        before: position("before", &uq.before)?,
        turns_before: position("turns_before", &uq.turns_before)?,
        limit: SHOWN,
    };
    let view = users::view(&c, user, &page).await.map_err(user_fail)?;
    let mark = crate::repo::archive::show_mark(&c, user.user_id)
        .await
        .map_err(|e| db_fail("archive mark", e))?;
    let eligible = mark.as_ref().map(|m| eligibility(m, &app.cfg, Utc::now()));
    let actions = console_views::user_actions(&c, user.user_id, ACTIONS)
        .await
        .map_err(|e| db_fail("operator actions", e))?;
    let q = uq.q.trim();
    let hits = if q.is_empty() {
        None
    } else {
        // The plan the assemble stage makes for a query without analysis.
        let plan = crate::stage::memory::plan(None, q, None, Utc::now());
        let found = users::search(&c, &app.cfg, user, &plan.query, app.embedder.as_ref())
            .await
            .map_err(user_fail)?;
        Some(plan.arrange(found.hits))
    };
    Ok(context! {
        view => v(&view), mark => v(&mark), eligible => v(&eligible), actions => v(&actions),
        q, hits => v(&hits),
        limits => context! { hits => app.cfg.memory.hits, records => app.cfg.memory.records, window => app.cfg.memory.window },
        schedule => context! { enabled => app.cfg.archivist.enabled, cron => app.cfg.archivist.schedule.clone() },
    })
}

/// `GET /console/users/{id}` (`?q=` searches).
pub async fn user(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
    Query(q): Query<UserQuery>,
) -> Response {
    match user_data(&app, &id, &q).await {
        Ok(data) => render("user.html", context! { session => session_ctx(&app, &s), ..data }),
        Err(r) => r.into_response(),
    }
}

/// `POST /console/users/{id}/archive` with `csrf` and `reason`: archives
/// the user's pending turns now, as `maasctl archivist run --user ID`.
pub async fn archive(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    match archive_now(&app, &s, &id, &f).await {
        Ok(user) => Redirect::to(&format!("/console/users/{user}")).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn archive_now(app: &AppState, s: &Session, id: &str, f: &ActionForm) -> Result<Uuid, Fail> {
    check_action(s, &f.csrf)?;
    let user = parse_user(id)?;
    let reason = f.reason.trim();
    if reason.is_empty() {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "console: reason: an action needs a reason",
        ));
    }
    // Its own task: a browser that leaves does not cut the run (or its
    // record) short; shutdown still cancels it cleanly.
    let task = tokio::spawn(run_and_record(app.clone(), user, reason.to_owned()));
    task.await.map_err(|e| {
        fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("console: archive now: the run's task ended: {e}"),
        )
    })?
}

/// One manual archive run of `user`, recorded in `operator_actions`.
async fn run_and_record(app: AppState, user: Uuid, reason: String) -> Result<Uuid, Fail> {
    let app = &app;
    let reason = reason.as_str();
    let llm = Llm::from_config(&app.cfg.llm, &app.cfg.llm_provider).map_err(|e| {
        fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("console: archive now: the model configuration: {e}"),
        )
    })?;
    let worker = format!("console:{}", crate::sys::worker_id());
    let archivist = Archivist::new(app.pool.clone(), Arc::new(llm), app.cfg.clone(), worker);
    let opts = RunOptions {
        trigger: Trigger::Manual,
        user: Some(user),
        dry_run: false,
        tick: None,
    };
    let report = archivist
        .run(opts, &Quiet, &app.shutdown)
        .await
        .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, &format!("console: archive now: {e}")))?;
    let u = report.users.first();
    let detail = json!({
        "user_id": user,
        "run_id": report.archive_run_id,
        "outcome": u.map(|u| u.outcome.as_str()),
        "turns": report.logs,
        "records": report.records,
        "memory_version": u.and_then(|u| u.memory_version),
        "error": u.and_then(|u| u.error.clone()),
    });
    let c = client(app).await?;
    audit::record(&c, "archive_run", "console", Some(reason), &detail)
        .await
        .map_err(|e| db_fail("recording the action", e))?;
    tracing::info!(user_id = %user, outcome = ?u.map(|u| u.outcome), turns = report.logs, records = report.records,
        "console: archive now");
    if let Some(u) = u.filter(|u| u.outcome == UserOutcome::Failed) {
        return Err(fail(
            StatusCode::BAD_GATEWAY,
            &format!(
                "console: archive now: user {user}: {}: {}",
                u.error_class.as_deref().unwrap_or("error"),
                u.error.as_deref().unwrap_or("")
            ),
        ));
    }
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(pending: i64) -> MarkView {
        let now = Utc::now();
        MarkView {
            user_id: Uuid::nil(),
            logged_seq: pending,
            archived_seq: 0,
            pending,
            pending_since: Some(now - Span::seconds(10)),
            last_active_at: Some(now - Span::seconds(5)),
            last_archived_at: None,
            memory_version: 0,
            lease_owner: None,
            lease_expires_at: None,
            failures: 0,
            retry_after: None,
            last_error: None,
        }
    }

    fn cfg() -> Config {
        let mut c = Config::default();
        c.archivist.min_pending = 20;
        c.archivist.max_pending_age_secs = 3600;
        c.archivist.active_within_secs = 86_400;
        c.archivist.cooldown_secs = 600;
        c
    }

    #[test]
    fn few_young_turns_wait_for_the_age_threshold() {
        let now = Utc::now();
        let m = mark(3);
        let e = eligibility(&m, &cfg(), now);
        assert_eq!(e.state, "waiting");
        assert_eq!(e.from, m.pending_since.map(|t| t + Span::seconds(3600)));
        assert!(e.why.contains("min_pending"), "{}", e.why);
    }

    #[test]
    fn enough_turns_are_due_now_unless_in_cooldown() {
        let now = Utc::now();
        let mut m = mark(25);
        assert_eq!(eligibility(&m, &cfg(), now).state, "eligible");
        m.last_archived_at = Some(now - Span::seconds(60));
        let e = eligibility(&m, &cfg(), now);
        assert_eq!(e.state, "waiting");
        assert!(e.why.contains("cooldown"), "{}", e.why);
    }

    #[test]
    fn nothing_pending_or_inactive_is_never_due() {
        let now = Utc::now();
        assert_eq!(eligibility(&mark(0), &cfg(), now).state, "nothing_pending");
        let mut m = mark(25);
        m.last_active_at = Some(now - Span::days(2));
        assert_eq!(eligibility(&m, &cfg(), now).state, "inactive");
    }
}
