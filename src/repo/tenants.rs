//! Tenants (`tenants`) and the API tokens of the database (`api_tokens`),
//! sql/0012_tenants.sql.
//!
//! Guarantees:
//! - A token is kept only as its SHA-256; [`token_by_hash`] finds a live
//!   (not revoked) one without writing; [`touch_token`] stamps
//!   `last_used_at` of a found one.
//! - A tenant's user id becomes the stored user id only in SQL
//!   (`maas_tenant_user`, [`stored_user`]); for [`DEFAULT`] they are equal.
//! - Every change made here for `maasctl` writes its `operator_actions` row
//!   in the same statement.
//! - Which tenant a database role's INSERTs belong to is a row of
//!   `tenant_roles` ([`grant_role`]) for the role or a role it is a member
//!   of with INHERIT; the triggers apply it (triggers/0006_assign_tenant.sql)
//!   and refuse a role no mapping covers, or mappings of two tenants do. A
//!   role that may UPDATE `pipeline_runs` is never mapped: it is trusted to
//!   name any tenant. Removing a mapping ([`revoke_role`]) leaves the role
//!   to the mappings that still cover it, or to none (refused).
//! - [`roles`] resolves each mapping to the login roles it covers;
//!   [`producers`] lists the producer roles with what `maasctl doctor`
//!   warns about.
//! - [`lock_limits`] locks the tenant's row (`FOR UPDATE`) in a statement
//!   of its own before [`limit_counts`] counts: submissions of one limited
//!   tenant from any number of daemons are counted one after the other when
//!   the caller inserts in the same transaction.
//! - A console session is a row of `console_sessions`; the secret its
//!   cookie is signed with is not in the database.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::db::Error;
use crate::model::Scope;

/// The default tenant (the nil UUID): configured tokens and the loopback
/// mode act as this one.
pub const DEFAULT: Uuid = Uuid::nil();

super::statements! {
    TOKEN_BY_HASH = "tokens_by_hash",
    TOKEN_BY_ID = "tokens_by_id",
    TOKEN_TOUCH = "tokens_touch",
    TOKEN_CREATE = "tokens_create",
    TOKEN_LIST = "tokens_list",
    TOKEN_REVOKE = "tokens_revoke",
    SESSION_START = "tokens_session_start",
    SESSION_LIVE = "tokens_session_live",
    SESSION_END = "tokens_session_end",
    REQUEST_USER = "tenants_request_user",
    ANY_REQUEST = "tenants_any_request",
    TENANT_ADD = "tenants_add",
    TENANT_LIST = "tenants_list",
    TENANT_SET = "tenants_set",
    TENANT_SET_HITL = "tenants_set_hitl",
    STORED_USER = "tenants_stored_user",
    LIMIT_LOCK = "tenants_limit_lock",
    LIMIT_COUNTS = "tenants_limit_counts",
    COUNT_TURN = "tenants_count_turn",
    NAMES = "tenants_names",
    GRANT_ROLE = "tenants_grant",
    REVOKE_ROLE = "tenants_revoke",
    ROLES = "tenants_roles",
    PRODUCERS = "tenants_producers",
}

super::row_struct! {
    /// A tenant as the API and `maasctl tenants list` see it (the callback
    /// secret itself is never read out).
    #[derive(Debug, Clone, Serialize, PartialEq, Eq)]
    pub struct Tenant {
        pub id: Uuid,
        pub name: String,
        pub requests_per_minute: Option<i32>,
        pub max_in_flight: Option<i32>,
        pub has_callback_secret: bool,
        pub created_at: DateTime<Utc>,
    }
}

super::row_struct! {
    /// A live token found by its hash or id, with its tenant.
    #[derive(Debug, Clone)]
    pub struct TokenRow {
        pub id: i64,
        pub name: String,
        pub scope: Scope,
        pub token_sha256: Vec<u8>,
        pub tenant_id: Uuid,
        pub tenant_name: String,
        pub requests_per_minute: Option<i32>,
        pub max_in_flight: Option<i32>,
        /// The console shows this token every tenant.
        pub operator: bool,
        /// The one user (the tenant's own id) the token acts for; `None`:
        /// any of its tenant's users.
        pub user_id: Option<Uuid>,
    }
}

/// The live token whose SHA-256 is `hash` (a read: no write for an
/// unknown token).
pub async fn token_by_hash(client: &impl GenericClient, hash: &[u8; 32]) -> Result<Option<TokenRow>, Error> {
    super::query_opt_as(client, TOKEN_BY_HASH, &[&hash.as_slice()]).await
}

/// Stamps `last_used_at` of the token with id `id`.
pub async fn touch_token(client: &impl GenericClient, id: i64) -> Result<(), Error> {
    super::execute(client, TOKEN_TOUCH, &[&id]).await.map(|_| ())
}

