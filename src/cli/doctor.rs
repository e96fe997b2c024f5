//! `maasctl doctor`: one line per check, `ok`, `warn` or `FAIL`; exit 1 if
//! any check fails. The checks, in order:
//!
//! - database: reachable, and its version;
//! - schema: every migration applied, none changed;
//! - triggers: every trigger installed (the doorbell, the query log, callbacks);
//! - notify: a real NOTIFY round trip between two sessions, and the
//!   notification queue's fill level;
//! - daemons: how many `maasd` LISTEN sessions are connected (warn at none);
//! - claiming: warn while paused;
//! - leases: warn about expired leases nobody took back;
//! - callbacks: fail when deliveries wait and no secret is configured, warn
//!   about dead ones;
//! - producers: warn about producer roles (docs/deploying.md, "Producer
//!   roles") that may CREATE in a schema (a role chooses its own
//!   search_path) or use TEMP, and about those no mapping, or mappings of
//!   two tenants, cover (their inserts are refused);
//! - `llm.<role>`: the provider of each role is reachable (an authenticated
//!   request listing models); keys are never printed;
//! - embeddings: off, or the provider and model of `[llm.embedding]` (a
//!   local model's folder holds its files), and the turns the embedder has
//!   yet to embed (warn while any wait: those users' searches miss them).
//!
//! One function per group of checks, kept in the order they print;
//! most lines are what a check says when it warns or fails.

use std::path::Path;
use std::time::{Duration, Instant};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use futures_util::StreamExt;
use serde::Serialize;
use tokio_postgres::AsyncMessage;

use super::{CliError, Outcome, age, connect};
use crate::config::Config;
use crate::db;
use crate::llm::embed::EmbeddingProvider;
use crate::llm::{Llm, LlmConfig, ProviderKind, Role};
use crate::repo::{control, embeddings, stats, tenants};

const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
struct Check {
    name: String,
    level: Level,
    detail: String,
}

struct Report(Vec<Check>);

impl Report {
    fn add(&mut self, name: impl Into<String>, level: Level, detail: impl Into<String>) {
        self.0.push(Check {
            name: name.into(),
            level,
            detail: detail.into(),
        });
    }
}

pub async fn run(cfg: &Config, file: Option<&Path>, json: bool) -> Result<Outcome, CliError> {
    let mut r = Report(Vec::new());
    database_checks(cfg, &mut r).await;
    provider_checks(cfg, file, &mut r).await;
    embedding_checks(cfg, &mut r).await;
    let failed = r.0.iter().filter(|c| c.level == Level::Fail).count();
    if json {
        println!("{}", serde_json::json!({"ok": failed == 0, "checks": r.0}));
    } else {
        for c in &r.0 {
            let tag = match c.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{tag}  {:<18} {}", c.name, c.detail);
        }
        if failed > 0 {
            println!("{failed} check(s) failed");
        }
    }
    Ok(if failed == 0 { Outcome::Ok } else { Outcome::Finding })
}

/// The database, its schema and notifications; then, when the schema is
/// current, what its tables say.
async fn database_checks(cfg: &Config, r: &mut Report) {
    let Some(client) = reachable(cfg, r).await else {
        return;
    };
    let schema_ok = schema_checks(&client, r).await;
    notify_checks(cfg, &client, r).await;
    if !schema_ok {
        return; // the rest reads tables of the current schema
    }
    daemons_check(&client, r).await;
    claiming_check(&client, r).await;
    leases_check(&client, r).await;
    callbacks_check(cfg, &client, r).await;
    producers_check(&client, r).await;
}

/// A connection and the server's version, or `None` after a failed check.
async fn reachable(cfg: &Config, r: &mut Report) -> Option<deadpool_postgres::Object> {
    let started = Instant::now();
    let client = match connect(cfg).await {
        Ok(c) => c,
        Err(e) => {
            r.add("database", Level::Fail, format!("unreachable: {}", chain(&e)));
            return None;
        }
    };
    let version = stats::server_version(&client).await;
    match version {
        Ok(version) => r.add(
            "database",
            Level::Ok,
            format!("reachable: PostgreSQL {version} ({} ms)", started.elapsed().as_millis()),
        ),
        Err(e) => {
            r.add("database", Level::Fail, format!("query failed: {e}"));
            return None;
        }
    }
    Some(client)
}

