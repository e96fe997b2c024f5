//! The console's pages and fragments, and its actions.
//!
//! Guarantees: a page is rendered from one pooled connection; a fragment
//! (`…/overview`, `…/rows`, `…/body`) is the part of its page that the
//! browser fetches again on a `change` event. An action is one call of
//! [`crate::control`] with the operator's reason, after the CSRF and
//! read-only checks, and answers with a redirect to the request's page
//! (303) so a reload never repeats it, recorded with the session's token
//! name as actor.
//! - A session limited to a tenant ([`Session::tenant`]) lists only its
//!   tenant's requests, under the user ids the tenant uses; another
//!   tenant's request is 404 to it, page and action alike; the overview
//!   (the whole engine) sends it to its list.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use minijinja::context;
use serde::Deserialize;
use uuid::Uuid;

use super::auth::{Session, check_action};
use super::{Fail, fail, render};
use crate::control;
use crate::http::AppState;
use crate::model::Status;
use crate::repo::{audit, callbacks, requests, stats, steps};

/// Rows of one page of the list.
pub const PAGE: usize = 50;
/// Finished requests the overview shows.
const RECENT: usize = 15;

pub(super) type Client = deadpool_postgres::Object;

pub(super) async fn client(app: &AppState) -> Result<Client, Fail> {
    app.pool.get().await.map_err(|e| {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("console: no database connection: {e}"),
        )
    })
}

pub(super) fn db_fail(what: &str, e: impl std::fmt::Display) -> Fail {
    fail(StatusCode::INTERNAL_SERVER_ERROR, &format!("console: {what}: {e}"))
}

/// The id of a `what` ("request", "user") in a console path, read as the
/// API reads ids ([`crate::http::input::parse_id`]), or a 400.
pub(super) fn id_of(raw: &str, what: &str) -> Result<Uuid, Fail> {
    crate::http::input::parse_id(raw.trim(), what)
        .map_err(|e| fail(StatusCode::BAD_REQUEST, &format!("console: {}", e.message)))
}

/// A row (any `Serialize`) as a template value.
pub(super) fn v<T: serde::Serialize>(x: &T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(x))
}

/// What every page's header needs of the session.
pub(super) fn session_ctx(app: &AppState, s: &Session) -> minijinja::Value {
    context! {
        csrf => s.csrf.clone(), read_only => s.read_only, auth => !app.tokens.is_empty(),
        operator => s.who.operator, admin => s.admin, actor => s.actor(),
    }
}

// ---- overview --------------------------------------------------------------

async fn overview_data(app: &AppState) -> Result<minijinja::Value, Fail> {
    let c = client(app).await?;
    let backlog = stats::backlog(&c).await.map_err(|e| db_fail("backlog", e))?;
    let finished = stats::finished(&c, Duration::from_secs(3600))
        .await
        .map_err(|e| db_fail("finished requests", e))?;
    let leases = stats::leases(&c).await.map_err(|e| db_fail("leases", e))?;
    let cbs = stats::callbacks(&c).await.map_err(|e| db_fail("callbacks", e))?;
    let daemons = stats::daemons(&c).await.map_err(|e| db_fail("daemons", e))?;
    let pause = control::state(&c).await.map_err(|e| db_fail("pause state", e))?;
    let recent = requests::recently_finished(&c, RECENT)
        .await
        .map_err(|e| db_fail("recent requests", e))?;
    let charts = super::charts::data(app, &c).await?;
    Ok(context! {
        backlog => v(&backlog), finished => v(&finished), leases => v(&leases), callbacks => v(&cbs),
        daemons => v(&daemons), pause => v(&pause), recent => v(&recent),
        now => Utc::now().format("%H:%M:%S").to_string(), charts,
    })
}

/// `GET /console` (a session limited to a tenant goes to its list).
pub async fn overview(State(app): State<AppState>, Extension(s): Extension<Session>) -> Response {
    if s.tenant().is_some() {
        return Redirect::to("/console/requests").into_response();
    }
    match overview_data(&app).await {
        Ok(data) => render("overview.html", context! { session => session_ctx(&app, &s), ..data }),
        Err(r) => r.into_response(),
    }
}

