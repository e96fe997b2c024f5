//! What went wrong with a model call, and what the caller should do about it.
//!
//! Every failure of [`Llm::chat`](super::Llm::chat) is one [`LlmError`]
//! variant; [`LlmError::class`] names it for the attempt record and metrics,
//! [`LlmError::disposition`] tells the dispatcher whether to retry (counting an
//! attempt), wait for the provider's rate limit (not counting one), give up,
//! or truncate the prompt. The client itself never retries or backs off.
//!
//! The classification of an HTTP error ([`classify_status`]) looks at the
//! status first and the body second, because providers reuse statuses:
//! a 429 is either a rate limit that passes (wait) or an exhausted quota or
//! spend limit that does not (fail); a 400 is either a malformed request
//! (fail) or a prompt too long for the model (truncate).
//!
//! Provider text quoted in an error is truncated to [`MAX_PROVIDER_MESSAGE`]
//! characters and scrubbed of the API key.
//!
//! Every provider's error shapes (statuses, bodies, headers of
//! OpenAI-compatible, Anthropic and Gemini) are classified in one table so
//! one reading shows every case; its tests are in `error/tests.rs`.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, NaiveDateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::ProviderKind;
use crate::secret::Secret;

/// How many characters of a provider's own error message an error keeps.
pub const MAX_PROVIDER_MESSAGE: usize = 500;

/// What the caller does with a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmDisposition {
    /// Transient: count an attempt and retry with exponential backoff.
    Retry,
    /// The provider answered 429: wait `retry_after` if given, else the
    /// policy default (60 s); the try counts (the policy allows 3).
    RateLimited {
        /// The provider's hint, when it gave one.
        retry_after: Option<Duration>,
    },
    /// This daemon's own limit for the provider (its shared cool-down after
    /// a 429, the role's requests per minute or concurrency) kept the request
    /// from being sent: wait and try again without counting a try.
    Throttled {
        /// How long until the limit lifts, when known.
        retry_after: Option<Duration>,
    },
    /// Permanent: retrying the same request cannot succeed.
    Fail,
    /// The prompt does not fit the model: truncate it and try again.
    TokenLimit,
}