/// Every migration applied and every trigger installed; true when the
/// schema is current.
async fn schema_checks(client: &deadpool_postgres::Object, r: &mut Report) -> bool {
    let mut schema_ok = false;
    match db::migrate::state(client).await {
        Ok(s) => {
            if s.current_version == s.latest_version {
                schema_ok = true;
                r.add("schema", Level::Ok, format!("version {} (current)", s.current_version));
            } else {
                r.add(
                    "schema",
                    Level::Fail,
                    format!(
                        "version {} of {}: run `maasctl migrate` (maasd also migrates at start)",
                        s.current_version, s.latest_version
                    ),
                );
            }
            if s.missing_triggers.is_empty() {
                r.add("triggers", Level::Ok, "installed");
            } else {
                r.add(
                    "triggers",
                    Level::Fail,
                    format!(
                        "missing: {} — run `maasctl migrate` to reinstall",
                        s.missing_triggers.join(", ")
                    ),
                );
            }
        }
        Err(e) => r.add("schema", Level::Fail, e.to_string()),
    }
    schema_ok
}

/// A NOTIFY round trip and the notification queue's fill level.
async fn notify_checks(cfg: &Config, client: &deadpool_postgres::Object, r: &mut Report) {
    match notify_round_trip(cfg, client).await {
        Ok(took) => r.add("notify", Level::Ok, format!("round trip in {} ms", took.as_millis())),
        Err(e) => r.add("notify", Level::Fail, e),
    }
    let usage = stats::notification_queue_usage(client).await;
    match usage {
        Ok(usage) => {
            let level = if usage >= 0.5 {
                Level::Fail
            } else if usage >= 0.1 {
                Level::Warn
            } else {
                Level::Ok
            };
            r.add(
                "notify queue",
                level,
                format!(
                    "{:.1} % full{}",
                    usage * 100.0,
                    if level == Level::Ok {
                        ""
                    } else {
                        " — a listening session is not consuming (a stuck LISTEN connection or long transaction)"
                    }
                ),
            );
        }
        Err(e) => r.add("notify queue", Level::Warn, format!("cannot read: {e}")),
    }
}

/// How many daemons listen (warn at none).
async fn daemons_check(client: &deadpool_postgres::Object, r: &mut Report) {
    match stats::daemons(client).await {
        Ok(d) if d.is_empty() => r.add(
            "daemons",
            Level::Warn,
            "no maasd is listening on this database: nothing will be processed",
        ),
        Ok(d) => r.add("daemons", Level::Ok, format!("{} maasd listening", d.len())),
        Err(e) => r.add("daemons", Level::Warn, format!("cannot read pg_stat_activity: {e}")),
    }
}

/// Warns while claiming is paused.
async fn claiming_check(client: &deadpool_postgres::Object, r: &mut Report) {
    match control::get(client).await {
        Ok(c) if c.paused => r.add(
            "claiming",
            Level::Warn,
            format!(
                "PAUSED {} ago by {}{} — `maasctl resume`",
                c.changed_at.map(|t| age(super::since(t))).unwrap_or_default(),
                c.changed_by.as_deref().unwrap_or("?"),
                c.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
            ),
        ),
        Ok(_) => r.add("claiming", Level::Ok, "active"),
        Err(e) => r.add("claiming", Level::Fail, e.to_string()),
    }
}

/// Warns about expired leases nobody took back.
async fn leases_check(client: &deadpool_postgres::Object, r: &mut Report) {
    match stats::leases(client).await {
        Ok(leases) => {
            let expired: i64 = leases.iter().map(|l| l.expired).sum();
            let held: i64 = leases.iter().map(|l| l.held).sum();
            if expired > 0 {
                r.add(
                    "leases",
                    Level::Warn,
                    format!(
                        "{expired} of {held} in-flight lease(s) expired and not yet taken back \
                         (a daemon died; a running maasd's sweep or `maasctl sweep` recovers them)"
                    ),
                );
            } else {
                r.add("leases", Level::Ok, format!("{held} in flight, none expired"));
            }
        }
        Err(e) => r.add("leases", Level::Warn, e.to_string()),
    }
}

