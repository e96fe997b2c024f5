//! Harness code shared by the integration tests.

pub mod fake_llm;
