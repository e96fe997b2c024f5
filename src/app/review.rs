//! Reviewing an answer before its user gets it: the one function every
//! door calls (`POST /api/query/{id}/review`, `maasctl requests review`,
//! the console's review forms).
//!
//! A request with review on (its `review` flag, else its tenant's
//! `hitl_review`) rests in `AWAITING_REVIEW` once the responder answers:
//! the answer is stored, not logged to memory, not delivered. An operator
//! then gives a [`Verdict`]:
//!
//! - **approve**: `COMPLETED` with the answer; it is logged as the
//!   assistant's turn now, and callbacks, streams and long-polls deliver it
//!   as any completion;
//! - **edit**: the same with the operator's text instead: what the user
//!   gets and what memory keeps; the audit row keeps the original;
//! - **reject**: with a reason, either `FAILED` with it ([`Then::Fail`]) or
//!   back to the responder ([`Then::Redo`]) with the reason in its context
//!   as the reviewer's note; the new answer is reviewed again.
//!
//! One status-guarded statement (`sql/queries/review_request.sql`): of two
//! reviewers, exactly one applies; the other is refused naming the status
//! the request has now (`not_awaiting_review`), as is a review of any
//! request not in `AWAITING_REVIEW`.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use super::caller::{Need, Principal};
use super::error::{AppError, Code};
use crate::model::{Status, named_enum};
use crate::repo::GenericClient;
use crate::repo::reviews::{self, Applied};

/// Longest reason of a rejection (or note of an approval), in characters.
pub const MAX_REASON_CHARS: usize = 1000;

named_enum! {
    /// What a review does (`action` of `POST /api/query/{id}/review`).
    pub enum Action {
        Approve = "approve",
        Edit = "edit",
        Reject = "reject",
    }
}

named_enum! {
    /// Where a rejected request goes (`then`).
    pub enum Then {
        /// `FAILED`, the reason its error.
        Fail = "fail",
        /// Back to the responder, the reason in its context.
        Redo = "redo",
    }
}

/// An operator's verdict on an answer, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    /// The text the user gets instead.
    Edit(String),
    Reject {
        reason: String,
        then: Then,
    },
}

impl Verdict {
    /// The verdict of a door's fields (`action`, `text`, `reason`, `then`),
    /// each refusal naming the field: an unknown action or `then`, an edit
    /// without text, a rejection without a reason.
    pub fn from_fields(
        action: &str,
        text: Option<&str>,
        reason: Option<&str>,
        then: Option<&str>,
    ) -> Result<Verdict, AppError> {
        let action = Action::from_name(action).ok_or_else(|| {
            AppError::unprocessable(
                Code::InvalidField,
                format!("action {} is not one of {}", shown(action), Action::NAMES.join(", ")),
            )
        })?;
        let missing =
            |field: &str, why: &str| AppError::unprocessable(Code::MissingField, format!("{field} is required {why}"));
        match action {
            Action::Approve => Ok(Verdict::Approve),
            Action::Edit => {
                let text = text.ok_or_else(|| missing("text", "to edit: the answer the user gets"))?;
                super::input::query_text("text", text)?;
                Ok(Verdict::Edit(text.to_owned()))
            }
            Action::Reject => {
                let reason = reason.ok_or_else(|| missing("reason", "to reject"))?;
                let reason = checked_reason(reason)?;
                let then = match then {
                    None => Then::Fail,
                    Some(t) => Then::from_name(t).ok_or_else(|| {
                        AppError::unprocessable(
                            Code::InvalidField,
                            format!("then {} is not one of {}", shown(t), Then::NAMES.join(", ")),
                        )
                    })?,
                };
                Ok(Verdict::Reject { reason, then })
            }
        }
    }

    pub fn action(&self) -> Action {
        match self {
            Verdict::Approve => Action::Approve,
            Verdict::Edit(_) => Action::Edit,
            Verdict::Reject { .. } => Action::Reject,
        }
    }
}