/// The live token with id `id`.
pub async fn token_by_id(client: &impl GenericClient, id: i64) -> Result<Option<TokenRow>, Error> {
    super::query_opt_as(client, TOKEN_BY_ID, &[&id]).await
}

/// The stored user id of tenant `tenant`'s user `user` (`maas_tenant_user`).
pub async fn stored_user(client: &impl GenericClient, tenant: Uuid, user: Uuid) -> Result<Uuid, Error> {
    super::query_one_value(client, STORED_USER, &[&tenant, &user], "user_id").await
}

super::row_struct! {
    /// A tenant's name (`tenants_names.sql`).
    struct Name {
        id: Uuid,
        name: String,
    }
}

/// Every tenant's name by id.
pub async fn names(client: &impl GenericClient) -> Result<Vec<(Uuid, String)>, Error> {
    let rows: Vec<Name> = super::query_as(client, NAMES, &[]).await?;
    Ok(rows.into_iter().map(|r| (r.id, r.name)).collect())
}

// ---- limits ----------------------------------------------------------------

super::row_struct! {
    /// A limited tenant's usage, counted after its row was locked.
    #[derive(Debug, Clone)]
    pub struct LimitCounts {
        /// Submissions in the last minute, with the turns stored outside a
        /// request (counted up to the limit).
        pub last_minute: i64,
        /// Whole seconds until the oldest of them leaves the minute (at least 1).
        pub window_frees_in: i64,
        /// Requests not yet terminal (counted up to the limit).
        pub in_flight: i64,
    }
}

super::row_struct! {
    /// A tenant's limits (`tenants_limit_lock.sql`); `None` is no limit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Limits {
        pub requests_per_minute: Option<i32>,
        pub max_in_flight: Option<i32>,
    }
}

/// The tenant's limits, read under a row lock held until the transaction
/// ends; `None` when there is no such tenant. Call first in the
/// transaction that then counts with [`limit_counts`] and inserts.
pub async fn lock_limits(client: &impl GenericClient, tenant: Uuid) -> Result<Option<Limits>, Error> {
    super::query_opt_as(client, LIMIT_LOCK, &[&tenant]).await
}

/// Counts the tenant's usage up to its limits `rpm` and `in_flight` (a
/// statement after [`lock_limits`], so it sees every submission committed
/// before the lock was granted); a `None` limit is not counted.
pub async fn limit_counts(
    client: &impl GenericClient,
    tenant: Uuid,
    rpm: Option<i32>,
    in_flight: Option<i32>,
) -> Result<LimitCounts, Error> {
    super::query_one_as(client, LIMIT_COUNTS, &[&tenant, &rpm, &in_flight]).await
}

/// Counts one turn stored outside a request (MCP `remember`) against
/// tenant `tenant`'s `requests_per_minute` (a statement after
/// [`limit_counts`], under the same lock).
pub async fn count_turn(client: &impl GenericClient, tenant: Uuid) -> Result<(), Error> {
    super::execute(client, COUNT_TURN, &[&tenant]).await.map(|_| ())
}

// ---- maasctl ------------------------------------------------------------------

/// Adds tenant `name`, recorded as `actor`'s action.
pub async fn add(
    client: &impl GenericClient,
    name: &str,
    requests_per_minute: Option<i32>,
    max_in_flight: Option<i32>,
    callback_secret: Option<&str>,
    actor: &str,
) -> Result<Tenant, Error> {
    super::query_one_as(
        client,
        TENANT_ADD,
        &[&name, &requests_per_minute, &max_in_flight, &callback_secret, &actor],
    )
    .await
}

/// Every tenant, by name.
pub async fn list(client: &impl GenericClient) -> Result<Vec<Tenant>, Error> {
    super::query_as(client, TENANT_LIST, &[]).await
}

/// A change of `maasctl tenants set`: `None` leaves a field alone,
/// `Some(None)` clears it.
#[derive(Debug, Clone, Default)]
pub struct TenantChange<'a> {
    pub requests_per_minute: Option<Option<i32>>,
    pub max_in_flight: Option<Option<i32>>,
    pub callback_secret: Option<Option<&'a str>>,
}

/// Changes tenant `name`, recorded as `actor`'s action; `None` when unknown.
pub async fn set(
    client: &impl GenericClient,
    name: &str,
    c: &TenantChange<'_>,
    actor: &str,
) -> Result<Option<Tenant>, Error> {
    super::query_opt_as(
        client,
        TENANT_SET,
        &[
            &name,
            &c.requests_per_minute.is_some(),
            &c.requests_per_minute.flatten(),
            &c.max_in_flight.is_some(),
            &c.max_in_flight.flatten(),
            &c.callback_secret.is_some(),
            &c.callback_secret.flatten(),
            &actor,
        ],
    )
    .await
}

