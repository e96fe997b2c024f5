//! One integration binary against a real PostgreSQL; a module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod archivist;
mod callbacks;
mod caps;
mod cli;
mod console;
mod console_list;
mod control;
mod docs;
mod engine;
mod failover;
mod health;
mod hostile;
mod http;
mod layers;
mod llm;
mod memory;
mod metadata;
mod neighbours;
mod observability;
mod operate;
mod orchestrator;
mod poison;
mod pooler;
mod prompts;
mod props;
mod requests;
mod retention;
mod roles;
mod schema;
mod stages;
mod support;
mod systemd;
mod tenants;
mod tls;
mod users;
