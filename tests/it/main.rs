//! The one integration test binary; a module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod llm;
mod support;
