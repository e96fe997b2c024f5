//! The `[http]` section and the address the HTTP server binds.
//!
//! Guarantees: plain data with its defaults; [`HttpAddr::parse`] accepts
//! `HOST:PORT`, `IP:PORT`, `[IPv6]:PORT` and `:PORT` (loopback) and names
//! what is wrong with anything else. Imports nothing of the crate but the
//! secret type.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// Limits of the HTTP server (`[http]` in the file, `MAAS_HTTP__*` in the
/// environment).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    /// Largest request body accepted; a larger one gets 413. Default 1048576
    /// (a query may hold 100,000 characters of up to 4 bytes, plus JSON).
    pub max_body_bytes: usize,
    /// Longest time to produce a response (reading the body included);
    /// past it the request gets 503. Streams (SSE, WebSocket) are not bound
    /// by it once their headers are sent. Default 30.
    pub request_timeout_secs: u64,
    /// Cap of a long-poll's `?wait=`; a longer wait is shortened to this.
    /// Default 60.
    pub max_wait_secs: u64,
    /// How long an `Idempotency-Key` keeps returning its first request.
    /// Default 86400 (one day).
    pub idempotency_ttl_secs: u64,
    /// Interval of the metrics refresh: backlog counts and the step history
    /// of this daemon (stage and end-to-end latencies). Default 5.
    pub metrics_refresh_secs: u64,
    /// Interval of WebSocket pings and SSE keep-alive comments. Default 15.
    pub stream_keepalive_secs: u64,
    /// A stream whose client does not take a message within this time is
    /// closed. Default 10.
    pub stream_send_timeout_secs: u64,
    /// A client must send a request's headers within this time, and a
    /// kept-alive connection idle between requests this long is closed
    /// (slowloris, idle keep-alive). Default 10.
    pub header_read_timeout_secs: u64,
    /// Long-polls (`?wait=`) held at once by this daemon; past it 503 with
    /// `Retry-After`. Default 8192.
    pub max_long_polls: usize,
    /// Long-polls held at once per bearer token (all callers count as one
    /// without tokens); past it 429 with `Retry-After`. Default 2048.
    pub max_long_polls_per_token: usize,
    /// SSE and WebSocket streams open at once in this daemon; past it 503
    /// with `Retry-After`. Default 4096.
    pub max_streams: usize,
    /// Streams open at once per bearer token; past it 429. Default 1024.
    /// The console's `/console/events` counts under both stream caps.
    pub max_streams_per_token: usize,
    /// MCP sessions (`Mcp-Session-Id`, of the protocol revisions that have
    /// them) held at once by this daemon; past it 503 with `Retry-After`.
    /// Default 2048.
    pub max_mcp_sessions: usize,
    /// MCP sessions held at once per bearer token (all callers count as
    /// one without tokens); past it 429 with `Retry-After`. Default 256.
    pub max_mcp_sessions_per_token: usize,
    /// Failed authentications (an unknown or revoked bearer token, a wrong
    /// console login) one peer address may make per minute, in a burst of
    /// as many; past it 429 with `Retry-After`, before any lookup.
    /// Default 30 (0 counts as 1).
    pub max_auth_failures_per_minute: u32,
    /// Memory searches (`GET /api/users/{id}/memory?q=`) running at once
    /// per bearer token; past it 429. Default 4 (0 counts as 1).
    pub max_searches_per_token: usize,
    /// User exports (`GET /api/users/{id}/export`) running at once per
    /// bearer token; past it 429. Default 2 (0 counts as 1).
    pub max_exports_per_token: usize,
    /// Largest WebSocket message (and frame) a client may send; the socket
    /// is closed on a larger one. Default 65536.
    pub ws_max_message_bytes: usize,
    /// The operator console (`/console`) shows and refuses no action:
    /// no retry, cancel or continue. Default false.
    pub console_read_only: bool,
    /// PEM file of the server's certificate chain (leaf first): with
    /// `tls_key`, the API and the console are served over HTTPS only, with
    /// `Strict-Transport-Security`. Default none (plain HTTP).
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the private key of `tls_cert` (PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    /// The key console session cookies are signed with (HMAC-SHA256):
    /// long and random, the same on every daemon, kept out of the
    /// database. Empty (the default): a key derived from the configured
    /// `api_tokens`, which never reach the database either.
    pub session_secret: Secret,
    /// Model names the OpenAI-compatible endpoint (`/v1/chat/completions`,
    /// `/v1/models`) offers besides the responder's own model: aliases an
    /// application may send unchanged (`gpt-4o-mini`), each answered by
    /// maas's pipeline. Default none.
    /// `MAAS_HTTP__OPENAI_MODELS=gpt-4o-mini,gpt-4o`.
    #[serde(deserialize_with = "super::netallow::list")]
    pub openai_models: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 1024 * 1024,
            request_timeout_secs: 30,
            max_wait_secs: 60,
            idempotency_ttl_secs: 86_400,
            metrics_refresh_secs: 5,
            stream_keepalive_secs: 15,
            stream_send_timeout_secs: 10,
            header_read_timeout_secs: 10,
            max_long_polls: 8192,
            max_long_polls_per_token: 2048,
            max_streams: 4096,
            max_streams_per_token: 1024,
            max_mcp_sessions: 2048,
            max_mcp_sessions_per_token: 256,
            ws_max_message_bytes: 64 * 1024,
            console_read_only: false,
            max_auth_failures_per_minute: 30,
            max_searches_per_token: 4,
            max_exports_per_token: 2,
            tls_cert: None,
            tls_key: None,
            session_secret: Secret::default(),
            openai_models: Vec::new(),
        }
    }
}

