//! LLM settings: what each role uses, where providers live, and their keys.
//!
//! [`LlmConfig`] is the raw, deserialised `[llm]` section; every field is
//! optional and documented with its default. [`LlmConfig::resolve`] applies
//! the defaults and the ecosystem's environment variables (only where the
//! file is silent), validates everything once, and returns [`ResolvedLlm`];
//! a bad value fails startup naming its key.
//!
//! ```toml
//! [llm.analyzer]
//! provider = "gemini"            # else MAAS_LLM_PROVIDER, else "offline"
//! model = "gemini-2.5-flash"
//! requests_per_minute = 600
//!
//! [llm.responder]
//! provider = "anthropic"
//! temperature = 0.7
//! max_tokens = 2000
//! timeout_secs = 30
//!
//! [llm.openai]
//! base_url = "http://localhost:11434/v1"   # Ollama; else OPENAI_BASE_URL
//! ```
//!
//! Environment, read through a lookup closure so tests need not touch the
//! process environment: `OPENAI_API_KEY`, `OPENAI_BASE_URL` (includes `/v1`),
//! `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, `GEMINI_API_KEY` (or
//! `GOOGLE_API_KEY`), `GEMINI_BASE_URL`. Empty values count as unset.
//!
//! Keys are held in [`Secret`] (the crate's one secret type), whose `Debug`
//! and `Display` redact; only the HTTP layer calls [`Secret::expose`].
//!
//! The provider settings of every role live here with their validation.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::{ProviderKind, Role};
use crate::secret::Secret;

/// The `[llm]` configuration section. Every field may be omitted.
///
/// Unknown keys inside the role, provider and offline sections are errors;
/// unknown keys directly under `[llm]` are ignored, so that the daemon's
/// environment layer may place its own keys there.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LlmConfig {
    /// The analyzer role. Defaults: the cheap model of its provider,
    /// temperature 0.0, max_tokens 1024.
    pub analyzer: RoleConfig,
    /// The responder role (the respond stage's model). Defaults: the strong model of its
    /// provider, temperature 0.7, max_tokens 2000.
    pub responder: RoleConfig,
    /// The archivist role. Defaults: the cheap model of its provider,
    /// temperature 0.0, max_tokens 1024.
    pub archivist: RoleConfig,
    /// OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp,
    /// OpenRouter). base_url default: `OPENAI_BASE_URL`, else
    /// `https://api.openai.com/v1` (the URL includes `/v1`; requests go to
    /// `{base_url}/chat/completions`). api_key default: `OPENAI_API_KEY`.
    /// Servers that need no key still need a placeholder value.
    pub openai: EndpointConfig,
    /// Anthropic Messages endpoint. base_url default: `ANTHROPIC_BASE_URL`,
    /// else `https://api.anthropic.com` (requests go to
    /// `{base_url}/v1/messages`). api_key default: `ANTHROPIC_API_KEY`.
    pub anthropic: EndpointConfig,
    /// Google Gemini endpoint. base_url default: `GEMINI_BASE_URL`, else
    /// `https://generativelanguage.googleapis.com` (requests go to
    /// `{base_url}/v1beta/models/{model}:generateContent`). api_key default:
    /// `GEMINI_API_KEY`, else `GOOGLE_API_KEY`.
    pub gemini: EndpointConfig,
    /// The built-in offline provider.
    pub offline: OfflineConfig,
    /// Embeddings of memory text for the semantic part of the memory
    /// search; off by default (see [`super::embed`]).
    pub embedding: super::embed::EmbeddingConfig,
}

/// One role's settings; every field falls back to a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoleConfig {
    /// `openai`, `anthropic`, `gemini` or `offline`. Default: the daemon's
    /// `MAAS_LLM_PROVIDER`, itself defaulting to `offline`.
    pub provider: Option<String>,
    /// Model name as the provider spells it. Defaults per provider — cheap
    /// for analyzer and archivist, strong for the responder:
    /// openai `gpt-4.1-mini` / `gpt-4.1`; anthropic `claude-haiku-4-5` /
    /// `claude-sonnet-4-5`; gemini `gemini-2.5-flash` / `gemini-2.5-pro`;
    /// offline `offline`. For thinking models (Gemini 2.5), `max_tokens`
    /// includes the thinking tokens: give such a model room.
    pub model: Option<String>,
    /// Sampling temperature, 0.0–2.0 (Anthropic: 0.0–1.0). Default: 0.7 for
    /// the responder, 0.0 for analyzer and archivist.
    pub temperature: Option<f64>,
    /// Upper bound on generated tokens. Default: 2000 for the responder,
    /// 1024 for analyzer and archivist.
    pub max_tokens: Option<u32>,
    /// Per-request timeout, covering connect through the last body byte.
    /// Also bounds each admission wait before the request. Default: 30.
    pub timeout_secs: Option<u64>,
    /// Calls of this role in flight at once from this daemon. Default: 64.
    pub max_concurrency: Option<u32>,
    /// Calls of this role started per minute from this daemon, with bursts
    /// up to the same number. Default: unlimited.
    pub requests_per_minute: Option<u32>,
}