/// Fails when deliveries wait and no secret is set; warns about dead ones.
async fn callbacks_check(cfg: &Config, client: &deadpool_postgres::Object, r: &mut Report) {
    match stats::callbacks(client).await {
        Ok(c) => {
            let no_secret = cfg.callbacks.secret.expose().is_empty();
            if c.pending > 0 && no_secret {
                r.add(
                    "callbacks",
                    Level::Fail,
                    format!(
                        "{} delivery(ies) waiting but callbacks.secret is not set (MAAS_CALLBACKS__SECRET): \
                         nothing is sent unsigned",
                        c.pending
                    ),
                );
            } else if c.dead > 0 {
                r.add(
                    "callbacks",
                    Level::Warn,
                    format!(
                        "{} dead (attempts exhausted), {} pending; see `maasctl requests show ID`",
                        c.dead, c.pending
                    ),
                );
            } else {
                r.add(
                    "callbacks",
                    Level::Ok,
                    format!(
                        "{} pending{}",
                        c.pending,
                        c.oldest_pending_secs
                            .map(|s| format!(", oldest {}", age(s)))
                            .unwrap_or_default()
                    ),
                );
            }
        }
        Err(e) => r.add("callbacks", Level::Warn, e.to_string()),
    }
}

/// Warns about producer roles that hold more than the producer grants
/// (CREATE in a schema, TEMP) or that no mapping, or two tenants', cover.
async fn producers_check(client: &deadpool_postgres::Object, r: &mut Report) {
    match tenants::producers(client).await {
        Ok(all) => match producer_findings(&all) {
            Some(said) => r.add("producers", Level::Warn, said),
            None => r.add(
                "producers",
                Level::Ok,
                format!(
                    "{} producer role(s), each covered by one tenant's mapping, none may CREATE or use TEMP",
                    all.len()
                ),
            ),
        },
        Err(e) => r.add("producers", Level::Warn, e.to_string()),
    }
}

/// What `producers_check` says of the producer roles `all`, one finding
/// per kind, each naming its roles; `None` when nothing.
fn producer_findings(all: &[tenants::Producer]) -> Option<String> {
    let names =
        |f: &dyn Fn(&tenants::Producer) -> Option<String>| -> Vec<String> { all.iter().filter_map(f).collect() };
    let unmapped = names(&|p| p.tenants.is_empty().then(|| p.role.clone()));
    let two = names(&|p| (p.tenants.len() > 1).then(|| format!("{} ({})", p.role, p.tenants.join(", "))));
    let in_maas = names(&|p| p.creates_in.contains(&p.maas_schema).then(|| p.role.clone()));
    let elsewhere = names(&|p| {
        let other: Vec<&str> = p
            .creates_in
            .iter()
            .filter(|s| **s != p.maas_schema)
            .map(String::as_str)
            .collect();
        (!other.is_empty()).then(|| format!("{} (in {})", p.role, other.join(", ")))
    });
    let temp = names(&|p| p.temp.then(|| p.role.clone()));
    let schema = all.first().map(|p| p.maas_schema.as_str()).unwrap_or_default();
    let said: Vec<String> = [
        (
            unmapped,
            "mapped to no tenant, so their inserts are refused (maasctl tenants grant)".to_owned(),
        ),
        (
            two,
            "covered by mappings of two tenants, so their inserts are refused".to_owned(),
        ),
        (
            in_maas,
            format!("may CREATE in maas's own schema {schema}, so they could shadow what maas runs (REVOKE CREATE)"),
        ),
        (
            elsewhere,
            "may CREATE in a schema (a role sets its own search_path; REVOKE CREATE)".to_owned(),
        ),
        (
            temp,
            "may create TEMP tables here (REVOKE TEMP ON DATABASE … FROM PUBLIC, and from them)".to_owned(),
        ),
    ]
    .into_iter()
    .filter(|(roles, _)| !roles.is_empty())
    .map(|(roles, what)| format!("producer roles {what}: {}", roles.join(", ")))
    .collect();
    (!said.is_empty()).then(|| said.join("; "))
}

