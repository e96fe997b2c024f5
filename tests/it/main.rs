//! One integration binary against a real PostgreSQL; a module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod archivist;
mod callbacks;
mod cli;
mod console;
mod control;
mod engine;
mod health;
mod http;
mod layers;
mod llm;
mod memory;
mod observability;
mod orchestrator;
mod prompts;
mod props;
mod requests;
mod retention;
mod schema;
mod stages;
mod support;
mod systemd;
