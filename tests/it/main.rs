//! One integration binary against a real PostgreSQL; a module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod archivist;
mod cli;
mod engine;
mod http;
mod llm;
mod memory;
mod ops;
mod orchestrator;
mod props;
mod schema;
mod stages;
mod support;
