//! Who calls: the tenant, scope and bound user of a bearer token, what
//! each scope allows, and the user ids a caller may name. The same rules on
//! every door (HTTP routes, MCP tools, the console, the coming endpoints).
//!
//! Tokens:
//! - A configured token (`api_tokens`) is the default tenant with scope
//!   `admin`, as before tenants existed. Without configured tokens the
//!   server binds only loopback and a call without a token is the default
//!   tenant with scope `admin` (a token, when one is sent, is checked).
//! - A database token (`maasctl tokens create`) is looked up by its
//!   SHA-256. A found token is kept in memory for at most [`TOKEN_TTL`]: a
//!   revoked token is refused within that time. One lookup (a read) and
//!   one stamp of `last_used_at` per token per period, none per request.
//!   An unknown one is remembered apart, for [`UNKNOWN_TTL`], in a table
//!   of its own that wrong tokens can fill without pushing out a right
//!   one; it costs a read, never a write (and a door rate limits a peer's
//!   failed attempts, as HTTP's `AuthFailures` does).
//!
//! Scopes: each action needs one [`Need`]; [`Scope::allows`] is the matrix
//! (submit: submit and read a request; read: read a request and a user;
//! operate: all but admin; admin: all). Which route or tool needs what is
//! its door's table (`http::tenancy`, `crate::mcp`). A refusal is
//! `scope_required` naming the scope needed.
//!
//! User binding: a token made with `--user U` ([`Principal::user`]) acts
//! for that one user of its tenant; every door checks a user id it is
//! given with [`Principal::acts_for`] (`user_not_allowed`).
//!
//! Isolation: every statement that reads a request by id takes the
//! caller's tenant (`WHERE id = $1 AND tenant_id = $2`): another tenant's
//! request is not found. A user id a caller gives is mapped to the stored
//! one by `maas_tenant_user` in SQL ([`stored_user`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::error::{AppError, Code};
use crate::db::Pool;
use crate::repo::GenericClient;
use crate::repo::tenants::{self, TokenRow};

/// How long a found token is trusted (and how often an open stream checks
/// its token again).
pub const TOKEN_TTL: Duration = Duration::from_secs(5);
/// How long an unknown (or revoked) token is remembered as such.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(2);
/// Most cached lookups of found tokens; the cache is emptied when full.
const CACHE_LIMIT: usize = 10_000;
/// Most remembered unknown tokens; expired ones go first when full, then
/// all of them.
const UNKNOWN_LIMIT: usize = 4096;

pub use crate::model::Scope;

impl Scope {
    /// The matrix of the module docs.
    pub fn allows(self, need: Need) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Operate => need != Need::Admin,
            Scope::Read => matches!(need, Need::ReadRequest | Need::ReadUser),
            Scope::Submit => matches!(need, Need::Submit | Need::ReadRequest),
        }
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Submit,
    /// A request by id (its status and stream).
    ReadRequest,
    /// A user's memory and stream.
    ReadUser,
    Operate,
    Admin,
}

impl Need {
    /// The least scope that allows it, for the refusal.
    fn least(self) -> &'static str {
        match self {
            Need::Submit => "submit",
            Need::ReadRequest => "submit or read",
            Need::ReadUser => "read",
            Need::Operate => "operate",
            Need::Admin => "admin",
        }
    }
}

/// The caller of an `/api` route, put in the request's extensions by the
/// authentication.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: Uuid,
    pub tenant_name: Arc<str>,
    pub scope: Scope,
    /// The token's name (`config` for a configured token, `local` without).
    pub token: Arc<str>,
    /// The tenant has a limit set (as of the cached lookup).
    pub limited: bool,
    /// The database token's id (`None` for a configured token).
    pub token_id: Option<i64>,
    /// The console shows this caller every tenant (a configured token, the
    /// loopback mode, or a database token made with `--operator`); the
    /// JSON API ignores it.
    pub operator: bool,
    /// The one user this caller acts for (the tenant's own id; a token
    /// made with `--user`): any other user id is refused on every door.
    pub user: Option<Uuid>,
}

impl Principal {
    /// A configured token, or the loopback mode.
    pub fn default_admin(token: &str) -> Principal {
        Principal {
            tenant: tenants::DEFAULT,
            tenant_name: Arc::from("default"),
            scope: Scope::Admin,
            token: Arc::from(token),
            limited: false,
            token_id: None,
            operator: true,
            user: None,
        }
    }

    fn of_row(r: &TokenRow) -> Option<Principal> {
        Some(Principal {
            tenant: r.tenant_id,
            tenant_name: Arc::from(r.tenant_name.as_str()),
            scope: r.scope,
            token: Arc::from(r.name.as_str()),
            limited: r.requests_per_minute.is_some() || r.max_in_flight.is_some(),
            token_id: Some(r.id),
            operator: r.operator,
            user: r.user_id,
        })
    }

    pub fn is_default(&self) -> bool {
        self.tenant == tenants::DEFAULT
    }

    /// 403 `user_not_allowed` naming `field` when this caller is bound to
    /// a user other than `user` (the tenant's own id).
    pub fn acts_for(&self, user: Uuid, field: &str) -> Result<(), AppError> {
        match self.user {
            Some(bound) if bound != user => Err(AppError::forbidden(
                Code::UserNotAllowed,
                format!("{field}: token `{}` acts for user {bound} only, not {user}", self.token),
            )),
            _ => Ok(()),
        }
    }

    /// 403 naming the scope needed unless this caller's scope allows `need`.
    pub fn require(&self, need: Need) -> Result<(), AppError> {
        if self.scope.allows(need) {
            return Ok(());
        }
        Err(AppError::forbidden(
            Code::ScopeRequired,
            format!(
                "this needs a token with scope {}; token `{}` has scope {}",
                need.least(),
                self.token,
                self.scope.as_str()
            ),
        ))
    }
}