/// LISTEN on a private channel in a dedicated session, NOTIFY from the
/// pooled one, and wait for delivery: the same path the daemons' doorbell
/// takes (and fails the same way behind a transaction-mode PgBouncer).
async fn notify_round_trip(cfg: &Config, sender: &deadpool_postgres::Object) -> Result<Duration, String> {
    let pg = db::pg_config(cfg.listen_url(), "maasctl-doctor").map_err(|e| e.to_string())?;
    let tls = db::tls::connector(cfg.listen_url()).map_err(|e| e.to_string())?;
    let (client, mut conn) = pg
        .connect(tls)
        .await
        .map_err(|e| format!("cannot open a LISTEN session: {}", chain(&e)))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(msg)) = messages.next().await {
            if let AsyncMessage::Notification(n) = msg
                && tx.send((n.channel().to_owned(), n.payload().to_owned())).is_err()
            {
                return;
            }
        }
    });
    let channel = format!("maas_doctor_{}", uuid::Uuid::new_v4().simple());
    let token = uuid::Uuid::new_v4().to_string();
    let result = async {
        stats::listen(&client, &channel)
            .await
            .map_err(|e| format!("LISTEN failed: {e}"))?;
        let started = Instant::now();
        stats::notify(sender, &channel, &token)
            .await
            .map_err(|e| format!("NOTIFY failed: {e}"))?;
        let deadline = tokio::time::Instant::now() + NOTIFY_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((c, p))) if c == channel && p == token => return Ok(started.elapsed()),
                Ok(Some(_)) => continue,
                Ok(None) => return Err("the LISTEN session closed before the notification arrived".to_owned()),
                Err(_) => {
                    return Err(format!(
                        "no notification within {} s (is the URL going through a transaction-mode \
                         PgBouncer? LISTEN needs a direct connection)",
                        NOTIFY_TIMEOUT.as_secs()
                    ));
                }
            }
        }
    }
    .await;
    drop(client);
    driver.abort();
    result
}

/// The `[llm]` section, read the way the daemon's configuration is (file,
/// then `MAAS_LLM__*` variables).
fn llm_section(file: Option<&Path>) -> Result<LlmConfig, String> {
    let mut fig = Figment::new();
    if let Some(path) = file {
        fig = fig.merge(Toml::file(path));
    }
    fig.focus("llm")
        .merge(Env::prefixed("MAAS_LLM__").split("__"))
        .extract::<LlmConfig>()
        .map_err(|e| e.to_string())
}

async fn provider_checks(cfg: &Config, file: Option<&Path>, r: &mut Report) {
    let llm = match llm_section(file).and_then(|c| Llm::from_config(&c, &cfg.llm_provider).map_err(|e| e.to_string())) {
        Ok(l) => l,
        Err(e) => {
            r.add("llm", Level::Fail, format!("configuration: {e}"));
            return;
        }
    };
    let http = match reqwest::Client::builder()
        .timeout(PROVIDER_TIMEOUT)
        .connect_timeout(PROVIDER_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            r.add("llm", Level::Fail, format!("cannot build an HTTP client: {e}"));
            return;
        }
    };
    // One probe per provider endpoint, however many roles share it.
    let mut probed: Vec<(ProviderKind, String, Level, String)> = Vec::new();
    for role in Role::ALL {
        let s = llm.settings(role);
        let name = format!("llm.{role}");
        let Some(endpoint) = &s.endpoint else {
            r.add(
                name,
                Level::Ok,
                format!("{} (model {}, no network)", s.provider, s.model),
            );
            continue;
        };
        let shown = redact_url(&endpoint.base_url);
        if let Some((_, _, level, detail)) = probed
            .iter()
            .find(|(p, b, _, _)| *p == s.provider && *b == endpoint.base_url)
        {
            r.add(
                name,
                *level,
                format!("{} {shown} (model {}): {detail}", s.provider, s.model),
            );
            continue;
        }
        let (level, detail) = probe(&http, s.provider, &endpoint.base_url, endpoint.api_key.expose()).await;
        r.add(
            &name,
            level,
            format!("{} {shown} (model {}): {detail}", s.provider, s.model),
        );
        probed.push((s.provider, endpoint.base_url.clone(), level, detail));
    }
}

