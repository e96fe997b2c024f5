//! [`Llm`]: the per-role clients behind one shared `reqwest::Client`.
//!
//! Built once at startup from [`LlmConfig`]. A call goes: admission
//! ([`limit`](super::limit)) → the provider's request shape → one HTTP
//! exchange under the role timeout → classification ([`LlmError`]). A 429
//! also starts the endpoint's shared cool-down. A streamed call
//! ([`Llm::chat_stream`]) takes the same path, reading the answer through
//! [`stream`](super::stream) instead of as one body. Nothing is retried here, and no redirect
//! is followed (the API key goes only to the configured base URL).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::config::{Endpoint, LlmConfig, ResolvedLlm, RoleSettings};
use super::error::{classify_status, scrub};
use super::limit::{Cooling, OUTAGE_PATIENCE, RoleLimits};
use super::offline::Offline;
use super::wire::Shape;
use super::{
    ChatRequest, ChatResponse, ConfigError, DeltaSink, LlmError, ProviderKind, Role, anthropic, gemini, openai, stream,
};
use crate::secret::Secret;

/// Bodies larger than this are not read to the end: no chat completion is
/// this big, and a misbehaving endpoint must not exhaust memory.
pub(crate) const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// What a provider returned, before it becomes a [`ChatResponse`].
pub(crate) struct Completion {
    pub(crate) text: String,
    pub(crate) model: Option<String>,
    pub(crate) prompt_tokens: Option<u32>,
    pub(crate) completion_tokens: Option<u32>,
}

/// A failed call as the provider left it: the error, and whether the
/// endpoint had answered (a stream cut mid-answer is a `Connect` error of
/// an endpoint that is there).
pub(crate) struct Failed {
    pub(crate) error: LlmError,
    pub(crate) answered: bool,
}

impl From<LlmError> for Failed {
    fn from(error: LlmError) -> Failed {
        Failed { error, answered: false }
    }
}

/// Which API a role speaks, with its endpoint.
enum Backend {
    Http(Endpoint, &'static Shape),
    Offline,
}

type Parse = fn(&[u8]) -> Result<Completion, String>;

/// The LLM clients of all roles. Cheap to share behind an `Arc`.
pub struct Llm {
    http: reqwest::Client,
    roles: [RoleClient; 3],
    offline: Offline,
}

struct RoleClient {
    settings: RoleSettings,
    backend: Backend,
    limits: RoleLimits,
    /// Shared with every role that uses the same provider.
    cooling: Arc<Cooling>,
}

impl fmt::Debug for Llm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Llm");
        for client in &self.roles {
            s.field(client.settings.role.as_str(), &client.settings);
        }
        s.finish_non_exhaustive()
    }
}

impl Llm {
    /// Builds the clients, reading the provider variables (`OPENAI_API_KEY`
    /// and friends, see [`config`](super::config)) from the process
    /// environment. `default_provider` is `MAAS_LLM_PROVIDER` (`"offline"`
    /// when unset).
    pub fn from_config(cfg: &LlmConfig, default_provider: &str) -> Result<Llm, ConfigError> {
        Llm::from_config_with_env(cfg, default_provider, |name| std::env::var(name).ok())
    }