/// A failed model call. `provider` is the provider's configuration name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// No complete answer within the role timeout (or the server said 408).
    #[error("{provider}: timed out: {message}")]
    Timeout {
        /// Provider name.
        provider: &'static str,
        /// What timed out.
        message: String,
    },
    /// The request never got an HTTP answer: DNS, refused, reset, TLS.
    #[error("{provider}: connection failed: {message}")]
    Connect {
        /// Provider name.
        provider: &'static str,
        /// The transport error chain.
        message: String,
    },
    /// A connection failed again while the provider was already known to
    /// be unreachable (see [`limit`](super::limit)): an outage, not a try of
    /// this request's. It waits for the provider without counting a try,
    /// for as long as the outage is younger than
    /// [`OUTAGE_PATIENCE`](super::limit::OUTAGE_PATIENCE).
    #[error("{provider}: unreachable for {:.1} s (waiting {:.1} s before the next try): {message}",
            .down_for.as_secs_f64(), .retry_after.as_secs_f64())]
    Outage {
        /// Provider name.
        provider: &'static str,
        /// The transport error chain.
        message: String,
        /// Since the first failed connection of the outage.
        down_for: Duration,
        /// Until calls to the provider are tried again.
        retry_after: Duration,
    },
    /// A 5xx other than 529.
    #[error("{provider}: server error (HTTP {status}): {message}")]
    Server {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Anthropic's 529: the API as a whole is overloaded.
    #[error("{provider}: overloaded (HTTP {status}): {message}")]
    Overloaded {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// A 429 that passes with time.
    #[error("{provider}: rate limited{}: {message}", retry_after_note(*.retry_after))]
    RateLimited {
        /// Provider name.
        provider: &'static str,
        /// How long to wait, when known.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// A local limit of this daemon (the provider's shared cool-down, the
    /// role's requests per minute or concurrency) kept the request from being
    /// sent at all.
    #[error("{provider}: throttled by this daemon{}: {message}", retry_after_note(*.retry_after))]
    Throttled {
        /// Provider name.
        provider: &'static str,
        /// How long until the limit lifts, when known.
        retry_after: Option<Duration>,
        /// Which local limit applied.
        message: String,
    },
    /// The account's quota or spend limit is used up; waiting minutes will
    /// not help, so the request fails.
    #[error(
        "{provider}: quota or spend limit exhausted (HTTP {status}); not retrying until \
         the account is topped up or its quota resets: {message}"
    )]
    QuotaExhausted {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The prompt is longer than the model's context window.
    #[error("{provider}: prompt exceeds the model's token limit (HTTP {status}): {message}")]
    TokenLimit {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Any other 4xx: malformed request, unknown model, and so on.
    #[error("{provider}: request rejected (HTTP {status}): {message}")]
    BadRequest {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// 401 or 403: a wrong, revoked or unauthorised key.
    #[error("{provider}: authentication failed (HTTP {status}); check the API key: {message}")]
    Auth {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// A success status whose body is not the expected shape, or an empty
    /// completion.
    #[error("{provider}: invalid response: {message}")]
    InvalidResponse {
        /// Provider name.
        provider: &'static str,
        /// What was wrong with it.
        message: String,
    },
    /// The offline provider's fault injection fired
    /// (`llm.offline.fail_when_query_contains`).
    #[error("offline provider: injected failure")]
    Injected,
}

fn retry_after_note(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (retry after {:.1} s)", d.as_secs_f64()),
        None => String::new(),
    }
}

impl LlmError {
    /// A stable name for the attempt record and metrics: `timeout`,
    /// `connect` (an [`Outage`](LlmError::Outage) too), `server`, `overloaded`, `rate_limited`, `throttled`, `quota_exhausted`,
    /// `token_limit`, `bad_request`, `auth` or `invalid_response`.
    pub fn class(&self) -> &'static str {
        match self {
            LlmError::Timeout { .. } => "timeout",
            LlmError::Connect { .. } | LlmError::Outage { .. } => "connect",
            LlmError::Server { .. } | LlmError::Injected => "server",
            LlmError::Overloaded { .. } => "overloaded",
            LlmError::RateLimited { .. } => "rate_limited",
            LlmError::Throttled { .. } => "throttled",
            LlmError::QuotaExhausted { .. } => "quota_exhausted",
            LlmError::TokenLimit { .. } => "token_limit",
            LlmError::BadRequest { .. } => "bad_request",
            LlmError::Auth { .. } => "auth",
            LlmError::InvalidResponse { .. } => "invalid_response",
        }
    }

    /// What the caller should do; see [`LlmDisposition`].
    pub fn disposition(&self) -> LlmDisposition {
        match self {
            LlmError::Timeout { .. }
            | LlmError::Connect { .. }
            | LlmError::Server { .. }
            | LlmError::Overloaded { .. }
            | LlmError::InvalidResponse { .. }
            | LlmError::Injected => LlmDisposition::Retry,
            LlmError::RateLimited { retry_after, .. } => LlmDisposition::RateLimited {
                retry_after: *retry_after,
            },
            LlmError::Throttled { retry_after, .. } => LlmDisposition::Throttled {
                retry_after: *retry_after,
            },
            LlmError::Outage { retry_after, .. } => LlmDisposition::Throttled {
                retry_after: Some(*retry_after),
            },
            LlmError::QuotaExhausted { .. } | LlmError::BadRequest { .. } | LlmError::Auth { .. } => {
                LlmDisposition::Fail
            }
            LlmError::TokenLimit { .. } => LlmDisposition::TokenLimit,
        }
    }

    /// The provider's configuration name.
    pub fn provider(&self) -> &'static str {
        match self {
            LlmError::Timeout { provider, .. }
            | LlmError::Connect { provider, .. }
            | LlmError::Outage { provider, .. }
            | LlmError::Server { provider, .. }
            | LlmError::Overloaded { provider, .. }
            | LlmError::RateLimited { provider, .. }
            | LlmError::Throttled { provider, .. }
            | LlmError::QuotaExhausted { provider, .. }
            | LlmError::TokenLimit { provider, .. }
            | LlmError::BadRequest { provider, .. }
            | LlmError::Auth { provider, .. }
            | LlmError::InvalidResponse { provider, .. } => provider,
            LlmError::Injected => ProviderKind::Offline.as_str(),
        }
    }

    /// The HTTP status, when the provider answered with an error status.
    pub fn status(&self) -> Option<u16> {
        match self {
            LlmError::Server { status, .. }
            | LlmError::Overloaded { status, .. }
            | LlmError::QuotaExhausted { status, .. }
            | LlmError::TokenLimit { status, .. }
            | LlmError::BadRequest { status, .. }
            | LlmError::Auth { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The wait the provider asked for, for rate limits.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after, .. } | LlmError::Throttled { retry_after, .. } => *retry_after,
            LlmError::Outage { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Turns a non-success HTTP answer into an error.
///
/// `now` is the wall clock for `Retry-After` HTTP dates; `key` is scrubbed
/// from the provider's text.
pub fn classify_status(
    provider: ProviderKind,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    key: Option<&Secret>,
) -> LlmError {
    let provider_name = provider.as_str();
    let text = String::from_utf8_lossy(body);
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let message = scrub(&provider_message(json.as_ref(), &text, status), key);
    let lower = text.to_lowercase();

    match status {
        401 | 403 if !is_quota_exhausted(json.as_ref(), &lower) => LlmError::Auth {
            provider: provider_name,
            status,
            message,
        },
        408 => LlmError::Timeout {
            provider: provider_name,
            message: format!("HTTP 408: {message}"),
        },
        413 => LlmError::TokenLimit {
            provider: provider_name,
            status,
            message,
        },
        429 if is_quota_exhausted(json.as_ref(), &lower) => LlmError::QuotaExhausted {
            provider: provider_name,
            status,
            message,
        },
        429 => LlmError::RateLimited {
            provider: provider_name,
            retry_after: retry_after_from_headers(headers, now)
                .or_else(|| json.as_ref().and_then(retry_delay_from_body)),
            message,
        },
        529 => LlmError::Overloaded {
            provider: provider_name,
            status,
            message,
        },
        500..=599 => LlmError::Server {
            provider: provider_name,
            status,
            message,
        },
        400..=499 if is_token_limit(&lower) => LlmError::TokenLimit {
            provider: provider_name,
            status,
            message,
        },
        400..=499 if status == 402 || is_quota_exhausted(json.as_ref(), &lower) => LlmError::QuotaExhausted {
            provider: provider_name,
            status,
            message,
        },
        400..=499 => LlmError::BadRequest {
            provider: provider_name,
            status,
            message,
        },
        // The client follows no redirect, so the key goes only to the
        // configured base URL; a redirect is a base URL to correct.
        300..=399 => LlmError::BadRequest {
            provider: provider_name,
            status,
            message: redirect_message(headers, key),
        },
        _ => LlmError::InvalidResponse {
            provider: provider_name,
            message: format!("unexpected HTTP status {status}: {message}"),
        },
    }
}

/// Why a redirect was not followed, naming where it led (`key` scrubbed).
fn redirect_message(headers: &HeaderMap, key: Option<&Secret>) -> String {
    let to = headers
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?");
    scrub(
        &format!(
            "redirect to `{to}` not followed (the API key is sent only to the configured base URL; \
             point the base URL at the provider itself)"
        ),
        key,
    )
}

/// The provider's own explanation: `error.message` (OpenAI, Anthropic,
/// Gemini and most compatible servers) with its type or code, else the body
/// text, else the status reason.
fn provider_message(json: Option<&Value>, text: &str, status: u16) -> String {
    let from_json = json.and_then(|v| {
        let error = v.get("error").unwrap_or(v);
        let message = match error {
            Value::String(s) => Some(s.clone()),
            _ => error.get("message").and_then(Value::as_str).map(str::to_owned),
        }?;
        let kind = ["code", "type", "status"]
            .iter()
            .filter_map(|k| error.get(*k))
            .find_map(|v| match v {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                _ => None,
            });
        Some(match kind {
            Some(kind) => format!("{kind}: {message}"),
            None => message,
        })
    });
    let message = from_json.unwrap_or_else(|| text.trim().to_owned());
    if message.is_empty() {
        reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no message")
            .to_owned()
    } else {
        message
    }
}

/// Truncates to [`MAX_PROVIDER_MESSAGE`] characters and removes the key.
pub(crate) fn scrub(message: &str, key: Option<&Secret>) -> String {
    let mut clean = match key.map(Secret::expose) {
        Some(secret) if !secret.is_empty() => message.replace(secret, "[REDACTED]"),
        _ => message.to_owned(),
    };
    if let Some((cut, _)) = clean.char_indices().nth(MAX_PROVIDER_MESSAGE) {
        clean.truncate(cut);
        clean.push('…');
    }
    clean
}

/// Spend limits and exhausted quotas, which a short wait does not cure:
/// OpenAI `insufficient_quota`; Anthropic `enforced_spend_limit_reached`,
/// "usage limits" and credit/billing messages; Gemini quota violations
/// counted per day (or with a limit of 0, a model the tier cannot use);
/// OpenRouter-style "insufficient credits".
fn is_quota_exhausted(json: Option<&Value>, lower: &str) -> bool {
    const WORDS: [&str; 7] = [
        "insufficient_quota",
        "enforced_spend_limit_reached",
        "usage limits",
        "spend limit",
        "credit balance",
        "insufficient credits",
        "billing_error",
    ];
    if WORDS.iter().any(|w| lower.contains(w)) {
        return true;
    }
    // Gemini: error.details[] of @type …QuotaFailure with violations whose
    // quotaId / quotaMetric name a daily window.
    let Some(details) = json.and_then(|v| v.pointer("/error/details")).and_then(Value::as_array) else {
        return false;
    };
    let daily = details
        .iter()
        .filter(|d| type_is(d, "QuotaFailure"))
        .filter_map(|d| d.get("violations").and_then(Value::as_array))
        .flatten()
        .any(|violation| {
            ["quotaId", "quotaMetric", "description"]
                .iter()
                .filter_map(|k| violation.get(*k).and_then(Value::as_str))
                .any(|s| {
                    let s = s.to_lowercase();
                    s.contains("perday") || s.contains("per_day") || s.contains("per day")
                })
                || violation.get("quotaValue").and_then(Value::as_str) == Some("0")
        });
    daily || lower.contains("limit: 0,")
}

/// Context-window errors: OpenAI and vLLM (`context_length_exceeded`,
/// "maximum context length"), Anthropic ("prompt is too long"), Gemini
/// ("input token count … exceeds the maximum"), llama.cpp ("context size").
fn is_token_limit(lower: &str) -> bool {
    const WORDS: [&str; 7] = [
        "context_length_exceeded",
        "maximum context length",
        "prompt is too long",
        "input token count",
        "exceeds the maximum number of tokens",
        "exceed_context_size",
        "exceeds the available context size",
    ];
    WORDS.iter().any(|w| lower.contains(w))
}

fn type_is(detail: &Value, suffix: &str) -> bool {
    detail
        .get("@type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with(suffix))
}

/// `retry-after-ms` (OpenAI) or `retry-after` (seconds or an HTTP date).
fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        // try_from: a finite but huge value (1e300) would make from_secs_f64 panic.
        if let Ok(d) = Duration::try_from_secs_f64(ms / 1000.0) {
            return Some(d);
        }
    }
    header("retry-after").and_then(|v| parse_retry_after(v, now))
}

/// Gemini: `error.details[]` of `@type` `type.googleapis.com/google.rpc.RetryInfo`
/// with `retryDelay` such as `"22s"`.
fn retry_delay_from_body(json: &Value) -> Option<Duration> {
    json.pointer("/error/details")?
        .as_array()?
        .iter()
        .filter(|d| type_is(d, "RetryInfo"))
        .find_map(|d| d.get("retryDelay").and_then(Value::as_str))
        .and_then(parse_proto_duration)
}

/// Parses a `Retry-After` value: delay seconds (`"120"`, also a decimal
/// `"1.5"` as some servers send) or an HTTP date (IMF-fixdate, RFC 850 or
/// asctime). A date in the past means no wait. `None` if unparseable.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        // NaN, negative, infinite or beyond Duration::MAX: not a usable delay.
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = DateTime::parse_from_rfc2822(value)
        .map(|d| d.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            // RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime
            // ("Sun Nov  6 08:49:37 1994"), both UTC.
            ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(value, f).ok())
                .map(|n| n.and_utc())
        })?;
    let at: SystemTime = at.into();
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses a protobuf JSON duration such as `"22s"`, `"1.5s"` or
/// `"0.000001s"` (Gemini's `RetryInfo.retryDelay`).
pub fn parse_proto_duration(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().strip_suffix('s')?.parse().ok()?;
    // NaN, negative, infinite or beyond Duration::MAX ("1e300s"): none.
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests;
