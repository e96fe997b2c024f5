//! `maasctl tenants add|list|set|grant|revoke|roles` and `maasctl tokens
//! create|list|rotate|revoke`: the arguments parsed, the action done by
//! [`crate::control::tenants`] (which keeps the rules below), the result
//! printed.
//!
//! What the commands guarantee:
//! - `tenants grant` (and `tenants add --role`) maps a database role to a
//!   tenant: that role's plain INSERTs into `pipeline_runs` and `raw_logs`
//!   are the tenant's (docs/deploying.md, "Producer roles"). A role that
//!   may UPDATE `pipeline_runs` is refused: it is trusted to name any
//!   tenant. `add --role` adds the tenant and maps its roles in one
//!   transaction.
//!   A mapping covers the role and its members with INHERIT; `tenants
//!   roles` lists the login roles each one covers.
//! - `tenants revoke` removes a role's mapping: the role then inserts for
//!   another mapping that covers it, or for none (its inserts refused, it
//!   reads nothing), which it says. All the roles named, or none.
//! - A token is 32 random bytes, hex, after the prefix `maas_`; only its
//!   SHA-256 is stored. `create` and `rotate` print it once; nothing prints
//!   it again.
//! - `revoke` takes effect in every daemon within the token cache period
//!   (5 s, `http::tenancy::TOKEN_TTL`); `rotate` revokes the live token of
//!   that name and creates a new one with the same scope, in one
//!   transaction (the operator flag too).
//! - `create --all-tenants` makes an operator token, which the console
//!   shows every tenant;
//!   without it a console session sees only the token's tenant.
//! - Every change writes its `operator_actions` row in the statement that
//!   makes it (never the token, its hash or a callback secret).

use chrono::{DateTime, Utc};
use clap::Subcommand;

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::control::tenants as control;
use crate::model::Scope;
use crate::repo::tenants::{self, NewToken, Tenant, TenantChange, TokenInfo};

