//! `pipeline_runs` rows that wait for a person (WAITING_USER_INPUT,
//! AWAITING_REVIEW): an analyze attempt that asks the user, the user's
//! reply, and the sweep's expiry of waits whose limit passed.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::GenericClient;
use super::attempts::{Claimed, StepUsage};
use crate::db::Error;
use crate::model::Status;

super::statements! {
    ASK = "ask_user",
    REPLY = "reply",
    EXPIRE = "expire_waits",
}

/// A successful analyze attempt on `row` (run by `owner`) whose `analysis`
/// asks the user `question`: the row waits for the reply
/// (`sql/queries/ask_user.sql`). `None`: the lease was lost, nothing
/// changed; otherwise when the wait expires (`None` inside: never).
pub async fn ask_user(
    client: &impl GenericClient,
    row: &Claimed,
    owner: &str,
    analysis: &Value,
    question: &str,
    usage: &StepUsage,
    latency_ms: Option<i32>,
) -> Result<Option<Option<DateTime<Utc>>>, Error> {
    let r = super::rows_of(
        client,
        ASK,
        &[
            &row.id,
            &row.lease_token,
            &owner,
            analysis,
            &question,
            &row.attempt,
            &row.claimed_at,
            &usage.model,
            &usage.prompt_tokens,
            &usage.completion_tokens,
            &latency_ms,
        ],
    )
    .await?;
    r.first()
        .map(|r| r.try_get("wait_expires_at"))
        .transpose()
        .map_err(Error::from)
}

/// Applies `text` as the user's reply to request `id` if it is tenant
/// `tenant`'s and waits for one (`sql/queries/reply.sql`, the function
/// `maas_reply` that the SQL door's trigger calls too): the status it was
/// in (WAITING_USER_INPUT: applied, now NEW), `None` for an unknown id or
/// another tenant's request.
pub async fn reply(client: &impl GenericClient, id: Uuid, tenant: Uuid, text: &str) -> Result<Option<Status>, Error> {
    super::query_opt_value::<Option<Status>>(client, REPLY, &[&id, &tenant, &text], "was")
        .await
        .map(Option::flatten)
}

super::row_struct! {
    /// A wait the sweep ended because its limit passed.
    #[derive(Debug, Clone)]
    pub struct Expired {
        pub id: Uuid,
        /// The waiting status it was in.
        pub was: Status,
        /// NEW (asked again without the reply), COMPLETED (the answer as it
        /// was) or FAILED, as the tenant chose.
        pub new_status: Status,
    }
}

/// Ends up to `limit` waits whose `wait_expires_at` has passed
/// (`sql/queries/expire_waits.sql`): each once, whichever daemon sweeps.
pub async fn expire_waits(client: &impl GenericClient, limit: usize) -> Result<Vec<Expired>, Error> {
    super::query_as(client, EXPIRE, &[&super::as_limit(limit)]).await
}
