//! An operator's review of an answer that awaits it (`pipeline_runs` in
//! `AWAITING_REVIEW`, with its `raw_logs` turn and `operator_actions`
//! row): one status-guarded statement, `review_request.sql`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::GenericClient;
use crate::db::Error;
use crate::model::Status;

super::statements! {
    REVIEW = "review_request",
}

super::statement_params! {
    /// The inputs of `review_request.sql`, `$1` to `$8` (its comment says
    /// what each is).
    struct ReviewParams<'a> {
        id: Uuid,
        tenant: Option<Uuid>,
        actor: &'a str,
        verdict: &'a str,
        text: Option<&'a str>,
        reason: Option<&'a str>,
        then: Option<&'a str>,
        note: Option<&'a str>,
    }
}

/// One review, as `app::review` checked it.
#[derive(Debug, Clone)]
pub struct Review<'a> {
    pub id: Uuid,
    /// The reviewer's tenant; `None` for an operator of every tenant.
    pub tenant: Option<Uuid>,
    pub actor: &'a str,
    /// `approve`, `edit` or `reject`.
    pub action: &'a str,
    /// Edit: the answer the user gets instead.
    pub text: Option<&'a str>,
    /// Reject: why.
    pub reason: Option<&'a str>,
    /// Reject: `fail` or `redo`.
    pub then: Option<&'a str>,
    /// Redo: the reviewer's note as a block of the context, quoted.
    pub note: Option<&'a str>,
}

super::row_struct! {
    /// What the review found and did.
    #[derive(Debug, Clone)]
    pub struct Applied {
        /// The status before.
        pub was: Status,
        /// The status now (the one it was, when the review did not apply).
        pub status: Status,
        /// False: it did not await review.
        pub applied: bool,
        /// When it began to wait (its last change before the review).
        pub waiting_since: DateTime<Utc>,
    }
}

/// Applies `r`; `None` for an unknown request (or another tenant's).
pub async fn review(client: &impl GenericClient, r: &Review<'_>) -> Result<Option<Applied>, Error> {
    let params = ReviewParams {
        id: r.id,
        tenant: r.tenant,
        actor: r.actor,
        verdict: r.action,
        text: r.text,
        reason: r.reason,
        then: r.then,
        note: r.note,
    };
    super::query_opt_as(client, REVIEW, &params.params()).await
}