/// Where a provider lives and the key it takes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Overrides the provider's `*_BASE_URL` variable and default URL.
    pub base_url: Option<String>,
    /// Overrides the provider's `*_API_KEY` variable.
    pub api_key: Option<Secret>,
}

/// The offline provider's knobs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OfflineConfig {
    /// Simulated latency of every offline call, in milliseconds. Default: 0.
    /// A latency at or above the role timeout produces a timeout error.
    pub latency_ms: u64,
    /// Fault injection for tests and chaos runs: when the last user message
    /// contains this marker, the call fails with the retryable error
    /// "offline provider: injected failure". Default: none (never fails).
    pub fail_when_query_contains: Option<String>,
    /// A streamed offline answer's pause between two words, in
    /// milliseconds, so that a stream can be watched. Default:
    /// [`DEFAULT_STREAM_PACE_MS`]; 0 sends the words at once.
    pub stream_pace_ms: Option<u64>,
}

/// The offline provider's default pause between two streamed words.
pub const DEFAULT_STREAM_PACE_MS: u64 = 20;

/// Fully resolved settings of one role.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleSettings {
    /// The role these settings belong to.
    pub role: Role,
    /// Its provider.
    pub provider: ProviderKind,
    /// Its model.
    pub model: String,
    /// Its temperature.
    pub temperature: f64,
    /// Its generated-token limit.
    pub max_tokens: u32,
    /// Its request timeout.
    pub timeout: Duration,
    /// Its concurrency limit.
    pub max_concurrency: u32,
    /// Its requests-per-minute limit, if any.
    pub requests_per_minute: Option<NonZeroU32>,
    /// The provider's endpoint; `None` for the offline provider.
    pub endpoint: Option<Endpoint>,
}

/// A provider's base URL (no trailing slash) and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL without a trailing `/`.
    pub base_url: String,
    /// The key.
    pub api_key: Secret,
}

/// The validated result of [`LlmConfig::resolve`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedLlm {
    /// Settings per role, indexed like [`Role::ALL`].
    pub roles: [RoleSettings; 3],
    /// Offline provider latency.
    pub offline_latency: Duration,
    /// Offline fault-injection marker.
    pub offline_fail_marker: Option<String>,
    /// Offline pause between two streamed words.
    pub offline_stream_pace: Duration,
}

impl ResolvedLlm {
    /// The settings of one role.
    pub fn role(&self, role: Role) -> &RoleSettings {
        &self.roles[role.index()]
    }
}

/// A configuration problem, naming the key or variable at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A provider name that is not one of the four.
    #[error("{key}: unknown LLM provider {value:?} (expected openai, anthropic, gemini or offline)")]
    UnknownProvider {
        /// The key or variable that named it.
        key: String,
        /// What it said.
        value: String,
    },
    /// A role uses a provider that has no key.
    #[error(
        "llm.{role} uses the {provider} provider but it has no API key: \
         set {variable} or llm.{provider}.api_key"
    )]
    MissingApiKey {
        /// The role.
        role: &'static str,
        /// The provider.
        provider: &'static str,
        /// The environment variable that would supply the key.
        variable: &'static str,
    },
    /// A value out of range or malformed.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key, e.g. `llm.responder.temperature`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The shared HTTP client could not be built (e.g. no TLS roots).
    #[error("cannot build the LLM HTTP client: {0}")]
    HttpClient(String),
}

struct ProviderEnv {
    key_vars: &'static [&'static str],
    base_var: &'static str,
    default_base: &'static str,
}

