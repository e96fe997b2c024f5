//! Embeddings of memory text: the vectors the semantic part of the memory
//! search compares (`memory_search_semantic.sql`, the embedder service).
//!
//! On by default: with `provider` unset, the local model
//! ([`DEFAULT_LOCAL_MODEL`], multilingual-e5-small: Russian and English,
//! chosen by measurement in BENCHMARKS.md) is used from `model_dir` or the
//! default model folder ([`default_model_dir`]: `$XDG_CACHE_HOME/maas/models/…`, else
//! `~/.cache/maas/models/…`, where `bin/run` fetches it); when the folder
//! does not hold a model, the search is full text alone and
//! [`EmbeddingConfig::fallback_note`] says why. `provider = "off"` turns
//! the semantic part off. The providers:
//! - **local**: a model run in-process on the CPU, chosen by the files in
//!   its folder: multilingual-e5-small (Russian and English, 384
//!   dimensions) where it holds `e5-small-q4.bin` (`e5`), else
//!   all-MiniLM-L6-v2 (English, 384 dimensions) from `config.json`,
//!   `tokenizer.json` and `model.safetensors` (`local`). No network, no key.
//!   The runtime sits behind the cargo feature `local-model` (on by
//!   default); the rest of maas sees it through [`model`].
//! - **offline**: a deterministic hashed embedding of words and their
//!   letter trigrams ([`offline`]), so tests cover the whole path without a
//!   model; it finds spelling neighbours, not meaning.
//! - **openai**: an OpenAI-compatible `POST {base}/embeddings`.
//! - **gemini**: Gemini `batchEmbedContents`.
//!
//! The HTTP providers use the endpoint and key of `[llm.openai]` /
//! `[llm.gemini]` (and their environment variables), like the chat roles.
//!
//! Guarantees: [`Embedder::embed`] returns one vector per input text, in
//! input order, all of one length and each of unit length (cosine = dot
//! product); a provider reply of any other shape is an [`EmbedError`],
//! never a short, ragged or reordered result.
//! Nothing here logs the texts.

#[cfg(feature = "local-model")]
pub mod e5;
mod http;
#[cfg(feature = "local-model")]
pub mod local;
pub mod model;
pub mod offline;

use std::path::PathBuf;
use std::sync::Arc;

use model::{Kind, LocalModel};
use std::time::Duration;

use serde::Deserialize;

use super::ProviderKind;
use super::config::{ConfigError, Endpoint, LlmConfig};

/// `[llm.embedding]`: which provider embeds memory text. Every field may
/// be omitted.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// `off`, `local`, `offline`, `openai` or `gemini`. Unset: `local` when
    /// its model is found ([`default_model_dir`]), else off.
    pub provider: Option<String>,
    /// The provider's model name. Defaults: openai `text-embedding-3-small`,
    /// gemini `text-embedding-004`, local `multilingual-e5-small` or
    /// `all-MiniLM-L6-v2` (by the folder's files), offline
    /// `offline-hash-384`. Stored with every embedding: a change of model
    /// re-embeds the user's turns.
    pub model: Option<String>,
    /// The local provider's model folder (`e5-small-q4.bin`, or
    /// `config.json`, `tokenizer.json` and `model.safetensors`; `bin/run`
    /// and `bin/eval-memory` fetch the first). Default: [`default_model_dir`].
    pub model_dir: Option<PathBuf>,
    /// Texts per call. Default 32.
    pub batch: Option<usize>,
    /// Timeout of one call, in seconds. Default 30 for a provider over
    /// HTTP; 600 for the local model, whose call is CPU work on this
    /// machine that a timeout cannot stop (on a busy machine a short one
    /// only throws the work away and starts it again).
    pub timeout_secs: Option<u64>,
}

/// Which provider embeds.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingProvider {
    /// A model run in-process from this folder.
    Local(PathBuf),
    /// The deterministic hashed embedding.
    Offline,
    /// An OpenAI-compatible endpoint.
    OpenAi(Endpoint),
    /// Gemini.
    Gemini(Endpoint),
}

