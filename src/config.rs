//! Typed settings, loaded and validated once.
//!
//! Layers, later wins: built-in defaults → the TOML file named by `--config`
//! or `MAAS_CONFIG` → `MAAS_`-prefixed environment variables (nested keys
//! with `__`, e.g. `MAAS_CONCURRENCY__RESPOND=64`) → `DATABASE_URL`.
//! Raw keys carry their unit (`lease_secs`); the program uses `Duration`.
//!
//! Fixed names other tools rely on: `DATABASE_URL`, `MAAS_HTTP_ADDR`,
//! `MAAS_API_TOKENS`, `MAAS_LLM_PROVIDER`, `MAAS_LEASE_SECS`, `MAAS_SWEEP_SECS`.
//!
//! Sections with no tie to the loading live beside this file
//! (`config/archivist.rs`, `config/http.rs`) and import nothing of the crate
//! outside this module (only its `secs_getters!`, which declares the
//! `Duration` getters of whole-seconds keys).
//! This file is over 500 lines only by its tests (about 200); the code is
//! under 500.
//!
//! The code is one loader; its tests (every key's validation and the
//! environment overrides) are in `config/tests.rs`.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::llm::LlmConfig;
use crate::model::StageKind;
pub use crate::secret::Secret;

mod archivist;
mod db;
mod http;
pub mod netallow;
pub mod pgtls;