#[derive(Subcommand, Debug)]
pub enum TenantsCommand {
    /// Add a tenant (its users are a namespace of their own).
    Add {
        /// Lower-case letters, digits, `_`, `.`, `-`; at most 63.
        name: String,
        /// Submissions per rolling minute (default: unlimited).
        #[arg(long)]
        requests_per_minute: Option<i32>,
        /// Requests not yet finished (default: unlimited).
        #[arg(long)]
        max_in_flight: Option<i32>,
        /// Signs this tenant's callbacks instead of `callbacks.secret`
        /// (16 to 512 characters).
        #[arg(long)]
        callback_secret: Option<String>,
        /// A database role whose INSERTs are this tenant's (repeatable; see
        /// `tenants grant`).
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
        /// Reads the callback secret from this file, or stdin with `-`
        /// (so that it is not on the command line).
        #[arg(long, value_name = "PATH|-", conflicts_with = "callback_secret")]
        callback_secret_file: Option<std::path::PathBuf>,
    },
    /// Every tenant with its limits (never the callback secret).
    List,
    /// Map database roles to a tenant: their plain INSERTs into
    /// pipeline_runs and raw_logs are then that tenant's.
    Grant {
        /// The tenant (`default` for the default tenant).
        name: String,
        /// A database role (repeatable); one mapped before is moved.
        #[arg(long = "role", value_name = "ROLE", required = true)]
        roles: Vec<String>,
    },
    /// Remove database roles' mapping to their tenant: a role no mapping
    /// covers inserts nothing and reads nothing.
    Revoke {
        /// A database role (repeatable).
        #[arg(long = "role", value_name = "ROLE", required = true)]
        roles: Vec<String>,
    },
    /// Every database role mapped to a tenant, with the login roles it
    /// covers.
    Roles,
    /// Change a tenant's limits, callback secret or person-in-the-loop
    /// settings; `none` clears one.
    Set {
        name: String,
        #[command(flatten)]
        hitl: HitlArgs,
        #[arg(long, value_name = "N|none")]
        requests_per_minute: Option<String>,
        #[arg(long, value_name = "N|none")]
        max_in_flight: Option<String>,
        #[arg(long, value_name = "SECRET|none")]
        callback_secret: Option<String>,
        /// Reads the callback secret from this file, or stdin with `-`.
        #[arg(long, value_name = "PATH|-", conflicts_with = "callback_secret")]
        callback_secret_file: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokensCommand {
    /// Create a token and print it (once).
    Create {
        /// A name for the token, unique among the tenant's live tokens.
        name: String,
        /// The tenant (default: the default tenant).
        #[arg(long, default_value = "default")]
        tenant: String,
        /// submit, read, operate or admin (see docs/deploying.md, "Scopes").
        #[arg(long, value_parser = scope_named)]
        scope: Scope,
        /// An operator token: the console shows it every tenant's
        /// requests, users and the engine's state; without it, only its own
        /// tenant's. (`--operator` names the acting operator.)
        #[arg(long)]
        all_tenants: bool,
        /// Bind the token to this user of its tenant (the tenant's own
        /// user id): it acts for that user only, on every door (HTTP, MCP);
        /// any other user id is refused.
        #[arg(long)]
        user: Option<uuid::Uuid>,
    },
    /// Tokens (never the token itself).
    List {
        /// Revoked tokens too.
        #[arg(long)]
        all: bool,
    },
    /// Revoke the live token NAME and create a new one with its scope; print it.
    Rotate {
        name: String,
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Why (recorded).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Revoke the live token NAME (refused by every daemon within 5 s).
    Revoke {
        name: String,
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Why (recorded).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `--scope`: exactly one of the scopes' names.
/// The person-in-the-loop settings of `tenants set` (the tenant's
/// `hitl_*` columns, sql/0037_person_in_the_loop.sql).
#[derive(clap::Args, Debug, Default)]
pub struct HitlArgs {
    /// May the analyzer ask the user a question before it goes on, for
    /// the requests that do not say (on|off; default off).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    clarify: Option<bool>,
    /// Must an operator review each answer, for the requests that do not
    /// say (on|off; default off).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    review: Option<bool>,
    /// How long a question waits for its reply (90s, 15m, 2h, 3d), or none.
    #[arg(long, value_name = "DURATION|none")]
    user_reply_timeout: Option<String>,
    /// How long an answer waits for its review, or none.
    #[arg(long, value_name = "DURATION|none")]
    review_timeout: Option<String>,
    /// When no reply came in time: answer without it, or fail.
    #[arg(long, value_parser = ["answer", "fail"])]
    on_reply_timeout: Option<String>,
    /// When no review came in time: deliver the answer as it is, or fail.
    #[arg(long, value_parser = ["answer", "fail"])]
    on_review_timeout: Option<String>,
}

fn on_off(v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{v:?}: expected on or off")),
    }
}

/// A timeout flag: a duration, or `none` (no limit).
fn timeout(flag: &str, v: &str) -> Result<Option<std::time::Duration>, CliError> {
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match super::parse_duration(v) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        Ok(_) => Err(CliError::Usage(format!(
            "--{flag} 0: a limit must be positive, or none"
        ))),
        Err(e) => Err(CliError::Usage(format!("--{flag} {v}: {e}"))),
    }
}

impl HitlArgs {
    fn change(&self) -> Result<tenants::HitlChange<'_>, CliError> {
        Ok(tenants::HitlChange {
            clarify: self.clarify,
            review: self.review,
            user_reply_timeout: self
                .user_reply_timeout
                .as_deref()
                .map(|v| timeout("user-reply-timeout", v))
                .transpose()?,
            review_timeout: self
                .review_timeout
                .as_deref()
                .map(|v| timeout("review-timeout", v))
                .transpose()?,
            on_reply_timeout: self.on_reply_timeout.as_deref(),
            on_review_timeout: self.on_review_timeout.as_deref(),
        })
    }
}

/// `tenants set`: the limits and secret of `change`, then the
/// person-in-the-loop settings of `hitl` when it gives any.
async fn set(
    cfg: &Config,
    name: &str,
    change: &TenantChange<'_>,
    hitl: &HitlArgs,
    actor: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let hitl = hitl.change()?;
    let client = connect(cfg).await?;
    let Some(t) = control::set_tenant(&client, name, change, actor).await? else {
        eprintln!("no tenant {name:?}");
        return Ok(Outcome::Finding);
    };
    let h = if hitl.is_empty() {
        None
    } else {
        tenants::set_hitl(&client, name, &hitl, actor)
            .await
            .map_err(|e| CliError::Usage(format!("tenant {name}: {e}")))?
    };
    match (json, h) {
        (true, Some(h)) => println!("{}", serde_json::json!({"tenant": t, "hitl": h})),
        (true, None) => println!("{}", serde_json::to_string(&t).unwrap_or_default()),
        (false, Some(h)) => println!("{}\n{}", show_tenant(&t), show_hitl(&h)),
        (false, None) => println!("{}", show_tenant(&t)),
    }
    Ok(Outcome::Ok)
}

/// One line of a tenant's person-in-the-loop settings.
fn show_hitl(h: &tenants::HitlSettings) -> String {
    let limit = |s: Option<f64>| s.map_or_else(|| "no limit".to_owned(), |s| format!("{s} s"));
    format!(
        "person in the loop: clarify {}, reply within {} then {}; review {}, within {} then {}",
        if h.hitl_clarify { "on" } else { "off" },
        limit(h.user_reply_timeout_secs),
        h.on_reply_timeout,
        if h.hitl_review { "on" } else { "off" },
        limit(h.review_timeout_secs),
        h.on_review_timeout
    )
}

fn scope_named(name: &str) -> Result<Scope, String> {
    Scope::from_name(name).ok_or_else(|| format!("one of {}", Scope::NAMES.join(", ")))
}

/// `N` or `none`.
fn limit(flag: &str, v: &str) -> Result<Option<i32>, CliError> {
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    v.parse::<i32>()
        .ok()
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| CliError::Usage(format!("--{flag} {v:?}: expected a positive number or none")))
}

/// The callback secret given inline or read from a file (`-`: stdin), its
/// line break at the end dropped.
fn secret_given(inline: Option<String>, file: Option<std::path::PathBuf>) -> Result<Option<String>, CliError> {
    let Some(path) = file else {
        return Ok(inline);
    };
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(&path)
    }
    .map_err(|e| CliError::Usage(format!("--callback-secret-file {}: {e}", path.display())))?;
    Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()))
}