impl HttpConfig {
    /// True when the server speaks HTTPS (`tls_cert` and `tls_key` both
    /// set; the server refuses to start with only one): the console's
    /// cookie is then `Secure`.
    pub fn serves_tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }
}

super::secs_getters!(HttpConfig {
    request_timeout: request_timeout_secs,
    max_wait: max_wait_secs,
    idempotency_ttl: idempotency_ttl_secs,
    metrics_refresh: metrics_refresh_secs,
    stream_keepalive: stream_keepalive_secs,
    stream_send_timeout: stream_send_timeout_secs,
    header_read_timeout: header_read_timeout_secs,
});

/// The address to bind, parsed from `http_addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpAddr {
    /// A literal IP address and port.
    Socket(SocketAddr),
    /// A host name, resolved at start.
    Host(String, u16),
}

impl HttpAddr {
    pub fn parse(s: &str) -> Result<HttpAddr, String> {
        let s = s.trim();
        if let Some(port) = s.strip_prefix(':') {
            let port = port.parse::<u16>().map_err(|_| format!("{s:?}: not a port"))?;
            return Ok(HttpAddr::Socket(SocketAddr::from(([127, 0, 0, 1], port))));
        }
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(HttpAddr::Socket(addr));
        }
        match s.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && !host.contains(':') => {
                let port = port.parse::<u16>().map_err(|_| format!("{s:?}: not a port"))?;
                Ok(HttpAddr::Host(host.to_owned(), port))
            }
            _ => Err(format!("{s:?}: expected HOST:PORT, IP:PORT, [IPv6]:PORT or :PORT")),
        }
    }
}

/// True for addresses only this machine can reach.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// Why an address may not be bound without tokens, as said at start.
pub fn exposed_without_tokens(addr: &str) -> String {
    format!(
        "{addr} is not a loopback address and no api_tokens are configured: anyone who can reach it \
         could submit queries and read every answer. Set MAAS_API_TOKENS (or api_tokens in the file), \
         or bind 127.0.0.1"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_loopback_is_recognised() {
        assert_eq!(
            HttpAddr::parse(":8081"),
            Ok(HttpAddr::Socket(SocketAddr::from(([127, 0, 0, 1], 8081))))
        );
        assert!(HttpAddr::parse("nonsense").is_err());
        assert!(is_loopback(
            "::ffff:127.0.0.1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
        ));
    }
}