/// Declares getters that read whole-seconds fields as `Duration`s, from one
/// list of `getter: field`.
macro_rules! secs_getters {
    ($ty:ty { $($(#[$meta:meta])* $getter:ident: $field:ident),+ $(,)? }) => {
        impl $ty {
            $(
                $(#[$meta])*
                pub fn $getter(&self) -> std::time::Duration {
                    std::time::Duration::from_secs(self.$field)
                }
            )+
        }
    };
}
use secs_getters;

/// Delay before retry number `attempt` (1-based) of a section with
/// `retry_base_ms` and `retry_max_secs`: exponential, capped, with jitter
/// in [½, 1].
fn retry_delay(base_ms: u64, max_secs: u64, attempt: u32) -> Duration {
    crate::backoff::retry_delay(Duration::from_millis(base_ms), Duration::from_secs(max_secs), attempt)
}

/// The error of setting `key`, which has `problem`.
fn invalid(key: &'static str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key,
        problem: problem.to_owned(),
    })
}

/// The first of `settings` that is 0, as an error.
fn at_least_one(settings: &[(&'static str, u64)]) -> Result<(), ConfigError> {
    match settings.iter().find(|(_, v)| *v == 0) {
        Some((key, _)) => invalid(key, "must be at least 1"),
        None => Ok(()),
    }
}
mod memory;
pub use archivist::{ArchivistConfig, cron_schedule};
pub use db::{DbConfig, Pooler};
pub use http::{HttpAddr, HttpConfig, exposed_without_tokens, is_loopback};
pub use memory::MemoryConfig;

/// Everything `maasd` and `maasctl` read from configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// PostgreSQL connection string. Required (no default): `DATABASE_URL`.
    pub database_url: Secret,
    /// Connection string of the LISTEN session only, when it must bypass a
    /// transaction-mode pooler (PgBouncer) that `database_url` goes through.
    /// Default: `database_url`. `MAAS_LISTEN_DATABASE_URL`.
    pub listen_database_url: Secret,
    /// Address of the HTTP server. Default `127.0.0.1:8080`; port 0 picks a
    /// free port; `:PORT` means `127.0.0.1:PORT`. A host name is resolved at
    /// start. `MAAS_HTTP_ADDR`.
    pub http_addr: String,
    /// Bearer tokens accepted on every `/api` route. Default: none, and then
    /// the server refuses to bind anything but a loopback address (anyone who
    /// can reach it could submit queries and read answers). In the file a
    /// list; in the environment a comma-separated string:
    /// `MAAS_API_TOKENS=tok1,tok2`. Never logged.
    #[serde(deserialize_with = "tokens")]
    pub api_tokens: Vec<Secret>,
    /// The HTTP server's limits.
    pub http: HttpConfig,
    /// Provider for every LLM role the file does not set: `offline` (default),
    /// `openai`, `anthropic` or `gemini`. `MAAS_LLM_PROVIDER`.
    pub llm_provider: String,
    /// How long a claim holds a row before the sweep may take it back.
    /// Heartbeats renew it every third of this. Default 30. `MAAS_LEASE_SECS`.
    pub lease_secs: u64,
    /// Interval of the catch-up sweep: a due row is worked on within this
    /// time even if every notification was lost. Default 5. `MAAS_SWEEP_SECS`.
    pub sweep_secs: u64,
    /// The engine counts as wedged (and the systemd watchdog is no longer
    /// fed) when a claim runs longer than this, a dispatcher does not
    /// answer the sweep's wake within it, or the sweep finishes no pass for
    /// its interval plus this. Default 120.
    pub engine_stall_secs: u64,
    /// Attempts per stage before a request is `FAILED`. Default 3.
    pub max_attempts: u32,
    /// First retry delay after a retryable failure; doubles per attempt with
    /// jitter. Default 1000.
    pub retry_base_ms: u64,
    /// Upper bound of a retry delay. Default 300.
    pub retry_max_secs: u64,
    /// Longest a single stage attempt may run before it counts as a timeout.
    /// Default 300.
    pub stage_timeout_secs: u64,
    /// On SIGTERM/SIGINT, how long running stages may finish before their
    /// leases are released. Default 20.
    pub grace_secs: u64,
    /// Size of the engine's connection pool: claims, heartbeats, result
    /// writes, the sweep and background services (the LISTEN session and
    /// the HTTP API's pool, `db.api_pool_size`, are extra). Default 16.
    pub pool_size: usize,
    /// Session timeouts and the API's pool (`[db]`, see [`DbConfig`]).
    pub db: DbConfig,
    /// Most rows one claim statement takes. Default 128.
    pub claim_batch: usize,
    /// Most results one completion statement writes. Default 512.
    pub complete_batch: usize,
    /// Stage executions at once, per stage.
    pub concurrency: Concurrency,
    /// The LISTEN session.
    pub listener: ListenerConfig,
    /// The analyzer reads this many of the user's most recent memory
    /// records. Default 20.
    pub memory_records: usize,
    /// Token budget of the assembled context (counted with the responder
    /// model's tokenizer, or a conservative estimate). The history is cut
    /// first, the query never. Default 16000.
    pub context_max_tokens: usize,
    /// How long the active prompts are cached before they are read again.
    /// Default 5.
    pub prompt_cache_secs: u64,
    /// The LLM roles and providers (`[llm]`, see `llm::LlmConfig`).
    #[serde(skip_serializing)]
    pub llm: LlmConfig,
    /// Callback deliveries to a run's `callback_url`.
    pub callbacks: CallbacksConfig,
    /// Deleting finished runs after a while.
    pub retention: RetentionConfig,
    /// The archivist's schedule, thresholds and budgets (`[archivist]`, see
    /// [`ArchivistConfig`]).
    pub archivist: ArchivistConfig,
    /// Retrieval and packing of the user's memory (`[memory]`, see
    /// [`MemoryConfig`]).
    pub memory: MemoryConfig,
    /// What `/metrics` shows (`[metrics]`).
    pub metrics: MetricsConfig,
}

/// What the unauthenticated `/metrics` shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricsConfig {
    /// Show the series labelled with a tenant's name
    /// (`maas_llm_tenant_tokens_total{tenant}`) to anyone who can reach
    /// `/metrics`. Default false: they are left out, so the scrape names
    /// no tenant. `MAAS_METRICS__PUBLIC_TENANTS`.
    pub public_tenants: bool,
}

/// Per-stage concurrency limits. A notification that finds no free slot is
/// not lost: the row stays due and the next freed slot claims it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Concurrency {
    /// Default 256.
    pub analyze: usize,
    /// Default 256.
    pub assemble: usize,
    /// Default 256.
    pub respond: usize,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            analyze: 256,
            assemble: 256,
            respond: 256,
        }
    }
}