impl EmbeddingProvider {
    /// Its name in configuration, logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            EmbeddingProvider::Local(_) => "local",
            EmbeddingProvider::Offline => "offline",
            EmbeddingProvider::OpenAi(_) => "openai",
            EmbeddingProvider::Gemini(_) => "gemini",
        }
    }
}

/// The resolved `[llm.embedding]` when it is on.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingSettings {
    /// The provider.
    pub provider: EmbeddingProvider,
    /// The model name (stored with every embedding).
    pub model: String,
    /// Texts per call.
    pub batch: usize,
    /// Timeout of one call.
    pub timeout: Duration,
}

/// Default texts per call.
pub const DEFAULT_BATCH: usize = 32;

/// Default timeout of a local model's call, in seconds: 32 turns with their
/// neighbours take multilingual-e5-small about 5 s of one core, and far
/// longer on a machine other work keeps busy.
const LOCAL_TIMEOUT_SECS: u64 = 600;

/// Longest wait for a search query's embedding, whatever the timeout of a
/// call: a request waits for it.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The local model used by default: the one model choice the default
/// configuration makes (the English all-MiniLM-L6-v2 is one setting away:
/// `model_dir` naming its folder).
pub const DEFAULT_LOCAL_MODEL: &str = model::E5_MODEL;

/// The files of the English local model's folder (the multilingual one's
/// is [`model::E5_WEIGHTS`]).
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// The folder the local model is looked for in when `model_dir` is unset:
/// `$XDG_CACHE_HOME/maas/models/<model>`, else
/// `$HOME/.cache/maas/models/<model>`; `None` without either variable.
pub fn default_model_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let cache = env("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env("HOME")
                .filter(|d| !d.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(cache.join("maas").join("models").join(DEFAULT_LOCAL_MODEL))
}

/// Whether `dir` holds a local model: the multilingual one's weights, or
/// the English one's three files.
fn holds_model(dir: &std::path::Path) -> bool {
    missing_model_files(dir).is_empty()
}

/// The files a local model's folder `dir` lacks: none when it holds the
/// multilingual model's weights ([`model::E5_WEIGHTS`]), else those of the
/// English model's three ([`MODEL_FILES`]) it lacks.
pub fn missing_model_files(dir: &std::path::Path) -> Vec<&'static str> {
    if model::e5_present(dir) {
        return Vec::new();
    }
    MODEL_FILES.into_iter().filter(|f| !dir.join(f).is_file()).collect()
}

impl EmbeddingConfig {
    /// The local model folder the default (provider unset) uses.
    fn default_dir(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        self.model_dir.clone().or_else(|| default_model_dir(env))
    }

