//! maas as the memory of any agent: a Model Context Protocol server, over
//! the official Rust SDK (`rmcp`).
//!
//! Two transports serve one [`Server`]:
//!
//! - streamable HTTP at `/mcp` on `maasd`'s own listener ([`http`]): behind
//!   the same bearer tokens, scopes, tenants, per-token caps and
//!   Host/Origin guard as every other route. Clients of the current
//!   protocol revision are served statelessly, as that revision asks;
//!   clients of the revisions that had sessions get one (`Mcp-Session-Id`),
//!   kept in memory by the daemon that began it.
//! - stdio, `maasctl mcp --user U` ([`crate::cli`]), for a desktop client
//!   on the same machine: a local trust, with the CLI's database rights for
//!   that one user.
//!
//! Tools (each needs the scope of its HTTP twin; what it calls is the one
//! function the HTTP API, the console and `maasctl` call too):
//!
//! | tool       | scope  | does                                                        |
//! |------------|--------|-------------------------------------------------------------|
//! | `remember` | submit | stores a turn in `raw_logs` ([`crate::users::remember`])     |
//! | `recall`   | read   | the pipeline's retrieval ([`crate::app::memory::search`])    |
//! | `ask`      | submit | submits ([`crate::app::submit::enqueue`]) and waits the answer |
//! | `reply`    | submit | the user's reply to an `ask`'s question ([`crate::app::reply::reply`]) and waits the answer |
//! | `correct`  | operate| [`crate::users::correct`], as `PUT`/`DELETE …/memory/{record}`, `DELETE …/turns/{turn}` |
//! | `forget`   | admin  | [`crate::users::forget_in_background`], as `DELETE /api/users/{id}` |
//!
//! Resources: `maas://users/{id}/memory` (the user's records) and
//! `maas://users/{id}/threads` (recent threads), listed for the caller's
//! user and readable with scope read.
//!
//! Isolation: the user a tool acts on is the caller's tenant's (mapped in
//! SQL as on every door); a token bound to a user (`maasctl tokens create
//! … --user U`) acts for that user only, needs no `user_id`, and is refused
//! naming the field when another is given.

mod elicit;
pub mod http;
mod resources;
pub mod sessions;
mod tools;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolResult, ContentBlock, ListResourcesResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool_handler};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::app::{App, AppError, Caller, Code, Kind, Need, Principal};
use crate::users::UserKey;

/// What the server tells a client about itself at the start.
const INSTRUCTIONS: &str = "maas is this user's long-term memory. Call `recall` before answering \
anything that may depend on what the user said before (names, plans, preferences, dates); call \
`remember` when the user tells you something worth keeping. `ask` runs maas's own pipeline (its \
analyzer, retrieval and model) and returns its answer with the memory it used. Items are dated and \
carry their source (`turn` or `record` and its id), which `correct` takes.";

/// The MCP server of one caller: the application, and for stdio
/// the caller fixed for the process (over HTTP it comes with each request).
#[derive(Clone)]
pub struct Server {
    app: App,
    local: Option<Arc<Principal>>,
    tool_router: ToolRouter<Server>,
}

impl Server {
    /// A server for the HTTP transport: each request carries its caller.
    pub fn new(app: App) -> Server {
        Server {
            app,
            local: None,
            tool_router: Server::tools(),
        }
    }

    /// A server for stdio: acts as `who` (whose `user` is the one user).
    pub fn local(app: App, who: Principal) -> Server {
        Server {
            app,
            local: Some(Arc::new(who)),
            tool_router: Server::tools(),
        }
    }

    /// The caller of a request: the principal the HTTP authentication put
    /// on it (and its key for the per-token caps), or the stdio caller.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<(Principal, Caller), AppError> {
        if let Some(who) = &self.local {
            return Ok(((**who).clone(), Caller::ANONYMOUS));
        }
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let who = parts.and_then(|p| p.extensions.get::<Principal>());
        let key = parts.and_then(|p| p.extensions.get::<Caller>()).copied();
        match who {
            Some(who) => Ok((who.clone(), key.unwrap_or(Caller::ANONYMOUS))),
            None => Err(AppError::new(
                Kind::Unauthenticated,
                Code::Unauthenticated,
                "no caller on this request",
            )),
        }
    }

    /// The caller, refused unless its scope allows `need`.
    fn caller_for(&self, ctx: &RequestContext<RoleServer>, need: Need) -> Result<(Principal, Caller), AppError> {
        let (who, key) = self.caller(ctx)?;
        who.require(need)?;
        Ok((who, key))
    }

    /// The user a call acts on: `given` (a UUID, the tenant's own id) or
    /// the caller's bound user; a bound caller naming another is refused.
    async fn user(&self, who: &Principal, given: Option<&str>) -> Result<UserKey, AppError> {
        let shown = match (given.map(str::trim).filter(|g| !g.is_empty()), who.user) {
            (None, Some(bound)) => bound,
            (None, None) => {
                return Err(AppError::bad_request(
                    Code::MissingArgument,
                    "user_id is required: this token is not bound to a user",
                ));
            }
            (Some(raw), _) => raw.parse::<Uuid>().map_err(|_| {
                AppError::bad_request(
                    Code::InvalidArgument,
                    format!("user_id: {raw:?} is not a user id (a UUID)"),
                )
            })?,
        };
        crate::app::memory::user(&self.app, who, shown, "user_id").await
    }
}

/// A refused tool call as the tool's error result: the code and the
/// message naming the problem, given to the model as JSON text.
fn tool_error(e: &AppError) -> CallToolResult {
    let body = json!({ "error": e.message, "code": e.code });
    CallToolResult::error(vec![ContentBlock::text(body.to_string())])
}

/// A refusal outside a tool (a resource, a list) as a protocol error.
fn protocol(e: &AppError) -> ErrorData {
    ErrorData::invalid_params(format!("{} ({})", e.message, e.code), None)
}

/// A tool's result: its JSON as text (what every client shows a model) and
/// as structured content; a refusal as the tool's error result.
fn answer(done: Result<Value, AppError>) -> CallToolResult {
    match done {
        Ok(v) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&v).unwrap_or_default(),
            )]);
            r.structured_content = Some(v);
            r
        }
        Err(refusal) => tool_error(&refusal),
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_instructions(INSTRUCTIONS);
        info.server_info = rmcp::model::Implementation::new("maas", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let (who, _) = self.caller_for(&ctx, Need::ReadUser).map_err(|r| protocol(&r))?;
        Ok(ListResourcesResult::with_all_items(resources::list(&who)))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let (who, _) = self.caller_for(&ctx, Need::ReadUser).map_err(|r| protocol(&r))?;
        let read = resources::read(self, &who, &request.uri).await;
        read.map(Into::into).map_err(|r| protocol(&r))
    }
}

/// Serves `server` over stdin and stdout until the client closes them or
/// `shutdown` fires.
pub async fn serve_stdio(server: Server, shutdown: tokio_util::sync::CancellationToken) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    let running = server
        .serve_with_ct(rmcp::transport::stdio(), shutdown)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| std::io::Error::other(e.to_string()))
}