impl Concurrency {
    pub fn of(&self, stage: StageKind) -> usize {
        match stage {
            StageKind::Analyze => self.analyze,
            StageKind::Assemble => self.assemble,
            StageKind::Respond => self.respond,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ListenerConfig {
    /// Interval of the timed health query on the LISTEN session. A frozen
    /// backend keeps TCP alive; only a query notices. Default 5.
    pub health_secs: u64,
    /// How long the health query may take. Default 5.
    pub health_timeout_secs: u64,
    /// First reconnect delay; doubles with jitter. Default 100.
    pub reconnect_min_ms: u64,
    /// Cap of the reconnect delay. Default 5000.
    pub reconnect_max_ms: u64,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            health_secs: 5,
            health_timeout_secs: 5,
            reconnect_min_ms: 100,
            reconnect_max_ms: 5000,
        }
    }
}

/// Accepts a list of tokens, or one string of comma-separated tokens (the
/// form an environment variable takes). A numeric token is kept as written.
fn tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Secret>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<Secret>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of tokens or a comma-separated string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| Secret(t.to_owned()))
                .collect())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(vec![Secret(v.to_string())])
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(vec![Secret(v.to_string())])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<String>()? {
                let t = t.trim();
                if !t.is_empty() {
                    out.push(Secret(t.to_owned()));
                }
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

/// Callbacks: when a run with a `callback_url` becomes `COMPLETED`, `FAILED`
/// or `CANCELLED`, a trigger queues a delivery in `callback_outbox` (same
/// transaction); a worker in every `maasd` POSTs it, signed, with retries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct CallbacksConfig {
    /// HMAC-SHA256 key of the `X-Maas-Signature` header. Default: none —
    /// then nothing is delivered (deliveries wait in the outbox, and
    /// `maasctl doctor` says so): callbacks are never sent unsigned.
    /// `MAAS_CALLBACKS__SECRET`.
    pub secret: Secret,
    /// Longest one delivery (connect, send, response) may take. Default 10.
    pub timeout_secs: u64,
    /// Attempts before a delivery is given up as `dead`. Default 12.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt with jitter. Default 1000.
    pub retry_base_ms: u64,
    /// Upper bound of a retry delay. Default 3600.
    pub retry_max_secs: u64,
    /// How often the worker looks for due deliveries when nothing wakes it
    /// (a terminal transition seen on the LISTEN session wakes it at once).
    /// Default 5.
    pub poll_secs: u64,
    /// Most deliveries claimed at once. Default 32.
    pub batch: usize,
    /// Most deliveries in flight at once per daemon. Default 16.
    pub concurrency: usize,
    /// Loopback, private, link-local and unique-local networks callbacks may
    /// go to (checked on the address connected to). Default: none — such
    /// destinations are refused. `MAAS_CALLBACKS__ALLOW_NETWORKS=10.1.0.0/16,::1`.
    #[serde(deserialize_with = "netallow::list")]
    pub allow_networks: Vec<String>,
}

impl Default for CallbacksConfig {
    fn default() -> Self {
        CallbacksConfig {
            secret: Secret(String::new()),
            timeout_secs: 10,
            max_attempts: 12,
            retry_base_ms: 1000,
            retry_max_secs: 3600,
            poll_secs: 5,
            batch: 32,
            concurrency: 16,
            allow_networks: Vec::new(),
        }
    }
}

secs_getters!(CallbacksConfig { timeout: timeout_secs });

impl CallbacksConfig {
    /// Delay before retrying after failed attempt `attempt` (1-based), with
    /// jitter in [½, 1].
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        retry_delay(self.retry_base_ms, self.retry_max_secs, attempt)
    }
}

/// Retention: every `maasd` deletes terminal runs (with their steps,
/// callbacks and operator actions) that finished more than `keep_days` ago,
/// in batches, every `interval_secs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct RetentionConfig {
    /// Age after which a finished run is deleted. 0 keeps everything.
    /// Default 30. `MAAS_RETENTION__KEEP_DAYS`.
    pub keep_days: u64,
    /// How often the daemon deletes. Default 300.
    pub interval_secs: u64,
    /// Runs deleted per statement (one short transaction each). Default 500.
    pub batch: usize,
    /// Age after which a turn (`raw_logs`) is deleted. 0 (the default)
    /// keeps turns. `MAAS_RETENTION__LOGS_KEEP_DAYS`.
    pub logs_keep_days: u64,
    /// Age of the end of its period after which a record (`lsm_storage`)
    /// is deleted. 0 (the default) keeps records.
    /// `MAAS_RETENTION__MEMORY_KEEP_DAYS`.
    pub memory_keep_days: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            keep_days: 30,
            interval_secs: 300,
            batch: 500,
            logs_keep_days: 0,
            memory_keep_days: 0,
        }
    }
}

impl RetentionConfig {
    /// The age limit, or `None` when retention is off.
    pub fn keep(&self) -> Option<Duration> {
        days(self.keep_days)
    }

    /// The age limit of turns, or `None` when they are kept.
    pub fn logs_keep(&self) -> Option<Duration> {
        days(self.logs_keep_days)
    }

    /// The age limit of records, or `None` when they are kept.
    pub fn memory_keep(&self) -> Option<Duration> {
        days(self.memory_keep_days)
    }
}

