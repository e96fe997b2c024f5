//! The console's prompts page (`/console/prompts`): every role with its
//! active version, a role's kept versions, a line diff between two of
//! them, and activating one.
//!
//! Guarantees:
//! - Reads are the repo functions `maasctl prompts list|show` use, and
//!   activating is [`control::activate_prompt`], as for `maasctl prompts
//!   activate`: one transaction that takes the role's lock, switches the
//!   active version and records `prompt_activate` (role, version, previous)
//!   in `operator_actions` with the session's token name as actor and the
//!   operator's reason, after the CSRF and read-only checks and only for an
//!   operator's session of scope `admin` (403 otherwise); a version the
//!   role does not have changes nothing (404).
//! - The prompts are every tenant's, so the page needs an operator's
//!   session (403 otherwise).
//! - The diff is computed on the server ([`similar`], by lines, with three
//!   lines of context per change) and escaped like every other value.

use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::context;
use serde::{Deserialize, Serialize};
use similar::{ChangeTag, TextDiff};

use super::auth::{Session, check_action};
use super::pages::{ActionForm, client, db_fail, session_ctx, v};
use super::{Fail, fail, render};
use crate::control;
use crate::http::AppState;
use crate::model::PromptRole;
use crate::repo::{audit, prompts};

/// Prompt changes the page lists.
const ACTIONS: usize = 20;
/// Unchanged lines kept around each change of the diff.
const CONTEXT: usize = 3;

/// The role an operator names ([`control::parse_role`]), or a 400.
fn role_of(text: &str) -> Result<PromptRole, Fail> {
    control::parse_role(text).map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            &format!("console: role: {text:?} is not one of {}", PromptRole::NAMES.join(", ")),
        )
    })
}

/// One line of the diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffLine {
    /// `del`, `ins`, `eq`, or `gap` between context groups.
    pub tag: &'static str,
    pub old: Option<usize>,
    pub new: Option<usize>,
    pub text: String,
}

/// The line diff from `old` to `new`, with `CONTEXT` lines around each
/// change; an empty list when the texts are equal.
pub fn diff_lines(old: &str, new: &str) -> Vec<DiffLine> {
    let diff = TextDiff::from_lines(old, new);
    let mut out = Vec::new();
    for (i, group) in diff.grouped_ops(CONTEXT).iter().enumerate() {
        if i > 0 {
            out.push(DiffLine {
                tag: "gap",
                old: None,
                new: None,
                text: "…".into(),
            });
        }
        for op in group {
            for ch in diff.iter_changes(op) {
                out.push(DiffLine {
                    tag: match ch.tag() {
                        ChangeTag::Delete => "del",
                        ChangeTag::Insert => "ins",
                        ChangeTag::Equal => "eq",
                    },
                    old: ch.old_index().map(|n| n + 1),
                    new: ch.new_index().map(|n| n + 1),
                    text: ch.value().trim_end_matches(['\n', '\r']).to_owned(),
                });
            }
        }
    }
    out
}

/// The page's query: the role, and the two versions to compare.
#[derive(Debug, Default, Deserialize)]
pub struct PromptsQuery {
    #[serde(default)]
    role: String,
    #[serde(default)]
    a: Option<i32>,
    #[serde(default)]
    b: Option<i32>,
}