fn show_tenant(t: &Tenant) -> String {
    let lim = |v: Option<i32>| v.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    format!(
        "{:<24} {:>12} {:>12}  {:<6} {}",
        t.name,
        lim(t.requests_per_minute),
        lim(t.max_in_flight),
        if t.has_callback_secret { "own" } else { "config" },
        t.id
    )
}

/// `tenants grant`: maps `roles` to tenant `name`, all or none.
async fn grant(cfg: &Config, name: &str, roles: &[String], actor: &str, json: bool) -> Result<Outcome, CliError> {
    control::grant(&mut connect(cfg).await?, name, roles, actor).await?;
    if json {
        println!("{}", serde_json::json!({ "tenant": name, "roles": roles }));
    } else {
        for role in roles {
            println!("role {role} inserts for tenant {name}");
        }
    }
    Ok(Outcome::Ok)
}

/// `tenants revoke`: removes the mapping of every one of `roles`, or of
/// none (a role mapped to no tenant is an error naming it).
async fn revoke(cfg: &Config, roles: &[String], actor: &str, json: bool) -> Result<Outcome, CliError> {
    let done = control::revoke(&mut connect(cfg).await?, roles, actor).await?;
    if json {
        let revoked: Vec<_> = done
            .iter()
            .map(|(role, r)| {
                serde_json::json!({ "role": role, "tenant": r.tenant, "still_covered_by": r.still_covered_by })
            })
            .collect();
        println!("{}", serde_json::json!({ "revoked": revoked }));
    } else {
        for (role, r) in &done {
            println!("{}", revoked_line(role, r));
        }
    }
    Ok(Outcome::Ok)
}

