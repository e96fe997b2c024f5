//! Typed settings, loaded and validated once.
//!
//! Layers, later wins: built-in defaults → the TOML file named by `--config`
//! or `MAAS_CONFIG` → `MAAS_`-prefixed environment variables (nested keys
//! with `__`, e.g. `MAAS_CONCURRENCY__RESPOND=64`) → `DATABASE_URL`.
//! Raw keys carry their unit (`lease_secs`); the program uses `Duration`.
//!
//! Fixed names other tools rely on: `DATABASE_URL`, `MAAS_HTTP_ADDR`,
//! `MAAS_LLM_PROVIDER`, `MAAS_LEASE_SECS`, `MAAS_SWEEP_SECS`.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::archivist::ArchivistConfig;
use crate::llm::LlmConfig;
use crate::model::StageKind;

/// Everything `maasd` and `maasctl` read from configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// PostgreSQL connection string. Required (no default): `DATABASE_URL`.
    pub database_url: Secret,
    /// Address of the HTTP server. Default `127.0.0.1:8080`; port 0 picks a
    /// free port. `MAAS_HTTP_ADDR`.
    pub http_addr: String,
    /// Provider for every LLM role the file does not set: `offline` (default),
    /// `openai`, `anthropic` or `gemini`. `MAAS_LLM_PROVIDER`.
    pub llm_provider: String,
    /// How long a claim holds a row before the sweep may take it back.
    /// Heartbeats renew it every third of this. Default 30. `MAAS_LEASE_SECS`.
    pub lease_secs: u64,
    /// Interval of the catch-up sweep: a due row is worked on within this
    /// time even if every notification was lost. Default 5. `MAAS_SWEEP_SECS`.
    pub sweep_secs: u64,
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
    /// Size of the connection pool (the LISTEN session is extra). Default 16.
    pub pool_size: usize,
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
    /// The archivist's schedule, thresholds and budgets (`[archivist]`, see
    /// `archivist::ArchivistConfig`).
    pub archivist: ArchivistConfig,
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

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: Secret(String::new()),
            http_addr: "127.0.0.1:8080".into(),
            llm_provider: "offline".into(),
            lease_secs: 30,
            sweep_secs: 5,
            max_attempts: 3,
            retry_base_ms: 1000,
            retry_max_secs: 300,
            stage_timeout_secs: 300,
            grace_secs: 20,
            pool_size: 16,
            claim_batch: 128,
            complete_batch: 512,
            concurrency: Concurrency::default(),
            listener: ListenerConfig::default(),
            memory_records: 20,
            context_max_tokens: 16000,
            prompt_cache_secs: 5,
            llm: LlmConfig::default(),
            archivist: ArchivistConfig::default(),
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
            .map_err(Box::new)?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, problem: &str| {
            Err(ConfigError::Invalid {
                key,
                problem: problem.to_owned(),
            })
        };
        if self.database_url.0.trim().is_empty() {
            return invalid(
                "database_url",
                "not set: export DATABASE_URL (or put database_url in the config file)",
            );
        }
        if self.database_url.0.parse::<tokio_postgres::Config>().is_err() {
            return invalid("database_url", "not a valid PostgreSQL connection string");
        }
        for (key, v) in [
            ("lease_secs", self.lease_secs),
            ("sweep_secs", self.sweep_secs),
            ("max_attempts", u64::from(self.max_attempts)),
            ("stage_timeout_secs", self.stage_timeout_secs),
            ("listener.health_secs", self.listener.health_secs),
            ("listener.health_timeout_secs", self.listener.health_timeout_secs),
        ] {
            if v == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        for (key, v) in [
            ("pool_size", self.pool_size),
            ("claim_batch", self.claim_batch),
            ("complete_batch", self.complete_batch),
            ("concurrency.analyze", self.concurrency.analyze),
            ("concurrency.assemble", self.concurrency.assemble),
            ("concurrency.respond", self.concurrency.respond),
            ("context_max_tokens", self.context_max_tokens),
        ] {
            if v == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        if self.pool_size < 4 {
            return invalid(
                "pool_size",
                "must be at least 4 (claims, completions, heartbeats and the sweep share it)",
            );
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
        Ok(())
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }
    pub fn sweep_interval(&self) -> Duration {
        Duration::from_secs(self.sweep_secs)
    }
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_secs)
    }
    pub fn stage_timeout(&self) -> Duration {
        Duration::from_secs(self.stage_timeout_secs)
    }

    /// Delay before retry number `attempt` (1-based): exponential from
    /// `retry_base_ms`, capped at `retry_max_secs`, with jitter in [½, 1] so
    /// rows that failed together do not return together.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        let base = Duration::from_millis(self.retry_base_ms);
        let cap = Duration::from_secs(self.retry_max_secs);
        let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        exp.min(cap).mul_f64(rand::random_range(0.5..=1.0))
    }
}

