//! maas: a PostgreSQL-native orchestrator.
pub mod llm;