    /// [`Llm::from_config`] with the environment given as a lookup function.
    pub fn from_config_with_env(
        cfg: &LlmConfig,
        default_provider: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Llm, ConfigError> {
        Llm::new(cfg.resolve(default_provider, &env)?)
    }

    /// Builds the clients from resolved settings.
    pub fn new(resolved: ResolvedLlm) -> Result<Llm, ConfigError> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("maas/", env!("CARGO_PKG_VERSION")))
            // A redirect would carry the API key to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConfigError::HttpClient(e.to_string()))?;
        let offline = Offline::new(
            resolved.offline_latency,
            resolved.offline_stream_pace,
            resolved.offline_fail_marker.clone(),
        );
        // One cool-down per provider: the configuration gives each provider
        // one endpoint and one key, i.e. one account's rate limits.
        let mut cooling: HashMap<ProviderKind, Arc<Cooling>> = HashMap::new();
        let mut build = |role: Role, settings: RoleSettings| -> Result<RoleClient, ConfigError> {
            if settings.role != role {
                return Err(ConfigError::Invalid {
                    key: format!("llm.{role}"),
                    reason: format!("holds the settings of llm.{}", settings.role),
                });
            }
            let backend = match (settings.provider, settings.endpoint.clone()) {
                (ProviderKind::OpenAi, Some(endpoint)) => Backend::Http(endpoint, &openai::SHAPE),
                (ProviderKind::Anthropic, Some(endpoint)) => Backend::Http(endpoint, &anthropic::SHAPE),
                (ProviderKind::Gemini, Some(endpoint)) => Backend::Http(endpoint, &gemini::SHAPE),
                (ProviderKind::Offline, _) => Backend::Offline,
                (provider, None) => {
                    return Err(ConfigError::Invalid {
                        key: format!("llm.{provider}"),
                        reason: format!("llm.{} has no endpoint", settings.role),
                    });
                }
            };
            let cooling = Arc::clone(cooling.entry(settings.provider).or_default());
            Ok(RoleClient {
                limits: RoleLimits::new(&settings),
                backend,
                settings,
                cooling,
            })
        };
        let [analyzer, responder, archivist] = resolved.roles;
        let roles = [
            build(Role::Analyzer, analyzer)?,
            build(Role::Responder, responder)?,
            build(Role::Archivist, archivist)?,
        ];
        Ok(Llm { http, roles, offline })
    }

    /// The model a role uses.
    pub fn model(&self, role: Role) -> &str {
        &self.roles[role.index()].settings.model
    }

    /// The provider name a role uses (`openai`, `anthropic`, `gemini`,
    /// `offline`).
    pub fn provider_name(&self, role: Role) -> &'static str {
        self.roles[role.index()].settings.provider.as_str()
    }

    /// All resolved settings of a role (keys redact in `Debug`).
    pub fn settings(&self, role: Role) -> &RoleSettings {
        &self.roles[role.index()].settings
    }

    /// Sends one chat request with the role's provider, model, temperature,
    /// token limit and timeout, within its concurrency and rate limits.
    ///
    /// Returns within two role timeouts: at most one waiting for admission
    /// (see [`limit`](super::limit)), one for the HTTP exchange. Never
    /// retries: the error's [`LlmError::disposition`] says what to do.
    pub async fn chat(&self, role: Role, req: ChatRequest) -> Result<ChatResponse, LlmError> {
        let result = self.call(role, req, None).await;
        super::metrics::record_call(self.roles[role.index()].settings.provider, role, result.as_ref());
        result
    }

    /// [`Llm::chat`], asking the provider to stream: each piece of the
    /// answer goes to `sink` as [`Delta::Text`](super::Delta::Text) while the
    /// model writes (never a `Restart`: a call does not start over), and the
    /// whole answer with its usage is returned at the end.
    ///
    /// Same limits, timeouts, metrics and error classes as `chat`; the role
    /// timeout bounds the whole stream. A failed call may have sent part of
    /// an answer: the caller voids it.
    pub async fn chat_stream(&self, role: Role, req: ChatRequest, sink: &DeltaSink) -> Result<ChatResponse, LlmError> {
        let result = self.call(role, req, Some(sink)).await;
        super::metrics::record_call(self.roles[role.index()].settings.provider, role, result.as_ref());
        result
    }

    async fn call(&self, role: Role, req: ChatRequest, sink: Option<&DeltaSink>) -> Result<ChatResponse, LlmError> {
        let client = &self.roles[role.index()];
        let settings = &client.settings;
        let provider = settings.provider.as_str();
        let deadline = Instant::now() + settings.timeout;
        let _permit = client
            .limits
            .admit(provider, &client.cooling, deadline)
            .await
            .inspect_err(|e| {
                tracing::debug!(
                    role = role.as_str(),
                    provider,
                    error.class = e.class(),
                    "llm call not admitted"
                );
            })?;

        let sent = Instant::now();
        let result = match &client.backend {
            Backend::Http(ep, shape) => {
                let builder = (shape.request)(ep, settings, &req, sink.is_some()).build(&self.http);
                match sink {
                    None => exchange(settings, ep, builder, shape.parse).await.map_err(Failed::from),
                    Some(sink) => stream::exchange(settings, ep, builder, shape.read_event, sink).await,
                }
            }
            Backend::Offline => self
                .offline
                .chat(role, settings, &req, sink)
                .await
                .map_err(Failed::from),
        };
        let latency = sent.elapsed();

        match result {
            Ok(done) => {
                client.cooling.reachable();
                tracing::debug!(
                    role = role.as_str(),
                    provider,
                    model = settings.model,
                    prompt.chars = req.prompt_chars(),
                    completion.chars = done.text.len(),
                    prompt_tokens = done.prompt_tokens,
                    completion_tokens = done.completion_tokens,
                    latency_ms = latency.as_millis(),
                    "llm call completed"
                );
                Ok(ChatResponse {
                    text: done.text,
                    model: done.model.unwrap_or_else(|| settings.model.clone()),
                    prompt_tokens: done.prompt_tokens,
                    completion_tokens: done.completion_tokens,
                    latency,
                })
            }
            Err(error) => Err(failed(client, role, sent, latency, error)),
        }
    }
}