async fn prompts_data(app: &AppState, q: &PromptsQuery) -> Result<minijinja::Value, Fail> {
    let role = if q.role.trim().is_empty() {
        PromptRole::ALL[0]
    } else {
        role_of(&q.role)?
    };
    let c = client(app).await?;
    let roles = prompts::list(&c).await.map_err(|e| db_fail("prompts", e))?;
    let versions = prompts::versions(&c, role)
        .await
        .map_err(|e| db_fail("prompt versions", e))?;
    // By default: the active version (else the newest) against the one before it.
    let b =
        q.b.or_else(|| versions.iter().find(|v| v.active).map(|v| v.version))
            .or_else(|| versions.first().map(|v| v.version));
    let a =
        q.a.or_else(|| b.and_then(|b| versions.iter().map(|v| v.version).filter(|v| *v < b).max()));
    let mut diff = None;
    let mut shown = None;
    if let Some(b) = b {
        let new = prompts::show(&c, role, Some(b))
            .await
            .map_err(|e| db_fail("prompt", e))?
            .ok_or_else(|| fail(StatusCode::NOT_FOUND, &format!("console: {role} has no version {b}")))?;
        if let Some(a) = a {
            let old = prompts::show(&c, role, Some(a))
                .await
                .map_err(|e| db_fail("prompt", e))?
                .ok_or_else(|| fail(StatusCode::NOT_FOUND, &format!("console: {role} has no version {a}")))?;
            diff = Some(diff_lines(&old.text, &new.text));
        }
        shown = Some(new);
    }
    let actions = audit::prompt_changes(&c, ACTIONS)
        .await
        .map_err(|e| db_fail("prompt changes", e))?;
    Ok(context! {
        role => role.as_str(), roles => v(&roles), versions => v(&versions), a, b, diff => v(&diff), shown => v(&shown),
        actions => v(&actions), all_roles => PromptRole::NAMES.to_vec(),
    })
}

/// `GET /console/prompts` (`?role=&a=&b=`).
pub async fn page(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Query(q): Query<PromptsQuery>,
) -> Response {
    if let Err(r) = s.require_operator("the prompts page") {
        return r.into_response();
    }
    match prompts_data(&app, &q).await {
        Ok(data) => render("prompts.html", context! { session => session_ctx(&app, &s), ..data }),
        Err(r) => r.into_response(),
    }
}

/// `POST /console/prompts/{role}/{version}/activate` with `csrf` and
/// `reason`: `maasctl prompts activate ROLE VERSION`.
pub async fn activate(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path((role, version)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Response {
    match activate_version(&app, &s, &role, &version, &f).await {
        Ok(role) => Redirect::to(&format!("/console/prompts?role={role}")).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn activate_version(
    app: &AppState,
    s: &Session,
    role: &str,
    version: &str,
    f: &ActionForm,
) -> Result<PromptRole, Fail> {
    check_action(s, &f.csrf)?;
    s.require_operator("activating a prompt")?;
    if !s.admin {
        return Err(fail(
            StatusCode::FORBIDDEN,
            &format!(
                "console: activating a prompt needs scope admin; token `{}` has scope {}",
                s.actor(),
                s.who.scope.as_str()
            ),
        ));
    }
    let role = role_of(role)?;
    let version: i32 = version.trim().parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            &format!("console: version: {version:?} is not a version number"),
        )
    })?;
    let reason = f.reason.trim();
    if reason.is_empty() {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "console: reason: an action needs a reason",
        ));
    }
    let mut c = client(app).await?;
    let Some(change) = control::activate_prompt(&mut c, role, version, s.actor(), Some(reason))
        .await
        .map_err(|e| db_fail("activate", e))?
    else {
        return Err(fail(
            StatusCode::NOT_FOUND,
            &format!("console: {role} has no version {version}; nothing changed"),
        ));
    };
    tracing::info!(role = role.as_str(), version, previous = ?change.previous, "console: prompt activated");
    Ok(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_shows_changed_lines_with_context_and_gaps() {
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new = old.replace("line 2\n", "line two\n").replace("line 18\n", "");
        let d = diff_lines(&old, &new);
        let tags: Vec<&str> = d.iter().map(|l| l.tag).collect();
        assert!(tags.contains(&"gap"), "{tags:?}");
        assert!(
            d.iter()
                .any(|l| l.tag == "del" && l.text == "line 2" && l.old == Some(2))
        );
        assert!(
            d.iter()
                .any(|l| l.tag == "ins" && l.text == "line two" && l.new == Some(2))
        );
        assert!(d.iter().any(|l| l.tag == "del" && l.text == "line 18"));
        assert!(!d.iter().any(|l| l.text == "line 10"), "far from a change: left out");
        assert!(diff_lines("same\n", "same\n").is_empty());
    }

    #[test]
    fn roles_are_read_like_maasctl_reads_them() {
        assert_eq!(role_of("responder").ok(), Some(PromptRole::Responder));
        assert!(role_of("nobody").is_err());
    }
}
