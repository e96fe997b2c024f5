//! Without `api_tokens` the server binds only a loopback address; this
//! guard makes sure that only local programs — not a web page open in a
//! local browser — drive it:
//!
//! - `Host` must name the loopback (`localhost`, `127.x.y.z`, `[::1]`, with
//!   any port): a page on another name that resolves to 127.0.0.1 (DNS
//!   rebinding) sends its own name and is refused.
//! - `Origin`, when present (browsers send it on cross-origin requests and
//!   on every POST and WebSocket), must be a loopback origin too; `null`
//!   (sandboxed pages, files) is refused.
//!
//! The guard ([`layer`]) sits in front of every route of the server — the
//! API, the console, health, metrics and OpenAPI alike — whenever no token
//! is configured, so no door is left without it.
//!
//! Apart from that mode, [`same_origin`] is the console's rule for every
//! POST (tokens or not): the browser's `Origin` must name this server, as
//! the request's `Host` does; a POST without `Origin` is refused (every
//! browser sends one on a form POST). The transports a browser opens
//! without CORS — `GET /api/ws` (WebSockets skip it) and `/mcp` — apply
//! the same rule to any request carrying an `Origin` ([`browser_origin`]):
//! a loopback origin on another port is another site's page too.
//!
//! Refusals are 403 with the header and value named.

use std::net::IpAddr;

use axum::Extension;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::app::{AppError, Code};

/// The middleware: without configured tokens, [`check`] before any route.
pub async fn layer(Extension(app): Extension<AppState>, req: Request, next: Next) -> Response {
    if !app.has_configured_tokens()
        && let Err(refused) = check(req.headers())
    {
        return refused.into_response();
    }
    next.run(req).await
}

/// The middleware of the doors mounted beside `/api` (`/mcp`): a browser's
/// `Origin` must be this server's ([`browser_origin`]).
pub async fn origin_layer(req: Request, next: Next) -> Response {
    if let Err(refused) = browser_origin(req.headers()) {
        return refused.into_response();
    }
    next.run(req).await
}

/// Whether `Origin` names the server the request was sent to (its `Host`,
/// over http or https); `Err` says what is wrong, for the refusal.
pub fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Err("a POST needs an Origin header naming this server".to_owned());
    };
    let origin = origin.to_str().unwrap_or("?");
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    if host.is_empty() || !authority.eq_ignore_ascii_case(host) {
        return Err(format!("Origin `{origin}` is not this server (Host `{host}`)"));
    }
    Ok(())
}

/// The rule of the transports a browser opens without CORS (a WebSocket,
/// `/mcp`'s streams), with tokens or not: a request carrying an `Origin`
/// must come from this server's own pages ([`same_origin`]); a page on
/// another site, or on another port of the loopback, is refused with 403
/// `forbidden_origin`. A request without `Origin` (not a browser's) passes.
pub fn browser_origin(headers: &HeaderMap) -> Result<(), AppError> {
    if !headers.contains_key(header::ORIGIN) {
        return Ok(());
    }
    same_origin(headers).map_err(|why| {
        AppError::forbidden(
            Code::ForbiddenOrigin,
            format!("{why}; a page of another origin may not open this route"),
        )
    })
}

/// Checks `Host` and `Origin` of a request served without tokens.
pub fn check(headers: &HeaderMap) -> Result<(), AppError> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !is_loopback_authority(host) {
        return Err(AppError::forbidden(
            Code::ForbiddenHost,
            format!("Host `{host}` is not a loopback name; without api_tokens only requests to localhost are served"),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("?");
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or("");
        if authority.contains('/') || !is_loopback_authority(authority) {
            return Err(AppError::forbidden(
                Code::ForbiddenOrigin,
                format!(
                    "Origin `{origin}` is not a loopback origin; without api_tokens a web page may not call this API"
                ),
            ));
        }
    }
    Ok(())
}

/// `localhost`, a loopback address, or `[::1]`, each with an optional port.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => h,
            _ => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, port)) if is_port(port) => h,
            Some(_) => return false,
            None => authority,
        }
    };
    let host = host.trim_end_matches('.');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(crate::config::is_loopback)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().unwrap());
        }
        h
    }

    #[test]
    fn loopback_hosts_and_origins_pass_others_are_named() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:9",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
            "LOCALHOST.",
        ] {
            assert!(check(&headers(host, None)).is_ok(), "{host}");
        }
        for origin in ["http://localhost:3000", "https://127.0.0.1", "http://[::1]:80"] {
            assert!(check(&headers("localhost", Some(origin))).is_ok(), "{origin}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "",
            "[::1]x",
        ] {
            let e = check(&headers(host, None)).unwrap_err();
            assert_eq!(e.code, Code::ForbiddenHost, "{host}: {e:?}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "http://localhost.evil.example",
            "http://localhost:3000/x",
        ] {
            assert!(check(&headers("localhost:8080", Some(origin))).is_err(), "{origin}");
        }
    }

    #[test]
    fn a_browser_transport_takes_only_this_servers_pages() {
        assert!(browser_origin(&headers("localhost:8080", None)).is_ok());
        assert!(browser_origin(&headers("localhost:8080", Some("http://localhost:8080"))).is_ok());
        for origin in [
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "null",
            "http://evil.example",
        ] {
            let e = browser_origin(&headers("localhost:8080", Some(origin))).unwrap_err();
            assert_eq!(e.code, Code::ForbiddenOrigin, "{origin}");
        }
    }

    #[test]
    fn a_post_must_come_from_this_server() {
        assert!(same_origin(&headers("maas.example:8080", Some("https://maas.example:8080"))).is_ok());
        assert!(same_origin(&headers("127.0.0.1:9", Some("http://127.0.0.1:9"))).is_ok());
        for origin in [
            None,
            Some("null"),
            Some("http://evil.example"),
            Some("http://maas.example:8081"),
            Some("http://maas.example:8080/x"),
        ] {
            assert!(
                same_origin(&headers("maas.example:8080", origin)).is_err(),
                "{origin:?}"
            );
        }
    }
}