/// What a failed call leaves: the endpoint's reachability and rate-limit
/// pause noted, the error as the caller sees it (a failed connection may
/// become the outage's, see [`outage`]), logged.
fn failed(client: &RoleClient, role: Role, sent: Instant, latency: Duration, failure: Failed) -> LlmError {
    let settings = &client.settings;
    let provider = settings.provider.as_str();
    let Failed { error, answered } = failure;
    let error = match error {
        LlmError::Connect { provider, message } if !answered => outage(&client.cooling, sent, provider, message),
        // Not sent, or no answer: says nothing of the endpoint.
        LlmError::Timeout { .. } | LlmError::Throttled { .. } | LlmError::Outage { .. } => error,
        // Any HTTP answer: the endpoint is there.
        answered => {
            client.cooling.reachable();
            answered
        }
    };
    if let LlmError::RateLimited { retry_after, .. } = &error {
        let pause = client.cooling.rate_limited(*retry_after);
        tracing::warn!(
            provider,
            retry_after_ms = retry_after.map(|d| d.as_millis()),
            cooling_ms = pause.as_millis(),
            "llm provider is rate limiting; every call to it waits"
        );
    }
    tracing::debug!(
        role = role.as_str(),
        provider,
        model = settings.model,
        error.class = error.class(),
        error.status = error.status(),
        latency_ms = latency.as_millis(),
        "llm call failed"
    );
    error
}

/// A failed connection to an endpoint (see [`limit`](super::limit)): the
/// first of an outage stays a `Connect` error (a try of its request); later
/// ones are the outage's, until it has lasted [`OUTAGE_PATIENCE`].
fn outage(cooling: &Cooling, sent: Instant, provider: &'static str, message: String) -> LlmError {
    let down = cooling.unreachable(sent);
    if down.first {
        tracing::warn!(
            provider,
            error = %message,
            pause_ms = down.pause.as_millis(),
            "llm provider unreachable; calls to it pause, and requests wait for it without spending tries"
        );
    }
    if down.first || down.down_for >= OUTAGE_PATIENCE {
        LlmError::Connect { provider, message }
    } else {
        LlmError::Outage {
            provider,
            message,
            down_for: down.down_for,
            retry_after: down.pause,
        }
    }
}

/// One HTTP exchange: send, read the body (bounded), classify.
async fn exchange(
    settings: &RoleSettings,
    endpoint: &Endpoint,
    builder: reqwest::RequestBuilder,
    parse: Parse,
) -> Result<Completion, LlmError> {
    let mut response = send(settings, endpoint, builder).await?;
    if !response.status().is_success() {
        return Err(http_error(response, settings, endpoint).await);
    }
    let body = read_body(&mut response, settings, endpoint).await?;
    parse(&body).map_err(|message| LlmError::InvalidResponse {
        provider: settings.provider.as_str(),
        message: scrub(&message, Some(&endpoint.api_key)),
    })
}

/// Sends a call under the role timeout; the response, whatever its status.
pub(crate) async fn send(
    settings: &RoleSettings,
    endpoint: &Endpoint,
    builder: reqwest::RequestBuilder,
) -> Result<reqwest::Response, LlmError> {
    builder
        .timeout(settings.timeout)
        .send()
        .await
        .map_err(|e| transport_error(settings.provider, settings.timeout, e, Some(&endpoint.api_key)))
}

/// A non-success answer, read and classified.
pub(crate) async fn http_error(
    mut response: reqwest::Response,
    settings: &RoleSettings,
    endpoint: &Endpoint,
) -> LlmError {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    match read_body(&mut response, settings, endpoint).await {
        Ok(body) => classify_status(
            settings.provider,
            status,
            &headers,
            &body,
            SystemTime::now(),
            Some(&endpoint.api_key),
        ),
        Err(error) => error,
    }
}

/// The rest of a response's body, at most [`MAX_BODY_BYTES`].
async fn read_body(
    response: &mut reqwest::Response,
    settings: &RoleSettings,
    endpoint: &Endpoint,
) -> Result<Vec<u8>, LlmError> {
    let provider = settings.provider;
    let mut body = Vec::new();
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Ok(body),
            Err(e) => return Err(transport_error(provider, settings.timeout, e, Some(&endpoint.api_key))),
        };
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(LlmError::InvalidResponse {
                provider: provider.as_str(),
                message: format!("HTTP {}: body larger than {MAX_BODY_BYTES} bytes", response.status()),
            });
        }
        body.extend_from_slice(&chunk);
    }
}

/// A reqwest error: the timeout, or a transport failure with its cause
/// chain (the URL is left out; the provider name says where).
pub(crate) fn transport_error(
    provider: ProviderKind,
    timeout: Duration,
    error: reqwest::Error,
    key: Option<&Secret>,
) -> LlmError {
    if error.is_timeout() {
        return LlmError::Timeout {
            provider: provider.as_str(),
            message: format!("no complete answer within {} s", timeout.as_secs_f64()),
        };
    }
    let error = error.without_url();
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    LlmError::Connect {
        provider: provider.as_str(),
        message: scrub(&message, key),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}

    /// The dispatcher shares one `Llm` across tasks and spawns `chat`.
    #[test]
    fn llm_is_shareable_and_chat_can_be_spawned() {
        send_sync::<Llm>();
        let llm = Llm::from_config_with_env(&LlmConfig::default(), "offline", |_| None).unwrap();
        let call = llm.chat(Role::Responder, ChatRequest::new(None, "hi"));
        send(&call);
    }
}