/// A change of the person-in-the-loop settings (`maasctl tenants set
/// --clarify …`): `None` leaves a field alone; for the timeouts
/// `Some(None)` clears it (no limit).
#[derive(Debug, Clone, Default)]
pub struct HitlChange<'a> {
    pub clarify: Option<bool>,
    pub review: Option<bool>,
    pub user_reply_timeout: Option<Option<std::time::Duration>>,
    pub review_timeout: Option<Option<std::time::Duration>>,
    /// `answer` or `fail`.
    pub on_reply_timeout: Option<&'a str>,
    /// `answer` or `fail`.
    pub on_review_timeout: Option<&'a str>,
}

impl HitlChange<'_> {
    /// Whether it changes anything.
    pub fn is_empty(&self) -> bool {
        self.clarify.is_none()
            && self.review.is_none()
            && self.user_reply_timeout.is_none()
            && self.review_timeout.is_none()
            && self.on_reply_timeout.is_none()
            && self.on_review_timeout.is_none()
    }
}

super::row_struct! {
    /// A tenant's person-in-the-loop settings (`tenants.hitl_*`).
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct HitlSettings {
        pub name: String,
        pub hitl_clarify: bool,
        pub hitl_review: bool,
        pub user_reply_timeout_secs: Option<f64>,
        pub review_timeout_secs: Option<f64>,
        pub on_reply_timeout: String,
        pub on_review_timeout: String,
    }
}

/// Changes tenant `name`'s person-in-the-loop settings, recorded as
/// `actor`'s action; `None` when unknown.
pub async fn set_hitl(
    client: &impl GenericClient,
    name: &str,
    c: &HitlChange<'_>,
    actor: &str,
) -> Result<Option<HitlSettings>, Error> {
    let secs = |d: Option<Option<std::time::Duration>>| d.flatten().map(|d| d.as_secs_f64());
    super::query_opt_as(
        client,
        TENANT_SET_HITL,
        &[
            &name,
            &c.clarify,
            &c.review,
            &c.user_reply_timeout.is_some(),
            &secs(c.user_reply_timeout),
            &c.review_timeout.is_some(),
            &secs(c.review_timeout),
            &c.on_reply_timeout,
            &c.on_review_timeout,
            &actor,
        ],
    )
    .await
}

super::row_struct! {
    /// What [`grant_role`] found and did.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct RoleGrant {
        pub tenant_known: bool,
        pub role_known: bool,
        /// The role may UPDATE `pipeline_runs` (so it was not mapped).
        pub trusted: bool,
        pub granted: bool,
    }
}

/// Maps database role `role` to tenant `tenant` (by name), recorded as
/// `actor`'s action; the result says whether it was and, if not, why.
pub async fn grant_role(
    client: &impl GenericClient,
    tenant: &str,
    role: &str,
    actor: &str,
) -> Result<RoleGrant, Error> {
    super::query_one_as(client, GRANT_ROLE, &[&tenant, &role, &actor]).await
}

super::row_struct! {
    /// What [`revoke_role`] found and did.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct RoleRevoke {
        /// The tenant the role was mapped to (none: it was not mapped).
        pub tenant: Option<String>,
        /// The role still holds INSERT on `pipeline_runs` or `raw_logs` or
        /// SELECT on `maas_my_requests`.
        pub still_producing: bool,
        pub revoked: bool,
        /// The other mappings that still cover the role (it is a member of
        /// their roles), as "tenant (role …)".
        pub still_covered_by: Vec<String>,
    }
}

/// Removes database role `role`'s mapping to a tenant, recorded as
/// `actor`'s action; the result says whether there was one and what
/// covers the role now.
pub async fn revoke_role(client: &impl GenericClient, role: &str, actor: &str) -> Result<RoleRevoke, Error> {
    super::query_one_as(client, REVOKE_ROLE, &[&role, &actor]).await
}

super::row_struct! {
    /// A database role mapped to a tenant, resolved to the login roles it
    /// covers.
    #[derive(Debug, Clone, Serialize)]
    pub struct TenantRole {
        pub tenant: String,
        pub role: String,
        pub created_at: DateTime<Utc>,
        /// False for a mapping whose role was dropped (it covers no one).
        pub role_exists: bool,
        /// The login roles whose inserts are this tenant's through this
        /// mapping: the role itself, its members with INHERIT (trusted
        /// roles left out).
        pub covers: Vec<String>,
        /// Those of `covers` that a mapping to another tenant covers too:
        /// their inserts are refused.
        pub refused: Vec<String>,
    }
}

/// Every database role mapped to a tenant, by tenant and role.
pub async fn roles(client: &impl GenericClient) -> Result<Vec<TenantRole>, Error> {
    super::query_as(client, ROLES, &[]).await
}