/// What `tenants revoke` says of `role` once its mapping is gone.
fn revoked_line(role: &str, r: &tenants::RoleRevoke) -> String {
    let tenant = r.tenant.as_deref().unwrap_or_default();
    if !r.still_covered_by.is_empty() {
        format!(
            "role {role} is no longer mapped to tenant {tenant}; it still inserts through {}",
            r.still_covered_by.join(", ")
        )
    } else if r.still_producing {
        format!(
            "role {role} no longer inserts for tenant {tenant}: mapped to no tenant, its inserts are refused \
             and maas_my_requests shows it nothing (REVOKE its grants to retire it)"
        )
    } else {
        format!("role {role} no longer inserts for tenant {tenant}")
    }
}

/// `tenants roles`: every mapped role, with the login roles it covers.
async fn list_roles(cfg: &Config, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let all = tenants::roles(&client).await?;
    if json {
        println!("{}", serde_json::to_string(&all).unwrap_or_default());
        return Ok(Outcome::Ok);
    }
    println!("{:<24} {:<32} {:<20} covers (login roles)", "tenant", "role", "since");
    for r in &all {
        let covers = if !r.role_exists {
            "none: the role was dropped".to_owned()
        } else if r.covers.is_empty() {
            "none yet (no login role is it or its member with INHERIT)".to_owned()
        } else {
            r.covers
                .iter()
                .map(|c| {
                    if r.refused.contains(c) {
                        format!("{c} (refused: another tenant's role covers it too)")
                    } else {
                        c.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{:<24} {:<32} {:<20} {covers}",
            r.tenant,
            r.role,
            r.created_at.format("%Y-%m-%d %H:%M:%S").to_string()
        );
    }
    Ok(Outcome::Ok)
}

pub async fn tenants(cfg: &Config, cmd: TenantsCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    let done = match cmd {
        TenantsCommand::Add {
            name,
            requests_per_minute,
            max_in_flight,
            callback_secret,
            roles,
            callback_secret_file,
        } => {
            let secret = secret_given(callback_secret, callback_secret_file)?;
            let new = control::NewTenant {
                name: &name,
                requests_per_minute,
                max_in_flight,
                callback_secret: secret.as_deref(),
                roles: &roles,
            };
            control::add_tenant(&mut connect(cfg).await?, new, actor).await?
        }
        TenantsCommand::Grant { name, roles } => return grant(cfg, &name, &roles, actor, json).await,
        TenantsCommand::Revoke { roles } => return revoke(cfg, &roles, actor, json).await,
        TenantsCommand::Roles => return list_roles(cfg, json).await,
        TenantsCommand::List => {
            let all = tenants::list(&connect(cfg).await?).await?;
            if json {
                println!("{}", serde_json::to_string(&all).unwrap_or_default());
            } else {
                println!(
                    "{:<24} {:>12} {:>12}  {:<6} id",
                    "name", "req/minute", "in flight", "secret"
                );
                for t in &all {
                    println!("{}", show_tenant(t));
                }
            }
            return Ok(Outcome::Ok);
        }
        TenantsCommand::Set {
            name,
            hitl,
            requests_per_minute,
            max_in_flight,
            callback_secret,
            callback_secret_file,
        } => {
            let callback_secret = secret_given(callback_secret, callback_secret_file)?;
            let change = TenantChange {
                requests_per_minute: requests_per_minute
                    .map(|v| limit("requests-per-minute", &v))
                    .transpose()?,
                max_in_flight: max_in_flight.map(|v| limit("max-in-flight", &v)).transpose()?,
                callback_secret: callback_secret
                    .as_deref()
                    .map(|s| (!s.eq_ignore_ascii_case("none")).then_some(s)),
            };
            return set(cfg, &name, &change, &hitl, actor, json).await;
        }
    };
    if json {
        println!("{}", serde_json::to_string(&done).unwrap_or_default());
    } else {
        println!("{}", show_tenant(&done));
    }
    Ok(Outcome::Ok)
}

fn print_token(info: &TokenInfo, token: &str, json: bool) {
    if json {
        let mut v = serde_json::to_value(info).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("token".into(), token.into());
        }
        println!("{v}");
    } else {
        println!("{token}");
        eprintln!(
            "token {:?} of tenant {} with scope {}{} (id {}): shown once, keep it now",
            info.name,
            info.tenant,
            info.scope,
            match (info.operator, info.user_id) {
                (true, _) => ", operator".to_owned(),
                (false, Some(u)) => format!(", user {u}"),
                (false, None) => String::new(),
            },
            info.id
        );
    }
}

pub async fn tokens(cfg: &Config, cmd: TokensCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    let mut client = connect(cfg).await?;
    match cmd {
        TokensCommand::Create {
            name,
            tenant,
            scope,
            all_tenants,
            user,
        } => {
            let t = NewToken {
                name: &name,
                tenant: &tenant,
                scope,
                operator: all_tenants,
                user,
            };
            create_token(&client, t, actor, json).await
        }
        TokensCommand::List { all } => list_tokens(&client, all, json).await,
        TokensCommand::Revoke { name, tenant, reason } => {
            revoke_token(&client, &name, &tenant, reason.as_deref(), actor, json).await
        }
        TokensCommand::Rotate { name, tenant, reason } => {
            let reason = reason.unwrap_or_else(|| "rotated".to_owned());
            rotate_token(&mut client, &name, &tenant, &reason, actor, json).await
        }
    }
}

/// `tokens create`: a new token, printed once.
async fn create_token(
    client: &deadpool_postgres::Client,
    t: NewToken<'_>,
    actor: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let Some(made) = control::create_token(client, t, actor).await? else {
        eprintln!("no tenant {:?} (maasctl tenants list)", t.tenant);
        return Ok(Outcome::Finding);
    };
    print_token(&made.info, &made.token, json);
    Ok(Outcome::Ok)
}

/// `tokens list`: live tokens, with `all` revoked ones too.
async fn list_tokens(client: &deadpool_postgres::Client, all: bool, json: bool) -> Result<Outcome, CliError> {
    let list = tenants::list_tokens(client, all).await?;
    if json {
        println!("{}", serde_json::to_string(&list).unwrap_or_default());
        return Ok(Outcome::Ok);
    }
    println!(
        "{:>5} {:<24} {:<16} {:<8} {:<8} {:<20} state",
        "id", "name", "tenant", "scope", "operator", "last used"
    );
    let stamp = |a: DateTime<Utc>| a.format("%Y-%m-%d %H:%M:%S").to_string();
    for t in &list {
        let used = t.last_used_at.map_or_else(|| "never".to_owned(), stamp);
        let state = t
            .revoked_at
            .map_or_else(|| "live".to_owned(), |a| format!("revoked {}", stamp(a)));
        println!(
            "{:>5} {:<24} {:<16} {:<8} {:<8} {used:<20} {state}",
            t.id,
            t.name,
            t.tenant,
            t.scope,
            if t.operator { "yes" } else { "" }
        );
    }
    Ok(Outcome::Ok)
}

/// `tokens revoke`: the live token `name` of `tenant`.
async fn revoke_token(
    client: &deadpool_postgres::Client,
    name: &str,
    tenant: &str,
    reason: Option<&str>,
    actor: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    match control::revoke_token(client, name, tenant, reason, actor).await? {
        Some(info) if json => println!("{}", serde_json::to_string(&info).unwrap_or_default()),
        Some(info) => println!(
            "revoked token {:?} of tenant {} (id {}); every daemon refuses it within 5 s",
            info.name, info.tenant, info.id
        ),
        None => {
            eprintln!("no live token {name:?} of tenant {tenant:?}");
            return Ok(Outcome::Finding);
        }
    }
    Ok(Outcome::Ok)
}

/// `tokens rotate`: revokes the live token `name` of `tenant` and creates
/// a new one with its scope, in one transaction; prints the new one.
async fn rotate_token(
    client: &mut deadpool_postgres::Client,
    name: &str,
    tenant: &str,
    reason: &str,
    actor: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let Some(made) = control::rotate_token(client, name, tenant, reason, actor).await? else {
        eprintln!("no live token {name:?} of tenant {tenant:?}");
        return Ok(Outcome::Finding);
    };
    print_token(&made.info, &made.token, json);
    Ok(Outcome::Ok)
}