    /// With `provider` unset, the local provider's configuration when its
    /// model is found ([`default_model_dir`]).
    fn found_default(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<EmbeddingConfig> {
        let dir = self.default_dir(env).filter(|d| model::BUILT && holds_model(d))?;
        Some(EmbeddingConfig {
            provider: Some("local".into()),
            model_dir: Some(dir),
            ..self.clone()
        })
    }

    /// With `provider` unset and no model found, why the memory search is
    /// full text alone, in plain words (maasd logs it once at start,
    /// `maasctl doctor` shows it); `None` otherwise.
    pub fn fallback_note(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        if self.provider.is_some() {
            return None;
        }
        let place = match self.default_dir(env) {
            _ if !model::BUILT => "this build has no local model runtime (the cargo feature `local-model`)".to_owned(),
            Some(dir) if holds_model(&dir) => return None,
            Some(dir) => format!("no {DEFAULT_LOCAL_MODEL} model in {}", dir.display()),
            None => "no model folder (set llm.embedding.model_dir)".to_owned(),
        };
        Some(format!(
            "semantic memory search is off: {place} (bin/run fetches it); the memory search is full text alone. \
             Set [llm.embedding] provider = \"off\" to silence this."
        ))
    }

    /// The settings, or `None` when embeddings are off. `llm` gives the
    /// HTTP providers' endpoints; `env` looks a variable up.
    pub fn resolve(
        &self,
        llm: &LlmConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<EmbeddingSettings>, ConfigError> {
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            key: format!("llm.embedding.{field}"),
            reason,
        };
        let name = match self.provider.as_deref().map(str::trim) {
            Some(name) => name,
            // Unset: the local model where it is found, else full text.
            None => return self.found_default(env).map_or(Ok(None), |cfg| cfg.resolve(llm, env)),
        };
        let (provider, default_model) = match name.to_ascii_lowercase().as_str() {
            "off" | "" => return Ok(None),
            "local" => {
                let dir = self.model_dir.clone().ok_or_else(|| {
                    invalid(
                        "model_dir",
                        "the local provider needs the folder of its model (e5-small-q4.bin, or config.json, \
                         tokenizer.json and model.safetensors)"
                            .into(),
                    )
                })?;
                let name = model::model_in(&dir);
                (EmbeddingProvider::Local(dir), name)
            }
            "offline" => (EmbeddingProvider::Offline, offline::MODEL),
            other => {
                let kind: ProviderKind = other.parse().map_err(|_| {
                    invalid(
                        "provider",
                        format!("unknown embedding provider {name:?} (expected off, local, offline, openai or gemini)"),
                    )
                })?;
                if !matches!(kind, ProviderKind::OpenAi | ProviderKind::Gemini) {
                    return Err(invalid(
                        "provider",
                        format!("{name} offers no embeddings (expected off, local, offline, openai or gemini)"),
                    ));
                }
                match (kind, llm.resolve_endpoint(kind, "embedding", env)?) {
                    (ProviderKind::OpenAi, Some(e)) => (EmbeddingProvider::OpenAi(e), "text-embedding-3-small"),
                    (_, Some(e)) => (EmbeddingProvider::Gemini(e), "text-embedding-004"),
                    (_, None) => {
                        return Err(invalid("provider", format!("{name} has no endpoint")));
                    }
                }
            }
        };
        let batch = self.batch.unwrap_or(DEFAULT_BATCH);
        if !(1..=2048).contains(&batch) {
            return Err(invalid("batch", format!("must be between 1 and 2048 (got {batch})")));
        }
        let default_timeout = match provider {
            EmbeddingProvider::Local(_) => LOCAL_TIMEOUT_SECS,
            _ => 30,
        };
        let timeout_secs = self.timeout_secs.unwrap_or(default_timeout);
        if !(1..=3600).contains(&timeout_secs) {
            return Err(invalid(
                "timeout_secs",
                format!("must be between 1 and 3600 (got {timeout_secs})"),
            ));
        }
        let model = self
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(default_model)
            .to_owned();
        Ok(Some(EmbeddingSettings {
            provider,
            model,
            batch,
            timeout: Duration::from_secs(timeout_secs),
        }))
    }
}

/// Why texts could not be embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    /// The local model could not be loaded (at startup).
    #[error("the embedding model in {dir} could not be loaded: {reason}")]
    Load {
        /// Its folder.
        dir: String,
        /// What went wrong.
        reason: String,
    },
    /// A call failed: transport, status, timeout, or a reply of the wrong
    /// shape. `retryable` says whether trying again later may succeed.
    #[error("{provider} embeddings: {message}")]
    Call {
        /// The provider's name.
        provider: &'static str,
        /// What happened, with the provider's own words where it gave some
        /// (never the key).
        message: String,
        /// Whether a later try may succeed (transport, 429, 5xx, timeout).
        retryable: bool,
    },
}

impl EmbedError {
    /// Whether a later try may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            EmbedError::Load { .. } => false,
            EmbedError::Call { retryable, .. } => *retryable,
        }
    }
}

/// Why the embedder `[llm.embedding]` names could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// A setting is wrong (the error names its key).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The local model could not be loaded, or the HTTP client built.
    #[error("{0}")]
    Embed(#[from] EmbedError),
}

