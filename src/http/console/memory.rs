//! The console's memory page of one user (`/console/users/{id}`) and its
//! "archive now" action.
//!
//! Guarantees:
//! - The page shows what `maasctl users`/`archivist show` show: the user's
//!   records and pending turns ([`crate::users::view`]), the archive mark
//!   ([`crate::repo::archive::show_mark`]), and when the schedule will next
//!   take the user ([`crate::archivist::eligibility`]).
//! - The search box runs the pipeline's own retrieval: the text becomes a
//!   [`MemoryPlan`](crate::stage::memory::MemoryPlan) as the stage makes it
//!   for a request without analysis, [`crate::users::search`] runs
//!   `repo::memory::search` with the daemon's `[memory]` limits, and the
//!   plan arranges the hits; the page shows each item with its score.
//! - "Archive now" is [`control::archive_now`], as for `maasctl archivist
//!   run --user ID` (a manual run of the daemon's archivist, regardless of
//!   thresholds and cooldown), after the CSRF and read-only checks and with
//!   a reason; it is recorded in `operator_actions` as `archive_run` with
//!   the session's token name as actor and the run's outcome, and answers
//!   with a redirect
//!   (303) to the page. The run and its record happen in a task of their
//!   own, so a browser that leaves does not cut them short.
//! - A session limited to a tenant names the tenant's users by the ids the
//!   tenant uses (mapped to the stored id as the API maps them), so it can
//!   reach no other tenant's user; an operator's names the stored ids.

use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use minijinja::context;
use serde::Deserialize;

use super::auth::{Session, check_action};
use super::pages::{ActionForm, client, db_fail, id_of, session_ctx, v};
use super::{Fail, fail, render};
use crate::archivist::{Quiet, UserOutcome};
use crate::control;
use crate::http::AppState;
use crate::repo::audit;
use crate::users::{self, Page, UserError, UserKey};

/// Records and pending turns the page lists.
const SHOWN: usize = 50;
/// Operator actions the page lists.
const ACTIONS: usize = 20;

fn user_fail(e: UserError) -> Fail {
    match e {
        UserError::Db(d) => db_fail("user", d),
        UserError::Erasing(_) => fail(StatusCode::CONFLICT, &format!("console: {e}")),
        other => fail(StatusCode::NOT_FOUND, &format!("console: {other}")),
    }
}

/// The page's query: the search text, and where the lists start (the
/// `next_before` / `next_turns_before` of the page before).
#[derive(Debug, Default, Deserialize)]
pub struct UserQuery {
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
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

/// The user a session names `id`: the stored id for an operator's, the
/// tenant's own id otherwise.
async fn user_key(c: &super::pages::Client, s: &Session, id: &str) -> Result<UserKey, Fail> {
    let shown = id_of(id, "user")?;
    if s.tenant().is_none() {
        return Ok(UserKey::new(shown));
    }
    let stored = crate::app::caller::stored_user(c, &s.who, shown)
        .await
        .map_err(|e| db_fail("user", e.message))?;
    Ok(UserKey::of_tenant(stored, shown))
}

async fn user_data(app: &AppState, s: &Session, id: &str, uq: &UserQuery) -> Result<minijinja::Value, Fail> {
    let c = client(app).await?;
    let user = user_key(&c, s, id).await?;
    let page = Page {
        before: position("before", &uq.before)?,
        turns_before: position("turns_before", &uq.turns_before)?,
        limit: SHOWN,
    };
    let view = users::view(&c, user, &page).await.map_err(user_fail)?;
    let mark = crate::repo::archive::show_mark(&c, user.user_id)
        .await
        .map_err(|e| db_fail("archive mark", e))?;
    let eligible = mark
        .as_ref()
        .map(|m| crate::archivist::eligibility(m, &app.cfg.archivist, Utc::now()));
    let actions = audit::about_user(&c, user.user_id, ACTIONS)
        .await
        .map_err(|e| db_fail("operator actions", e))?;
    let q = uq.q.trim();
    let hits = if q.is_empty() {
        None
    } else {
        // The plan the assemble stage makes for a query without analysis.
        let plan = crate::stage::memory::plan(None, q, None, Utc::now());
        let found = users::search(
            &c,
            &app.cfg,
            user,
            users::Search {
                query: &plan.query,
                ..Default::default()
            },
            app.embedder.as_ref(),
        )
        .await
        .map_err(user_fail)?;
        Some(plan.arrange(found.hits))
    };
    Ok(context! {
        view => v(&view), mark => v(&mark), eligible => v(&eligible), actions => v(&actions),
        q, hits => v(&hits),
        limits => context! { hits => crate::stage::memory::hits(&app.cfg.memory), records => app.cfg.memory.records, window => app.cfg.memory.window },
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
    match user_data(&app, &s, &id, &q).await {
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
        Ok(user) => Redirect::to(&format!("/console/users/{}", user.shown)).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn archive_now(app: &AppState, s: &Session, id: &str, f: &ActionForm) -> Result<UserKey, Fail> {
    check_action(s, &f.csrf)?;
    let user = user_key(&client(app).await?, s, id).await?;
    let reason = f.reason.trim();
    if reason.is_empty() {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "console: reason: an action needs a reason",
        ));
    }
    // Its own task: a browser that leaves does not cut the run (or its
    // record) short; shutdown still cancels it cleanly.
    let task = tokio::spawn(run_and_record(
        app.clone(),
        user,
        s.actor().to_owned(),
        reason.to_owned(),
    ));
    task.await.map_err(|e| {
        fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("console: archive now: the run's task ended: {e}"),
        )
    })?
}

/// "Archive now" for `user`, by the daemon's archivist, recorded with
/// `actor`; a user whose run failed is a 502 naming the failure.
async fn run_and_record(app: AppState, user: UserKey, actor: String, reason: String) -> Result<UserKey, Fail> {
    let report = control::archive_now(
        &app.archivist,
        user.user_id,
        &actor,
        Some(&reason),
        &Quiet,
        &app.shutdown,
    )
    .await
    .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, &format!("console: archive now: {e}")))?;
    if let Some(u) = report.users.first().filter(|u| u.outcome == UserOutcome::Failed) {
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
