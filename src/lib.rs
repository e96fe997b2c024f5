//! maas: a PostgreSQL-native orchestrator for an LLM pipeline with long-term
//! memory.
//!
//! PostgreSQL holds every bit of state. `maasd` LISTENs on
//! [`listener::CHANNEL`], claims requests as leases and moves each through
//! the stages analyze → assemble → respond. The table is the truth; a
//! notification is only a doorbell (`docs/invariants.md`).
//!
//! # Glossary
//!
//! One word for one thing, in SQL, types, logs, the CLI and HTTP:
//!
//! - **request** — one user query and everything done for it: a row of
//!   `pipeline_runs` (the table keeps the seed's name), [`repo::requests`].
//!   Its id is a time-ordered UUID (version 7, `maas_uuid7()`).
//!   Older outside names (`/api/query`, `maas_runs_*` series) stay for
//!   their callers.
//! - **stage** — one step of a request: `analyze`, `assemble`, `respond`
//!   ([`model::StageKind`]). Each has a ready status and an in-flight status.
//! - **role** — whose prompt a stage or the archivist runs with:
//!   `Analyzer`, `Assembler`, `Responder` (stored as `FinalResponder`),
//!   `Archivist` ([`model::PromptRole`]).
//! - **attempt** — one try of a stage; counted in `pipeline_runs.attempt`,
//!   recorded as a row of `pipeline_steps` ([`repo::steps`]). A result of
//!   an attempt that a newer claim of its row replaced is *superseded*
//!   (never "a run": a request is not a run, whatever its table is called).
//!   An attempt's **result** ([`repo::Finished`]) either succeeded, with
//!   its stage's **output** (analysis, context or answer), or did not, as
//!   its decision says (retrying, deferred, failed, released).
//! - **debug request** — a request submitted with `debug`: it rests in
//!   `ANALYZED` and `READY` until an operator continues it.
//! - **wait** — a request resting for a person: `WAITING_USER_INPUT` (for
//!   its user's reply) or `AWAITING_REVIEW` (for an operator's review). A
//!   wait is the row alone: no lease, no connection, no daemon; the claim,
//!   the ring of due rows and the reclaim never read it. It ends by a
//!   reply, a review, a cancel or the sweep when `wait_expires_at` passes
//!   (`sql/queries/expire_waits.sql`, [`repo::waits`]). Opt-in per tenant
//!   (`tenants.hitl_clarify`, `hitl_review`) or per request (`clarify`,
//!   `review`).
//! - **question** — what the analyzer asks the user of a request too vague
//!   to answer (`pipeline_runs.question` while it waits; logged once as
//!   the assistant's turn, `assistant_question`).
//! - **reply** — the user's answer to a question (logged once as the
//!   user's turn, `user_reply`); the request then goes back to the analyzer
//!   with the exchange in its context.
//! - **review** — an operator's approval, edit or rejection of an answer
//!   resting in `AWAITING_REVIEW` before anyone receives it.
//! - **claim** — taking due requests of a stage as leases, with
//!   `FOR UPDATE SKIP LOCKED` ([`dispatcher`], `sql/queries/claim.sql`).
//! - **lease** — the time-limited right of one daemon to run a claimed
//!   request (`lease_owner`, `lease_expires_at`), renewed by the heartbeat
//!   and taken back by the sweep when it runs out. A scheduled archive run
//!   holds a lease of its own (`archive_schedule.run_owner`).
//! - **chain** — the statement that writes a stage's result also claims the
//!   request for its next stage (no doorbell in between).
//! - **fuse** — running the assemble stage in the same task right after a
//!   successful analyze and writing both results in one statement; the
//!   respond stage is fused too when it answers within a few milliseconds.
//! - **decision** — what the attempt policy makes of an outcome: advance,
//!   retry after a delay, defer, fail, release ([`dispatcher::policy`]).
//! - **delta** — a piece of a streamed answer (prose says "piece"): the
//!   text that follows the one before it in one attempt of the respond
//!   stage, numbered `seq` from 1 per attempt, or a restart; a row of
//!   `answer_deltas` and an SSE `delta` event, only for a request that
//!   asked to stream (`pipeline_runs.stream`; [`dispatcher::publish`],
//!   `app::follow::deltas`).
//! - Three things flow piece by piece; each has one name:
//!   - **streamed answer** — an answer sent as deltas while the respond
//!     stage runs (the request's `stream` flag; see *delta*);
//!   - **live push** — the events a client follows: SSE (`/events`), the
//!     WebSocket (`/api/ws`) and an MCP session's event stream, fed by
//!     one follower ([`app::follow`]; the HTTP streams `http::live`);
//!   - **provider stream** — a model's reply read as it is generated
//!     (`llm::stream`).
//! - **turn** — one message of a conversation, the user's or the
//!   assistant's: a row of `raw_logs` (short-term memory; the archivist's
//!   input).
//! - **record** — a summary of turns the archivist made: a row of
//!   `lsm_storage` (long-term memory).
//! - **sub-query** — a short search text the analysis gives beside the
//!   query (`sub_queries`, at most four: one per person or instance a
//!   question with several parts implies), searched like the query, its hits
//!   taken in turn with the query's; the analysis' **entities** (names, places,
//!   titles) are one more, joined ([`stage::memory::merge`]).
//! - **first person** — a query that speaks of its user as "I", "my",
//!   "я", "мой" ([`person`]): its memory search scores the user's own turns
//!   (`user_query`) as a named speaker's, and the offline analyzer searches
//!   memory for it.
//! - **archive run** — one pass of the archivist over the users that have
//!   turns to archive ([`archivist`]).
//! - **embedding** — the vector of a turn's text (with the turn before it)
//!   or of a query, for the semantic part of the memory search: a row of
//!   `turn_embeddings`, made by the **embedder** service ([`embedder`],
//!   [`llm::embed`]); optional, `[llm.embedding]`. The caller embeds a
//!   query; `repo` takes the vector.
//! - **service** — a background job of `maasd` with one `run(shutdown)`
//!   ([`service::Service`]).
//! - **tenant** — one application served by this maas, with its own users,
//!   API tokens, limits (`requests_per_minute`, `max_in_flight`) and
//!   callback secret: a row of `tenants` (`sql/0012_tenants.sql`). Every
//!   request carries its `tenant_id`; the **default tenant** (nil id) is
//!   the configured `api_tokens` and a call without a token on loopback.
//!   See [`app::caller`] and [`app::limits`].
//! - **chat completion** — a request made through the OpenAI-compatible
//!   endpoint (`POST /v1/chat/completions`, `http::openai`): the last user
//!   message is its query, its id `chatcmpl-` and the request id (every
//!   door and `maasctl` take it as the request's).
//! - **MCP session** — a session of the MCP revisions before the current
//!   one (`Mcp-Session-Id`), held in the memory of the daemon that began
//!   it and bound to the API token that opened it (`mcp::sessions`); not a
//!   console session.
//! - **producer role** — a database role of another application that
//!   inserts requests and turns with plain SQL. `maasctl tenants grant`
//!   maps it, or a group role it is a member of, to a tenant (a row of
//!   `tenant_roles`) and `tenants revoke` removes the mapping; a role no
//!   mapping covers inserts nothing (invariant 13).
//! - **shown and stored user id** — the user id a tenant sends and sees
//!   (the shown id) is not the one in the tables: every table keys on the
//!   stored id, `maas_tenant_user(tenant, user)` in SQL, a version-8 UUID
//!   made from the tenant and the shown id (the default tenant's ids stay
//!   themselves, but for version-8 ones). So a tenant's users are its own
//!   by construction, and memory, archive, retention, export and erase
//!   never see another tenant's. Answers show the shown id
//!   (`repo::users::UserKey` holds both).
//!
//! "Token" names five things; the code always says which:
//!
//! - **API token** — the bearer token of an HTTP call (`Authorization:
//!   Bearer`): a configured one (`api_tokens`, the default tenant, scope
//!   `admin`) or a database one (`maasctl tokens create`, kept as its
//!   SHA-256 in the table `api_tokens`, with a tenant and a scope).
//! - **fencing token** — `lease_token`, new at every claim; a result is
//!   written only with the token of the lease it ran under.
//! - **console session and CSRF token** — the `maas_console` cookie made
//!   from an API token at `/console/login`, and the `csrf` field every
//!   console action carries, an HMAC of that session (`http::console::auth`).
//! - **LLM tokens** — what a model counts: `prompt_tokens` and
//!   `completion_tokens` of an attempt, `context_max_tokens` and the memory
//!   budgets of the assembler ([`llm::tokens`]), `maas_llm_tokens_total`
//!   and the per-tenant `maas_llm_tenant_tokens_total`.
//! - **cancellation token** — `tokio_util`'s `CancellationToken`: how
//!   shutdown and the grace period reach a task; never stored.
//!
//! # Map
//!
//! Layers, lowest first; each module is linked once, in its layer. A module
//! uses only modules of lower layers (and its own children), so there are
//! no import circles. `tests/it/layers.rs` reads this list and checks it
//! against every `crate::` path of the code.
//!
//! 0. Leaves, no crate imports: [`model`] (statuses, stages, prompt roles,
//!    the memory shapes), [`error`] (what a failure means for the request),
//!    [`secret`], [`backoff`], [`sys`], [`shutdown`], [`telemetry`],
//!    [`timescope`], [`person`] (a query in the first person), [`sanitize`]
//!    (what a model's text may carry into the database).
//! 1. [`llm`] — providers (OpenAI-compatible, Anthropic, Gemini, offline),
//!    rate limits, token counting, fence stripping, error mapping,
//!    embeddings ([`llm::embed`]).
//! 2. [`config`] — typed settings, loaded once (defaults → file →
//!    environment).
//! 3. [`db`] — the pool, TLS to the server ([`db::tls`]), failover
//!    ([`db::failover`]), a connection outside the pool ([`db::session`]),
//!    migrations, a private cluster for development and tests
//!    ([`db::devdb`]).
//! 4. [`repo`] — every SQL statement, one file per table; rows read by
//!    column name. No SQL outside `repo` and `db`.
//! 5. Engine parts: [`metrics`] (Prometheus series), [`stage`] (the stages
//!    behind a trait that knows no SQL; the typed analysis), [`service`]
//!    (the background-job trait).
//! 6. [`listener`] (the LISTEN session and its [`listener::Notifier`]),
//!    [`users`] (a user's data: see, correct, forget; the one search
//!    of a memory plan, [`users::retrieve`], for the pipeline and the doors).
//! 7. Engine and services: [`dispatcher`] (claim → run → decide → write;
//!    the sweep; a streamed answer's deltas to `answer_deltas`), [`archivist`] (turns → records, on a schedule and on
//!    demand, exactly once), [`embedder`] (turns → embeddings, when on),
//!    [`callbacks`] (signed deliveries from a durable outbox), [`retention`]
//!    (old requests deleted in batches).
//! 8. [`control`] — every operator action with its audit row (cancel,
//!    retry, continue, pause, prompt activation, archive now; tenant and
//!    token administration, [`control::tenants`]), one path for `maasctl`,
//!    HTTP and the console; above the engine because "archive now" runs
//!    the archivist. (Memory corrections are a user's data, in layer 6.)
//! 9. [`app`] — the application layer below every door, knowing no wire:
//!    who calls (tenant, scope, bound user), the caps and the tenant's
//!    limits, the rules of text, submitting a request, following requests
//!    to their end, a user's memory; one error type ([`app::AppError`])
//!    that each door maps to its wire.
//! 10. Doors, each an adapter over `app` and never over another door:
//!     [`http`] (submit, status, long-poll, SSE, WebSocket, health,
//!     metrics, OpenAPI; the operator console, `http::console`; the
//!     OpenAI-compatible endpoint, `http::openai`), [`mcp`]
//!     (the Model Context Protocol server: tools and resources for agents,
//!     mounted at `/mcp` by the daemon, served over stdio by
//!     `maasctl mcp`), [`systemd`] (readiness, watchdog).
//! 11. [`cli`] (`maasctl`), above the doors for `maasctl mcp`.
//! 12. [`daemon`] — wires it all into `maasd`: one list of services.
//!
//! Beyond the order: `repo` never uses `llm` (the data layer takes
//! vectors, never a model); `stage` never uses `repo` and `stage` never
//! uses `db` (a stage sees plain values: no SQL, no row type).
//!
//! # Where a change goes
//!
//! - A new statement → its `.sql` in `sql/queries/`, its function in the
//!   table's file in `repo/`.
//! - A retry rule → `dispatcher/policy.rs` (pure, table-tested).
//! - What a stage does with model output → `stage/`.
//! - A provider quirk → `llm/`. A **new provider** → a file of its own in
//!   `llm/` (its request and reply shapes, like `llm/anthropic.rs`), its
//!   `ProviderKind` in `llm/mod.rs`, its call in `llm/client.rs`, its
//!   settings and defaults in `llm/config.rs`, its failures mapped in
//!   `llm/error.rs`.
//! - A background job → a [`service::Service`] listed in `daemon.rs`.
//! - A route → `http/` (and its entry in `http/openapi.rs`), calling the
//!   function of [`app`] its twins on the other doors call.
//! - A **new door** (a protocol) → a module beside `http` and `mcp` that
//!   reads its wire, asks [`app::caller`] who calls and what it may do,
//!   calls [`app`] (and `control`, `users`), and maps [`app::AppError`]'s
//!   kind to its wire; served on the daemon's listener as `mcp::http`
//!   is (a router given to `http::start`). See `docs/contributing.md`.
//! - A **new console page** → its handler in `http/console/pages.rs`, its
//!   route in `http/console/mod.rs`, its template in
//!   `http/console/templates/` (extending `base.html`); reads through
//!   `repo`, actions through `control`.
//! - A **new tenant limit** → a column of `tenants` in a new migration in
//!   `sql/`, its count in `sql/queries/tenants_limit_counts.sql` and
//!   `repo/tenants.rs`, its check in `app/limits.rs` (`check_limits`),
//!   its setting in `cli/tenants.rs` (`maasctl tenants`).
//! - An operator action → `control.rs`, then its command in `cli/`, its
//!   route in `http/` and its button in `http/console/`.
//! - A new module → a line in the map above, in the lowest layer above
//!   everything it uses.

pub mod app;
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
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod person;
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