fn provider_env(kind: ProviderKind) -> Option<ProviderEnv> {
    match kind {
        ProviderKind::OpenAi => Some(ProviderEnv {
            key_vars: &["OPENAI_API_KEY"],
            base_var: "OPENAI_BASE_URL",
            default_base: "https://api.openai.com/v1",
        }),
        ProviderKind::Anthropic => Some(ProviderEnv {
            key_vars: &["ANTHROPIC_API_KEY"],
            base_var: "ANTHROPIC_BASE_URL",
            default_base: "https://api.anthropic.com",
        }),
        ProviderKind::Gemini => Some(ProviderEnv {
            key_vars: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
            base_var: "GEMINI_BASE_URL",
            default_base: "https://generativelanguage.googleapis.com",
        }),
        ProviderKind::Offline => None,
    }
}

/// The default model of a provider for a role.
pub fn default_model(provider: ProviderKind, role: Role) -> &'static str {
    match (provider, role) {
        (ProviderKind::OpenAi, Role::Responder) => "gpt-4.1",
        (ProviderKind::OpenAi, _) => "gpt-4.1-mini",
        (ProviderKind::Anthropic, Role::Responder) => "claude-sonnet-4-5",
        (ProviderKind::Anthropic, _) => "claude-haiku-4-5",
        (ProviderKind::Gemini, Role::Responder) => "gemini-2.5-pro",
        (ProviderKind::Gemini, _) => "gemini-2.5-flash",
        (ProviderKind::Offline, _) => "offline",
    }
}

/// Default request timeout of every role, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;
/// Default concurrency limit of every role.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 64;

impl LlmConfig {
    /// The section of one role.
    pub fn role(&self, role: Role) -> &RoleConfig {
        match role {
            Role::Analyzer => &self.analyzer,
            Role::Responder => &self.responder,
            Role::Archivist => &self.archivist,
        }
    }

    /// The section of one provider; `None` for offline.
    pub fn endpoint(&self, provider: ProviderKind) -> Option<&EndpointConfig> {
        match provider {
            ProviderKind::OpenAi => Some(&self.openai),
            ProviderKind::Anthropic => Some(&self.anthropic),
            ProviderKind::Gemini => Some(&self.gemini),
            ProviderKind::Offline => None,
        }
    }

    /// Applies defaults and the environment (`env` looks a variable up),
    /// then validates. `default_provider` is `MAAS_LLM_PROVIDER` (callers
    /// pass `"offline"` when it is unset) and applies to every role whose
    /// section names no provider.
    pub fn resolve(
        &self,
        default_provider: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedLlm, ConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let default_kind: ProviderKind = default_provider.parse().map_err(|_| ConfigError::UnknownProvider {
            key: "MAAS_LLM_PROVIDER".to_owned(),
            value: default_provider.to_owned(),
        })?;
        let [analyzer, responder, archivist] = Role::ALL;
        let roles = [
            self.resolve_role(analyzer, default_kind, &env)?,
            self.resolve_role(responder, default_kind, &env)?,
            self.resolve_role(archivist, default_kind, &env)?,
        ];
        Ok(ResolvedLlm {
            roles,
            offline_latency: Duration::from_millis(self.offline.latency_ms),
            offline_fail_marker: self.offline.fail_when_query_contains.clone().filter(|m| !m.is_empty()),
            offline_stream_pace: Duration::from_millis(self.offline.stream_pace_ms.unwrap_or(DEFAULT_STREAM_PACE_MS)),
        })
    }

    fn resolve_role(
        &self,
        role: Role,
        default_kind: ProviderKind,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<RoleSettings, ConfigError> {
        let section = self.role(role);
        let key = |field: &str| format!("llm.{role}.{field}");
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            key: key(field),
            reason,
        };

        let provider = match &section.provider {
            Some(name) => name.parse().map_err(|_| ConfigError::UnknownProvider {
                key: key("provider"),
                value: name.clone(),
            })?,
            None => default_kind,
        };

        let model = match &section.model {
            Some(m) if m.trim().is_empty() => {
                return Err(invalid("model", "must not be empty".to_owned()));
            }
            Some(m) => m.trim().to_owned(),
            None => default_model(provider, role).to_owned(),
        };

        let default_temperature = if role == Role::Responder { 0.7 } else { 0.0 };
        let temperature = section.temperature.unwrap_or(default_temperature);
        let max_temperature = if provider == ProviderKind::Anthropic { 1.0 } else { 2.0 };
        if !(0.0..=max_temperature).contains(&temperature) {
            return Err(invalid(
                "temperature",
                format!("{temperature} is outside 0.0..={max_temperature:.1} for {provider}"),
            ));
        }

        let default_max_tokens = if role == Role::Responder { 2000 } else { 1024 };
        let max_tokens = section.max_tokens.unwrap_or(default_max_tokens);
        if max_tokens == 0 {
            return Err(invalid("max_tokens", "must be at least 1".to_owned()));
        }

        let timeout_secs = section.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if !(1..=3600).contains(&timeout_secs) {
            return Err(invalid("timeout_secs", format!("{timeout_secs} is outside 1..=3600")));
        }

        let max_concurrency = section.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY);
        if max_concurrency == 0 {
            return Err(invalid("max_concurrency", "must be at least 1".to_owned()));
        }