/// `[llm.embedding]`: off, or its provider and model, and the backlog of
/// turns to embed. A local model's files are looked for, not loaded (that
/// takes the daemon a second and 100 MB).
async fn embedding_checks(cfg: &Config, r: &mut Report) {
    const NAME: &str = "embeddings";
    let settings = match crate::llm::embed::settings(&cfg.llm) {
        Ok(Some(s)) => s,
        Ok(None) => match cfg.llm.embedding.fallback_note(&|name| std::env::var(name).ok()) {
            Some(note) => return r.add(NAME, Level::Warn, note),
            None => return r.add(NAME, Level::Ok, "off (the memory search is full text alone)"),
        },
        Err(e) => {
            r.add(NAME, Level::Fail, format!("configuration: {e}"));
            return;
        }
    };
    let what = format!("{} (model {})", settings.provider.name(), settings.model);
    if let EmbeddingProvider::Local(dir) = &settings.provider {
        let missing = crate::llm::embed::missing_model_files(dir);
        if !missing.is_empty() {
            r.add(
                NAME,
                Level::Fail,
                format!(
                    "{what}: {} missing in {} (llm.embedding.model_dir): maasd will not start",
                    missing.join(", "),
                    dir.display()
                ),
            );
            return;
        }
    }
    let backlog = match connect(cfg).await {
        Ok(client) => embeddings::backlog(&client, &settings.model)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(chain(&e)),
    };
    match backlog {
        Ok(b) if b.turns == 0 => r.add(NAME, Level::Ok, format!("{what}: every turn embedded")),
        Ok(b) => r.add(
            NAME,
            Level::Warn,
            format!(
                "{what}: {} turn(s) of {} user(s) not embedded yet — maasd's embedder works through them \
                 (maas_embedder_turns_total); until then the search finds those turns by full text only",
                b.turns, b.users
            ),
        ),
        Err(e) => r.add(NAME, Level::Warn, format!("{what}: cannot read the backlog: {e}")),
    }
}

/// An authenticated GET of the provider's model list: reachable and the key
/// accepted is `ok`; a rejected key or no answer is `FAIL`; any other HTTP
/// answer means the endpoint is there (some compatible servers have no
/// model list), so `ok` with the status.
async fn probe(http: &reqwest::Client, provider: ProviderKind, base: &str, key: &str) -> (Level, String) {
    let req = match provider {
        ProviderKind::OpenAi => http.get(format!("{base}/models")).bearer_auth(key),
        ProviderKind::Anthropic => http
            .get(format!("{base}/v1/models"))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01"),
        ProviderKind::Gemini => http.get(format!("{base}/v1beta/models")).header("x-goog-api-key", key),
        ProviderKind::Offline => return (Level::Ok, "no network".into()),
    };
    let started = Instant::now();
    match req.send().await {
        Ok(resp) => {
            let status = resp.status();
            let ms = started.elapsed().as_millis();
            if status.is_success() {
                (Level::Ok, format!("reachable, key accepted ({ms} ms)"))
            } else if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
                (
                    Level::Fail,
                    format!("reachable but the key was rejected (HTTP {status})"),
                )
            } else {
                (
                    Level::Ok,
                    format!("reachable (HTTP {status} for the model list, {ms} ms)"),
                )
            }
        }
        Err(e) => {
            let e = e.without_url();
            let kind = if e.is_timeout() {
                format!("no answer within {} s", PROVIDER_TIMEOUT.as_secs())
            } else {
                format!("unreachable: {}", chain(&e))
            };
            // Error text never holds the key (it travels in a header), but
            // scrub it anyway in case a server echoes it.
            (Level::Fail, kind.replace(key, "[REDACTED]"))
        }
    }
}

/// The URL without user or password.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string().trim_end_matches('/').to_owned()
        }
        Err(_) => "(invalid URL)".into(),
    }
}

use crate::error::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("https://u:p@api.example.com/v1"),
            "https://api.example.com/v1"
        );
        assert_eq!(redact_url("http://127.0.0.1:9/v1/"), "http://127.0.0.1:9/v1");
        assert_eq!(redact_url("nonsense"), "(invalid URL)");
    }
}