/// The settings `[llm.embedding]` names, with the process's environment
/// (keys of the HTTP providers), or `None` when embeddings are off.
pub fn settings(llm: &LlmConfig) -> Result<Option<EmbeddingSettings>, ConfigError> {
    llm.embedding.resolve(llm, &|name| std::env::var(name).ok())
}

/// The embedder `[llm.embedding]` names ([`settings`]), or `None` when
/// embeddings are off (the default); a local model is loaded here.
pub fn configured(llm: &LlmConfig) -> Result<Option<Embedder>, SetupError> {
    match settings(llm)? {
        Some(settings) => Ok(Some(Embedder::new(&settings)?)),
        None => Ok(None),
    }
}

enum Backend {
    Local(Arc<dyn LocalModel>),
    Offline,
    Http {
        http: reqwest::Client,
        provider: EmbeddingProvider,
    },
}

/// Embeds texts with the configured provider. Cheap to clone.
#[derive(Clone)]
pub struct Embedder {
    backend: Arc<Backend>,
    model: String,
    batch: usize,
    timeout: Duration,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("provider", &self.provider_name())
            .field("model", &self.model)
            .finish()
    }
}

impl Embedder {
    /// Builds the embedder; the local provider loads its model here (a
    /// missing or broken model fails startup, naming the folder).
    pub fn new(settings: &EmbeddingSettings) -> Result<Embedder, EmbedError> {
        let backend = match &settings.provider {
            EmbeddingProvider::Local(dir) => Backend::Local(model::load(dir)?),
            EmbeddingProvider::Offline => Backend::Offline,
            p @ (EmbeddingProvider::OpenAi(_) | EmbeddingProvider::Gemini(_)) => {
                let http = reqwest::Client::builder()
                    .user_agent(concat!("maas/", env!("CARGO_PKG_VERSION")))
                    // A redirect would carry the API key to another host.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| EmbedError::Call {
                        provider: p.name(),
                        message: format!("cannot build the HTTP client: {e}"),
                        retryable: false,
                    })?;
                Backend::Http {
                    http,
                    provider: p.clone(),
                }
            }
        };
        Ok(Embedder {
            backend: Arc::new(backend),
            model: settings.model.clone(),
            batch: settings.batch,
            timeout: settings.timeout,
        })
    }

    /// The provider's name.
    pub fn provider_name(&self) -> &'static str {
        match &*self.backend {
            Backend::Local(_) => "local",
            Backend::Offline => "offline",
            Backend::Http { provider, .. } => provider.name(),
        }
    }

    /// The model name stored with every embedding.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Texts per call.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// One unit vector per text, in order (calls of at most
    /// [`Embedder::batch`] texts each, each within the timeout).
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_as(texts, Kind::Passage).await
    }

    /// [`Embedder::embed`] for texts of one kind (a model trained with
    /// query and passage prefixes gets the right one; others ignore it).
    async fn embed_as(&self, texts: &[String], kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch.max(1)) {
            let call = self.embed_chunk(chunk, kind);
            let vectors = tokio::time::timeout(self.timeout, call)
                .await
                .map_err(|_| EmbedError::Call {
                    provider: self.provider_name(),
                    message: format!("no answer within {} s", self.timeout.as_secs()),
                    retryable: true,
                })??;
            if vectors.len() != chunk.len() {
                return Err(EmbedError::Call {
                    provider: self.provider_name(),
                    message: format!("asked for {} vectors, got {}", chunk.len(), vectors.len()),
                    retryable: false,
                });
            }
            for v in vectors {
                if let Some(first) = out.first().map(Vec::len).filter(|n| *n != v.len()) {
                    return Err(EmbedError::Call {
                        provider: self.provider_name(),
                        message: format!("a vector has {} components, an earlier one {first}", v.len()),
                        retryable: false,
                    });
                }
                out.push(normalised(v).ok_or_else(|| EmbedError::Call {
                    provider: self.provider_name(),
                    message: "a vector was empty, zero or not finite".into(),
                    retryable: false,
                })?);
            }
        }
        Ok(out)
    }

    /// The embedding of a search's query, or `None` when it cannot be had
    /// (logged with the error): the search then runs on full text alone
    /// rather than failing.
    pub async fn embed_query(&self, query: &str) -> Option<Vec<f32>> {
        // A request waits for it: never longer than an HTTP provider's call.
        let within = self.timeout.min(QUERY_TIMEOUT);
        let embedded = tokio::time::timeout(within, self.embed_as(&[query.to_owned()], Kind::Query))
            .await
            .unwrap_or_else(|_| {
                Err(EmbedError::Call {
                    provider: self.provider_name(),
                    message: format!("no answer within {} s", within.as_secs()),
                    retryable: true,
                })
            });
        match embedded {
            Ok(mut v) => v.pop(),
            Err(e) => {
                tracing::warn!(error = %e, "embedding the query failed; the memory search runs on full text alone");
                None
            }
        }
    }

    /// The embedding of a search's query and the model that made it, for
    /// the semantic part of a memory search: `None` without an embedder,
    /// for a blank query, or when it cannot be embedded ([`Embedder::embed_query`]):
    /// the search then runs on full text alone.
    pub async fn for_search<'e>(embedder: Option<&'e Embedder>, query: &str) -> Option<(Vec<f32>, &'e str)> {
        let e = embedder.filter(|_| !query.trim().is_empty())?;
        Some((e.embed_query(query).await?, e.model()))
    }

    async fn embed_chunk(&self, texts: &[String], kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError> {
        match &*self.backend {
            Backend::Offline => Ok(texts.iter().map(|t| offline::embed(t)).collect()),
            Backend::Local(model) => {
                let model = Arc::clone(model);
                let texts = texts.to_vec();
                tokio::task::spawn_blocking(move || model.embed(&texts, kind))
                    .await
                    .map_err(stopped)?
            }
            Backend::Http {
                http,
                provider: EmbeddingProvider::OpenAi(endpoint),
            } => http::openai(http, endpoint, &self.model, texts).await,
            Backend::Http {
                http,
                provider: EmbeddingProvider::Gemini(endpoint),
            } => http::gemini(http, endpoint, &self.model, texts).await,
            Backend::Http { provider, .. } => Err(EmbedError::Call {
                provider: provider.name(),
                message: "not an HTTP provider".into(),
                retryable: false,
            }),
        }
    }
}

