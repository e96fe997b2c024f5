//! maas: a PostgreSQL-native orchestrator for an LLM pipeline with long-term
//! memory.
//!
//! PostgreSQL holds every bit of state. `maasd` LISTENs on
//! [`listener::CHANNEL`], claims requests as leases and moves each through
//! analyzer → assembler → final responder. The table is the truth; a
//! notification is only a doorbell (see `DESIGN.md` for the invariants).
//!
//! Module map:
//! - [`config`] — typed settings, loaded once (defaults → file → environment).
//! - [`secret`] — the one secret type (redacted in `Debug` and `Display`).
//! - [`db`] — the connection pool, migrations, and a private cluster for
//!   development and tests ([`db::devdb`]).
//! - [`repo`] — every SQL statement the daemon runs, named after its effect.
//! - [`listener`] — the dedicated LISTEN session.
//! - [`dispatcher`] — wake or sweep → claim → run stage → record.
//! - [`llm`] — LLM providers (OpenAI-compatible, Anthropic, Gemini, offline).
//! - [`stage`] — the stages, behind a trait that knows nothing of SQL.
//! - [`http`] — the HTTP API: submit, status, long-poll, live push (SSE,
//!   WebSocket), health, readiness, metrics, OpenAPI.
//! - [`metrics`] — Prometheus series and the hooks that feed them.
//! - [`control`] — operator actions: cancel, retry, continue (debug mode),
//!   pause/resume; shared by `maasctl` and the HTTP server.
//! - [`callbacks`] — signed callback deliveries from a durable outbox.
//! - [`retention`] — deleting old finished runs in batches.
//! - [`systemd`] — `Type=notify` readiness and the watchdog.
//! - [`archivist`] — long-term memory from raw logs, on a schedule and on
//!   demand, exactly once.
//! - [`daemon`] — wires the above into `maasd`.
//! - [`cli`] — `maasctl`.

pub mod archivist;
pub mod backoff;
pub mod callbacks;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod db;
pub mod dispatcher;
pub mod error;
pub mod http;
pub mod listener;
pub mod llm;
pub mod metrics;
pub mod model;
pub mod repo;
pub mod retention;
pub mod secret;
pub mod service;
pub mod shutdown;
pub mod stage;
pub mod sys;
pub mod systemd;
pub mod telemetry;
