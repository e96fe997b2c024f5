//! maas: a PostgreSQL-native orchestrator for an LLM pipeline with long-term
//! memory.
//!
//! PostgreSQL holds every bit of state. `maasd` LISTENs on
//! [`listener::CHANNEL`], claims requests as leases and moves each through
//! the stages analyze → assemble → respond. The table is the truth; a
//! notification is only a doorbell (README.md, "Invariants").
//!
//! # Glossary
//!
//! One word for one thing, in SQL, types, logs, the CLI and HTTP:
//!
//! - **request** — one user query and everything done for it: a row of
//!   `pipeline_runs` (the table keeps the seed's name), [`repo::requests`].
//!   Older outside names (`/api/query`, `maas_runs_*` series) stay for
//!   their callers.
//! - **stage** — one step of a request: `analyze`, `assemble`, `respond`
//!   ([`model::StageKind`]). Each has a ready status and an in-flight status.
//! - **role** — whose prompt a stage or the archivist runs with:
//!   `Analyzer`, `Assembler`, `Responder` (stored as `FinalResponder`),
//!   `Archivist` ([`model::PromptRole`]).
//! - **attempt** — one try of a stage; counted in `pipeline_runs.attempt`,
//!   recorded as a row of `pipeline_steps` ([`repo::steps`]).
//! - **claim** — taking due requests of a stage as leases, with
//!   `FOR UPDATE SKIP LOCKED` ([`dispatcher`], `sql/queries/claim.sql`).
//! - **lease** — the time-limited right of one daemon to run a claimed
//!   request (`lease_owner`, `lease_expires_at`), renewed by the heartbeat
//!   and taken back by the sweep when it runs out.
//! - **fencing token** — `lease_token`, new at every claim; a result is
//!   written only with the token of the lease it ran under.
//! - **chain** — the statement that writes a stage's result also claims the
//!   request for its next stage (no doorbell in between).
//! - **fuse** — running the assemble stage in the same task right after a
//!   successful analyze and writing both results in one statement.
//! - **decision** — what the attempt policy makes of an outcome: advance,
//!   retry after a delay, defer, fail, release ([`dispatcher::policy`]).
//! - **turn** — one message of a conversation, the user's or the
//!   assistant's: a row of `raw_logs` (short-term memory; the archivist's
//!   input).
//! - **record** — a summary of turns the archivist made: a row of
//!   `lsm_storage` (long-term memory).
//! - **archive run** — one pass of the archivist over the users that have
//!   turns to archive ([`archivist`]).
//! - **embedding** — the vector of a turn's text (with the turn before it)
//!   or of a query, for the semantic part of the memory search: a row of
//!   `turn_embeddings`, made by the **embedder** service ([`embedder`],
//!   [`llm::embed`]); optional, `[llm.embedding]`.
//! - **service** — a background job of `maasd` with one `run(shutdown)`
//!   ([`service::Service`]).
//!
//! # Map
//!
//! Layers, lowest first. A module uses only modules of lower layers (and
//! its own children); `tests/it/layers.rs` checks it, so there are no
//! import circles.
//!
//! 0. Leaves, no crate imports: [`model`] (statuses, stages, prompt roles,
//!    the memory shapes), [`error`] (what a failure means for the request),
//!    [`secret`], [`backoff`], [`sys`], [`shutdown`], [`telemetry`],
//!    [`timescope`].
//! 1. [`llm`] — providers (OpenAI-compatible, Anthropic, Gemini, offline),
//!    rate limits, token counting, fence stripping, error mapping.
//! 2. [`config`] — typed settings, loaded once (defaults → file →
//!    environment).
//! 3. [`db`] — the pool, TLS to the server ([`db::tls`]), failover
//!    ([`db::failover`]), migrations, a private cluster for development and
//!    tests ([`db::devdb`]).
//! 4. [`repo`] — every SQL statement, one file per table; rows read by
//!    column name. No SQL outside `repo` and `db`.
//! 5. Engine parts: [`metrics`] (Prometheus series), [`stage`] (the stages
//!    behind a trait that knows no SQL; the typed analysis), [`listener`]
//!    (the LISTEN session and its [`listener::Notifier`]), [`service`]
//!    (the background-job trait), [`control`] (operator actions shared by
//!    `maasctl` and HTTP), [`users`] (a user's data: see, correct, forget).
//! 6. Engine and services: [`dispatcher`] (claim → run → decide → write;
//!    the sweep), [`archivist`] (turns → records, on a schedule and on
//!    demand, exactly once), [`embedder`] (turns → embeddings, when on), [`callbacks`] (signed deliveries from a
//!    durable outbox), [`retention`] (old requests deleted in batches).
//! 7. Front ends: [`http`] (submit, status, long-poll, SSE, WebSocket,
//!    health, metrics, OpenAPI; the operator console, `http::console`), [`cli`] (`maasctl`), [`systemd`]
//!    (readiness, watchdog).
//! 8. [`daemon`] — wires it all into `maasd`: one list of services.
//!
//! Where a change goes: a new statement → the table's file in `repo/`; a
//! retry rule → `dispatcher/policy.rs` (pure, table-tested); what a stage
//! does with model output → `stage/`; a provider quirk → `llm/`; a
//! background job → a [`service::Service`] listed in `daemon.rs`; a route
//! → `http/`; an operator command → `cli/` over `control` or `repo`.

pub mod archivist;
pub mod backoff;
pub mod callbacks;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod db;
pub mod dispatcher;
pub mod embedder;
pub mod error;
pub mod http;
pub mod listener;
pub mod llm;
pub mod metrics;
pub mod model;
pub mod repo;
pub mod retention;
pub mod sanitize;
pub mod secret;
pub mod service;
pub mod shutdown;
pub mod stage;
pub mod sys;
pub mod systemd;
pub mod telemetry;
pub mod timescope;
pub mod users;