/// The cosine of two vectors.
#[cfg(test)]
fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (n(a) * n(b))
}

/// A local model's task that ended without an answer.
fn stopped(e: tokio::task::JoinError) -> EmbedError {
    EmbedError::Call {
        provider: "local",
        message: format!("the embedding task stopped: {e}"),
        retryable: true,
    }
}

/// `v` scaled to unit length; `None` if empty, zero or not finite.
fn normalised(mut v: Vec<f32>) -> Option<Vec<f32>> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if v.is_empty() || !norm.is_finite() || norm == 0.0 {
        return None;
    }
    for x in &mut v {
        // Narrowing back to f32 is the point: vectors travel as real[].
        #[allow(clippy::cast_possible_truncation)]
        let scaled = (f64::from(*x) / norm) as f32;
        *x = scaled;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(_: &str) -> Option<String> {
        None
    }

    fn cfg(provider: &str) -> EmbeddingConfig {
        EmbeddingConfig {
            provider: Some(provider.into()),
            ..EmbeddingConfig::default()
        }
    }

    #[test]
    #[cfg(feature = "local-model")]
    fn unset_is_the_local_model_where_found_else_full_text_with_a_note() {
        let dir = std::env::temp_dir().join(format!("maas-model-{}", uuid::Uuid::new_v4().simple()));
        let home = dir.to_string_lossy().into_owned();
        let at_home = move |name: &str| (name == "HOME").then(|| home.clone());
        let unset = EmbeddingConfig::default();
        assert_eq!(unset.resolve(&LlmConfig::default(), &at_home), Ok(None));
        let note = unset.fallback_note(&at_home).unwrap_or_default();
        assert!(
            note.contains("full text") && note.contains(".cache/maas/models/multilingual-e5-small"),
            "{note}"
        );
        assert_eq!(cfg("off").fallback_note(&at_home), None, "off says nothing");

        let models = dir.join(".cache/maas/models").join(DEFAULT_LOCAL_MODEL);
        std::fs::create_dir_all(&models).unwrap_or_default();
        std::fs::write(models.join(model::E5_WEIGHTS), "").unwrap_or_default();
        let got = unset.resolve(&LlmConfig::default(), &at_home);
        assert!(
            matches!(&got, Ok(Some(s)) if s.provider == EmbeddingProvider::Local(models.clone()) && s.model == DEFAULT_LOCAL_MODEL),
            "{got:?}"
        );
        assert_eq!(unset.fallback_note(&at_home), None);

        // The English model, one setting away: its folder as `model_dir`.
        let english = dir.join("all-MiniLM-L6-v2");
        std::fs::create_dir_all(&english).unwrap_or_default();
        assert_eq!(missing_model_files(&english), MODEL_FILES);
        for f in MODEL_FILES {
            std::fs::write(english.join(f), "").unwrap_or_default();
        }
        let chosen = EmbeddingConfig {
            model_dir: Some(english.clone()),
            ..EmbeddingConfig::default()
        };
        let got = chosen.resolve(&LlmConfig::default(), &at_home);
        assert!(
            matches!(&got, Ok(Some(s)) if s.provider == EmbeddingProvider::Local(english.clone()) && s.model == model::MINILM_MODEL),
            "{got:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap_or_default();
    }

    #[test]
    fn off_without_a_model() {
        let got = EmbeddingConfig::default().resolve(&LlmConfig::default(), &env);
        assert_eq!(got, Ok(None));
    }

    #[test]
    fn local_needs_its_folder_and_unknown_names_are_named() {
        let problem = |provider: &str| {
            cfg(provider)
                .resolve(&LlmConfig::default(), &env)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = problem("local");
        assert!(e.starts_with("llm.embedding.model_dir"), "{e}");
        let e = problem("word2vec");
        assert!(e.contains("\"word2vec\""), "{e}");
        let e = problem("anthropic");
        assert!(e.contains("offers no embeddings"), "{e}");
    }

    #[test]
    fn openai_needs_a_key_and_takes_the_endpoint_of_llm_openai() {
        let e = cfg("openai")
            .resolve(&LlmConfig::default(), &env)
            .err()
            .map(|e| e.to_string());
        assert!(e.as_deref().is_some_and(|e| e.contains("OPENAI_API_KEY")), "{e:?}");
        let key = |name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_owned());
        let got = cfg("openai").resolve(&LlmConfig::default(), &key);
        let Ok(Some(s)) = got else { panic!("{got:?}") };
        assert_eq!(s.model, "text-embedding-3-small");
        let EmbeddingProvider::OpenAi(endpoint) = s.provider else {
            panic!("{:?}", s.provider)
        };
        assert_eq!(endpoint.base_url, "https://api.openai.com/v1");
    }

    #[test]
    fn vectors_come_back_unit_length_or_not_at_all() {
        let v = normalised(vec![3.0, 4.0]).unwrap_or_default();
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6, "{v:?}");
        assert_eq!(normalised(vec![0.0, 0.0]), None);
        assert_eq!(normalised(vec![]), None);
        assert_eq!(normalised(vec![f32::NAN]), None);
    }

    #[tokio::test]
    async fn the_offline_embedder_is_deterministic_and_batches_in_order() {
        let Ok(Some(s)) = cfg("offline").resolve(&LlmConfig::default(), &env) else {
            panic!("offline resolves")
        };
        let e = Embedder::new(&EmbeddingSettings { batch: 2, ..s }).unwrap_or_else(|e| panic!("{e}"));
        let texts: Vec<String> = ["a sister in Lisbon", "the weather", "Lisboa", "tea"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let a = e.embed(&texts).await.unwrap_or_else(|e| panic!("{e}"));
        let b = e.embed(&texts[2..]).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.len(), 4);
        assert_eq!(a[2..], b[..], "the same text, the same vector, whatever its batch");
    }
}
