//! The application layer: what every door does, in the door's own terms
//! nowhere. HTTP (`crate::http`), MCP (`crate::mcp`) and the endpoints to
//! come are adapters over it: they read their wire, call one function
//! here, and write its answer or [`AppError`] back in their shape.
//!
//! | what                                   | where          |
//! |----------------------------------------|----------------|
//! | who calls: tenant, scope, bound user   | [`caller`]     |
//! | caps on what a caller holds open       | [`caps`]       |
//! | a tenant's limits                      | [`limits`]     |
//! | the rules of text a door takes         | [`input`]      |
//! | making a request (limits, idempotency) | [`submit`]     |
//! | following requests to their end        | [`follow`]     |
//! | a user's memory: map, search, remember | [`memory`]     |
//! | an operator's review of an answer      | [`review`]     |
//!
//! [`App`] holds what they share: the configuration, the API pool, the
//! LISTEN session's fan-out ([`follow::Hub`]), the token cache, the caps
//! and the memory services. A door adds only what its wire needs (HTTP:
//! the metrics exporter and the per-address failure budget). Operator
//! actions on requests and users are `crate::control` and `crate::users`,
//! which every door calls the same way.

pub mod caller;
pub mod caps;
mod error;
pub mod follow;
pub mod input;
pub mod limits;
pub mod memory;
pub mod reply;
pub mod review;
pub mod submit;

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use caller::{Caller, Need, Principal};
pub use error::{AppError, Code, Kind};

use crate::config::Config;
use crate::db::Pool;
use crate::listener::Notifier;

/// The application every door serves: cheap to clone.
#[derive(Clone)]
pub struct App(Arc<Inner>);

pub struct Inner {
    pub cfg: Arc<Config>,
    /// The pool of the doors (`db.api_pool_size`), never the engine's.
    pub pool: Pool,
    /// The LISTEN session's broadcast and health.
    pub notifier: Arc<Notifier>,
    /// The fan-out of the notifications to followers.
    pub hub: Arc<follow::Hub>,
    pub shutdown: CancellationToken,
    /// SHA-256 of each configured token (`api_tokens`).
    pub tokens: Vec<[u8; 32]>,
    /// The database's tokens (tenants), looked up by hash and cached briefly.
    pub db_tokens: caller::TokenCache,
    /// Caps of long-polls (and MCP waits) and of streams.
    pub long_polls: Arc<caps::Gate>,
    pub streams: Arc<caps::Gate>,
    /// Caps of memory searches and exports per token.
    pub searches: Arc<caps::Gate>,
    pub exports: Arc<caps::Gate>,
    /// The embedder of `[llm.embedding]`, for searching a user's memory as
    /// the pipeline does (`None`: embeddings are off).
    pub embedder: Option<crate::llm::embed::Embedder>,
    /// The daemon's archivist, for "archive now" from the console.
    pub archivist: Arc<crate::archivist::Archivist>,
}

impl std::ops::Deref for App {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// What the application uses of the daemon's memory services.
pub struct MemoryServices {
    /// The embedder of `[llm.embedding]` (`None`: embeddings are off).
    pub embedder: Option<crate::llm::embed::Embedder>,
    /// The archivist, for "archive now" (built whether or not the schedule runs).
    pub archivist: Arc<crate::archivist::Archivist>,
}

impl App {
    /// The application, and its helper task (the hub, which follows
    /// `notifier` until `shutdown`). Start it before the engine runs, so
    /// the hub sees every notification.
    pub fn new(
        cfg: Arc<Config>,
        pool: Pool,
        notifier: Arc<Notifier>,
        memory: MemoryServices,
        shutdown: CancellationToken,
    ) -> (App, TaskTracker) {
        let hub = follow::Hub::new();
        let helpers = TaskTracker::new();
        helpers.spawn(follow::run_hub(
            hub.clone(),
            pool.clone(),
            notifier.clone(),
            notifier.subscribe(),
            shutdown.clone(),
        ));
        helpers.close();
        let tokens = cfg
            .api_tokens
            .iter()
            .map(|t| Sha256::digest(t.expose().as_bytes()).into())
            .collect();
        let http = &cfg.http;
        let app = App(Arc::new(Inner {
            long_polls: caps::Gate::new("long-polls", http.max_long_polls, http.max_long_polls_per_token),
            streams: caps::Gate::new("streams", http.max_streams, http.max_streams_per_token),
            searches: caps::Gate::coded(
                "memory searches",
                Code::TooManySearches,
                usize::MAX,
                http.max_searches_per_token.max(1),
            ),
            exports: caps::Gate::coded(
                "exports",
                Code::TooManyExports,
                usize::MAX,
                http.max_exports_per_token.max(1),
            ),
            cfg: cfg.clone(),
            pool,
            notifier,
            hub,
            shutdown,
            tokens,
            db_tokens: caller::TokenCache::default(),
            embedder: memory.embedder,
            archivist: memory.archivist,
        }));
        (app, helpers)
    }

    /// Whether the caller's token is one of `api_tokens` (never revoked),
    /// compared with every one in full, so timing tells nothing.
    pub fn is_configured(&self, caller: Caller) -> bool {
        self.tokens.iter().fold(false, |acc, t| {
            acc | (t.iter().zip(caller.0.iter()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0)
        })
    }

    /// Whether tokens are configured at all (without them, only loopback
    /// callers reach the doors, each as the default tenant's admin).
    pub fn has_configured_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The principal of `caller` (a bearer token's [`Caller::of_token`]):
    /// a configured token, or a database one (cached); `None` for a wrong
    /// or revoked token. A door counts a `None` against the peer's failure
    /// budget.
    pub async fn authenticate(&self, caller: Caller) -> Result<Option<Principal>, AppError> {
        if self.is_configured(caller) {
            return Ok(Some(Principal::default_admin("config")));
        }
        self.db_tokens.lookup(&self.pool, caller.0).await
    }

    /// Whether `caller`'s token is configured or a database token still
    /// trusted from the cache, with no lookup: a door may let such a caller
    /// past its failure budget.
    pub fn known(&self, caller: Caller) -> bool {
        self.is_configured(caller) || self.db_tokens.cached(&caller.0).is_some()
    }
}