/// A reason: not blank, at most [`MAX_REASON_CHARS`], no NUL; trimmed.
fn checked_reason(reason: &str) -> Result<String, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::unprocessable(Code::EmptyField, "reason must not be empty"));
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(AppError::unprocessable(
            Code::FieldTooLong,
            format!("reason is longer than {MAX_REASON_CHARS} characters"),
        ));
    }
    super::input::check_field("reason", reason)?;
    Ok(reason.to_owned())
}

/// Who reviews: a caller of a door (scope operate, its own tenant's
/// requests, its bound user's only), or an operator of every tenant
/// (`maasctl`, the console's operator session).
#[derive(Debug, Clone, Copy)]
pub enum Reviewer<'a> {
    Caller(&'a Principal),
    Operator,
}

/// What a review did.
#[derive(Debug, Clone, Serialize)]
pub struct Reviewed {
    pub request_id: Uuid,
    pub action: &'static str,
    /// The status it has now: `COMPLETED`, `FAILED` or (redo) `READY`.
    pub status: Status,
}

/// Applies `verdict` to request `id` as `actor`: see the module's docs.
/// Not found (404) for an unknown request or one the reviewer may not
/// see; `not_awaiting_review` (409) naming its status when it does not
/// await review.
pub async fn review(
    client: &impl GenericClient,
    who: Reviewer<'_>,
    actor: &str,
    id: Uuid,
    verdict: &Verdict,
) -> Result<Reviewed, AppError> {
    let tenant = match who {
        Reviewer::Caller(p) => {
            p.require(Need::Operate)?;
            if let Some(user) = super::caller::bound_user(client, p).await? {
                let rows = crate::repo::requests::request_state_of_tenant(client, id, p.tenant).await?;
                if !rows.iter().any(|r| r.user_id == user) {
                    return Err(not_found(id));
                }
            }
            Some(p.tenant)
        }
        Reviewer::Operator => None,
    };
    let (text, reason, then, note) = match verdict {
        Verdict::Approve => (None, None, None, None),
        Verdict::Edit(text) => (Some(text.as_str()), None, None, None),
        Verdict::Reject { reason, then } => {
            let note = (*then == Then::Redo).then(|| crate::stage::assembler::review_note(reason));
            (None, Some(reason.as_str()), Some(*then), note)
        }
    };
    let action = verdict.action();
    let applied: Option<Applied> = reviews::review(
        client,
        &reviews::Review {
            id,
            tenant,
            actor,
            action: action.as_str(),
            text,
            reason,
            then: then.map(Then::as_str),
            note: note.as_deref(),
        },
    )
    .await?;
    let Some(applied) = applied else {
        return Err(not_found(id));
    };
    if !applied.applied {
        return Err(AppError::conflict(
            Code::NotAwaitingReview,
            format!(
                "request {id} is {}, not AWAITING_REVIEW: only an answer that awaits review is reviewed",
                applied.status
            ),
        ));
    }
    let waited = (chrono::Utc::now() - applied.waiting_since)
        .to_std()
        .unwrap_or(Duration::ZERO);
    crate::metrics::observe_review(action.as_str(), waited);
    tracing::info!(request.id = %id, action = action.as_str(), actor, status = %applied.status, "review applied");
    Ok(Reviewed {
        request_id: id,
        action: action.as_str(),
        status: applied.status,
    })
}

/// The answer of request `id` while it awaits review, for a caller who
/// may review it (scope operate, its tenant's request): what the status
/// JSON shows it as `answer`. `None` for anyone else, and once the request
/// has moved on (a user sees no answer before it is approved).
pub async fn answer_under_review(
    client: &impl GenericClient,
    who: &Principal,
    id: Uuid,
) -> Result<Option<String>, AppError> {
    if who.require(Need::Operate).is_err() {
        return Ok(None);
    }
    let rows = crate::repo::requests::request_state_of_tenant(client, id, who.tenant).await?;
    Ok(rows
        .into_iter()
        .find(|r| r.status == Status::AwaitingReview)
        .and_then(|r| r.answer))
}

/// A value a caller gave, quoted and cut at 40 characters, for a refusal.
fn shown(raw: &str) -> String {
    let head: String = raw.chars().take(40).collect();
    if head.len() < raw.len() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

fn not_found(id: Uuid) -> AppError {
    AppError::not_found(format!("no request {id}"))
}