super::row_struct! {
    /// A producer role (`tenants_producers.sql`): one that may insert into
    /// `pipeline_runs` or `raw_logs` and not update them, or that a
    /// mapping covers.
    #[derive(Debug, Clone, Serialize)]
    pub struct Producer {
        pub role: String,
        /// The tenants whose mappings cover it; its inserts are refused
        /// unless there is exactly one.
        pub tenants: Vec<String>,
        /// The schemas it may create objects in.
        pub creates_in: Vec<String>,
        /// It may create temporary tables in this database.
        pub temp: bool,
        /// The schema maas is installed in.
        pub maas_schema: String,
    }
}

/// Every producer role, by name.
pub async fn producers(client: &impl GenericClient) -> Result<Vec<Producer>, Error> {
    super::query_as(client, PRODUCERS, &[]).await
}

super::row_struct! {
    /// A token as `maasctl tokens list` shows it (never the token).
    #[derive(Debug, Clone, Serialize)]
    pub struct TokenInfo {
        pub id: i64,
        pub name: String,
        pub tenant: String,
        pub scope: Scope,
        pub operator: bool,
        /// The user the token is bound to (`--user`).
        pub user_id: Option<Uuid>,
        pub created_at: DateTime<Utc>,
        pub last_used_at: Option<DateTime<Utc>>,
        pub revoked_at: Option<DateTime<Utc>>,
    }
}

/// A token to create: its name, tenant (by name), scope, whether it is
/// an operator's (the console shows it every tenant) and the user it is
/// bound to (`None`: any of the tenant's users).
#[derive(Debug, Clone, Copy)]
pub struct NewToken<'a> {
    pub name: &'a str,
    pub tenant: &'a str,
    pub scope: Scope,
    pub operator: bool,
    pub user: Option<Uuid>,
}

/// Stores a new token's hash, recorded as `actor`'s action; `None` when
/// the tenant is unknown.
pub async fn create_token(
    client: &impl GenericClient,
    t: NewToken<'_>,
    hash: &[u8; 32],
    actor: &str,
) -> Result<Option<TokenInfo>, Error> {
    super::query_opt_as(
        client,
        TOKEN_CREATE,
        &[
            &t.name,
            &t.tenant,
            &t.scope,
            &hash.as_slice(),
            &actor,
            &t.operator,
            &t.user,
        ],
    )
    .await
}

/// Tokens, newest first; with `all`, revoked ones too.
pub async fn list_tokens(client: &impl GenericClient, all: bool) -> Result<Vec<TokenInfo>, Error> {
    super::query_as(client, TOKEN_LIST, &[&all]).await
}

/// Revokes tenant `tenant`'s live token `name`, recorded as `actor`'s
/// action with `reason`; `None` when there is no such live token.
pub async fn revoke_token(
    client: &impl GenericClient,
    name: &str,
    tenant: &str,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<TokenInfo>, Error> {
    super::query_opt_as(client, TOKEN_REVOKE, &[&name, &tenant, &actor, &reason]).await
}

// ---- console sessions ----------------------------------------------------------

/// Starts console session `id` of database token `token_id` (`None`: a
/// configured token), valid until `expires_at`.
pub async fn start_session(
    client: &impl GenericClient,
    id: Uuid,
    token_id: Option<i64>,
    expires_at: DateTime<Utc>,
) -> Result<(), Error> {
    super::execute(client, SESSION_START, &[&id, &token_id, &expires_at]).await?;
    Ok(())
}

/// Whether console session `id` of `token_id` is live: not expired, not
/// logged out.
pub async fn session_live(client: &impl GenericClient, id: Uuid, token_id: Option<i64>) -> Result<bool, Error> {
    super::query_one_value(client, SESSION_LIVE, &[&id, &token_id], "live").await
}

/// Ends console session `id` (a logout).
pub async fn end_session(client: &impl GenericClient, id: Uuid) -> Result<(), Error> {
    super::execute(client, SESSION_END, &[&id]).await?;
    Ok(())
}

// ---- the console of one tenant ---------------------------------------------------

/// The user id tenant `tenant` knows request `id`'s user by (its shown
/// id); `None` when the request is not the tenant's.
pub async fn request_user(client: &impl GenericClient, id: Uuid, tenant: Uuid) -> Result<Option<Uuid>, Error> {
    super::query_opt_value(client, REQUEST_USER, &[&id, &tenant], "user_id").await
}

/// Whether any of the requests `ids` is tenant `tenant`'s.
pub async fn any_request_of(client: &impl GenericClient, tenant: Uuid, ids: &[Uuid]) -> Result<bool, Error> {
    super::query_one_value(client, ANY_REQUEST, &[&tenant, &ids], "found").await
}
