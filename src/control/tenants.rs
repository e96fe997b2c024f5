//! Tenant and token administration: every change to who may call maas,
//! with its rules and its audit rows (`tenant_add`, `tenant_set`,
//! `tenant_grant`, `tenant_revoke`, `token_create`, `token_revoke`, written
//! by the statements of `repo::tenants`). `maasctl tenants|tokens` only
//! parses and prints; any other door that administers tenants calls these.
//!
//! The rules kept here:
//! - a tenant and the mapping of its producer roles are made together or
//!   not at all; so are the mappings of one `grant`, the removals of one
//!   `revoke` and the two halves of a rotation;
//! - a role named twice in one `revoke` is removed once;
//! - a token is made here (`maas_` and 64 hex digits) and only its SHA-256
//!   is stored: the caller gets the token once, to show it.

use deadpool_postgres::Object;

use crate::db;
use crate::repo::GenericClient;
use crate::repo::tenants::{self, NewToken, RoleRevoke, Tenant, TenantChange, TokenInfo};

/// Why an administrative action did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The action was refused: the message names the tenant, role or token
    /// and why. Nothing was changed.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Db(#[from] db::Error),
}

impl From<tokio_postgres::Error> for AdminError {
    fn from(e: tokio_postgres::Error) -> Self {
        AdminError::Db(e.into())
    }
}

/// A tenant to add: its name, limits, own callback secret and the
/// producer roles mapped to it.
#[derive(Debug, Clone, Copy)]
pub struct NewTenant<'a> {
    pub name: &'a str,
    pub requests_per_minute: Option<i32>,
    pub max_in_flight: Option<i32>,
    pub callback_secret: Option<&'a str>,
    pub roles: &'a [String],
}

/// A token made by [`create_token`] or [`rotate_token`]: what is stored of
/// it, and the token itself, to be shown once.
#[derive(Debug, Clone)]
pub struct MadeToken {
    pub info: TokenInfo,
    pub token: String,
}

/// Adds a tenant and maps its roles, in one transaction.
pub async fn add_tenant(client: &mut Object, new: NewTenant<'_>, actor: &str) -> Result<Tenant, AdminError> {
    let tx = client.transaction().await?;
    let made = tenants::add(
        &tx,
        new.name,
        new.requests_per_minute,
        new.max_in_flight,
        new.callback_secret,
        actor,
    )
    .await
    .map_err(|e| AdminError::Refused(format!("tenant {}: {e}", new.name)))?;
    grant_roles(&tx, new.name, new.roles, actor).await?;
    tx.commit().await?;
    Ok(made)
}

/// Changes a tenant's limits or secret; `None` when there is no such tenant.
pub async fn set_tenant(
    client: &impl GenericClient,
    name: &str,
    change: &TenantChange<'_>,
    actor: &str,
) -> Result<Option<Tenant>, AdminError> {
    tenants::set(client, name, change, actor)
        .await
        .map_err(|e| AdminError::Refused(format!("tenant {name}: {e}")))
}

/// Maps every one of `roles` to tenant `tenant`, or none of them.
pub async fn grant(client: &mut Object, tenant: &str, roles: &[String], actor: &str) -> Result<(), AdminError> {
    let tx = client.transaction().await?;
    grant_roles(&tx, tenant, roles, actor).await?;
    tx.commit().await?;
    Ok(())
}

/// Maps each of `roles` to `tenant`; the first that cannot be mapped is
/// refused naming why (the caller's transaction then maps none).
async fn grant_roles(
    client: &impl GenericClient,
    tenant: &str,
    roles: &[String],
    actor: &str,
) -> Result<(), AdminError> {
    for role in roles {
        let g = tenants::grant_role(client, tenant, role, actor).await?;
        if g.granted {
            continue;
        }
        let why = if !g.tenant_known {
            "no such tenant (maasctl tenants list)"
        } else if !g.role_known {
            "no such database role (CREATE ROLE it first)"
        } else if g.trusted {
            "it may UPDATE pipeline_runs, so it is trusted to insert for any tenant; \
             a producer role holds INSERT only (docs/deploying.md, Producer roles)"
        } else {
            "not mapped"
        };
        return Err(AdminError::Refused(format!("tenant {tenant}, role {role:?}: {why}")));
    }
    Ok(())
}

/// Removes the mapping of every one of `roles` (each once), or of none: a
/// role mapped to no tenant is refused naming it. Returns each role with
/// what its removal left.
pub async fn revoke(
    client: &mut Object,
    roles: &[String],
    actor: &str,
) -> Result<Vec<(String, RoleRevoke)>, AdminError> {
    let mut seen = std::collections::HashSet::new();
    let tx = client.transaction().await?;
    let mut done = Vec::with_capacity(roles.len());
    for role in roles.iter().filter(|r| seen.insert(r.as_str())) {
        let r = tenants::revoke_role(&tx, role, actor).await?;
        if r.tenant.is_none() || !r.revoked {
            return Err(AdminError::Refused(format!(
                "role {role:?}: not mapped to a tenant (maasctl tenants roles)"
            )));
        }
        done.push((role.clone(), r));
    }
    tx.commit().await?;
    Ok(done)
}

/// A new token: `maas_` and 64 hex digits; and its SHA-256.
fn new_token() -> (String, [u8; 32]) {
    use sha2::Digest;
    let bytes: [u8; 32] = rand::random();
    let token = format!("maas_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let hash = sha2::Sha256::digest(token.as_bytes()).into();
    (token, hash)
}

/// Makes a token and stores its hash; `None` when the tenant is unknown.
pub async fn create_token(
    client: &impl GenericClient,
    t: NewToken<'_>,
    actor: &str,
) -> Result<Option<MadeToken>, AdminError> {
    let (token, hash) = new_token();
    let made = tenants::create_token(client, t, &hash, actor)
        .await
        .map_err(|e| AdminError::Refused(format!("token {:?} of tenant {}: {e}", t.name, t.tenant)))?;
    Ok(made.map(|info| MadeToken { info, token }))
}

/// Revokes the live token `name` of `tenant`; `None` when there is none.
pub async fn revoke_token(
    client: &impl GenericClient,
    name: &str,
    tenant: &str,
    reason: Option<&str>,
    actor: &str,
) -> Result<Option<TokenInfo>, AdminError> {
    Ok(tenants::revoke_token(client, name, tenant, actor, reason).await?)
}

/// Revokes the live token `name` of `tenant` and makes a new one with its
/// scope, operator flag and user, in one transaction; `None` when there is
/// no such live token.
pub async fn rotate_token(
    client: &mut Object,
    name: &str,
    tenant: &str,
    reason: &str,
    actor: &str,
) -> Result<Option<MadeToken>, AdminError> {
    let tx = client.transaction().await?;
    let Some(old) = tenants::revoke_token(&tx, name, tenant, actor, Some(reason)).await? else {
        return Ok(None);
    };
    let again = NewToken {
        name,
        tenant,
        scope: old.scope,
        operator: old.operator,
        user: old.user_id,
    };
    let (token, hash) = new_token();
    let Some(info) = tenants::create_token(&tx, again, &hash, actor).await? else {
        return Err(AdminError::Refused(format!(
            "tenant {tenant:?} vanished during the rotation"
        )));
    };
    tx.commit().await?;
    Ok(Some(MadeToken { info, token }))
}