/// `n` days, `None` for 0 (off).
fn days(n: u64) -> Option<Duration> {
    (n > 0).then(|| Duration::from_secs(n.saturating_mul(86_400)))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: Secret(String::new()),
            listen_database_url: Secret(String::new()),
            http_addr: "127.0.0.1:8080".into(),
            api_tokens: Vec::new(),
            http: HttpConfig::default(),
            llm_provider: "offline".into(),
            lease_secs: 30,
            sweep_secs: 5,
            engine_stall_secs: 120,
            max_attempts: 3,
            retry_base_ms: 1000,
            retry_max_secs: 300,
            stage_timeout_secs: 300,
            grace_secs: 20,
            pool_size: 16,
            db: DbConfig::default(),
            claim_batch: 128,
            complete_batch: 512,
            concurrency: Concurrency::default(),
            listener: ListenerConfig::default(),
            memory_records: 20,
            context_max_tokens: 16000,
            prompt_cache_secs: 5,
            llm: LlmConfig::default(),
            callbacks: CallbacksConfig::default(),
            retention: RetentionConfig::default(),
            archivist: ArchivistConfig::default(),
            memory: MemoryConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

/// A configuration problem, named by key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {key}: {problem}")]
    Invalid { key: &'static str, problem: String },
}

impl Config {
    /// Loads defaults, then `file` (if given), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_from(
            file,
            Env::prefixed("MAAS_").split("__"),
            Env::raw().only(&["DATABASE_URL"]),
        )
    }

    /// The connection string of the LISTEN session.
    pub fn listen_url(&self) -> &str {
        if self.listen_database_url.expose().is_empty() {
            self.database_url.expose()
        } else {
            self.listen_database_url.expose()
        }
    }

    fn load_from(file: Option<&Path>, maas_env: Env, db_env: Env) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid {
                    key: "config",
                    problem: format!("file {} does not exist", path.display()),
                });
            }
            fig = fig.merge(Toml::file(path));
        }
        let cfg: Config = fig
            .merge(maas_env.ignore(&["CONFIG"]))
            .merge(db_env.map(|_| "database_url".into()))
            .extract()
            .map_err(|e| Box::new(redact_secrets(e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_urls()?;
        if let Err(e) = netallow::parse(&self.callbacks.allow_networks) {
            return invalid("callbacks.allow_networks", &e);
        }
        at_least_one(&self.intervals())?;
        at_least_one(&self.counts())?;
        if self.pool_size < 4 {
            return invalid(
                "pool_size",
                "must be at least 4 (claims, completions, heartbeats and the sweep share it)",
            );
        }
        at_least_one(&self.http_limits())?;
        // Whether the address may be bound without tokens is the server's
        // check (`http::bind`, after resolving names), so that maasctl does
        // not refuse a configuration it shares with a daemon.
        if let Err(problem) = HttpAddr::parse(&self.http_addr) {
            return invalid("http_addr", &problem);
        }
        if self.listener.reconnect_min_ms == 0 || self.listener.reconnect_max_ms < self.listener.reconnect_min_ms {
            return invalid(
                "listener.reconnect_max_ms",
                "must be at least listener.reconnect_min_ms, which must be at least 1",
            );
        }
        if let Some((key, problem)) = self.archivist.problem() {
            return invalid(key, &problem);
        }
        if let Some((key, problem)) = self.memory.problem() {
            return invalid(key, &problem);
        }
        Ok(())
    }

    /// `database_url` set and valid; `listen_database_url` valid when set,
    /// and set when the database is reached through a transaction pooler.
    fn validate_urls(&self) -> Result<(), ConfigError> {
        if self.database_url.0.trim().is_empty() {
            return invalid(
                "database_url",
                "not set: export DATABASE_URL (or put database_url in the config file)",
            );
        }
        if self.db.through_pooler() && self.listen_database_url.0.trim().is_empty() {
            return invalid(
                "listen_database_url",
                "db.pooler = \"transaction\" needs listen_database_url straight to PostgreSQL \
                 (the LISTEN session cannot go through a transaction-mode pooler)",
            );
        }
        for (key, url) in [
            ("database_url", &self.database_url.0),
            ("listen_database_url", &self.listen_database_url.0),
        ] {
            if url.is_empty() && key == "listen_database_url" {
                continue;
            }
            match pgtls::split(url) {
                Err(e) => return invalid(key, &e.to_string()),
                Ok((rest, _)) if rest.parse::<tokio_postgres::Config>().is_err() => {
                    return invalid(key, "not a valid PostgreSQL connection string");
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// The durations, attempts and periods that must be at least 1.
    fn intervals(&self) -> [(&'static str, u64); 12] {
        [
            ("lease_secs", self.lease_secs),
            ("sweep_secs", self.sweep_secs),
            ("max_attempts", u64::from(self.max_attempts)),
            ("engine_stall_secs", self.engine_stall_secs),
            ("stage_timeout_secs", self.stage_timeout_secs),
            ("listener.health_secs", self.listener.health_secs),
            ("listener.health_timeout_secs", self.listener.health_timeout_secs),
            ("callbacks.timeout_secs", self.callbacks.timeout_secs),
            ("callbacks.max_attempts", u64::from(self.callbacks.max_attempts)),
            ("callbacks.retry_base_ms", self.callbacks.retry_base_ms),
            ("callbacks.poll_secs", self.callbacks.poll_secs),
            ("retention.interval_secs", self.retention.interval_secs),
        ]
    }

    /// The pool sizes, batches and concurrencies that must be at least 1.
    fn counts(&self) -> [(&'static str, u64); 11] {
        [
            ("pool_size", self.pool_size),
            ("claim_batch", self.claim_batch),
            ("complete_batch", self.complete_batch),
            ("concurrency.analyze", self.concurrency.analyze),
            ("concurrency.assemble", self.concurrency.assemble),
            ("concurrency.respond", self.concurrency.respond),
            ("context_max_tokens", self.context_max_tokens),
            ("callbacks.batch", self.callbacks.batch),
            ("callbacks.concurrency", self.callbacks.concurrency),
            ("retention.batch", self.retention.batch),
            ("db.api_pool_size", self.db.api_pool_size),
        ]
        .map(|(key, v)| (key, u64::try_from(v).unwrap_or(u64::MAX)))
    }

    /// The HTTP sizes, timeouts and caps that must be at least 1.
    fn http_limits(&self) -> [(&'static str, u64); 15] {
        let h = &self.http;
        [
            (
                "http.max_body_bytes",
                u64::try_from(h.max_body_bytes).unwrap_or(u64::MAX),
            ),
            ("http.request_timeout_secs", h.request_timeout_secs),
            ("http.max_wait_secs", h.max_wait_secs),
            ("http.idempotency_ttl_secs", h.idempotency_ttl_secs),
            ("http.metrics_refresh_secs", h.metrics_refresh_secs),
            ("http.stream_keepalive_secs", h.stream_keepalive_secs),
            ("http.stream_send_timeout_secs", h.stream_send_timeout_secs),
            ("http.header_read_timeout_secs", h.header_read_timeout_secs),
            ("http.max_long_polls", h.max_long_polls as u64),
            ("http.max_long_polls_per_token", h.max_long_polls_per_token as u64),
            ("http.max_streams", h.max_streams as u64),
            ("http.max_streams_per_token", h.max_streams_per_token as u64),
            ("http.max_mcp_sessions", h.max_mcp_sessions as u64),
            ("http.max_mcp_sessions_per_token", h.max_mcp_sessions_per_token as u64),
            ("http.ws_max_message_bytes", h.ws_max_message_bytes as u64),
        ]
    }

    /// Delay before retry number `attempt` (1-based): exponential from
    /// `retry_base_ms`, capped at `retry_max_secs`, with jitter in [½, 1] so
    /// rows that failed together do not return together.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        retry_delay(self.retry_base_ms, self.retry_max_secs, attempt)
    }
}

/// Whether a configuration key holds a secret (a token, a key, a password,
/// a connection string that may carry one): its value is never shown.
fn is_secret_key(path: &[String]) -> bool {
    path.iter().any(|segment| {
        let s = segment.to_ascii_lowercase();
        ["secret", "token", "key", "password", "database_url"]
            .iter()
            .any(|word| s.contains(word))
    })
}

/// `err` with the value taken out of every error about a secret key:
/// figment's messages quote the value they refused (`found string "…"`).
fn redact_secrets(err: figment::Error) -> figment::Error {
    use figment::error::Kind;
    let hidden = |expected: &str| format!("invalid value (not shown: the key holds a secret), expected {expected}");
    let mut errors: Vec<figment::Error> = err
        .into_iter()
        .map(|mut e| {
            if is_secret_key(&e.path) {
                e.kind = match e.kind {
                    Kind::InvalidType(_, expected) | Kind::InvalidValue(_, expected) => {
                        Kind::Message(hidden(&expected))
                    }
                    Kind::Message(_) | Kind::Unsupported(_) | Kind::UnsupportedKey(..) => {
                        Kind::Message("invalid value (not shown: the key holds a secret)".to_owned())
                    }
                    other => other,
                };
            }
            e
        })
        .collect();
    let Some(mut chained) = errors.pop() else {
        return figment::Error::from("configuration error".to_owned());
    };
    while let Some(e) = errors.pop() {
        chained = chained.chain(e);
    }
    chained
}

secs_getters!(Config {
    lease: lease_secs,
    sweep_interval: sweep_secs,
    grace: grace_secs,
    stage_timeout: stage_timeout_secs,
    engine_stall: engine_stall_secs,
});

#[cfg(test)]
mod tests;