/// A string that never shows itself in `Debug` or `Display` output.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::result_large_err, reason = "figment's test jail fixes the error type")]
    fn load(toml: Option<&str>, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut out = None;
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            for (k, v) in vars {
                jail.set_env(k, v);
            }
            if let Some(body) = toml {
                jail.create_file("maas.toml", body)?;
            }
            out = Some(Config::load(toml.map(|_| Path::new("maas.toml"))));
            Ok(())
        });
        out.unwrap_or_else(|| {
            Err(ConfigError::Invalid {
                key: "test",
                problem: "jail did not run".into(),
            })
        })
    }

    #[test]
    fn defaults_then_file_then_environment() {
        let cfg = load(
            Some("lease_secs = 7\nsweep_secs = 9\n[concurrency]\nrespond = 3\n"),
            &[
                ("DATABASE_URL", "postgres://u@localhost/db"),
                ("MAAS_SWEEP_SECS", "2"),
                ("MAAS_HTTP_ADDR", "127.0.0.1:0"),
                ("MAAS_CONCURRENCY__ANALYZE", "5"),
            ],
        );
        let cfg = match cfg {
            Ok(c) => c,
            Err(e) => panic!("load failed: {e}"),
        };
        assert_eq!(cfg.lease_secs, 7);
        assert_eq!(cfg.sweep_secs, 2, "environment overrides the file");
        assert_eq!(cfg.http_addr, "127.0.0.1:0");
        assert_eq!(cfg.concurrency.respond, 3);
        assert_eq!(cfg.concurrency.analyze, 5);
        assert_eq!(cfg.concurrency.assemble, 256);
        assert_eq!(cfg.llm_provider, "offline");
        assert_eq!(cfg.database_url.expose(), "postgres://u@localhost/db");
    }

    #[test]
    fn a_bad_value_is_refused_by_name() {
        let err = load(None, &[("DATABASE_URL", "postgres://u@h/db"), ("MAAS_LEASE_SECS", "0")])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("lease_secs"), "{err}");
        let err = load(
            None,
            &[("DATABASE_URL", "postgres://u@h/db"), ("MAAS_LEASE_SECS", "soon")],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.to_lowercase().contains("lease_secs"), "{err}");
        let err = load(None, &[]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("DATABASE_URL"), "{err}");
    }

    #[test]
    fn the_archivist_section_loads_and_is_validated() {
        let cfg = load(
            Some("[archivist]\nmin_pending = 5\nschedule = \"0 */10 * * * *\"\n"),
            &[
                ("DATABASE_URL", "postgres://u@h/db"),
                ("MAAS_ARCHIVIST__COOLDOWN_SECS", "60"),
            ],
        );
        let cfg = match cfg {
            Ok(c) => c,
            Err(e) => panic!("load failed: {e}"),
        };
        assert_eq!(cfg.archivist.min_pending, 5);
        assert_eq!(cfg.archivist.cooldown_secs, 60);
        assert_eq!(cfg.archivist.schedule, "0 */10 * * * *");
        assert_eq!(cfg.archivist.max_pending_age_secs, 86_400, "default");
        for bad in ["0 */6 * * *", "0 0 */6 * * * *", "every six hours x y z"] {
            let err = load(
                None,
                &[("DATABASE_URL", "postgres://u@h/db"), ("MAAS_ARCHIVIST__SCHEDULE", bad)],
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
            assert!(err.contains("archivist.schedule"), "{bad}: {err}");
        }
    }

    #[test]
    fn secrets_are_redacted() {
        let cfg = Config {
            database_url: Secret("postgres://u:hunter2@h/db".into()),
            ..Config::default()
        };
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn retry_delay_grows_and_is_capped() {
        let cfg = Config {
            retry_base_ms: 1000,
            retry_max_secs: 5,
            ..Config::default()
        };
        let d1 = cfg.retry_delay(1);
        assert!(
            d1 >= Duration::from_millis(500) && d1 <= Duration::from_secs(1),
            "{d1:?}"
        );
        let d3 = cfg.retry_delay(3);
        assert!(d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(4), "{d3:?}");
        let d30 = cfg.retry_delay(30);
        assert!(d30 <= Duration::from_secs(5), "{d30:?}");
    }
}