        let requests_per_minute = match section.requests_per_minute {
            None => None,
            Some(n) => {
                Some(NonZeroU32::new(n).ok_or_else(|| invalid("requests_per_minute", "must be at least 1".into()))?)
            }
        };

        let endpoint = self.resolve_endpoint(provider, role.as_str(), env)?;

        Ok(RoleSettings {
            role,
            provider,
            model,
            temperature,
            max_tokens,
            timeout: Duration::from_secs(timeout_secs),
            max_concurrency,
            requests_per_minute,
            endpoint,
        })
    }

    /// The endpoint of a provider (`None` for offline), for the settings
    /// named `user` (a role, or `embedding`) when the key is missing.
    pub(super) fn resolve_endpoint(
        &self,
        provider: ProviderKind,
        user: &'static str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Endpoint>, ConfigError> {
        let (Some(section), Some(vars)) = (self.endpoint(provider), provider_env(provider)) else {
            return Ok(None);
        };
        let base_key = format!("llm.{provider}.base_url");
        let (base_url, from) = match &section.base_url {
            Some(url) => (url.clone(), base_key.clone()),
            None => match env(vars.base_var) {
                Some(url) => (url, vars.base_var.to_owned()),
                None => (vars.default_base.to_owned(), base_key.clone()),
            },
        };
        let base_url = base_url.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
            Ok(_) => {
                return Err(ConfigError::Invalid {
                    key: from,
                    reason: format!("{base_url:?} is not an http(s) URL"),
                });
            }
            Err(e) => {
                return Err(ConfigError::Invalid {
                    key: from,
                    reason: format!("{base_url:?} is not a URL: {e}"),
                });
            }
        }
        let api_key = match &section.api_key {
            Some(key) if !key.expose().trim().is_empty() => key.clone(),
            _ => vars
                .key_vars
                .iter()
                .find_map(|var| env(var))
                .map(|k| Secret::new(k.trim()))
                .ok_or(ConfigError::MissingApiKey {
                    role: user,
                    provider: provider.as_str(),
                    variable: vars.key_vars[0],
                })?,
        };
        Ok(Some(Endpoint { base_url, api_key }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_are_offline_and_need_nothing() {
        let resolved = LlmConfig::default().resolve("offline", &no_env).unwrap();
        let responder = resolved.role(Role::Responder);
        assert_eq!(responder.provider, ProviderKind::Offline);
        assert_eq!(responder.model, "offline");
        assert!((responder.temperature - 0.7).abs() < f64::EPSILON);
        assert_eq!(responder.max_tokens, 2000);
        assert_eq!(responder.timeout, Duration::from_secs(30));
        assert_eq!(responder.max_concurrency, 64);
        assert_eq!(responder.requests_per_minute, None);
        assert_eq!(responder.endpoint, None);
        let analyzer = resolved.role(Role::Analyzer);
        assert!(analyzer.temperature.abs() < f64::EPSILON);
        assert_eq!(analyzer.max_tokens, 1024);
    }

    #[test]
    fn provider_falls_back_to_the_default_and_env_supplies_key_and_url() {
        let env = |name: &str| match name {
            "GEMINI_API_KEY" => Some("g-key".to_owned()),
            "GEMINI_BASE_URL" => Some("http://127.0.0.1:9/".to_owned()),
            _ => None,
        };
        let resolved = LlmConfig::default().resolve("Gemini", &env).unwrap();
        let analyzer = resolved.role(Role::Analyzer);
        assert_eq!(analyzer.provider, ProviderKind::Gemini);
        assert_eq!(analyzer.model, "gemini-2.5-flash");
        assert_eq!(resolved.role(Role::Responder).model, "gemini-2.5-pro");
        let endpoint = analyzer.endpoint.as_ref().unwrap();
        assert_eq!(endpoint.base_url, "http://127.0.0.1:9");
        assert_eq!(endpoint.api_key.expose(), "g-key");
    }

    #[test]
    fn the_file_wins_over_the_environment() {
        let mut cfg = LlmConfig::default();
        cfg.openai.base_url = Some("http://file.example/v1".into());
        cfg.openai.api_key = Some(Secret::new("file-key"));
        let env = |name: &str| match name {
            "OPENAI_API_KEY" => Some("env-key".to_owned()),
            "OPENAI_BASE_URL" => Some("http://env.example/v1".to_owned()),
            _ => None,
        };
        let resolved = cfg.resolve("openai", &env).unwrap();
        let endpoint = resolved.role(Role::Archivist).endpoint.clone().unwrap();
        assert_eq!(endpoint.base_url, "http://file.example/v1");
        assert_eq!(endpoint.api_key.expose(), "file-key");
    }

    #[test]
    fn defaults_urls() {
        let only_keys = |name: &str| name.ends_with("_API_KEY").then(|| "k".to_owned());
        for (provider, url) in [
            ("openai", "https://api.openai.com/v1"),
            ("anthropic", "https://api.anthropic.com"),
            ("gemini", "https://generativelanguage.googleapis.com"),
        ] {
            let resolved = LlmConfig::default().resolve(provider, &only_keys).unwrap();
            let endpoint = resolved.role(Role::Responder).endpoint.clone().unwrap();
            assert_eq!(endpoint.base_url, url);
        }
    }

    #[test]
    fn errors_name_the_key_or_variable() {
        let err = LlmConfig::default().resolve("openai", &no_env).unwrap_err();
        assert_eq!(
            err,
            ConfigError::MissingApiKey {
                role: "analyzer",
                provider: "openai",
                variable: "OPENAI_API_KEY"
            }
        );
        assert!(err.to_string().contains("OPENAI_API_KEY"));

        let err = LlmConfig::default().resolve("chatgpt", &no_env).unwrap_err();
        assert!(err.to_string().starts_with("MAAS_LLM_PROVIDER: unknown"), "{err}");

        let mut cfg = LlmConfig::default();
        cfg.responder.provider = Some("anthropic".into());
        cfg.responder.temperature = Some(1.5);
        cfg.anthropic.api_key = Some(Secret::new("k"));
        let err = cfg.resolve("offline", &no_env).unwrap_err();
        assert!(err.to_string().starts_with("llm.responder.temperature:"), "{err}");

        let mut cfg = LlmConfig::default();
        cfg.archivist.requests_per_minute = Some(0);
        let err = cfg.resolve("offline", &no_env).unwrap_err();
        assert!(err.to_string().starts_with("llm.archivist.requests_per_minute:"));

        let env = |name: &str| (name == "OPENAI_BASE_URL").then(|| "not a url".to_owned());
        let mut cfg = LlmConfig::default();
        cfg.openai.api_key = Some(Secret::new("k"));
        let err = cfg.resolve("openai", &env).unwrap_err();
        assert!(err.to_string().starts_with("OPENAI_BASE_URL:"), "{err}");
    }

    #[test]
    fn deserialises_from_json_and_rejects_typos_in_sections() {
        let cfg: LlmConfig = serde_json::from_value(serde_json::json!({
            "responder": {"provider": "openai", "max_tokens": 500},
            "openai": {"api_key": "sk-from-file"},
            "offline": {"latency_ms": 5, "stream_pace_ms": 0},
            "something_else": true
        }))
        .unwrap();
        assert_eq!(cfg.responder.max_tokens, Some(500));
        assert_eq!(cfg.offline.latency_ms, 5);
        let resolved = cfg.resolve("offline", &no_env).unwrap();
        assert_eq!(resolved.offline_stream_pace, Duration::ZERO);
        assert!(!format!("{cfg:?}").contains("sk-from-file"));

        let typo = serde_json::from_value::<LlmConfig>(serde_json::json!({
            "responder": {"max_token": 500}
        }));
        assert!(typo.unwrap_err().to_string().contains("max_token"));
    }
}
