//! A tenant's limits (`requests_per_minute`, `max_in_flight`), checked
//! the same way by every door that writes for a tenant.
//!
//! A tenant with a limit set is counted in PostgreSQL under a lock on its
//! `tenants` row, in the transaction that inserts the request (or stores
//! the turn of MCP `remember`, which counts against `requests_per_minute`
//! as a request does), so the limits hold across any number of daemons;
//! over one the refusal is [`Kind::TooMany`](super::Kind::TooMany) with a
//! retry time, its code naming the limit. A tenant without limits (the
//! default tenant always) pays nothing: the limits come with the cached
//! token ([`Principal::limited`]), so a change takes effect within
//! [`TOKEN_TTL`](super::caller::TOKEN_TTL). The limits are checked before
//! the idempotency key: over a limit, a replay is refused too (it gets its
//! first request once under the limit again).

use super::caller::Principal;
use super::error::{AppError, Code};
use crate::repo::GenericClient;
use crate::repo::tenants;

/// When to retry over `max_in_flight` (when a request finishes is not
/// known).
const IN_FLIGHT_RETRY_SECS: u64 = 2;

/// What a write adds to a tenant's usage ([`check_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A request (`POST /api/query`, MCP `ask`): counted against both
    /// limits (it is the row counted).
    Request,
    /// A turn stored outside a request (MCP `remember`): counted against
    /// `requests_per_minute` only (it is never in flight), as a row of
    /// `tenant_turns` written here.
    Turn,
}

/// Checks a limited tenant's limits inside the writing transaction (its
/// `tenants` row stays locked until that commits): 429 with `Retry-After`
/// over one. A [`Usage::Turn`] within them is counted here. The one check
/// of every door that writes for a tenant.
pub async fn check_limits(client: &impl GenericClient, p: &Principal, usage: Usage) -> Result<(), AppError> {
    let Some(tenants::Limits {
        requests_per_minute: rpm,
        max_in_flight,
    }) = tenants::lock_limits(client, p.tenant).await?
    else {
        return Ok(());
    };
    let in_flight = max_in_flight.filter(|_| usage == Usage::Request);
    if rpm.is_none() && in_flight.is_none() {
        return Ok(());
    }
    let c = tenants::limit_counts(client, p.tenant, rpm, in_flight).await?;
    if let Some(rpm) = rpm
        && c.last_minute >= i64::from(rpm)
    {
        let secs = u64::try_from(c.window_frees_in).unwrap_or(1).max(1);
        return Err(AppError::too_many(
            Code::RequestsPerMinute,
            format!(
                "tenant `{}` is over its limit of {rpm} requests per minute (requests_per_minute); retry in {secs} s",
                p.tenant_name
            ),
        )
        .retry_after(secs));
    }
    if let Some(max) = in_flight
        && c.in_flight >= i64::from(max)
    {
        return Err(AppError::too_many(
            Code::MaxInFlight,
            format!(
                "tenant `{}` has {max} requests in flight, its limit (max_in_flight)",
                p.tenant_name
            ),
        )
        .retry_after(IN_FLIGHT_RETRY_SECS));
    }
    if usage == Usage::Turn && rpm.is_some() {
        tenants::count_turn(client, p.tenant).await?;
    }
    Ok(())
}
