//! What each HTTP route needs of its caller (the rules themselves are the
//! application layer's, `crate::app::caller`).
//!
//! | route                                          | need         | submit | read | operate | admin |
//! |------------------------------------------------|--------------|--------|------|---------|-------|
//! | `POST /api/query`, `POST /v1/chat/completions` | submit       | yes    | –    | yes     | yes   |
//! | `GET /api/query/{id}/status`, `/events`, `GET /api/ws?request_id=` | read request | yes | yes | yes | yes |
//! | `GET /api/ws?user_id=`, `GET /api/users/{id}/memory`, `/memory/search`, `/export`, `GET /api/query/{id}/status?include=context` | read user | – | yes | yes | yes |
//! | `POST /api/query/{id}/cancel`, `/retry`, `/continue`; `PUT`/`DELETE /api/users/{id}/memory/{record}`, `DELETE /api/users/{id}/turns/{turn}` | operate | – | – | yes | yes |
//! | `DELETE /api/users/{id}` (forget)              | admin        | –      | –    | –       | yes   |
//!
//! `/mcp` needs any valid token; each MCP tool asks for the need of its
//! HTTP twin (`crate::mcp`). A refusal is 403 `scope_required` naming the
//! scope needed; a user id a user-bound token may not name is 403
//! `user_not_allowed`. The console's rows of the table are in
//! `docs/deploying.md`, which `tests/it/scopes.rs` walks route by route.
//! A tenant over a limit (`crate::app::limits`) is 429 with `Retry-After`
//! naming the limit.

use axum::http::Method;

use crate::app::Need;

/// What the route `method path` (as routed) needs. `GET /api/ws` needs
/// [`Need::ReadRequest`] here; its handler asks for [`Need::ReadUser`]
/// when it follows a user.
pub fn need_of_route(method: &Method, path: &str) -> Need {
    match (method.as_str(), path) {
        ("POST", "/api/query" | "/api/query/{id}/reply" | "/v1/chat/completions") => Need::Submit,
        ("GET", "/api/users/{id}/memory" | "/api/users/{id}/memory/search" | "/api/users/{id}/export") => {
            Need::ReadUser
        }
        // Any scope reaches the MCP server; each tool asks for its own.
        (_, "/mcp") => Need::ReadRequest,
        ("GET", _) => Need::ReadRequest,
        ("DELETE", "/api/users/{id}") => Need::Admin,
        _ => Need::Operate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_need_what_the_docs_say() {
        let need = |m: &Method, p: &str| need_of_route(m, p);
        assert_eq!(need(&Method::POST, "/api/query"), Need::Submit);
        assert_eq!(need(&Method::POST, "/api/query/{id}/reply"), Need::Submit);
        assert_eq!(need(&Method::GET, "/api/query/{id}/status"), Need::ReadRequest);
        assert_eq!(need(&Method::GET, "/api/query/{id}/events"), Need::ReadRequest);
        assert_eq!(need(&Method::GET, "/api/users/{id}/export"), Need::ReadUser);
        assert_eq!(need(&Method::POST, "/api/query/{id}/cancel"), Need::Operate);
        assert_eq!(need(&Method::POST, "/api/query/{id}/continue"), Need::Operate);
        assert_eq!(need(&Method::DELETE, "/api/users/{id}/memory/{record}"), Need::Operate);
        assert_eq!(need(&Method::DELETE, "/api/users/{id}"), Need::Admin);
    }
}