/// Who holds a place under the caps (`super::caps`): the SHA-256 of the
/// bearer token, or all zeros without tokens (every caller is then one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller(pub [u8; 32]);

impl Caller {
    pub const ANONYMOUS: Caller = Caller([0; 32]);

    /// The caller of bearer token `given`: its SHA-256, hashed once per
    /// request and used for the lookup, the caps and the token watch.
    pub fn of_token(given: &str) -> Caller {
        use sha2::{Digest, Sha256};
        Caller(Sha256::digest(given.as_bytes()).into())
    }
}

/// A database token found by id: its SHA-256 and principal.
type ById = Option<([u8; 32], Principal)>;

/// Database tokens by SHA-256 (and by id, for console sessions): found
/// ones trusted for [`TOKEN_TTL`], unknown ones remembered apart for
/// [`UNKNOWN_TTL`].
#[derive(Default)]
pub struct TokenCache {
    found: Mutex<HashMap<[u8; 32], (Instant, Principal)>>,
    unknown: Mutex<HashMap<[u8; 32], Instant>>,
    by_id: Mutex<HashMap<i64, (Instant, ById)>>,
}

impl TokenCache {
    /// The live token with id `id`: its SHA-256 and principal (`None` when
    /// unknown or revoked).
    pub async fn by_id(&self, pool: &Pool, id: i64) -> Result<ById, AppError> {
        if let Ok(entries) = self.by_id.lock()
            && let Some((at, found)) = entries.get(&id)
            && at.elapsed() < TOKEN_TTL
        {
            return Ok(found.clone());
        }
        let client = pool.get().await?;
        let found = tenants::token_by_id(&client, id).await?.and_then(|r| {
            let digest: [u8; 32] = r.token_sha256.as_slice().try_into().ok()?;
            Some((digest, Principal::of_row(&r)?))
        });
        if let Ok(mut entries) = self.by_id.lock() {
            if entries.len() >= CACHE_LIMIT {
                entries.clear();
            }
            entries.insert(id, (Instant::now(), found.clone()));
        }
        Ok(found)
    }

    /// The principal of a found token still trusted from the cache, with
    /// no lookup.
    pub fn cached(&self, digest: &[u8; 32]) -> Option<Principal> {
        let entries = self.found.lock().ok()?;
        let (at, p) = entries.get(digest)?;
        (at.elapsed() < TOKEN_TTL).then(|| p.clone())
    }

    /// The principal of the token with SHA-256 `digest`, `None` for an
    /// unknown or revoked token.
    pub async fn lookup(&self, pool: &Pool, digest: [u8; 32]) -> Result<Option<Principal>, AppError> {
        if let Some(p) = self.cached(&digest) {
            return Ok(Some(p));
        }
        if let Ok(unknown) = self.unknown.lock()
            && unknown.get(&digest).is_some_and(|at| at.elapsed() < UNKNOWN_TTL)
        {
            return Ok(None);
        }
        let client = pool.get().await?;
        let found = tenants::token_by_hash(&client, &digest)
            .await?
            .and_then(|r| Principal::of_row(&r));
        match &found {
            Some(p) => {
                if let Some(id) = p.token_id
                    && let Err(e) = tenants::touch_token(&client, id).await
                {
                    tracing::warn!(token = %p.token, error = %e, "http: cannot stamp the token's last use");
                }
                if let Ok(mut entries) = self.found.lock() {
                    if entries.len() >= CACHE_LIMIT {
                        entries.clear();
                    }
                    entries.insert(digest, (Instant::now(), p.clone()));
                }
            }
            None => {
                if let Ok(mut unknown) = self.unknown.lock() {
                    if unknown.len() >= UNKNOWN_LIMIT {
                        unknown.retain(|_, at| at.elapsed() < UNKNOWN_TTL);
                        if unknown.len() >= UNKNOWN_LIMIT {
                            unknown.clear();
                        }
                    }
                    unknown.insert(digest, Instant::now());
                }
                if let Ok(mut entries) = self.found.lock() {
                    entries.remove(&digest);
                }
            }
        }
        Ok(found)
    }
}

/// The stored user id of the caller's user `user` (the same id for the
/// default tenant, without a round trip, unless it is a version-8 id: see
/// `maas_tenant_user`).
pub async fn stored_user(client: &impl GenericClient, p: &Principal, user: Uuid) -> Result<Uuid, AppError> {
    if p.is_default() && user.get_version_num() != 8 {
        return Ok(user);
    }
    Ok(tenants::stored_user(client, p.tenant, user).await?)
}

/// The stored id of the one user the caller's token is bound to
/// (`maasctl tokens create … --user`); `None` for a token of every user.
/// A bound caller sees only that user's requests on every route that names
/// a request by id (another user's reads as absent, as another tenant's).
pub async fn bound_user(client: &impl GenericClient, p: &Principal) -> Result<Option<Uuid>, AppError> {
    match p.user {
        Some(user) => Ok(Some(stored_user(client, p, user).await?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_matrix_holds() {
        use Need::*;
        let all = [Submit, ReadRequest, ReadUser, Operate, Admin];
        let allowed = |s: Scope| all.iter().filter(|n| s.allows(**n)).copied().collect::<Vec<_>>();
        assert_eq!(allowed(Scope::Submit), vec![Submit, ReadRequest]);
        assert_eq!(allowed(Scope::Read), vec![ReadRequest, ReadUser]);
        assert_eq!(allowed(Scope::Operate), vec![Submit, ReadRequest, ReadUser, Operate]);
        assert_eq!(allowed(Scope::Admin), all.to_vec());
    }
}