/// `GET /console/overview`: the overview's live part.
pub async fn overview_body(State(app): State<AppState>, Extension(s): Extension<Session>) -> Response {
    if let Err(r) = s.require_operator("the overview") {
        return r.into_response();
    }
    match overview_data(&app).await {
        Ok(data) => render("overview_body.html", data),
        Err(r) => r.into_response(),
    }
}

// ---- the list --------------------------------------------------------------

/// The list's filters as the form sends them (empty = any).
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    status: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    thread: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    text: String,
    /// Created at or after (RFC 3339, or `YYYY-MM-DDTHH:MM` from a form, UTC).
    #[serde(default)]
    since: String,
    /// Created before (as `since`).
    #[serde(default)]
    until: String,
    /// `CREATED_AT_RFC3339,ID` of the last row of the page before.
    #[serde(default)]
    after: String,
}

impl ListQuery {
    fn filter(&self) -> Result<requests::PageFilter, Fail> {
        let bad = |field: &str, v: &str| {
            fail(
                StatusCode::BAD_REQUEST,
                &format!("console: {field}: {v:?} is not valid"),
            )
        };
        let uuid = |field: &str, v: &str| -> Result<Option<Uuid>, Fail> {
            let v = v.trim();
            if v.is_empty() {
                Ok(None)
            } else {
                v.parse().map(Some).map_err(|_| bad(field, v))
            }
        };
        let status = self.status.trim();
        let statuses = if status.is_empty() {
            None
        } else {
            let parsed: Status = status.parse().map_err(|_| bad("status", status))?;
            Some(vec![parsed.to_string()])
        };
        let before = match self.after.trim() {
            "" => None,
            a => {
                let (t, id) = a.split_once(',').ok_or_else(|| bad("after", a))?;
                let t: DateTime<Utc> = t.parse().map_err(|_| bad("after", a))?;
                Some((t, id.parse().map_err(|_| bad("after", a))?))
            }
        };
        let time = |field: &str, v: &str| -> Result<Option<DateTime<Utc>>, Fail> {
            let v = v.trim();
            if v.is_empty() {
                return Ok(None);
            }
            v.parse::<DateTime<Utc>>()
                .or_else(|_| chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M").map(|t| t.and_utc()))
                .map(Some)
                .map_err(|_| bad(field, v))
        };
        let text = self.text.trim();
        Ok(requests::PageFilter {
            statuses,
            user_id: uuid("user", &self.user)?,
            thread_id: uuid("thread", &self.thread)?,
            text: (!text.is_empty()).then(|| text.to_owned()),
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            before,
            limit: PAGE,
            tenant: None,
        })
    }
}

async fn rows_data(app: &AppState, s: &Session, q: &ListQuery) -> Result<minijinja::Value, Fail> {
    let mut f = q.filter()?;
    let c = client(app).await?;
    if let Some(tenant) = s.tenant() {
        f.tenant = Some(tenant);
        if let Some(user) = f.user_id {
            f.user_id = Some(
                crate::app::caller::stored_user(&c, &s.who, user)
                    .await
                    .map_err(|e| db_fail("user", e.message))?,
            );
        }
    }
    let page = requests::page(&c, &f).await.map_err(|e| db_fail("list", e))?;
    let next = page.next.map(|(t, id)| format!("{},{id}", t.to_rfc3339()));
    let searched = page
        .searched
        .map(|(n, t)| context! { rows => n, to => t.format("%Y-%m-%d %H:%M:%S").to_string() });
    Ok(context! {
        rows => v(&page.lines), next, searched,
        q => context! { status => q.status.trim(), user => q.user.trim(), thread => q.thread.trim(), text => q.text.trim(),
                        since => q.since.trim(), until => q.until.trim() },
        statuses => Status::ALL.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// `GET /console/requests`.
pub async fn requests(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Query(q): Query<ListQuery>,
) -> Response {
    match rows_data(&app, &s, &q).await {
        Ok(data) => render("requests.html", context! { session => session_ctx(&app, &s), ..data }),
        Err(r) => r.into_response(),
    }
}

/// `GET /console/requests/rows`: one page of rows.
pub async fn request_rows(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Query(q): Query<ListQuery>,
) -> Response {
    match rows_data(&app, &s, &q).await {
        Ok(data) => render("request_rows.html", data),
        Err(r) => r.into_response(),
    }
}

// ---- one request -----------------------------------------------------------

/// The user id a session knows request `id`'s user by — the stored one
/// for an operator, the tenant's own otherwise — or 404 when the request
/// is not the session's tenant's.
pub(super) async fn request_user(c: &Client, s: &Session, id: Uuid, stored: Uuid) -> Result<Uuid, Fail> {
    let Some(tenant) = s.tenant() else {
        return Ok(stored);
    };
    crate::repo::tenants::request_user(c, id, tenant)
        .await
        .map_err(|e| db_fail("request", e))?
        .ok_or_else(|| fail(StatusCode::NOT_FOUND, &format!("console: no request {id}")))
}

async fn request_data(app: &AppState, id: &str, s: &Session) -> Result<minijinja::Value, Fail> {
    let id = id_of(id, "request")?;
    let c = client(app).await?;
    let Some(r) = requests::get(&c, id).await.map_err(|e| db_fail("request", e))? else {
        return Err(fail(StatusCode::NOT_FOUND, &format!("console: no request {id}")));
    };
    let user = request_user(&c, s, id, r.user_id).await?;
    let steps = steps::for_request(&c, id).await.map_err(|e| db_fail("steps", e))?;
    let actions = audit::for_request(&c, id)
        .await
        .map_err(|e| db_fail("operator actions", e))?;
    let cbs = callbacks::for_request(&c, id)
        .await
        .map_err(|e| db_fail("callbacks", e))?;
    let analysis = r
        .analysis_result
        .as_ref()
        .map(|v| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
    let sources = r
        .context_sources
        .as_ref()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    let status = r.status;
    let can = context! {
        retry => status == crate::model::Status::Failed,
        cancel => !status.is_terminal(),
        cont => r.debug && r.held,
        review => status == crate::model::Status::AwaitingReview,
    };
    Ok(context! {
        r => v(&r), user => user.to_string(), steps => v(&steps), actions => v(&actions), callbacks => v(&cbs), analysis,
        sources => v(&sources), can, running => !status.is_terminal(),
        session => session_ctx(app, s),
    })
}

/// `GET /console/requests/{id}`.
pub async fn request(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    match request_data(&app, &id, &s).await {
        Ok(data) => render("request.html", data),
        Err(r) => r.into_response(),
    }
}

/// `GET /console/requests/{id}/body`: the request page's live part.
pub async fn request_body(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    match request_data(&app, &id, &s).await {
        Ok(data) => render("request_body.html", data),
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    pub(super) csrf: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    pub(super) reason: String,
}

/// `POST /console/requests/{id}/{retry|cancel|continue}` with `csrf` and
/// `reason` (required): the `maasctl requests …` action, as the
/// session's operator.
pub async fn act(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path((id, action)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Response {
    if let Err(r) = check_action(&s, &f.csrf) {
        return r.into_response();
    }
    let id = match id_of(&id, "request") {
        Ok(id) => id,
        Err(r) => return r.into_response(),
    };
    let reason = f.reason.trim();
    if reason.is_empty() {
        return fail(StatusCode::BAD_REQUEST, "console: reason: an action needs a reason").into_response();
    }
    let c = match client(&app).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = request_user(&c, &s, id, id).await {
        return r.into_response();
    }
    let actor = s.actor();
    let done = match action.as_str() {
        "retry" => control::retry(&c, id, actor, Some(reason))
            .await
            .map(serde_json::to_value),
        "cancel" => control::cancel(&c, id, actor, Some(reason))
            .await
            .map(serde_json::to_value),
        "continue" => control::continue_request(&c, id, actor, Some(reason))
            .await
            .map(serde_json::to_value),
        other => {
            return fail(
                StatusCode::NOT_FOUND,
                &format!("console: no action {other:?}; retry, cancel or continue"),
            )
            .into_response();
        }
    };
    match done {
        Ok(outcome) => {
            tracing::info!(request_id = %id, action, outcome = ?outcome.ok(), "console: operator action");
            Redirect::to(&format!("/console/requests/{id}")).into_response()
        }
        Err(e) => db_fail(&action, e).into_response(),
    }
}
